// The job runner's API, the lifecycle of its threads, and job state: updates, persistence,
// progress and watches.
#include "service/engine/job_runner.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "service/engine/job_internal.h"
#include "spdlog/spdlog.h"

namespace ckpt {

using job_internal::kCancelledReason;
using job_internal::Logger;
using job_internal::StatusText;
using job_internal::TargetText;

namespace job_internal {

const std::shared_ptr<spdlog::logger>& Logger() {
  static const std::shared_ptr<spdlog::logger> logger = spdlog::default_logger()->clone("jobs");
  return logger;
}

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

const char* StateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_QUEUED:
      return "QUEUED";
    case v1::JOB_STATE_RUNNING:
      return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED:
      return "SUCCEEDED";
    case v1::JOB_STATE_FAILED:
      return "FAILED";
    case v1::JOB_STATE_CANCELLED:
      return "CANCELLED";
    default:
      return "UNSPECIFIED";
  }
}

std::string TargetText(const v1::TransformTarget& t) {
  switch (t.output_case()) {
    case v1::TransformTarget::kNewCheckpointId:
      return absl::StrCat("new_checkpoint=", t.new_checkpoint_id());
    case v1::TransformTarget::kExportDir:
      return absl::StrCat("export_dir=", t.export_dir());
    case v1::TransformTarget::kMergedFile:
      return absl::StrCat("merged_file=", t.merged_file());
    case v1::TransformTarget::OUTPUT_NOT_SET:
      break;
  }
  return "none";
}

}  // namespace job_internal

namespace {

std::string NewJobId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrCat("job-", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()),
                      "-", absl::StrFormat("%06x", rng() & 0xffffff));
}

}  // namespace

JobWatch::~JobWatch() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->fn = nullptr;
  state_->alive = false;
}

// ------------------------------------------------------------------------------- JobRunner

JobRunner::JobRunner(CheckpointManager* manager, JobRunnerOptions options)
    : manager_(manager),
      store_(manager->store()),
      options_(std::move(options)),
      bucket_(options_.max_bytes_per_second > 0
                  ? std::make_unique<TokenBucket>(options_.max_bytes_per_second)
                  : nullptr) {}

JobRunner::~JobRunner() { Shutdown(); }

bool JobRunner::IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string JobRunner::PartialPath(const std::string& output, const std::string& job_id) {
  return absl::StrCat(output, ".ckptd-partial-", job_id);
}

absl::Status JobRunner::Available() const {
  if (stopping_) return absl::UnavailableError("ckptd is shutting down");
  if (!started_) return absl::UnavailableError("the job runner is not started");
  return absl::OkStatus();
}

std::shared_ptr<JobRunner::Entry> JobRunner::Find(const std::string& id) const {
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

absl::Status JobRunner::Start() {
  if (!options_.export_root.empty() && export_root_ == nullptr) {
    absl::StatusOr<std::unique_ptr<ConfinedRoot>> root = ConfinedRoot::Open(options_.export_root);
    if (!root.ok()) {
      return absl::Status(root.status().code(),
                          absl::StrCat("--export-root: ", root.status().message()));
    }
    export_root_ = *std::move(root);
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<JobRecord> records, store_->ListJobs());
  std::vector<std::shared_ptr<Entry>> queued;
  std::map<std::string, std::shared_ptr<Entry>> loaded;
  for (const JobRecord& r : records) {
    v1::Job job;
    if (!job.ParseFromString(r.record) || job.id() != r.id) {
      Logger()->error("event=job_load job={} error=\"record does not parse\"", r.id);
      continue;
    }
    if (job.state() == v1::JOB_STATE_RUNNING) {
      // Interrupted by a crash or shutdown: start again from a clean point.
      RemovePartialOutput(job);
      job.set_state(v1::JOB_STATE_QUEUED);
      job.mutable_progress()->set_bytes_per_second(0);
      job.mutable_progress()->set_eta_seconds(0);
      const absl::Status requeued = store_->PutJob(job.id(), job.SerializeAsString());
      if (absl::IsResourceExhausted(requeued)) {
        // A full disk (the store refuses writes): the job stays RUNNING in the store and is
        // requeued at the next start with room; it is not run now, as it could record nothing.
        Logger()->warn("event=job_requeue job={} deferred=true error=\"{}\"", job.id(),
                       StatusText(requeued));
        loaded.emplace(r.id, std::make_shared<Entry>(std::move(job)));
        continue;
      }
      CKPT_RETURN_IF_ERROR(requeued);
      Logger()->info("event=job_requeue job={} attempts={}", job.id(), job.attempts());
    }
    auto e = std::make_shared<Entry>(std::move(job));
    if (e->job.state() == v1::JOB_STATE_QUEUED) queued.push_back(e);
    loaded.emplace(r.id, std::move(e));
  }
  // Oldest submission first.
  std::sort(queued.begin(), queued.end(), [](const auto& a, const auto& b) {
    return std::make_pair(a->job.submitted_unix(), a->job.id()) <
           std::make_pair(b->job.submitted_unix(), b->job.id());
  });
  std::lock_guard<std::mutex> lock(mu_);
  if (started_ || stopping_) return absl::FailedPreconditionError("JobRunner::Start called twice");
  jobs_ = std::move(loaded);
  for (const auto& e : queued) queue_.push_back(e->job.id());
  started_ = true;
  for (int i = 0; i < std::max(1, options_.workers); ++i) {
    threads_.emplace_back([this] { WorkerLoop(); });
  }
  Logger()->info("event=jobs_start jobs={} queued={} workers={} bandwidth={} export_root=\"{}\"",
                 jobs_.size(), queued.size(), std::max(1, options_.workers),
                 options_.max_bytes_per_second,
                 export_root_ ? export_root_->path() : std::string("(none: file outputs refused)"));
  return absl::OkStatus();
}

int JobRunner::RemoveExpired(absl::Time now) {
  if (options_.retention == absl::InfiniteDuration()) return 0;
  const int64_t cutoff = absl::ToUnixSeconds(now - options_.retention);
  std::vector<std::string> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, e] : jobs_) {
      if (IsTerminal(e->job.state()) && !e->running && e->job.finished_unix() < cutoff) {
        expired.push_back(id);
      }
    }
  }
  int removed = 0;
  for (const std::string& id : expired) {
    absl::Status status = Delete(id);
    if (status.ok()) {
      ++removed;
      Logger()->info("event=job_expire job={}", id);
    } else if (status.code() != absl::StatusCode::kNotFound) {
      Logger()->warn("event=job_expire job={} error=\"{}\"", id, std::string(status.message()));
    }
  }
  return removed;
}

void JobRunner::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    threads.swap(threads_);
  }
  queue_cv_.notify_all();
  job_cv_.notify_all();
  for (std::thread& t : threads) t.join();
  // No job changes any more: end every watch.
  std::vector<std::shared_ptr<JobWatch::State>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, e] : jobs_) {
      for (auto& w : e->watchers) watchers.push_back(std::move(w));
      e->watchers.clear();
    }
  }
  for (const auto& w : watchers) {
    std::lock_guard<std::mutex> lock(w->mu);
    if (!w->fn) continue;
    JobWatchFn fn = std::move(w->fn);
    w->fn = nullptr;
    fn(nullptr);
  }
}

// ------------------------------------------------------------------------------- API

absl::StatusOr<SubmitResult> JobRunner::Submit(const v1::SubmitTransformRequest& request,
                                               const std::string& owner) {
  std::lock_guard<std::mutex> submit_lock(submit_mu_);
  v1::SubmitTransformRequest req = request;
  if (req.job_id().empty()) req.set_job_id(NewJobId());
  {
    std::lock_guard<std::mutex> lock(mu_);
    CKPT_RETURN_IF_ERROR(Available());
    if (auto e = Find(req.job_id())) {
      if (google::protobuf::util::MessageDifferencer::Equals(e->job.request(), req)) {
        return SubmitResult{e->job, false};
      }
      return absl::AlreadyExistsError(
          absl::StrCat("job ", req.job_id(), " already exists with a different request"));
    }
  }
  CKPT_RETURN_IF_ERROR(ValidateRequest(req));
  v1::Job job;
  job.set_id(req.job_id());
  *job.mutable_request() = req;
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_submitted_unix(absl::ToUnixSeconds(absl::Now()));
  job.set_owner(owner);
  CKPT_RETURN_IF_ERROR(store_->PutJob(job.id(), job.SerializeAsString()));
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Shutdown may have begun meanwhile: the record is QUEUED and the next start runs it.
    auto e = std::make_shared<Entry>(job);
    e->last_persist = absl::Now();
    jobs_.emplace(job.id(), std::move(e));
    queue_.push_back(job.id());
  }
  queue_cv_.notify_one();
  Logger()->info("event=job_submit job={} checkpoint={} destination_strategy={} {}", job.id(),
                 req.checkpoint_id(), req.destination_strategy(), TargetText(req.target()));
  return SubmitResult{std::move(job), true};
}

absl::StatusOr<v1::Job> JobRunner::Get(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto e = Find(id);
  if (!e) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return e->job;
}

std::vector<v1::Job> JobRunner::List() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Job> out;
  out.reserve(jobs_.size());
  for (const auto& [id, e] : jobs_) out.push_back(e->job);
  return out;
}

std::map<v1::JobState, int64_t> JobRunner::CountByState() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<v1::JobState, int64_t> out;
  for (const auto& [id, e] : jobs_) ++out[e->job.state()];
  return out;
}

absl::Status JobRunner::Delete(const std::string& id) {
  std::shared_ptr<Entry> e;
  {
    std::unique_lock<std::mutex> lock(mu_);
    CKPT_RETURN_IF_ERROR(Available());
    e = Find(id);
    if (!e) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
    // A job that has just ended may still be on its worker for a moment after its terminal state
    // was published: wait (bounded) for the worker to let go of it.
    if (IsTerminal(e->job.state()) && e->running) {
      job_cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.cancel_wait),
                       [&] { return !e->running; });
    }
    if (!IsTerminal(e->job.state()) || e->running) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is ", job_internal::StateName(e->job.state()),
                       "; only a finished job can be removed (cancel it first)"));
    }
  }
  // The record goes first: were the store to fail, the job stays listed and can be removed
  // again. A finished job never changes, so nothing persists it again meanwhile.
  std::lock_guard<std::mutex> persist(e->persist_mu);
  CKPT_RETURN_IF_ERROR(store_->DeleteJob(id));
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(id);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> JobRunner::Cancel(const std::string& id) {
  std::shared_ptr<Entry> e;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CKPT_RETURN_IF_ERROR(Available());
    e = Find(id);
    if (!e) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
    if (IsTerminal(e->job.state())) return e->job;
    e->cancel = true;
    // A worker picks a job only if it is QUEUED and not cancelled, both checked under mu_:
    // a queued job is ours to finish.
    queued = !e->running;
  }
  if (queued) {
    Update(e.get(), Change::kState, [](v1::Job* j) {
      j->set_state(v1::JOB_STATE_CANCELLED);
      j->set_reason(kCancelledReason);
      j->set_finished_unix(absl::ToUnixSeconds(absl::Now()));
    });
    Logger()->info("event=job_end job={} state=CANCELLED reason=\"{}\"", id, kCancelledReason);
    std::lock_guard<std::mutex> lock(mu_);
    return e->job;
  }
  job_cv_.notify_all();  // wakes the job if it waits for bandwidth
  std::unique_lock<std::mutex> lock(mu_);
  job_cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.cancel_wait),
                   [&] { return !e->running; });
  return e->job;
}

absl::StatusOr<std::unique_ptr<JobWatch>> JobRunner::Watch(const std::string& id, JobWatchFn fn) {
  auto state = std::make_shared<JobWatch::State>();
  state->fn = std::move(fn);
  v1::Job snapshot;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    CKPT_RETURN_IF_ERROR(Available());
    auto e = Find(id);
    if (!e) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
    std::erase_if(e->watchers, [](const auto& w) { return !w->alive; });
    e->watchers.push_back(state);
    snapshot = e->job;
    version = e->version;
  }
  {
    std::lock_guard<std::mutex> lock(state->mu);
    if (state->fn && version > state->last_version) {
      state->last_version = version;
      state->fn(&snapshot);
    }
  }
  return std::make_unique<JobWatch>(std::move(state));
}

// ------------------------------------------------------------------------------- state

void JobRunner::Update(Entry* e, Change change, const std::function<void(v1::Job*)>& mutate) {
  const absl::Time now = absl::Now();
  bool persist = false;
  bool notify = false;
  v1::Job snapshot;
  uint64_t version = 0;
  std::vector<std::shared_ptr<JobWatch::State>> watchers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    mutate(&e->job);
    version = ++e->version;
    persist =
        change == Change::kState || now - e->last_persist >= options_.progress_persist_interval;
    notify = change == Change::kState || now - e->last_notify >= options_.watch_interval;
    if (persist) e->last_persist = now;
    if (notify) {
      e->last_notify = now;
      std::erase_if(e->watchers, [](const auto& w) { return !w->alive; });
      watchers = e->watchers;
      if (!watchers.empty()) snapshot = e->job;
    }
  }
  if (persist) Persist(e);
  for (const auto& w : watchers) {
    std::lock_guard<std::mutex> lock(w->mu);
    if (!w->fn || version <= w->last_version) continue;  // gone, or a newer state was delivered
    w->last_version = version;
    w->fn(&snapshot);
  }
}

void JobRunner::Persist(Entry* e) {
  // The snapshot is taken under persist_mu, so whichever write lands last carries the newest
  // state.
  std::lock_guard<std::mutex> persist_lock(e->persist_mu);
  std::string id;
  std::string bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = e->job.id();
    bytes = e->job.SerializeAsString();
  }
  if (absl::Status s = store_->PutJob(id, bytes); !s.ok()) {
    Logger()->error("event=job_persist job={} error=\"{}\"", id, StatusText(s));
  }
}

void JobRunner::RecordBytesLocked(Entry* e, int64_t bytes, absl::Time now) {
  bytes_written_.fetch_add(bytes, std::memory_order_relaxed);
  v1::JobProgress* p = e->job.mutable_progress();
  p->set_bytes_done(p->bytes_done() + bytes);
  auto& samples = e->samples;
  if (samples.empty() || now - samples.back().first >= absl::Milliseconds(100)) {
    samples.emplace_back(now, p->bytes_done());
  }
  while (samples.size() > 2 && samples.front().first < now - options_.rate_window) {
    samples.pop_front();
  }
  const double span = absl::ToDoubleSeconds(now - samples.front().first);
  if (span >= 0.2) {
    const double rate = static_cast<double>(p->bytes_done() - samples.front().second) / span;
    p->set_bytes_per_second(rate);
    const int64_t left = std::max<int64_t>(0, p->bytes_total() - p->bytes_done());
    p->set_eta_seconds(rate > 0 ? static_cast<double>(left) / rate : 0);
  }
}

absl::Status JobRunner::Check(Entry* e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (e->cancel) return absl::CancelledError(kCancelledReason);
  if (stopping_) return absl::AbortedError("interrupted: ckptd is shutting down");
  return absl::OkStatus();
}

absl::Status JobRunner::Throttle(Entry* e, int64_t bytes) {
  if (bucket_) {
    const absl::Duration wait = bucket_->Reserve(bytes);
    if (wait > absl::ZeroDuration()) {
      std::unique_lock<std::mutex> lock(mu_);
      job_cv_.wait_for(lock, absl::ToChronoMicroseconds(wait),
                       [&] { return e->cancel || stopping_; });
    }
  }
  return Check(e);
}

}  // namespace ckpt
