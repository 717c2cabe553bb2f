// The fetch cases: one worker (this process) fetches every rank of a re-split of the uploaded
// checkpoint, checking what arrives; an unmeasured warm-up pass, then kRepeats measured passes,
// each after a transport pass.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/fetch_verify.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {

std::optional<int64_t> Harness::FetchAllRanks(const FetchCase& c, const Strategy* destination,
                                              int64_t ranks, int64_t* verified_bytes) {
  int64_t bytes = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    v1::FetchRequest request;
    request.set_checkpoint_id(kCheckpointId);
    if (c.strategy.empty()) {
      request.set_merged(true);
    } else {
      request.set_destination_strategy(c.strategy);
      request.set_rank(r);
    }
    if (!c.include_prefix.empty()) request.add_include(c.include_prefix + "*");
    CheckingVisitor visitor(&spec_, destination, r, c.include_prefix);
    absl::Status s = client_->Fetch(request, visitor);
    if (s.ok()) s = visitor.Complete();
    if (!s.ok()) {
      Error(absl::StrCat("fetch ", c.name, " rank ", r), s);
      return std::nullopt;
    }
    bytes += visitor.bytes();
    *verified_bytes += visitor.checked();
  }
  return bytes;
}

void Harness::MeasureFetch(const FetchCase& c) {
  std::optional<Strategy> destination;
  int64_t ranks = 1;
  if (!c.strategy.empty()) {
    destination = *StrategyByName(spec_, c.strategy);
    ranks = destination->world_size();
  }
  const Strategy* const layout = destination ? &*destination : nullptr;
  FetchResult result;
  result.c = c;
  result.ranks = ranks;
  // One unmeasured pass first, as the transport limit's passes each start with a warm-up stream:
  // the measured passes then find both processes in the state a long-running ckptd and client
  // are in (the storage limit restarts ckptd just before the first case, and both processes'
  // heaps still grow during a first pass).
  {
    const auto start = Clock::now();
    const std::optional<int64_t> bytes = FetchAllRanks(c, layout, ranks, &result.verified_bytes);
    if (!bytes) return;
    result.bytes = *bytes;
    result.warmup_gibps = *bytes / kGiB / Seconds(start);
    Progress(absl::StrFormat("fetch %s: warm-up pass, %.3f GiB = %.2f GiB/s (not measured)", c.name,
                             *bytes / kGiB, *result.warmup_gibps));
  }
  auto before = Stats();
  std::vector<double> pass_seconds;
  CpuTally cpu;
  for (int pass = 0; pass < kRepeats; ++pass) {
    TransportPass();  // interleaved: see transport_server_
    const CpuMeter pass_cpu(server_->pid());
    const auto start = Clock::now();
    const std::optional<int64_t> pass_bytes =
        FetchAllRanks(c, layout, ranks, &result.verified_bytes);
    if (!pass_bytes) return;
    pass_seconds.push_back(Seconds(start));
    const std::optional<CpuPerGib> this_pass = pass_cpu.Finish(*pass_bytes);
    pass_cpu.AddTo(&cpu, *pass_bytes);
    if (*pass_bytes != result.bytes) {
      return Error(absl::StrCat("fetch ", c.name),
                   absl::InternalError(absl::StrCat("pass ", pass, " delivered ", *pass_bytes,
                                                    " bytes, the warm-up pass ", result.bytes)));
    }
    result.passes_gibps.push_back(*pass_bytes / kGiB / pass_seconds.back());
    Progress(absl::StrFormat(
        "fetch %s: %d rank(s), %.3f GiB in %.2f s = %.2f GiB/s, CPU per GiB %s, %lld bytes "
        "verified",
        c.name, ranks, *pass_bytes / kGiB, pass_seconds.back(), result.passes_gibps.back(),
        CpuText(this_pass), static_cast<long long>(result.verified_bytes)));
  }
  result.cpu = cpu.PerGib();
  result.seconds = Median(pass_seconds);
  result.gibps = result.bytes / kGiB / result.seconds;
  auto after = Stats();
  if (before.ok() && after.ok()) {
    const int64_t read = after->store_bytes_read() - before->store_bytes_read();
    result.amplification = static_cast<double>(read) / static_cast<double>(result.bytes * kRepeats);
    // Chunks the store could not hand out as views of its mapped windows (over ckptd's
    // --map-budget-mib, or larger than a window) are read as copies, a copy of every such byte
    // in ckptd's CPU: the share says how much of the case's server CPU that is.
    const int64_t copied = after->store_bytes_copied() - before->store_bytes_copied();
    Progress(absl::StrFormat("fetch %s: the store read %.1f%% of the bytes it served as copies",
                             c.name, read > 0 ? 100.0 * static_cast<double>(copied) / read : 0.0));
  }
  fetch_.push_back(std::move(result));
}

}  // namespace ckpt::bench
