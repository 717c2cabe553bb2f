// The WatchJob RPC: streams a job's states as the JobRunner reports them, newest first when the
// watcher is slower than the job.
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/engine/job_runner.h"
#include "service/rpc/checkpoint_service.h"
#include "service/rpc/grpc_status.h"

namespace ckpt {
namespace {

// The state of one WatchJob, shared by the reactor (gRPC events) and the JobRunner's watch
// callback (runner, job or RPC threads). One Job is written at a time; states arriving meanwhile
// collapse into the newest, so a slow watcher never holds up a job. Thread-safe (mu_).
// Lock order: the runner's per-watch lock (held while it calls OnJob), then mu_; the JobWatch
// is therefore only ever destroyed outside mu_.
class WatchCall : public std::enable_shared_from_this<WatchCall> {
 public:
  WatchCall(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx, std::string job_id,
            grpc::ServerWriteReactor<v1::Job>* reactor)
      : service_(service),
        peer_(ctx->peer()),
        job_id_(std::move(job_id)),
        start_(absl::Now()),
        reactor_(reactor) {}

  void Start() {
    auto self = shared_from_this();
    if (service_->shutting_down()) {
      std::lock_guard<std::mutex> lock(mu_);
      FinishLocked(ShuttingDownError());
      return;
    }
    std::weak_ptr<WatchCall> weak = self;
    // The current state arrives through OnJob before Watch returns.
    auto watch = service_->jobs()->Watch(job_id_, [weak](const v1::Job* job) {
      if (auto call = weak.lock()) call->OnJob(job);
    });
    std::unique_ptr<JobWatch> unused;
    std::lock_guard<std::mutex> lock(mu_);
    if (!watch.ok()) {
      FinishLocked(watch.status());
      return;
    }
    if (reactor_ == nullptr) {
      unused = std::move(*watch);  // already done; destroyed after unlocking (declared first)
    } else {
      watch_ = std::move(*watch);
    }
  }

  void OnWriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(absl::CancelledError("watcher gone"));
    } else if (JobRunner::IsTerminal(current_.state())) {
      FinishLocked(absl::OkStatus());  // the job ended: nothing more to say
    } else if (cancelled_) {
      FinishLocked(absl::CancelledError("watch cancelled by the client"));
    } else {
      MaybeWriteLocked();
      if (!writing_ && closing_) FinishLocked(ShuttingDownError());
    }
  }

  void OnCancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(absl::CancelledError("watch cancelled by the client"));
  }

  void OnDone() {
    std::unique_ptr<JobWatch> watch;  // destroyed after unlocking: see the lock order above
    std::lock_guard<std::mutex> lock(mu_);
    reactor_ = nullptr;
    watch = std::move(watch_);
  }

 private:
  // A new state, or null when the runner shuts down.
  void OnJob(const v1::Job* job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || reactor_ == nullptr) return;
    if (job == nullptr) {
      closing_ = true;
      if (!writing_) FinishLocked(ShuttingDownError());
      return;
    }
    pending_ = *job;
    has_pending_ = true;
    MaybeWriteLocked();
  }

  void MaybeWriteLocked() {
    if (writing_ || finished_ || !has_pending_ || reactor_ == nullptr) return;
    current_ = std::move(pending_);
    has_pending_ = false;
    writing_ = true;
    ++updates_;
    reactor_->StartWrite(&current_);
  }

  // Finishes exactly once; nothing may be in flight.
  void FinishLocked(const absl::Status& status) {
    if (finished_ || reactor_ == nullptr) return;
    finished_ = true;
    LogRpc("WatchJob", peer_, status, 0, absl::Now() - start_,
           absl::StrCat("job=", job_id_, " updates=", updates_));
    service_->RpcFinished(status);
    reactor_->Finish(ToGrpcStatus(status));
  }

  CheckpointServiceImpl* const service_;
  const std::string peer_;
  const std::string job_id_;
  const absl::Time start_;

  std::mutex mu_;
  grpc::ServerWriteReactor<v1::Job>* reactor_;  // null after OnDone
  std::unique_ptr<JobWatch> watch_;
  v1::Job current_;  // being written while writing_
  v1::Job pending_;  // newest unsent state when has_pending_
  bool has_pending_ = false;
  bool writing_ = false;
  bool cancelled_ = false;
  bool closing_ = false;  // the runner shut down: finish once the queue is written
  bool finished_ = false;
  int64_t updates_ = 0;
};

class WatchJobReactor final : public grpc::ServerWriteReactor<v1::Job> {
 public:
  WatchJobReactor(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
                  const v1::WatchJobRequest* request)
      : call_(std::make_shared<WatchCall>(service, ctx, request->job_id(), this)) {
    call_->Start();
  }
  void OnWriteDone(bool ok) override { call_->OnWriteDone(ok); }
  void OnCancel() override { call_->OnCancel(); }
  void OnDone() override {
    call_->OnDone();
    delete this;
  }

 private:
  std::shared_ptr<WatchCall> call_;
};

}  // namespace

grpc::ServerWriteReactor<v1::Job>* CheckpointServiceImpl::WatchJob(grpc::CallbackServerContext* ctx,
                                                                   const v1::WatchJobRequest* req) {
  absl::StatusOr<Principal> principal = auth().Authorize(*ctx, FullMethodName("WatchJob"));
  if (!principal.ok()) {
    LogRpc("WatchJob", ctx->peer(), principal.status(), 0, absl::ZeroDuration());
    return new RefusedReactor<grpc::ServerWriteReactor<v1::Job>>(principal.status());
  }
  return new WatchJobReactor(this, ctx, req);
}

}  // namespace ckpt
