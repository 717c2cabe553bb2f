// The storm phase: a job of kStormTp tensor-parallel groups x kStormDp data-parallel replicas
// starting at once. One worker process per rank (the bench binary in its --worker mode, each with
// its own channel and connection) fetches its rank of the storm destination; every unique slice
// is wanted by kStormDp workers at the same moment. A fresh ckptd, so that its peak RSS is this
// phase's; an unmeasured warm-up pass, then kRepeats measured passes, each after a transport
// pass. Reported: the aggregate GiB/s against the transport limit, the store bytes read per
// unique byte needed (GetStats), the slowest worker against the median one, ckptd's peak RSS.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {
namespace {

std::string Range(const std::vector<double>& v, int precision) {
  if (v.empty()) return "none";
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  return absl::StrFormat("%d, %.*f-%.*f", v.size(), precision, *lo, precision, *hi);
}

}  // namespace

void Harness::MeasureStorm() {
  StopServer();
  if (auto s = StartServer(); !s.ok()) return Error("restart ckptd", s);
  auto destination = StrategyByName(spec_, kStormName);
  if (!destination.ok()) return Error("storm strategy", destination.status());
  if (auto put = client_->PutStrategy(kStormName, *destination, true); !put.ok()) {
    return Error(absl::StrCat("PutStrategy ", kStormName), put.status());
  }
  const int workers_count = kStormTp * kStormDp;
  std::vector<std::unique_ptr<Child>> workers;
  if (!SpawnWorkers(&workers, kStormName, workers_count)) return;
  Progress(absl::StrFormat("storm: %d workers ready", workers_count));

  StormResult r;
  r.workers = workers_count;
  CpuTally cpu;
  for (int pass = -1; pass < kRepeats; ++pass) {
    const bool warmup = pass < 0;
    if (!warmup) TransportPass();  // interleaved: see transport_server_
    const absl::StatusOr<v1::ServerStats> before = Stats();
    const absl::StatusOr<double> server_cpu_start = ProcessCpuSeconds(server_->pid());
    const auto start = Clock::now();
    const std::optional<WorkersPass> done = RunWorkersPass(workers, warmup ? nullptr : &cpu.client);
    if (!done) return;
    const double seconds = Seconds(start);
    const absl::StatusOr<double> server_cpu_end = ProcessCpuSeconds(server_->pid());
    const absl::StatusOr<v1::ServerStats> after = Stats();
    if (warmup) {
      r.bytes = done->bytes;
      r.unique_bytes = done->bytes / kStormDp;
    } else if (done->bytes != r.bytes) {
      return Error("storm",
                   absl::InternalError(absl::StrCat("pass ", pass, " delivered ", done->bytes,
                                                    " bytes, the warm-up ", r.bytes)));
    }
    const double gibps = done->bytes / kGiB / seconds;
    std::optional<double> amplification;
    if (before.ok() && after.ok() && r.unique_bytes > 0) {
      amplification = static_cast<double>(after->store_bytes_read() - before->store_bytes_read()) /
                      static_cast<double>(r.unique_bytes);
      r.passes_amplification.push_back(*amplification);
    }
    std::vector<double> times = done->seconds;
    const double median = Median(times);
    const double slowest = *std::max_element(times.begin(), times.end());
    const double spread = median > 0 ? slowest / median : 0;
    Progress(absl::StrFormat(
        "storm: %s%d workers, %.3f GiB in %.2f s = %.2f GiB/s, read amplification %s, "
        "slowest/median %.2f (%.2f / %.2f s)",
        warmup ? "warm-up pass (not measured), " : "", workers_count, done->bytes / kGiB, seconds,
        gibps, Fmt(amplification, "", 3), spread, slowest, median));
    if (warmup) {
      r.warmup_gibps = gibps;
      continue;
    }
    if (server_cpu_start.ok() && server_cpu_end.ok()) {
      cpu.server += *server_cpu_end - *server_cpu_start;
    } else {
      cpu.complete = false;
    }
    cpu.bytes += done->bytes;
    r.passes_gibps.push_back(gibps);
    r.passes_slowest_over_median.push_back(spread);
  }
  if (!StopWorkers(workers)) return;
  r.gibps = Median(r.passes_gibps);
  r.slowest_over_median = Median(r.passes_slowest_over_median);
  if (!r.passes_amplification.empty()) {
    r.read_amplification =
        *std::max_element(r.passes_amplification.begin(), r.passes_amplification.end());
  }
  if (auto peak = ProcessPeakRssBytes(server_->pid()); peak.ok()) {
    r.server_peak_rss_mib = *peak / kMiB;
  } else {
    Error("ckptd peak RSS", peak.status());
  }
  r.cpu = cpu.PerGib();
  r.load_average = LoadAverage();
  storm_ = r;
  Progress(absl::StrFormat("storm: median %.2f GiB/s, ckptd VmHWM %s, load average %s", r.gibps,
                           Fmt(r.server_peak_rss_mib, " MiB", 0), r.load_average));
}

nlohmann::json Harness::StormJson() const {
  using nlohmann::json;
  if (!storm_) {
    return {{"workers", kStormTp * kStormDp},
            {"gibps", nullptr},
            {"ratio", nullptr},
            {"read_amplification", nullptr},
            {"slowest_over_median", nullptr},
            {"server_peak_rss_mib", nullptr}};
  }
  const StormResult& r = *storm_;
  std::optional<double> ratio;
  if (transport_gibps_ && *transport_gibps_ > 0) ratio = r.gibps / *transport_gibps_;
  json cpu = nullptr;
  if (r.cpu)
    cpu = {{"server_cpu_s_per_gib", r.cpu->server}, {"client_cpu_s_per_gib", r.cpu->client}};
  return {{"workers", r.workers},
          {"tensor_parallel", kStormTp},
          {"data_parallel", kStormDp},
          {"gibps", r.gibps},
          {"ratio", Opt(ratio)},
          {"read_amplification", Opt(r.read_amplification)},
          {"slowest_over_median", r.slowest_over_median},
          {"server_peak_rss_mib", Opt(r.server_peak_rss_mib)},
          {"bytes", r.bytes},
          {"unique_bytes", r.unique_bytes},
          {"passes_gibps", r.passes_gibps},
          {"warmup_gibps", Opt(r.warmup_gibps)},
          {"passes_read_amplification", r.passes_amplification},
          {"passes_slowest_over_median", r.passes_slowest_over_median},
          {"cpu", cpu},
          {"load_average_end", r.load_average}};
}

void Harness::StormRows(std::vector<Row>* rows) const {
  const std::optional<StormResult>& r = storm_;
  std::optional<double> gibps, ratio, spread, rss, amplification;
  if (r) {
    gibps = r->gibps;
    spread = r->slowest_over_median;
    rss = r->server_peak_rss_mib;
    amplification = r->read_amplification;
    if (transport_gibps_ && *transport_gibps_ > 0) ratio = r->gibps / *transport_gibps_;
  }
  rows->push_back({absl::StrFormat("storm (%d workers, %dx%d TP x DP, median)", kStormTp * kStormDp,
                                   kStormTp, kStormDp),
                   absl::StrCat(Fmt(gibps, " GiB/s"), "  ratio ", Fmt(ratio, "")), "ratio >= 0.8",
                   Verdict(ratio ? std::optional<bool>(*ratio >= 0.8) : std::nullopt)});
  if (r && !r->passes_gibps.empty()) {
    rows->push_back(
        {"  passes (median of; after a warm-up)",
         absl::StrCat(Range(r->passes_gibps, 2), " GiB/s; warm-up ", Fmt(r->warmup_gibps, "")), "",
         ""});
  }
  rows->push_back(
      {"  read amplification (store / unique)", Fmt(amplification, "", 3), "<= 1.10",
       Verdict(amplification ? std::optional<bool>(*amplification <= 1.1 + 1e-9) : std::nullopt)});
  rows->push_back({"  slowest worker / median worker", Fmt(spread, "", 2), "<= 1.5",
                   Verdict(spread ? std::optional<bool>(*spread <= 1.5) : std::nullopt)});
  if (r) {
    rows->push_back({"  CPU per GiB (server + all workers)", CpuText(r->cpu), "", ""});
  }
  rows->push_back({"  ckptd peak RSS (VmHWM)", Fmt(rss, " MiB", 0), "<= 512 MiB",
                   Verdict(rss ? std::optional<bool>(*rss <= 512.0) : std::nullopt)});
}

}  // namespace ckpt::bench
