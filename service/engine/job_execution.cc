// Running transform jobs: the worker threads, one run of a job from QUEUED to its end, and
// streaming a fetch into a job's output.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "service/engine/fetch_stream.h"
#include "service/engine/job_internal.h"
#include "service/engine/job_runner.h"
#include "spdlog/spdlog.h"
#include "storage/confined_dir.h"

namespace ckpt {

using job_internal::CheckStop;
using job_internal::kCancelledReason;
using job_internal::Logger;
using job_internal::OutputSpelling;
using job_internal::RemoveTreeQuietly;
using job_internal::StateName;
using job_internal::StatusText;
using job_internal::TargetText;

namespace job_internal {

void RemoveTreeQuietly(int dir_fd, const std::string& name, const std::string& display) {
  const absl::StatusOr<int64_t> removed = RemoveTreeAt(dir_fd, name, display);
  if (!removed.ok()) {
    Logger()->warn("event=job_cleanup path=\"{}\" error=\"{}\"", display,
                   std::string(removed.status().message()));
  } else if (*removed > 0) {
    Logger()->info("event=job_cleanup path=\"{}\" removed_entries={}", display, *removed);
  }
}

absl::Status CheckStop(const std::atomic<bool>* stop) {
  if (stop != nullptr && stop->load()) {
    return absl::AbortedError("stopped because another rank of this job failed");
  }
  return absl::OkStatus();
}

}  // namespace job_internal

namespace {

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

}  // namespace

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
      if (status.code() == absl::StatusCode::kDataLoss) {
        data_loss_failures_.fetch_add(1, std::memory_order_relaxed);
      }
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
  const auto level =
      final_state == v1::JOB_STATE_FAILED ? spdlog::level::warn : spdlog::level::info;
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
    // Only beneath the export root, as the job itself would write: a record this server's root
    // refuses never wrote anything through it.
    absl::StatusOr<ConfinedRoot::Location> out = OpenFileOutput(t);
    if (!out.ok()) {
      Logger()->info("event=job_cleanup job={} skipped=\"{}\"", job.id(),
                     std::string(out.status().message()));
      return;
    }
    RemoveTreeQuietly(out->parent.get(), PartialPath(out->name, job.id()),
                      PartialPath(OutputSpelling(t), job.id()));
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
          return absl::InternalError(
              absl::StrCat("fetch of tensor ", tensor, " ended ", remaining, " bytes early"));
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
      case v1::FetchResponse::kBatch:  // sent only to clients that accept batches
        return absl::InternalError("a tensor batch in an in-process fetch stream");
      case v1::FetchResponse::KIND_NOT_SET:
        return absl::InternalError("empty fetch message");
    }
  }
  if (remaining != 0) {
    return absl::InternalError(
        absl::StrCat("fetch of tensor ", tensor, " ended ", remaining, " bytes early"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
