#include "service/engine/job_runner.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ckpt_records.pb.h"
#include "core/absl_compat.h"
#include "core/ckpt_format.h"
#include "core/dtype.h"
#include "core/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "service/engine/fetch_stream.h"
#include "spdlog/spdlog.h"
#include "storage/file_stream.h"

namespace ckpt {

// ------------------------------------------------------------------------------- internals

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

JobWatch::~JobWatch() {
  std::lock_guard<std::mutex> lock(state_->mu);
  state_->fn = nullptr;
  state_->alive = false;
}

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

namespace {

std::shared_ptr<spdlog::logger> Logger() {
  static std::shared_ptr<spdlog::logger> logger = spdlog::default_logger()->clone("jobs");
  return logger;
}

constexpr char kDefaultPrefix[] = "checkpoint_";
constexpr char kCancelledReason[] = "cancelled by request";

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

// "new_checkpoint=X", "export_dir=/d", "merged_file=/f" for logs and messages.
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

// Accepts an absolute, normalised path and drops trailing slashes: the temporary sibling and
// the conflict check between jobs both rely on one spelling per location.
absl::StatusOr<std::string> CleanOutputPath(const std::string& what, const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be an absolute path on the server, got \"", path, "\""));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " contains a NUL character"));
  }
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p == "/") return absl::InvalidArgumentError(absl::StrCat(what, " cannot be /"));
  if (std::filesystem::path(p).lexically_normal().string() != p) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", path, "\" must be normalised (no '.', '..' or repeated '/')"));
  }
  return p;
}

std::string ParentOf(const std::string& path) {
  return std::filesystem::path(path).parent_path().string();
}

std::string BaseNameOf(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

// The path of a job's file output, already validated at submission.
std::string OutputPath(const v1::TransformTarget& t) {
  const std::string& raw =
      t.output_case() == v1::TransformTarget::kExportDir ? t.export_dir() : t.merged_file();
  auto clean = CleanOutputPath("output", raw);
  return clean.ok() ? *clean : raw;
}

std::string PrefixOf(const v1::TransformTarget& t) {
  return t.prefix().empty() ? std::string(kDefaultPrefix) : t.prefix();
}

std::string RankFile(const std::string& dir, const std::string& prefix, int64_t rank) {
  return absl::StrCat(dir, "/rank_", rank, "/", prefix, rank, ".ckpt");
}

// Whether `path` exists (lstat: a symlink counts as existing and as not being a directory).
bool Exists(const std::string& path, struct stat* st = nullptr) {
  struct stat local;
  return ::lstat(path.c_str(), st ? st : &local) == 0;
}

absl::StatusOr<bool> IsEmptyDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, "opendir", path);
  bool empty = true;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string_view name = ent->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  ::closedir(d);
  return empty;
}

absl::Status MakeDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) != 0) return ErrnoToStatus(errno, "mkdir", path);
  return absl::OkStatus();
}

// Best effort: a leftover is logged, and removed again by the next start.
void RemoveTree(const std::string& path) {
  std::error_code ec;
  const auto removed = std::filesystem::remove_all(path, ec);
  if (ec) {
    Logger()->warn("event=job_cleanup path={} error=\"{}\"", path, ec.message());
  } else if (removed > 0 && removed != static_cast<std::uintmax_t>(-1)) {
    Logger()->info("event=job_cleanup path={} removed_entries={}", path, removed);
  }
}

std::string NewJobId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrCat("job-", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::UTCTimeZone()),
                      "-", absl::StrFormat("%06x", rng() & 0xffffff));
}

// Lowers the calling thread's CPU priority (Linux niceness is per thread).
void LowerPriority(int nice) {
  if (nice <= 0) return;
  const id_t tid = static_cast<id_t>(::gettid());
  errno = 0;
  const int current = ::getpriority(PRIO_PROCESS, tid);
  if (errno != 0) return;
  if (::setpriority(PRIO_PROCESS, tid, std::min(19, current + nice)) != 0) {
    Logger()->debug("event=job_nice error=\"{}\"", std::strerror(errno));
  }
}

// Calls fn(i, stop) for every i in [0, count) on up to `parallelism` threads: the caller's and
// up to parallelism - 1 started here (which inherit the caller's niceness), each taking the next
// index when it has finished one. After the first failure no further index starts and `stop` is
// set so that calls in progress can end early; returns that first failure. A thread that cannot
// be started only means less parallelism.
absl::Status ForEachInParallel(
    size_t count, int parallelism,
    const std::function<absl::Status(size_t, const std::atomic<bool>& stop)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  absl::Status first;  // guarded by mu; set before `stop`, so it is never a call stopped by it
  auto work = [&] {
    while (!stop.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      absl::Status s = fn(i, stop);
      if (!s.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (first.ok()) first = std::move(s);
        }
        stop = true;
      }
    }
  };
  std::vector<std::thread> helpers;
  const size_t threads = std::min<size_t>(count, static_cast<size_t>(std::max(1, parallelism)));
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error& err) {
      Logger()->warn("event=job_thread_failed error=\"{}\"", err.what());
      break;
    }
  }
  work();
  for (std::thread& t : helpers) t.join();
  std::lock_guard<std::mutex> lock(mu);
  return first;
}

// ABORTED once ForEachInParallel has set `stop` (another rank of the job failed), else OK.
absl::Status CheckStop(const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load()) {
    return absl::AbortedError("stopped because another rank of this job failed");
  }
  return absl::OkStatus();
}

// The fetch of destination rank `rank` (or of the merged tensors).
v1::FetchRequest FetchFor(const v1::SubmitTransformRequest& r, int64_t rank, bool merged) {
  v1::FetchRequest f;
  f.set_checkpoint_id(r.checkpoint_id());
  if (merged) {
    f.set_merged(true);
  } else {
    f.set_destination_strategy(r.destination_strategy());
    f.set_rank(rank);
  }
  return f;
}

// A .ckpt file as MindSpore writes it (no CRC trailer), one fetched tensor at a time.
class CkptFileSink final : public JobTensorSink {
 public:
  explicit CkptFileSink(ByteSink* out) : writer_(out) {}

  absl::Status BeginTensor(const v1::FetchTensorHeader& h) override {
    CKPT_ASSIGN_OR_RETURN(DType dtype, ParseDType(h.dtype()));
    // MindSpore stores scalars with empty dims and str values with dims [0] (spec §1.4).
    std::vector<int64_t> dims(h.local_shape().begin(), h.local_shape().end());
    if (dtype == DType::kStr) dims = {0};
    return writer_.BeginTensor(h.name(), dtype, dims, h.total_bytes());
  }
  absl::Status Append(std::string_view bytes) override { return writer_.Append(bytes); }
  absl::Status Finish() { return writer_.Finish(); }

 private:
  CkptWriter writer_;
};

// One destination rank fed into the upload path, which validates, chunks, deduplicates
// replicas and commits exactly as for a client upload.
class UploadSink final : public JobTensorSink {
 public:
  explicit UploadSink(RankUpload* upload) : upload_(upload) {}

  absl::Status BeginTensor(const v1::FetchTensorHeader& h) override {
    v1::UploadTensorHeader th;
    th.set_name(h.name());
    th.set_dtype(h.dtype());
    *th.mutable_dims() = h.local_shape();
    th.set_total_bytes(h.total_bytes());
    return upload_->StartTensor(th);
  }
  absl::Status Append(std::string_view bytes) override { return upload_->Append(bytes); }

 private:
  RankUpload* upload_;
};

}  // namespace

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
      CKPT_RETURN_IF_ERROR(store_->PutJob(job.id(), job.SerializeAsString()));
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
  Logger()->info("event=jobs_start jobs={} queued={} workers={} bandwidth={}", jobs_.size(),
                 queued.size(), std::max(1, options_.workers), options_.max_bytes_per_second);
  return absl::OkStatus();
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

absl::Status JobRunner::ValidateRequest(const v1::SubmitTransformRequest& request) {
  CKPT_RETURN_IF_ERROR(ValidateName("job id", request.job_id()));
  CKPT_RETURN_IF_ERROR(ValidateName("checkpoint id", request.checkpoint_id()));
  const v1::TransformTarget& target = request.target();
  const auto kind = target.output_case();
  if (kind == v1::TransformTarget::OUTPUT_NOT_SET) {
    return absl::InvalidArgumentError(
        "the target needs one of new_checkpoint_id, export_dir or merged_file");
  }
  if (kind != v1::TransformTarget::kExportDir &&
      (target.ranks_size() > 0 || !target.prefix().empty())) {
    return absl::InvalidArgumentError("target ranks and prefix apply to export_dir only");
  }
  // The source must exist now; a later deletion fails the job when it runs.
  CKPT_RETURN_IF_ERROR(store_->GetManifest(request.checkpoint_id()).status());
  std::shared_ptr<const Strategy> strategy;
  if (kind != v1::TransformTarget::kMergedFile) {
    if (request.destination_strategy().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(TargetText(target), " needs a destination strategy"));
    }
    CKPT_ASSIGN_OR_RETURN(strategy, manager_->GetStrategy(request.destination_strategy()));
  }
  // The conflict check below compares cleaned outputs.
  std::string output;
  switch (kind) {
    case v1::TransformTarget::kNewCheckpointId: {
      output = target.new_checkpoint_id();
      CKPT_RETURN_IF_ERROR(ValidateName("new checkpoint id", output));
      auto existing = store_->GetManifest(output);
      if (existing.ok()) {
        return absl::AlreadyExistsError(absl::StrCat("checkpoint ", output, " already exists"));
      }
      if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
      break;
    }
    case v1::TransformTarget::kExportDir: {
      CKPT_ASSIGN_OR_RETURN(output, CleanOutputPath("export_dir", target.export_dir()));
      const std::string& prefix = target.prefix();
      if (prefix.size() > 200 || prefix.find('/') != std::string::npos ||
          prefix.find('\0') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prefix \"", prefix, "\" must be at most 200 characters without '/'"));
      }
      std::set<int64_t> seen;
      for (int64_t r : target.ranks()) {
        if (r < 0 || r >= strategy->world_size()) {
          return absl::OutOfRangeError(absl::StrCat("rank ", r, " is outside strategy ",
                                                    request.destination_strategy(), "'s world of ",
                                                    strategy->world_size(), " ranks"));
        }
        if (!seen.insert(r).second) {
          return absl::InvalidArgumentError(absl::StrCat("rank ", r, " is listed twice"));
        }
      }
      struct stat st;
      if (Exists(output, &st)) {
        if (!S_ISDIR(st.st_mode)) {
          return absl::FailedPreconditionError(
              absl::StrCat("export directory ", output, " exists and is not a directory"));
        }
        CKPT_ASSIGN_OR_RETURN(bool empty, IsEmptyDir(output));
        if (!empty) {
          return absl::FailedPreconditionError(
              absl::StrCat("export directory ", output, " exists and is not empty"));
        }
      }
      break;
    }
    case v1::TransformTarget::kMergedFile: {
      CKPT_ASSIGN_OR_RETURN(output, CleanOutputPath("merged_file", target.merged_file()));
      if (Exists(output)) {
        return absl::FailedPreconditionError(absl::StrCat(output, " already exists"));
      }
      break;
    }
    case v1::TransformTarget::OUTPUT_NOT_SET:
      break;
  }
  if (kind != v1::TransformTarget::kNewCheckpointId) {
    struct stat st;
    const std::string parent = ParentOf(output);
    if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("parent directory ", parent, " of ", output, " does not exist"));
    }
  }
  // Plan errors (e.g. strategies that cannot be converted) surface now, not as a failed job.
  CKPT_RETURN_IF_ERROR(
      manager_
          ->OpenFetch(FetchFor(request, kind == v1::TransformTarget::kExportDir &&
                                                target.ranks_size() > 0
                                            ? target.ranks(0)
                                            : 0,
                               kind == v1::TransformTarget::kMergedFile))
          .status());
  // Two active jobs must not write the same output.
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : jobs_) {
    if (IsTerminal(e->job.state())) continue;
    const v1::TransformTarget& other = e->job.request().target();
    if (other.output_case() != kind) continue;
    const std::string other_output =
        kind == v1::TransformTarget::kNewCheckpointId ? other.new_checkpoint_id() : OutputPath(other);
    if (other_output == output) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " (", StateName(e->job.state()), ") already writes ", output));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SubmitResult> JobRunner::Submit(const v1::SubmitTransformRequest& request) {
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
      return absl::AlreadyExistsError(absl::StrCat(
          "job ", req.job_id(), " already exists with a different request"));
    }
  }
  CKPT_RETURN_IF_ERROR(ValidateRequest(req));
  v1::Job job;
  job.set_id(req.job_id());
  *job.mutable_request() = req;
  job.set_state(v1::JOB_STATE_QUEUED);
  job.set_submitted_unix(absl::ToUnixSeconds(absl::Now()));
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
    persist = change == Change::kState ||
              now - e->last_persist >= options_.progress_persist_interval;
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

// ------------------------------------------------------------------------------- execution

void JobRunner::WorkerLoop() {
  LowerPriority(options_.worker_nice);
  while (true) {
    std::shared_ptr<Entry> e;
    {
      std::unique_lock<std::mutex> lock(mu_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      e = Find(queue_.front());
      queue_.pop_front();
      if (!e || e->job.state() != v1::JOB_STATE_QUEUED || e->cancel || e->running) continue;
      e->running = true;
      e->samples.clear();
    }
    RunJob(e);
  }
}

void JobRunner::RunJob(const std::shared_ptr<Entry>& e) {
  v1::SubmitTransformRequest request;
  int32_t attempt = 0;
  Update(e.get(), Change::kState, [&](v1::Job* j) {
    j->set_state(v1::JOB_STATE_RUNNING);
    j->set_attempts(j->attempts() + 1);
    j->set_started_unix(absl::ToUnixSeconds(absl::Now()));
    j->set_finished_unix(0);
    j->clear_reason();
    j->clear_progress();
    request = j->request();
    attempt = j->attempts();
  });
  const std::string id = request.job_id();
  Logger()->info("event=job_run job={} attempt={} checkpoint={} {}", id, attempt,
                 request.checkpoint_id(), TargetText(request.target()));
  const absl::Time start = absl::Now();
  const absl::Status status = Execute(e.get(), request, attempt);
  bool cancelled = false;
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled = e->cancel;
    stopping = stopping_;
  }
  if (!status.ok() && !cancelled && stopping) {
    // Not a failure of the job: its RUNNING record makes the next start run it again.
    Logger()->info("event=job_interrupted job={} attempt={}", id, attempt);
    std::lock_guard<std::mutex> lock(mu_);
    e->running = false;
    job_cv_.notify_all();
    return;
  }
  Update(e.get(), Change::kState, [&](v1::Job* j) {
    v1::JobProgress* p = j->mutable_progress();
    if (status.ok()) {
      j->set_state(v1::JOB_STATE_SUCCEEDED);
      p->set_tensors_done(p->tensors_total());
      p->set_bytes_done(p->bytes_total());
      p->set_ranks_done(p->ranks_total());
    } else if (cancelled) {
      j->set_state(v1::JOB_STATE_CANCELLED);
      j->set_reason(kCancelledReason);
    } else {
      j->set_state(v1::JOB_STATE_FAILED);
      j->set_reason(StatusText(status));
    }
    p->set_bytes_per_second(0);
    p->set_eta_seconds(0);
    j->set_finished_unix(absl::ToUnixSeconds(absl::Now()));
  });
  v1::JobState final_state;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e->running = false;
    final_state = e->job.state();
  }
  job_cv_.notify_all();
  const auto level = final_state == v1::JOB_STATE_FAILED ? spdlog::level::warn : spdlog::level::info;
  Logger()->log(level, "event=job_end job={} state={} attempt={} s={:.1f}{}", id,
                StateName(final_state), attempt, absl::ToDoubleSeconds(absl::Now() - start),
                final_state == v1::JOB_STATE_SUCCEEDED
                    ? std::string()
                    : absl::StrCat(" reason=\"", status.message(), "\""));
}

absl::Status JobRunner::Execute(Entry* e, const v1::SubmitTransformRequest& request,
                                int32_t attempt) {
  switch (request.target().output_case()) {
    case v1::TransformTarget::kNewCheckpointId:
      return RunNewCheckpoint(e, request);
    case v1::TransformTarget::kExportDir:
      return RunExport(e, request, attempt);
    case v1::TransformTarget::kMergedFile:
      return RunMerged(e, request, attempt);
    case v1::TransformTarget::OUTPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError("the job has no output");
}

void JobRunner::RemovePartialOutput(const v1::Job& job) {
  const v1::TransformTarget& t = job.request().target();
  if (t.output_case() == v1::TransformTarget::kExportDir ||
      t.output_case() == v1::TransformTarget::kMergedFile) {
    RemoveTree(PartialPath(OutputPath(t), job.id()));
  }
  // A new checkpoint has no partial output to find: an uncommitted upload is invisible, and
  // its chunks are collected by the store (at open after a crash; DiscardData in process).
}

absl::Status JobRunner::ComputeTotals(Entry* e, const std::vector<v1::FetchRequest>& fetches) {
  int64_t tensors = 0;
  int64_t bytes = 0;
  for (const v1::FetchRequest& f : fetches) {
    CKPT_RETURN_IF_ERROR(Check(e));
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FetchStream> stream, manager_->OpenFetch(f));
    v1::FetchResponse first;
    CKPT_ASSIGN_OR_RETURN(bool more, stream->Next(&first));
    if (!more || !first.has_summary()) {
      return absl::InternalError("a fetch stream did not start with its plan summary");
    }
    tensors += first.summary().tensor_count();
    bytes += first.summary().total_bytes();
  }
  const absl::Time now = absl::Now();
  Update(e, Change::kState, [&](v1::Job* j) {
    v1::JobProgress* p = j->mutable_progress();
    p->set_tensors_total(tensors);
    p->set_bytes_total(bytes);
    p->set_ranks_total(static_cast<int64_t>(fetches.size()));
    e->samples.clear();
    e->samples.emplace_back(now, p->bytes_done());
  });
  return absl::OkStatus();
}

absl::Status JobRunner::Pump(Entry* e, const v1::FetchRequest& fetch, JobTensorSink* sink,
                             const std::atomic<bool>* stop) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<FetchStream> stream, manager_->OpenFetch(fetch));
  FetchPiece piece;       // data as views of stored chunks: written out without a copy
  std::string tensor;     // current tensor, for messages
  int64_t remaining = 0;  // its bytes still to come
  while (true) {
    CKPT_RETURN_IF_ERROR(Check(e));
    CKPT_RETURN_IF_ERROR(CheckStop(stop));
    CKPT_ASSIGN_OR_RETURN(bool more, stream->NextPiece(&piece, FetchReader::kInProcess));
    if (!more) break;
    const v1::FetchResponse& msg = piece.message;
    switch (piece.segments.empty() ? msg.kind_case() : v1::FetchResponse::kData) {
      case v1::FetchResponse::kSummary:
        break;
      case v1::FetchResponse::kTensor: {
        if (remaining != 0) {
          return absl::InternalError(absl::StrCat("fetch of tensor ", tensor, " ended ",
                                                  remaining, " bytes early"));
        }
        tensor = msg.tensor().name();
        remaining = msg.tensor().total_bytes();
        CKPT_RETURN_IF_ERROR(sink->BeginTensor(msg.tensor()));
        if (remaining == 0) {
          Update(e, Change::kProgress, [](v1::Job* j) {
            j->mutable_progress()->set_tensors_done(j->progress().tensors_done() + 1);
          });
        }
        break;
      }
      case v1::FetchResponse::kData: {
        const int64_t n = piece.data_bytes;
        for (const DataSegment& segment : piece.segments) {
          CKPT_RETURN_IF_ERROR(sink->Append(segment.bytes));
        }
        remaining -= n;
        const absl::Time now = absl::Now();
        Update(e, Change::kProgress, [&](v1::Job* j) {
          if (remaining == 0) {
            j->mutable_progress()->set_tensors_done(j->progress().tensors_done() + 1);
          }
          RecordBytesLocked(e, n, now);
        });
        CKPT_RETURN_IF_ERROR(Throttle(e, n));
        break;
      }
      case v1::FetchResponse::KIND_NOT_SET:
        return absl::InternalError("empty fetch message");
    }
  }
  if (remaining != 0) {
    return absl::InternalError(absl::StrCat("fetch of tensor ", tensor, " ended ", remaining,
                                            " bytes early"));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::RunNewCheckpoint(Entry* e, const v1::SubmitTransformRequest& request) {
  const std::string& new_id = request.target().new_checkpoint_id();
  const std::string& dst = request.destination_strategy();
  // Recorded as every rank's source file: proves, after a crash between the commit and the
  // SUCCEEDED record, that an existing checkpoint of this id is this job's output.
  const std::string marker = absl::StrCat("ckptd job ", request.job_id());
  auto existing = store_->GetManifest(new_id);
  if (existing.ok()) {
    records::CheckpointManifest m;
    if (m.ParseFromString(*existing) && m.strategy_name() == dst &&
        std::count(m.source_files().begin(), m.source_files().end(), marker) > 0) {
      Logger()->info("event=job_output_present job={} checkpoint={}", request.job_id(), new_id);
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", new_id, " already exists"));
  }
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();

  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const Strategy> strategy, manager_->GetStrategy(dst));
  std::vector<v1::FetchRequest> fetches;
  for (int64_t r = 0; r < strategy->world_size(); ++r) {
    fetches.push_back(FetchFor(request, r, false));
  }
  CKPT_RETURN_IF_ERROR(ComputeTotals(e, fetches));

  // The upload runs in a manager of its own (same store, same chunking): its pending checkpoint
  // is private to this run, so a cancelled or failed run can discard it at once (the shared
  // manager would keep it, with its received ranks, until the idle timeout, and a retry would
  // find those ranks "already received"). A zero idle timeout makes ExpireIdleUploads discard
  // it as soon as no rank stream is open.
  ManagerOptions upload_options;
  upload_options.upload = options_.upload;
  upload_options.upload_idle_timeout = absl::ZeroDuration();
  CheckpointManager uploads(store_, upload_options);
  std::atomic<bool> begun{false};
  std::atomic<bool> committed{false};
  absl::Status status = ForEachInParallel(
      static_cast<size_t>(strategy->world_size()), options_.rank_workers,
      [&](size_t r, const std::atomic<bool>& stop) -> absl::Status {
        // A rank whose slices all replicate other ranks' is still fetched and sent in full:
        // RankUpload verifies replicas against the stored copy, which costs a read but no
        // write. Skipping such ranks would need an upload API that accepts "same as rank k".
        v1::UploadHeader header;
        header.set_checkpoint_id(new_id);
        header.set_source_strategy(dst);
        header.set_rank(static_cast<int64_t>(r));
        header.set_source_file(marker);
        CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RankUpload> upload, uploads.BeginUpload(header));
        begun = true;
        UploadSink sink(upload.get());
        CKPT_RETURN_IF_ERROR(Pump(e, fetches[r], &sink, &stop));
        // The Finish of whichever rank completes last commits, making the output visible.
        CKPT_RETURN_IF_ERROR(Check(e));
        CKPT_RETURN_IF_ERROR(CheckStop(&stop));
        CKPT_ASSIGN_OR_RETURN(v1::UploadResponse response, upload->Finish());
        if (response.committed()) committed = true;
        Update(e, Change::kProgress, [](v1::Job* j) {
          j->mutable_progress()->set_ranks_done(j->progress().ranks_done() + 1);
        });
        return absl::OkStatus();
      });
  if (status.ok() && !committed) {
    status = absl::InternalError(
        absl::StrCat("checkpoint ", new_id, " was not committed after its last rank"));
  }
  if (!status.ok() && begun) {
    // Drops the pending checkpoint and its chunks. Retried briefly because the idle check is
    // strict (last activity < now) and a clock read may coincide with the last activity.
    for (int i = 0; i < 100 && uploads.ExpireIdleUploads() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return status;
}

absl::Status JobRunner::RunExport(Entry* e, const v1::SubmitTransformRequest& request,
                                  int32_t attempt) {
  const v1::TransformTarget& target = request.target();
  const std::string dir = OutputPath(target);
  const std::string partial = PartialPath(dir, request.job_id());
  const std::string prefix = PrefixOf(target);
  RemoveTree(partial);  // a clean point, whatever an earlier attempt left

  std::vector<int64_t> ranks(target.ranks().begin(), target.ranks().end());
  if (ranks.empty()) {
    CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const Strategy> s,
                          manager_->GetStrategy(request.destination_strategy()));
    for (int64_t r = 0; r < s->world_size(); ++r) ranks.push_back(r);
  }
  std::sort(ranks.begin(), ranks.end());

  struct stat st;
  if (Exists(dir, &st)) {
    // DIR was absent or empty at submission, and only the final rename fills it: if an earlier
    // attempt got that far (and the process died before recording SUCCEEDED), it is complete.
    const bool complete =
        attempt > 1 && std::all_of(ranks.begin(), ranks.end(), [&](int64_t r) {
          struct stat f;
          return ::stat(RankFile(dir, prefix, r).c_str(), &f) == 0 && S_ISREG(f.st_mode);
        });
    if (complete) {
      Logger()->info("event=job_output_present job={} dir={}", request.job_id(), dir);
      return absl::OkStatus();
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("export directory ", dir, " exists and is not a directory"));
    }
    CKPT_ASSIGN_OR_RETURN(bool empty, IsEmptyDir(dir));
    if (!empty) {
      return absl::FailedPreconditionError(
          absl::StrCat("export directory ", dir, " exists and is not empty"));
    }
  }

  std::vector<v1::FetchRequest> fetches;
  for (int64_t r : ranks) fetches.push_back(FetchFor(request, r, false));
  CKPT_RETURN_IF_ERROR(ComputeTotals(e, fetches));

  const absl::Status status = [&]() -> absl::Status {
    CKPT_RETURN_IF_ERROR(MakeDir(partial));
    CKPT_RETURN_IF_ERROR(ForEachInParallel(
        ranks.size(), options_.rank_workers,
        [&](size_t i, const std::atomic<bool>& stop) -> absl::Status {
          const int64_t r = ranks[i];
          CKPT_RETURN_IF_ERROR(MakeDir(absl::StrCat(partial, "/rank_", r)));
          CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> file,
                                AtomicFileSink::Create(RankFile(partial, prefix, r)));
          CkptFileSink sink(file.get());
          CKPT_RETURN_IF_ERROR(Pump(e, fetches[i], &sink, &stop));
          CKPT_RETURN_IF_ERROR(sink.Finish());
          CKPT_RETURN_IF_ERROR(file->Commit());
          Update(e, Change::kProgress, [](v1::Job* j) {
            j->mutable_progress()->set_ranks_done(j->progress().ranks_done() + 1);
          });
          return absl::OkStatus();
        }));
    CKPT_RETURN_IF_ERROR(SyncDirectory(partial));  // the rank_<r> entries
    CKPT_RETURN_IF_ERROR(Check(e));
    // rename(2) replaces an empty directory atomically and refuses a non-empty one, which is
    // exactly the submission rule.
    if (::rename(partial.c_str(), dir.c_str()) != 0) return ErrnoToStatus(errno, "rename", dir);
    return SyncDirectory(ParentOf(dir));
  }();
  if (!status.ok()) RemoveTree(partial);
  return status;
}

absl::Status JobRunner::RunMerged(Entry* e, const v1::SubmitTransformRequest& request,
                                  int32_t attempt) {
  const std::string path = OutputPath(request.target());
  const std::string partial = PartialPath(path, request.job_id());
  RemoveTree(partial);
  if (Exists(path)) {
    // Absent at submission and written only by the final rename (see RunExport).
    struct stat st;
    if (attempt > 1 && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      Logger()->info("event=job_output_present job={} file={}", request.job_id(), path);
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(path, " already exists"));
  }
  const std::vector<v1::FetchRequest> fetches = {FetchFor(request, 0, true)};
  CKPT_RETURN_IF_ERROR(ComputeTotals(e, fetches));
  const absl::Status status = [&]() -> absl::Status {
    // The file is assembled inside a job-specific directory, so that whatever a crash leaves
    // behind (AtomicFileSink's randomly named temporary included) is found and removed by name.
    CKPT_RETURN_IF_ERROR(MakeDir(partial));
    const std::string staged = absl::StrCat(partial, "/", BaseNameOf(path));
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> file, AtomicFileSink::Create(staged));
    CkptFileSink sink(file.get());
    CKPT_RETURN_IF_ERROR(Pump(e, fetches[0], &sink));
    CKPT_RETURN_IF_ERROR(sink.Finish());
    CKPT_RETURN_IF_ERROR(file->Commit());
    Update(e, Change::kProgress,
           [](v1::Job* j) { j->mutable_progress()->set_ranks_done(1); });
    CKPT_RETURN_IF_ERROR(Check(e));
    CKPT_RETURN_IF_ERROR(RenameNoReplace(staged, path));
    return SyncDirectory(ParentOf(path));
  }();
  RemoveTree(partial);  // empty after success
  return status;
}

}  // namespace ckpt
