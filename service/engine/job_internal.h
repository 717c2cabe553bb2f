// Internals shared by the job runner's translation units: job_runner.cc (the API, job state and
// watches), job_validation.cc (submission checks and the output path rules), job_execution.cc
// (worker threads, running a job, streaming a fetch into a sink) and job_outputs.cc (the three
// kinds of output). Not for use outside them.
#ifndef CKPT_SERVICE_ENGINE_JOB_INTERNAL_H_
#define CKPT_SERVICE_ENGINE_JOB_INTERNAL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckpt.pb.h"
#include "service/engine/job_runner.h"
#include "spdlog/spdlog.h"

namespace ckpt {

// Receives one fetched rank: a header per tensor, then exactly its bytes. Not thread-safe.
class JobTensorSink {
 public:
  virtual ~JobTensorSink() = default;
  virtual absl::Status BeginTensor(const v1::FetchTensorHeader& header) = 0;
  virtual absl::Status Append(std::string_view bytes) = 0;
};

struct JobWatch::State {
  std::mutex mu;  // held while `fn` runs, so that ~JobWatch waits for a call in progress
  JobWatchFn fn;  // null once unregistered or closed
  uint64_t last_version = 0;
  // Cleared by ~JobWatch; lets the runner drop dead registrations without taking `mu` (which
  // would invert the order with callbacks that call into the runner).
  std::atomic<bool> alive{true};
};

// One job's in-memory state. Every field is guarded by JobRunner::mu_ except persist_mu.
struct JobRunner::Entry {
  explicit Entry(v1::Job j) : job(std::move(j)) {}

  v1::Job job;
  bool cancel = false;   // cancellation requested
  bool running = false;  // a worker thread owns it
  // Bumped on every change; watchers never see an older version after a newer one. Starts at 1
  // so that the first delivery (version > 0) is never mistaken for a stale one.
  uint64_t version = 1;
  absl::Time last_persist = absl::InfinitePast();
  absl::Time last_notify = absl::InfinitePast();
  // (time, bytes_done) samples of the current run for the throughput estimate.
  std::deque<std::pair<absl::Time, int64_t>> samples;
  std::vector<std::shared_ptr<JobWatch::State>> watchers;
  // Serialises this job's record writes; taken before mu_ (never while holding it).
  std::mutex persist_mu;
};

// Shared bytes/second budget of all jobs. Deficit style: a caller takes what it moved and is
// told how long to wait until the budget is positive again, so a 1 MiB message under a 64 KiB/s
// cap simply waits 16 s instead of being split. Thread-safe.
class JobRunner::TokenBucket {
 public:
  explicit TokenBucket(int64_t bytes_per_second)
      : rate_(static_cast<double>(bytes_per_second)),
        burst_(std::max(1.0, rate_ / 4)),  // a quarter second of credit
        tokens_(burst_),
        last_(absl::Now()) {}

  absl::Duration Reserve(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time now = absl::Now();
    tokens_ = std::min(burst_, tokens_ + rate_ * absl::ToDoubleSeconds(now - last_));
    last_ = now;
    tokens_ -= static_cast<double>(bytes);
    if (tokens_ >= 0) return absl::ZeroDuration();
    return absl::Seconds(-tokens_ / rate_);
  }

 private:
  std::mutex mu_;
  const double rate_;
  const double burst_;
  double tokens_;
  absl::Time last_;
};

namespace job_internal {

// The "jobs" logger.
const std::shared_ptr<spdlog::logger>& Logger();

// The reason recorded on a cancelled job.
inline constexpr char kCancelledReason[] = "cancelled by request";

// "CODE: message", as recorded in a failed job's reason.
std::string StatusText(const absl::Status& s);
// "QUEUED", "RUNNING", ... for logs and messages.
const char* StateName(v1::JobState state);
// "new_checkpoint=X", "export_dir=/d", "merged_file=/f" for logs and messages.
std::string TargetText(const v1::TransformTarget& t);

// "export_dir" or "merged_file": the name of a file output's field, for messages.
const char* OutputField(const v1::TransformTarget& t);
// A file output's path as the caller gave it (relative to the export root), for messages: errors
// name outputs only this way, never by their location on the server.
const std::string& OutputSpelling(const v1::TransformTarget& t);
// Removes entry `name` of directory `dir_fd` and everything under it, never following a symlink
// (RemoveTreeAt). Best effort: a leftover is logged (as `display`), and removed again by the next
// start.
void RemoveTreeQuietly(int dir_fd, const std::string& name, const std::string& display);

// The fetch of destination rank `rank` (or of the merged tensors).
v1::FetchRequest FetchFor(const v1::SubmitTransformRequest& r, int64_t rank, bool merged);
// ABORTED once ForEachInParallel (job_outputs.cc) has set `stop` (another rank of the job
// failed), else OK.
absl::Status CheckStop(const std::atomic<bool>* stop);

}  // namespace job_internal
}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_JOB_INTERNAL_H_
