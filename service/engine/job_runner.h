// Transform jobs: the server-side replacement for MindSpore's offline
// transform_checkpoints / transform_checkpoint_by_rank / load_distributed_checkpoint(
// predict_strategy=None). A job reads a committed checkpoint through the same FetchStream the
// Fetch RPC uses and writes one output:
//   - a new stored checkpoint under a destination strategy (fed through the upload path, so it is
//     chunked, checksummed and committed exactly like an uploaded one);
//   - an export directory DIR/rank_<r>/<prefix><r>.ckpt in MindSpore's layout;
//   - one merged .ckpt with every tensor whole.
// File outputs are confined beneath JobRunnerOptions::export_root (storage/confined_dir.h): their
// paths are relative to it, resolved by the kernel beneath a descriptor of it (never leaving it,
// whatever symlinks lie on the way), written relative to the descriptor of their parent directory
// opened when the job starts (a symlink planted later is never followed) and published with
// renameat2(RENAME_NOREPLACE) (an existing entry is never replaced or merged into). Without an
// export root, file-output jobs are refused.
// Every byte written therefore equals what Fetch serves for the same rank, in the same order
// (MindSpore's: transformed tensors in source order, then verbatim ones).
//
// Durability: jobs are ckpt.v1.Job records in the store's `jobs` column family, written (synced)
// on every state change and at most every progress interval. File outputs are written under a
// sibling `<output>.ckptd-partial-<job id>` directory and renamed into place only when complete;
// a new checkpoint becomes visible only at its atomic commit. So a crash never leaves output that
// looks finished: at the next start RUNNING jobs are re-queued, their partial output is removed
// and they run again from the beginning (attempts + 1). Output found complete at a restart (a
// crash between publishing it and recording SUCCEEDED) is recognised and the job succeeds.
//
// Isolation from workers' fetches: jobs run on their own threads (never on the service Executor,
// so a fetch is never queued behind a job), at most `workers` at a time (each writing up to
// `rank_workers` destination ranks at once), at a lowered CPU priority, and optionally under a
// shared bytes/second cap.
#ifndef CKPT_SERVICE_ENGINE_JOB_RUNNER_H_
#define CKPT_SERVICE_ENGINE_JOB_RUNNER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt.pb.h"
#include "core/strategy.h"
#include "service/engine/manager.h"
#include "service/engine/upload_session.h"
#include "storage/confined_dir.h"

namespace ckpt {

struct JobRunnerOptions {
  // Jobs running at the same time, each on its own thread. Default 1.
  int workers = 1;
  // Destination ranks one export or new-checkpoint job writes at the same time (the job's
  // thread plus rank_workers - 1 it starts for the job's duration). Each rank alternates
  // re-sharding (CPU) with waiting for its output's writes, so several at once keep the cores
  // busy; each costs its fetch's bounded memory plus a 4 MiB write buffer. Default 4. A
  // merged-file job always writes its one file on one thread.
  int rank_workers = 4;
  // Cap on the tensor bytes per second all jobs together move; 0 = unlimited. Default 0.
  int64_t max_bytes_per_second = 0;
  // Niceness added to job threads (Linux applies it per thread) so that fetch handlers win CPU
  // contention; 0 leaves the priority alone. Default 10.
  int worker_nice = 10;
  // Progress is persisted at most this often; state changes always are. Default 1 s.
  absl::Duration progress_persist_interval = absl::Seconds(1);
  // Watchers hear about progress at most this often; state changes always reach them.
  // Default 250 ms (4 per second).
  absl::Duration watch_interval = absl::Milliseconds(250);
  // Window of the throughput (and so ETA) estimate. Default 10 s.
  absl::Duration rate_window = absl::Seconds(10);
  // How long Cancel() waits for a running job to stop and remove its partial output before it
  // returns the job as it is then. Default 10 s.
  absl::Duration cancel_wait = absl::Seconds(10);
  // Finished jobs (SUCCEEDED, FAILED, CANCELLED) whose finished time is older than this are
  // removed by RemoveExpired() (at Start() and whenever the server's maintenance runs).
  // InfiniteDuration keeps them forever. Default 7 days.
  absl::Duration retention = absl::Hours(24 * 7);
  // Chunking of checkpoints written by jobs. Should equal ManagerOptions::upload so that a
  // job-written checkpoint is stored exactly like an uploaded one.
  UploadOptions upload;
  // The directory beneath which export_dir and merged_file outputs are written (ckptd
  // --export-root); it must exist when Start() runs. Empty: such jobs are refused
  // (FAILED_PRECONDITION) and only new-checkpoint jobs run.
  std::string export_root;
};

// Where a job writes one fetched rank (job_internal.h).
class JobTensorSink;

struct SubmitResult {
  v1::Job job;
  // False when an identical request with the same job id already existed (idempotent retry).
  bool created = false;
};

// Receives a job's state: the current state once at registration, then after every change (at
// most every JobRunnerOptions::watch_interval for mere progress; state changes always), oldest
// state never after a newer one. `job` is null exactly once, as the last call, when the runner
// shuts down. Called on runner or caller threads with no runner lock held, so it may call back
// into the runner; it must not destroy its own JobWatch.
using JobWatchFn = std::function<void(const v1::Job* job)>;

// A registration made by JobRunner::Watch. Destroying it unregisters: when the destructor
// returns, the callback is not running and will not be called again. May outlive the runner.
// Thread-safe.
class JobWatch {
 public:
  struct State;
  explicit JobWatch(std::shared_ptr<State> state) : state_(std::move(state)) {}
  ~JobWatch();
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

 private:
  std::shared_ptr<State> state_;
};

// Thread-safe: every public method may be called from any thread. Does not own the manager (nor
// its store), which must outlive the runner. Shutdown() (also run by the destructor) joins the
// job threads.
class JobRunner {
 public:
  JobRunner(CheckpointManager* manager, JobRunnerOptions options);
  ~JobRunner();
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Opens the export root (when set; its errors fail the start), loads every job record; QUEUED
  // and RUNNING jobs are queued again (RUNNING ones after their partial output is removed), then
  // the job threads start. Call once, before the other calls.
  absl::Status Start();
  // Stops the job threads promptly. A running job keeps its RUNNING record so that the next
  // Start() runs it again; its partial output is removed. Watches end (callback with null).
  // Later calls get UNAVAILABLE. Idempotent.
  void Shutdown();

  // The export root opened by Start(), or null when --export-root is not set. Immutable after
  // Start(); also confines the Backup RPC's target.
  const ConfinedRoot* export_root() const { return export_root_.get(); }

  // Validates and records a job (QUEUED). Same id + same request: the existing job with
  // created = false; same id + another request: ALREADY_EXISTS. Errors: INVALID_ARGUMENT (bad
  // request), NOT_FOUND (checkpoint or strategy), OUT_OF_RANGE (rank >= destination world),
  // FAILED_PRECONDITION (no export root for a file output, its parent directory missing, or
  // another active job writes the same output), PERMISSION_DENIED (a file output that leads
  // outside the export root), ALREADY_EXISTS (the output file or directory, or the new
  // checkpoint id, exists). Errors name file outputs as the caller spelled them. `owner` (the
  // submitting principal) is recorded as Job.owner.
  absl::StatusOr<SubmitResult> Submit(const v1::SubmitTransformRequest& request,
                                      const std::string& owner = "");
  // NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Job> Get(const std::string& id) const;
  // Every job, by id.
  std::vector<v1::Job> List() const;
  // Cancels a queued job at once, or a running one at its next message: its I/O stops and its
  // partial output is removed. Waits (up to cancel_wait) for that and returns the job, CANCELLED
  // unless it had ended already (then unchanged). NOT_FOUND for an unknown id.
  absl::StatusOr<v1::Job> Cancel(const std::string& id);
  // Removes the record of a finished job. FAILED_PRECONDITION while it is queued or running,
  // NOT_FOUND for an unknown id, UNAVAILABLE when not started or stopping. Its output (a
  // checkpoint or files) is not touched.
  absl::Status Delete(const std::string& id);
  // Removes every finished job that finished before `now` - JobRunnerOptions::retention; returns
  // how many. Failures to delete a record are logged and the job kept for the next round.
  int RemoveExpired(absl::Time now);
  // Registers `fn` for job `id` (see JobWatchFn); the current state is delivered before this
  // returns. NOT_FOUND for an unknown id.
  absl::StatusOr<std::unique_ptr<JobWatch>> Watch(const std::string& id, JobWatchFn fn);

  // Jobs known now, by state (cheap: counts the records held in memory). Thread-safe.
  std::map<v1::JobState, int64_t> CountByState() const;
  // Tensor bytes all jobs have written since this runner was created (a job that runs again
  // after a restart or a retry counts its bytes again). Thread-safe.
  int64_t bytes_written() const { return bytes_written_.load(std::memory_order_relaxed); }
  // Jobs that ended FAILED with a DATA_LOSS error (a stored chunk failed its checksum) since this
  // runner was created. Thread-safe.
  int64_t data_loss_failures() const { return data_loss_failures_.load(std::memory_order_relaxed); }

  static bool IsTerminal(v1::JobState state);
  // Where a file output is assembled before it is renamed into place:
  // "<output>.ckptd-partial-<job id>" (a sibling in the same directory, so that the rename stays
  // in one directory descriptor and on one filesystem).
  static std::string PartialPath(const std::string& output, const std::string& job_id);

 private:
  struct Entry;
  class TokenBucket;
  enum class Change { kState, kProgress };

  absl::Status Available() const;  // UNAVAILABLE unless started and not stopping; mu_ held
  // Submission checks (job_validation.cc): the request as a whole; its output, returning the
  // cleaned output path (or the new checkpoint id); and that no active job writes that output
  // (takes mu_).
  absl::Status ValidateRequest(const v1::SubmitTransformRequest& request);
  absl::StatusOr<std::string> ValidateOutput(const v1::SubmitTransformRequest& request,
                                             const Strategy* strategy);
  absl::Status CheckOutputFree(v1::TransformTarget::OutputCase kind,
                               const std::string& output) const;
  // A file output's path normalised relative to the export root (ConfinedRoot::Normalize):
  // FAILED_PRECONDITION without an export root, PERMISSION_DENIED for a path that leaves it,
  // INVALID_ARGUMENT for a merged_file spelled as a directory (a trailing '/').
  absl::StatusOr<std::string> FileOutput(const v1::TransformTarget& target) const;
  // Opens a file output's parent directory beneath the export root (ConfinedRoot::OpenParent).
  absl::StatusOr<ConfinedRoot::Location> OpenFileOutput(const v1::TransformTarget& target) const;
  std::shared_ptr<Entry> Find(const std::string& id) const;

  void WorkerLoop();
  void RunJob(const std::shared_ptr<Entry>& e);
  absl::Status Execute(Entry* e, const v1::SubmitTransformRequest& request, int32_t attempt);
  absl::Status RunNewCheckpoint(Entry* e, const v1::SubmitTransformRequest& request);
  absl::Status RunExport(Entry* e, const v1::SubmitTransformRequest& request, int32_t attempt);
  absl::Status RunMerged(Entry* e, const v1::SubmitTransformRequest& request, int32_t attempt);
  // Removes what an interrupted run of this job may have left behind (idempotent).
  void RemovePartialOutput(const v1::Job& job);

  // Sums the plan summaries of `fetches` and records them as the job's totals.
  absl::Status ComputeTotals(Entry* e, const std::vector<v1::FetchRequest>& fetches);
  // Streams one fetch into `sink`, checking cancellation (and `stop`, when given) between
  // messages, throttling, and counting progress.
  absl::Status Pump(Entry* e, const v1::FetchRequest& fetch, JobTensorSink* sink,
                    const std::atomic<bool>* stop = nullptr);
  // CANCELLED when the job was cancelled, ABORTED when the runner is stopping, else OK.
  absl::Status Check(Entry* e);
  // Takes `bytes` from the bandwidth budget, waiting (interruptibly) when it is exhausted.
  absl::Status Throttle(Entry* e, int64_t bytes);

  // Applies `mutate` to the job under mu_, then persists and notifies watchers as the kind of
  // change and the intervals ask.
  void Update(Entry* e, Change change, const std::function<void(v1::Job*)>& mutate);
  void Persist(Entry* e);
  void RecordBytesLocked(Entry* e, int64_t bytes, absl::Time now);  // progress + rate; mu_ held

  CheckpointManager* const manager_;
  CheckpointStore* const store_;
  const JobRunnerOptions options_;
  std::unique_ptr<TokenBucket> bucket_;  // null: unlimited
  // Opened by Start() when options_.export_root is set; null otherwise. Immutable after Start().
  std::unique_ptr<ConfinedRoot> export_root_;

  // Serialises submissions (validation touches the store and the filesystem) so that two
  // submissions of one id cannot both create it. Taken before mu_.
  std::mutex submit_mu_;

  mutable std::mutex mu_;
  std::condition_variable queue_cv_;  // work queued, or stopping
  std::condition_variable job_cv_;    // a job cancelled or ended, or stopping
  std::map<std::string, std::shared_ptr<Entry>> jobs_;
  std::deque<std::string> queue_;
  bool started_ = false;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
  std::atomic<int64_t> bytes_written_{0};
  std::atomic<int64_t> data_loss_failures_{0};
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_JOB_RUNNER_H_
