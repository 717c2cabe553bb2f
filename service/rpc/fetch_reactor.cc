// The Fetch RPC: once admitted (FetchAdmission, --max-active-fetches; streams beyond it wait in
// arrival order), a producer on the executor fills a bounded queue of encoded messages from a
// FetchStream; gRPC writes drain it. The producer parks, without holding a thread, while the
// server budget has no room for its next message (granted in arrival order) or while its stream
// runs too far ahead of the other streams of its job (FetchStream::MayProceed). A stream whose
// client accepts nothing for ServiceOptions::fetch_stall_timeout is cancelled (StreamWatch), and
// a stream is logged with the status its client received: OK only once the final status went
// out.
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/engine/fetch_stream.h"
#include "service/rpc/checkpoint_service.h"
#include "service/rpc/grpc_status.h"
#include "service/rpc/wire_format.h"

namespace ckpt {
namespace {

bool ParseRequest(const grpc::ByteBuffer& buffer, v1::FetchRequest* request) {
  grpc::ByteBuffer copy(buffer);  // Deserialize consumes its buffer; slices are shared, not copied
  return grpc::SerializationTraits<v1::FetchRequest>::Deserialize(&copy, request).ok();
}

// The state of one Fetch, shared by the reactor (gRPC events), the producer task (executor) and
// the service's StreamWatch. The producer fills a bounded queue; writes drain it. At most one
// producer task runs at a time. A stop status (a stall, the end of a shutdown's drain) stops the
// producer, drops the queued messages and finishes the call with that status once the message
// being written is out.
class FetchCall : public std::enable_shared_from_this<FetchCall> {
 public:
  // `lease` holds the principal's fetch-stream slot; it is given back as the call finishes (before
  // the client can see the status, so that a client fetching one stream after another never finds
  // its own finished stream still counted).
  FetchCall(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
            const grpc::ByteBuffer& request, grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor,
            LimitLease lease)
      : lease_(std::move(lease)),
        service_(service),
        ctx_(ctx),
        peer_(ctx->peer()),
        request_ok_(ParseRequest(request, &request_)),
        reactor_(reactor),
        start_(absl::Now()) {
    service_->FetchStarted();
  }

  void Start() {
    if (service_->shutting_down() || !request_ok_) {
      std::lock_guard<std::mutex> lock(mu_);
      final_ = request_ok_ ? ShuttingDownError()
                           : absl::InvalidArgumentError("the FetchRequest could not be parsed");
      producer_done_ = true;
      MaybeFinishLocked();
      return;
    }
    std::weak_ptr<FetchCall> weak = shared_from_this();
    service_->stream_watch()->Add([weak](absl::Time now, bool ending) {
      std::shared_ptr<FetchCall> self = weak.lock();
      return self != nullptr && self->Watch(now, ending);
    });
    // Produces once admitted (FetchAdmission): at once while fewer than --max-active-fetches
    // streams produce, otherwise when the streams that came before have had their slots. Until
    // then nothing runs for the call, and it ends only if cancelled (its deadline too) or
    // stopped (a shutdown), leaving the queue (MaybeFinishLocked).
    const uint64_t ticket = service_->admission()->Enter([weak](FetchAdmission::Slot slot) {
      if (auto self = weak.lock()) self->Admitted(std::move(slot));
      // Otherwise the slot passes on as it is destroyed.
    });
    std::lock_guard<std::mutex> lock(mu_);
    ticket_ = ticket;
  }

  // StreamWatch: cancels the call when an operation (a write, or the final status) has been
  // pending for the stall timeout, and stops it when the server is ending its streams. Returns
  // false once the call is done.
  bool Watch(absl::Time now, bool ending) {
    int64_t released = 0;
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ == nullptr) return false;
      const absl::Duration timeout = service_->options().fetch_stall_timeout;
      if (timeout > absl::ZeroDuration() && !stalled_ && now - pending_since_ >= timeout) {
        stalled_ = true;
        cancel = true;
        stall_status_ = absl::DeadlineExceededError(absl::StrCat(
            "no progress for ", absl::FormatDuration(timeout), ": the client stopped reading"));
        if (!finished_) {
          if (stop_.ok()) stop_ = stall_status_;
          released = DropQueuedLocked();
        }
      } else if (ending && !finished_ && stop_.ok()) {
        stop_ = absl::UnavailableError("ckptd is shutting down; retry");
        released = DropQueuedLocked();
        MaybeFinishLocked();
      }
    }
    service_->budget()->Release(released);
    if (cancel) {
      // The pending write (or status) cannot leave while the client does not read: reset the
      // stream, so that gRPC completes the write (not ok) and frees what it holds.
      std::lock_guard<std::mutex> lock(ctx_mu_);
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    return true;
  }

  void OnWriteDone(bool ok) {
    int64_t released = 0;
    bool resume = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_since_ = absl::InfiniteFuture();
      if (ok) service_->CountFetchBytesSent(data_sizes_.front());
      data_sizes_.pop_front();
      released += sizes_.front();
      queued_bytes_ -= sizes_.front();
      queue_.pop_front();
      sizes_.pop_front();
      writing_ = false;
      if (!ok) {
        cancelled_ = true;
        for (int64_t s : sizes_) released += s;
        queue_.clear();
        sizes_.clear();
        data_sizes_.clear();
        queued_bytes_ = 0;
      } else if (!queue_.empty() && stop_.ok()) {
        writing_ = true;
        pending_since_ = absl::Now();
        reactor_->StartWrite(&queue_.front());
      }
      // The paused producer resumes once the queue is down to half its limit, and then fills it
      // again: each producer task produces many messages, rather than one task per message as
      // resuming at every write below the limit would, which costs CPU when many streams are
      // open.
      if (!running_ && !producer_done_ && !cancelled_ && stop_.ok() && !pace_waiting_ &&
          !budget_waiting_ && queued_bytes_ <= service_->FetchQueueLimit() / 2) {
        running_ = true;
        resume = true;
      }
      MaybeFinishLocked();
    }
    service_->budget()->Release(released);
    if (resume) {
      auto self = shared_from_this();
      service_->executor()->Submit([self] { self->Produce(); });
    }
  }

  void OnCancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    MaybeFinishLocked();
  }

  // Logs the call with the status its client received: OK only when gRPC delivered the final
  // status (the context is not cancelled); a call that ended before is logged with why.
  void OnDone() {
    service_->FetchEnded();
    const bool undelivered = ctx_->IsCancelled();
    {
      std::lock_guard<std::mutex> lock(ctx_mu_);
      ctx_ = nullptr;
    }
    int64_t released = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      absl::Status logged = status_;
      if (undelivered && logged.ok()) {
        logged = stalled_ ? stall_status_
                          : absl::CancelledError(
                                "the client did not receive the whole stream (it cancelled, its "
                                "deadline passed, or the connection closed)");
      }
      LogRpc("Fetch", peer_, logged, bytes_, absl::Now() - start_,
             absl::StrCat("checkpoint=", request_.checkpoint_id(), " target=",
                          request_.merged() ? std::string("merged")
                                            : absl::StrCat(request_.destination_strategy(), "/",
                                                           request_.rank())));
      reactor_ = nullptr;
      released += std::exchange(reserved_bytes_, 0);
      for (int64_t s : sizes_) released += s;
      queue_.clear();
      sizes_.clear();
      data_sizes_.clear();
    }
    service_->budget()->Release(released);
  }

 private:
  // The stream has its admission slot (called once, on the thread that freed it or in Start).
  void Admitted(FetchAdmission::Slot slot) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || reactor_ == nullptr || cancelled_ || !stop_.ok()) return;  // slot freed
      slot_ = std::move(slot);
      admitted_ = true;
      running_ = true;
    }
    auto self = shared_from_this();
    service_->executor()->Submit([self] { self->Produce(); });
  }

  // The cohort's slower members caught up (FetchStream::MayProceed): produce again.
  void PaceReady() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!pace_waiting_) {
        pace_ready_ = true;  // the producer has not parked yet: it finds this
        return;
      }
      pace_waiting_ = false;
      if (producer_done_ || cancelled_ || !stop_.ok() || reactor_ == nullptr) {
        MaybeFinishLocked();
        return;
      }
      running_ = true;
    }
    auto self = shared_from_this();
    service_->executor()->Submit([self] { self->Produce(); });
  }

  // The server budget granted the `n` bytes of the next message (ByteBudget::AcquireOrWait):
  // they are the producer's (reserved_bytes_) until it queues the message, or returned.
  void Granted(int64_t n) {
    bool submit = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      budget_waiting_ = false;
      if (!producer_done_ && !cancelled_ && stop_.ok() && reactor_ != nullptr) {
        reserved_bytes_ = n;
        n = 0;
        if (!running_) {  // else the producer has not parked yet, and finds the bytes
          running_ = true;
          submit = true;
        }
      } else {
        MaybeFinishLocked();
      }
    }
    if (n > 0) service_->budget()->Release(n);  // not wanted any more
    if (submit) {
      auto self = shared_from_this();
      service_->executor()->Submit([self] { self->Produce(); });
    }
  }

  // Runs on the executor: produces messages until the stream's queue is full, the server budget
  // is exhausted, the stream runs too far ahead of its cohort, or the stream ends.
  void Produce() {
    if (!stream_) {
      auto s = service_->manager()->OpenFetch(request_);
      if (!s.ok()) {
        EndProducer(s.status());
        return;
      }
      stream_ = std::move(*s);
    }
    while (true) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (cancelled_ || !stop_.ok() || reactor_ == nullptr) {
          running_ = false;
          MaybeFinishLocked();
          return;
        }
        if (queued_bytes_ >= service_->FetchQueueLimit()) {
          running_ = false;  // OnWriteDone resumes us
          return;
        }
      }
      if (!has_next_) {
        std::weak_ptr<FetchCall> weak = shared_from_this();
        if (!stream_->MayProceed([weak] {
              if (auto self = weak.lock()) self->PaceReady();
            })) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!pace_ready_) {
            pace_waiting_ = true;  // PaceReady resumes us
            running_ = false;
            MaybeFinishLocked();
            return;
          }
          pace_ready_ = false;  // woken already: go on
        }
        auto more = stream_->NextPiece(&piece_, FetchReader::kClient);
        if (!more.ok()) {
          EndProducer(more.status());
          return;
        }
        if (!*more) {
          EndProducer(absl::OkStatus());
          return;
        }
        has_next_ = true;
        next_data_ = piece_.data_bytes;
        next_ = EncodeFetchResponse(&piece_);  // piece_ keeps its storage
        next_size_ = static_cast<int64_t>(next_.Length());
      }
      int64_t reserved;
      {
        std::lock_guard<std::mutex> lock(mu_);
        reserved = std::exchange(reserved_bytes_, 0);
        if (reserved == 0) budget_waiting_ = true;
      }
      if (reserved == 0) {
        std::weak_ptr<FetchCall> weak = shared_from_this();
        const int64_t n = next_size_;
        ByteBudget* budget = service_->budget();
        if (!budget->AcquireOrWait(n, [weak, n, budget] {
              if (auto self = weak.lock()) {
                self->Granted(n);
              } else {
                budget->Release(n);
              }
            })) {
          // Server-wide budget exhausted: Granted resumes us with the bytes, in our turn. If it
          // ran already (on another thread), its bytes are in reserved_bytes_ (or were returned
          // because the call ended): the loop goes on from the top.
          std::lock_guard<std::mutex> lock(mu_);
          if (budget_waiting_) {
            running_ = false;
            return;
          }
          continue;
        }
        std::lock_guard<std::mutex> lock(mu_);
        budget_waiting_ = false;
      }
      std::lock_guard<std::mutex> lock(mu_);
      if (reactor_ == nullptr || cancelled_ || !stop_.ok()) {
        service_->budget()->Release(next_size_);
        has_next_ = false;
        continue;
      }
      bytes_ += next_data_;
      queue_.push_back(std::move(next_));
      next_.Clear();
      sizes_.push_back(next_size_);
      data_sizes_.push_back(next_data_);
      queued_bytes_ += next_size_;
      has_next_ = false;
      if (!writing_) {
        // The writer is idle: restart it on another executor thread rather than here. gRPC
        // sends a message inline in StartWrite, and the next writes start from OnWriteDone where
        // the previous one completed; started from the producer, every byte would be read,
        // assembled and sent by this one thread while the other core idles.
        writing_ = true;
        auto self = shared_from_this();
        service_->executor()->Submit([self] { self->StartWriting(); });
      }
    }
  }

  // Runs on the executor: writes the front of the queue (Produce set writing_ for this).
  void StartWriting() {
    std::lock_guard<std::mutex> lock(mu_);
    if (reactor_ == nullptr || cancelled_ || !stop_.ok() || queue_.empty()) {
      writing_ = false;
      MaybeFinishLocked();
      return;
    }
    pending_since_ = absl::Now();
    reactor_->StartWrite(&queue_.front());
  }

  void EndProducer(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    final_ = status;
    producer_done_ = true;
    running_ = false;
    MaybeFinishLocked();
  }

  // Drops the queued messages but the one being written; returns their budget bytes for the
  // caller to release (outside mu_).
  int64_t DropQueuedLocked() {
    int64_t released = 0;
    const size_t keep = writing_ ? 1 : 0;
    while (queue_.size() > keep) {
      released += sizes_.back();
      queued_bytes_ -= sizes_.back();
      queue_.pop_back();
      sizes_.pop_back();
      data_sizes_.pop_back();
    }
    return released;
  }

  // Finishes exactly once, when nothing is being written and either everything was produced,
  // the call was stopped (stop_) or it was cancelled. OnDone logs the outcome.
  void MaybeFinishLocked() {
    if (finished_ || reactor_ == nullptr || writing_ || running_) return;
    absl::Status status;
    if (!stop_.ok()) {
      status = stop_;
    } else if (cancelled_) {
      status = absl::CancelledError("fetch cancelled (client gone or deadline exceeded)");
    } else if (producer_done_ && queue_.empty()) {
      status = final_;
    } else {
      return;
    }
    finished_ = true;
    status_ = status;
    lease_ = LimitLease();
    // The admission slot goes to the next waiting stream, on an executor thread (that stream's
    // Admitted takes its own lock, never while this one is held); a stream still waiting for a
    // slot leaves the queue.
    if (slot_) {
      service_->executor()->Submit(
          [slot = std::make_shared<FetchAdmission::Slot>(std::move(slot_))] {});
    } else if (ticket_ != 0 && !admitted_) {
      service_->admission()->Withdraw(ticket_);
    }
    service_->RpcFinished(status);
    pending_since_ = absl::Now();  // the status waits for the client like a write
    reactor_->Finish(ToGrpcStatus(status));
  }

  LimitLease lease_;  // guarded by mu_
  CheckpointServiceImpl* const service_;
  std::mutex ctx_mu_;                 // never held together with mu_
  grpc::CallbackServerContext* ctx_;  // guarded by ctx_mu_; null after OnDone
  const std::string peer_;
  v1::FetchRequest request_;
  const bool request_ok_;
  std::unique_ptr<FetchStream> stream_;  // producer only
  FetchPiece piece_;                     // producer only: reused from message to message
  grpc::ByteBuffer next_;                // producer only: the encoded piece_
  bool has_next_ = false;                // producer only
  int64_t next_size_ = 0;                // producer only: encoded bytes
  int64_t next_data_ = 0;                // producer only: tensor bytes in it

  std::mutex mu_;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* reactor_;  // null after OnDone
  std::deque<grpc::ByteBuffer> queue_;                   // front is being written while writing_
  std::deque<int64_t> sizes_;                            // encoded bytes of each queued message
  std::deque<int64_t> data_sizes_;                       // tensor bytes of each queued message
  int64_t queued_bytes_ = 0;
  int64_t bytes_ = 0;
  bool writing_ = false;
  bool running_ = false;  // a producer task is submitted or runs
  // Admission: the ticket of Enter, and the slot once admitted (until the call finishes).
  uint64_t ticket_ = 0;
  bool admitted_ = false;
  FetchAdmission::Slot slot_;
  bool pace_waiting_ = false;    // parked until PaceReady (the cohort's slower members)
  bool pace_ready_ = false;      // PaceReady ran before the producer parked
  bool budget_waiting_ = false;  // queued in the server budget until Granted
  int64_t reserved_bytes_ = 0;   // granted by the budget for the next message, not queued yet
  bool producer_done_ = false;
  bool cancelled_ = false;
  bool finished_ = false;
  absl::Status final_;
  absl::Status stop_;                                  // non-OK: stop producing and finish with it
  absl::Status status_;                                // the status given to Finish
  bool stalled_ = false;                               // cancelled by Watch for want of progress
  absl::Status stall_status_;                          // why, when stalled_
  absl::Time pending_since_ = absl::InfiniteFuture();  // a write or the status is pending since
  const absl::Time start_;
};

class FetchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  FetchReactor(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
               const grpc::ByteBuffer* request, LimitLease lease)
      : call_(std::make_shared<FetchCall>(service, ctx, *request, this, std::move(lease))) {
    call_->Start();
  }
  void OnWriteDone(bool ok) override { call_->OnWriteDone(ok); }
  void OnCancel() override { call_->OnCancel(); }
  void OnDone() override {
    call_->OnDone();
    delete this;
  }

 private:
  std::shared_ptr<FetchCall> call_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* CheckpointServiceImpl::Fetch(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  // Authorized, and within the principal's stream limit, before the request is even parsed.
  absl::StatusOr<Principal> principal = auth().Authorize(*ctx, FullMethodName("Fetch"));
  absl::StatusOr<LimitLease> lease =
      principal.ok() ? auth().Acquire(*principal, LimitKind::kFetchStreams) : principal.status();
  if (!lease.ok()) {
    LogRpc("Fetch", ctx->peer(), lease.status(), 0, absl::ZeroDuration());
    if (principal.ok())
      Audit(&*principal, FullMethodName("Fetch"), ctx->peer(), "-", lease.status());
    return new RefusedReactor<grpc::ServerWriteReactor<grpc::ByteBuffer>>(lease.status());
  }
  return new FetchReactor(this, ctx, req, std::move(*lease));
}

}  // namespace ckpt
