// The concurrent phase: kWorkers worker processes (the bench binary in its --worker mode) fetch
// their ranks of the column re-split at once from a fresh ckptd; an unmeasured warm-up pass, then
// kRepeats measured passes, each after a transport pass.
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {

bool Harness::SpawnWorkers(std::vector<std::unique_ptr<Child>>* workers,
                           const std::string& strategy, int count) {
  for (int r = 0; r < count; ++r) {
    auto child = Child::Spawn(
        {SelfExe(), "--worker", "--server", server_->address(), "--fetch-strategy", strategy,
         "--rank", absl::StrCat(r), "--size-gib", absl::StrFormat("%.17g", size_gib_)},
        {.pipe_stdin = true, .pipe_stdout = true});
    if (!child.ok()) {
      Error("spawn worker", child.status());
      return false;
    }
    workers->push_back(*std::move(child));
  }
  for (auto& w : *workers) {
    const auto line = w->ReadLine();
    if (!line || *line != "ready") {
      Error("worker", absl::InternalError(line ? *line : "exited before ready"));
      return false;
    }
  }
  return true;
}

std::optional<Harness::WorkersPass> Harness::RunWorkersPass(
    const std::vector<std::unique_ptr<Child>>& workers, double* worker_cpu) {
  for (auto& w : workers) {
    if (auto s = w->WriteLine("go"); !s.ok()) {
      Error("worker", s);
      return std::nullopt;
    }
  }
  WorkersPass pass;
  for (auto& w : workers) {
    const auto line = w->ReadLine();
    long long b = 0, v = 0;
    double secs = 0, cpu = 0;
    if (!line || std::sscanf(line->c_str(), "ok %lld %lf %lld %lf", &b, &secs, &v, &cpu) != 4) {
      Error("worker", absl::InternalError(line ? *line : "no result"));
      return std::nullopt;
    }
    pass.bytes += b;
    pass.verified += v;
    pass.seconds.push_back(secs);
    if (worker_cpu != nullptr) *worker_cpu += cpu;
  }
  return pass;
}

bool Harness::StopWorkers(const std::vector<std::unique_ptr<Child>>& workers) {
  for (auto& w : workers) {
    if (auto s = w->WriteLine("quit"); !s.ok()) {
      Error("worker", s);
      return false;
    }
    const Child::Exit e = w->Wait();
    if (e.exit_code != 0) {
      Error("worker", absl::InternalError(absl::StrCat("exit code ", e.exit_code)));
      return false;
    }
  }
  return true;
}

void Harness::MeasureConcurrent() {
  // A fresh server, so that its peak RSS is that of this phase (plus start-up).
  StopServer();
  if (auto s = StartServer(); !s.ok()) return Error("restart ckptd", s);
  std::vector<std::unique_ptr<Child>> workers;
  if (!SpawnWorkers(&workers, kColumnName, kWorkers)) return;
  // An unmeasured warm-up pass (as for each fetch case), then kRepeats passes, each every worker
  // fetching its rank once (the workers stay up between them): the aggregate is the median
  // pass's.
  std::vector<double> pass_gibps;
  int64_t verified = 0;
  CpuTally cpu;  // server + all workers (their own CPU, during their fetch, not their start-up)
  absl::StatusOr<v1::ServerStats> after_warmup = absl::UnknownError("no warm-up pass");
  for (int pass = -1; pass < kRepeats; ++pass) {
    const bool warmup = pass < 0;
    if (!warmup) TransportPass();  // interleaved: see transport_server_
    const auto start = Clock::now();
    const absl::StatusOr<double> server_cpu_start = ProcessCpuSeconds(server_->pid());
    const std::optional<WorkersPass> done = RunWorkersPass(workers, warmup ? nullptr : &cpu.client);
    if (!done) return;
    const double seconds = Seconds(start);
    const int64_t bytes = done->bytes;
    verified += done->verified;
    if (warmup) {
      concurrent_bytes_ = bytes;
      concurrent_warmup_gibps_ = bytes / kGiB / seconds;
      Progress(absl::StrFormat(
          "concurrent: %d workers, warm-up pass, %.3f GiB = %.2f GiB/s (not measured)", kWorkers,
          bytes / kGiB, *concurrent_warmup_gibps_));
      after_warmup = Stats();
      continue;
    }
    const absl::StatusOr<double> server_cpu_end = ProcessCpuSeconds(server_->pid());
    if (server_cpu_start.ok() && server_cpu_end.ok()) {
      cpu.server += *server_cpu_end - *server_cpu_start;
    } else {
      cpu.complete = false;
    }
    cpu.bytes += bytes;
    if (bytes != concurrent_bytes_) {
      return Error("concurrent", absl::InternalError(
                                     absl::StrCat("pass ", pass, " delivered ", bytes,
                                                  " bytes, the warm-up pass ", concurrent_bytes_)));
    }
    pass_gibps.push_back(bytes / kGiB / seconds);
    Progress(absl::StrFormat("concurrent: %d workers, %.3f GiB in %.2f s = %.2f GiB/s", kWorkers,
                             bytes / kGiB, seconds, pass_gibps.back()));
  }
  if (!StopWorkers(workers)) return;
  concurrent_runs_ = pass_gibps;
  concurrent_gibps_ = Median(pass_gibps);
  concurrent_cpu_ = cpu.PerGib();
  ConcurrentServerFigures(after_warmup);
  Progress(absl::StrFormat(
      "concurrent: median %.2f GiB/s, ckptd VmHWM %.0f MiB, %lld bytes verified",
      *concurrent_gibps_, concurrent_rss_mib_.value_or(-1), static_cast<long long>(verified)));
}

void Harness::ConcurrentServerFigures(const absl::StatusOr<v1::ServerStats>& after_warmup) {
  auto peak = ProcessPeakRssBytes(server_->pid());
  if (peak.ok()) {
    concurrent_rss_mib_ = *peak / kMiB;
  } else {
    Error("ckptd peak RSS", peak.status());
  }
  if (auto stats = Stats(); stats.ok()) {
    concurrent_stats_rss_mib_ = stats->peak_rss_bytes() / kMiB;
    // The measured passes' reads: the counters since the warm-up pass.
    if (after_warmup.ok()) {
      const int64_t read = stats->store_bytes_read() - after_warmup->store_bytes_read();
      const int64_t copied = stats->store_bytes_copied() - after_warmup->store_bytes_copied();
      if (read > 0) {
        concurrent_copied_fraction_ = static_cast<double>(copied) / static_cast<double>(read);
      }
    }
  }
}

}  // namespace ckpt::bench
