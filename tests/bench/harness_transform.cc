// The transform phase: ckptd's export job (8 -> 3 ranks, in a fresh ckptd) against the naive
// baseline (a child process), kRepeats alternating passes, both outputs verified.
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/fetch_verify.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// Total bytes of the 3 exported rank files under `export_dir`; NOT_FOUND naming a missing one.
absl::StatusOr<int64_t> ExportedBytes(const std::string& export_dir) {
  int64_t output_bytes = 0;
  for (int r = 0; r < 3; ++r) {
    const std::string file = absl::StrCat(export_dir, "/rank_", r, "/checkpoint_", r, ".ckpt");
    std::error_code size_error;
    const auto size = fs::file_size(file, size_error);
    if (size_error) return absl::NotFoundError(absl::StrCat("rank ", r, " file missing"));
    output_bytes += static_cast<int64_t>(size);
  }
  return output_bytes;
}

}  // namespace

void Harness::MeasureTransformPhase() {
  // Alternating passes (the disk's speed, which bounds the job, drifts within a run): the job in
  // a fresh ckptd, then the baseline alone on the machine, as the job ran.
  for (int pass = 0; pass < kRepeats; ++pass) {
    if (!MeasureTransform(pass)) break;
    StopServer();
    if (!MeasureBaseline()) break;
  }
  TransformMedians();
}

bool Harness::MeasureTransform(int pass) {
  // A fresh ckptd, so that its peak RSS is the job's (plus start-up).
  StopServer();
  if (auto s = StartServer(); !s.ok()) {
    Error("restart ckptd", s);
    return false;
  }
  const std::string export_dir = work_ + "/export";
  const Strategy d3 = ThreeRankStrategy(spec_);
  v1::SubmitTransformRequest request;
  request.set_job_id(absl::StrCat("bench-export-", getpid(), "-", pass));
  request.set_checkpoint_id(kCheckpointId);
  request.set_destination_strategy(kThreeName);
  request.mutable_target()->set_export_dir("export");  // relative to --export-root work_
  const auto start = Clock::now();
  const absl::StatusOr<double> cpu_start = ProcessCpuSeconds(server_->pid());
  auto submitted = client_->SubmitTransform(request);
  if (!submitted.ok()) {
    if (submitted.status().code() == absl::StatusCode::kUnimplemented) {
      Note(absl::StrCat("ckptd does not implement transform jobs yet (",
                        submitted.status().ToString(), "): transform seconds/peak RSS are null"));
      return false;
    }
    Error("SubmitTransform", submitted.status());
    return false;
  }
  auto job = client_->WatchJob(submitted->job().id());
  const double seconds = Seconds(start);
  if (!job.ok()) {
    Error("WatchJob", job.status());
    return false;
  }
  if (job->state() != v1::JOB_STATE_SUCCEEDED) {
    Error("transform job",
          absl::InternalError(absl::StrCat(JobStateName(job->state()), ": ", job->reason())));
    return false;
  }
  auto peak = ProcessPeakRssBytes(server_->pid());
  if (!peak.ok()) {
    Error("ckptd peak RSS", peak.status());
    return false;
  }
  const absl::StatusOr<double> cpu_end = ProcessCpuSeconds(server_->pid());
  std::optional<double> cpu;
  if (cpu_start.ok() && cpu_end.ok()) cpu = *cpu_end - *cpu_start;
  Progress(absl::StrFormat(
      "transform job (export, 8 -> 3 ranks): %.2f s, ckptd CPU %s, ckptd VmHWM %.0f MiB", seconds,
      cpu ? absl::StrFormat("%.2f s", *cpu) : std::string("n/a"), *peak / kMiB));
  auto checked = VerifyRankFile(spec_, d3, 1, export_dir + "/rank_1/checkpoint_1.ckpt");
  if (!checked.ok()) {
    Error("verify export", checked.status());
    return false;
  }
  transform_runs_.push_back(seconds);
  transform_rss_mib_ = std::max(transform_rss_mib_.value_or(0), *peak / kMiB);
  if (cpu) transform_cpu_runs_.push_back(*cpu);
  const absl::StatusOr<int64_t> output_bytes = ExportedBytes(export_dir);
  if (!output_bytes.ok()) {
    Error("verify export", output_bytes.status());
    return false;
  }
  transform_output_bytes_ = *output_bytes;
  std::error_code ec;
  fs::remove_all(export_dir, ec);
  return true;
}

bool Harness::MeasureBaseline() {
  const std::string out_dir = work_ + "/baseline";
  const auto start = Clock::now();
  auto child = Child::Spawn({SelfExe(), "--baseline", "--src", work_ + "/src", "--baseline-out",
                             out_dir, "--size-gib", absl::StrFormat("%.17g", size_gib_)},
                            {});
  if (!child.ok()) {
    Error("baseline", child.status());
    return false;
  }
  const Child::Exit e = (*child)->Wait();
  const double seconds = Seconds(start);
  if (e.exit_code != 0) {
    Error("baseline", absl::InternalError(absl::StrCat("exit code ", e.exit_code)));
    return false;
  }
  Progress(
      absl::StrFormat("naive baseline (merge then split, 8 -> 3 ranks): %.2f s, peak RSS %.0f MiB",
                      seconds, e.max_rss_kib / 1024.0));
  auto checked =
      VerifyRankFile(spec_, ThreeRankStrategy(spec_), 1, out_dir + "/rank_1/checkpoint_1.ckpt");
  std::error_code ec;
  fs::remove_all(out_dir, ec);
  if (!checked.ok()) {
    Error("verify baseline output", checked.status());
    return false;
  }
  baseline_runs_.push_back(seconds);
  baseline_rss_mib_ = std::max(baseline_rss_mib_.value_or(0), e.max_rss_kib / 1024.0);
  baseline_cpu_runs_.push_back(e.cpu_seconds);
  return true;
}

void Harness::TransformMedians() {
  if (!transform_runs_.empty()) transform_seconds_ = Median(transform_runs_);
  if (!transform_cpu_runs_.empty()) transform_cpu_seconds_ = Median(transform_cpu_runs_);
  if (!baseline_runs_.empty()) baseline_seconds_ = Median(baseline_runs_);
  if (!baseline_cpu_runs_.empty()) baseline_cpu_seconds_ = Median(baseline_cpu_runs_);
}

}  // namespace ckpt::bench
