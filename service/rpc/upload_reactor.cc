// The Upload RPC: one source rank's stream of raw (grpc::ByteBuffer) UploadRequest messages fed
// into a RankUpload.
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "service/engine/upload_session.h"
#include "service/engine/upload_wire.h"
#include "service/rpc/checkpoint_service.h"
#include "service/rpc/grpc_status.h"
#include "service/rpc/wire_format.h"

namespace ckpt {
namespace {

// Bytes of a gathered upload message (UploadReactor::Handle) kept per thread for the next one:
// more than a batch message, which clients keep to a data message's size (a few MiB).
constexpr size_t kKeptGatherBytes = size_t{8} << 20;

// Reads one rank's stream. Messages are handled in order on the executor, one task at a time;
// the next read starts as soon as a message is taken off the wire, so that it arrives while the
// one before is handled, and stops while kMaxWaiting messages wait: backpressure towards the
// client, with at most kMaxWaiting + 1 messages of a stream in memory. Deleted by gRPC in OnDone.
//
// Threads: OnReadDone runs on gRPC's threads and the handler (Drain) on the executor's; mu_
// guards the queue and the flags between them. Only Drain calls Finish (through Done) and
// OnReadDone never touches the upload, so a call is finished by one thread; a read that
// OnReadDone decided to start is started before the call is finished (starting_read_: Done
// leaves the Finish to OnReadDone, deferred_finish_).
class UploadReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `lease` holds the principal's upload slot until the call finishes; `principal` is audited
  // with the outcome.
  UploadReactor(CheckpointServiceImpl* service, grpc::CallbackServerContext* ctx,
                grpc::ByteBuffer* response, Principal principal, LimitLease lease)
      : service_(service),
        ctx_(ctx),
        response_(response),
        start_(absl::Now()),
        principal_(std::move(principal)),
        lease_(std::move(lease)) {
    service_->UploadStarted();
    if (service_->shutting_down()) {
      Done(ShuttingDownError());
      return;
    }
    reading_ = true;
    StartRead(&incoming_);
  }

  void OnReadDone(bool ok) override {
    bool read_next = false;
    bool submit = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_ = false;
      if (finished_) return;  // the call is finished: nothing more is read or handled
      if (ok) {
        waiting_.push_back(std::move(incoming_));
        incoming_ = grpc::ByteBuffer();
        read_next = waiting_.size() < kMaxWaiting;
      } else {
        ended_ = true;  // half-close by the client, or cancellation
      }
      reading_ = read_next;
      starting_read_ = read_next;
      submit = !draining_;
      draining_ = true;
    }
    if (read_next) {
      StartRead(&incoming_);
      std::optional<absl::Status> finish;
      {
        std::lock_guard<std::mutex> lock(mu_);
        starting_read_ = false;
        finish.swap(deferred_finish_);
      }
      // Drain ended the call while this read was being started: its status goes out now.
      if (finish) Finish(ToGrpcStatus(*finish));
    }
    if (submit) service_->executor()->Submit([this] { Drain(); });
  }

  void OnDone() override {
    service_->UploadEnded();
    delete this;
  }

 private:
  // Messages of one stream read ahead of the one being handled, at most.
  static constexpr size_t kMaxWaiting = 2;

  // The handler: the waiting messages in order, then Complete once the client half-closed.
  void Drain() {
    while (true) {
      bool read_next = false;
      bool complete = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (waiting_.empty()) {
          if (!ended_) {
            draining_ = false;  // the next OnReadDone submits a new task
            return;
          }
          complete = true;
        } else {
          message_ = std::move(waiting_.front());
          waiting_.pop_front();
          // Reads stopped while the queue was full: this one resumes them.
          read_next = !reading_ && !ended_;
          reading_ = reading_ || read_next;
        }
      }
      if (complete) {
        Complete();  // finishes the call: nothing may touch `this` afterwards
        return;
      }
      if (read_next) StartRead(&incoming_);
      const absl::Status s = Handle();
      message_.Clear();  // the message's bytes are chunked or copied by now
      slices_.clear();
      data_.clear();
      views_.data = {};
      views_.tensors.clear();
      batch_.clear();
      if (!s.ok()) {
        upload_.reset();  // undoes this rank's contributions
        Done(s);
        return;
      }
    }
  }

  absl::Status Handle() {
    // A data message (the bulk of a large tensor's bytes) is read in place from its slices.
    if (UploadDataViews(message_, &slices_, &data_)) {
      size_t size = 0;
      for (std::string_view d : data_) size += d.size();
      CKPT_RETURN_IF_ERROR(CheckData(size));
      for (std::string_view d : data_) CKPT_RETURN_IF_ERROR(upload_->Append(d));
      service_->CountUploadBytes(static_cast<int64_t>(size));
      return absl::OkStatus();
    }
    // Any other message in one piece (a batch is at most a data message's size), walked whole
    // before any of it is used.
    std::string_view message;
    // A message in several slices is gathered here, into memory kept per thread from message to
    // message: a batch of small tensors arrives in several slices, and a new buffer for each
    // (grpc::ByteBuffer's DumpToSingleSlice) would be fresh memory to fault in for every batch.
    // Nothing of the message is used after Handle returns (a batch's bytes are copied into
    // chunks); a message larger than a batch (up to the server's receive limit) is not kept.
    thread_local std::string gathered;
    absl::Cleanup drop_large = [] {
      if (gathered.capacity() > kKeptGatherBytes) std::string().swap(gathered);
    };
    if (slices_.size() == 1) {
      message =
          std::string_view(reinterpret_cast<const char*>(slices_[0].begin()), slices_[0].size());
    } else if (slices_.size() > 1) {
      gathered.clear();
      for (const grpc::Slice& slice : slices_) {
        gathered.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
      }
      message = gathered;
    }
    CKPT_ASSIGN_OR_RETURN(const UploadWireKind kind, ReadUploadMessage(message, &views_));
    if (kind == UploadWireKind::kBatch) return HandleBatchViews();
    v1::UploadRequest request;
    if (!request.ParseFromArray(message.data(), static_cast<int>(message.size()))) {
      return absl::InvalidArgumentError("malformed upload message (not a ckpt.v1.UploadRequest)");
    }
    switch (request.kind_case()) {
      case v1::UploadRequest::kHeader: {
        if (upload_) return absl::InvalidArgumentError("a second upload header in one stream");
        header_ = request.header();
        auto u = service_->manager()->BeginUpload(header_);
        if (!u.ok()) return u.status();
        upload_ = std::move(*u);
        return absl::OkStatus();
      }
      case v1::UploadRequest::kTensor:
        if (!upload_) return absl::InvalidArgumentError("the first message must be the header");
        return upload_->StartTensor(request.tensor());
      case v1::UploadRequest::kBatch: {
        const v1::UploadTensorBatch& batch = request.batch();
        batch_.clear();
        for (const v1::UploadTensor& t : batch.tensors()) batch_.push_back({&t.header(), t.data()});
        return HandleBatch();
      }
      case v1::UploadRequest::kData:
        CKPT_RETURN_IF_ERROR(CheckData(request.data().size()));
        CKPT_RETURN_IF_ERROR(upload_->Append(request.data()));
        service_->CountUploadBytes(static_cast<int64_t>(request.data().size()));
        return absl::OkStatus();
      case v1::UploadRequest::KIND_NOT_SET:
        return absl::InvalidArgumentError("empty upload message");
    }
    return absl::InvalidArgumentError("unknown upload message");
  }

  // The tensors ReadUploadMessage found in a batch: every header is parsed (into headers_, whose
  // messages are reused from batch to batch) before any tensor is started, as protobuf's parser
  // refuses a malformed message before anything of it is used.
  absl::Status HandleBatchViews() {
    const size_t n = views_.tensors.size();
    if (headers_.size() < n) headers_.resize(n);
    batch_.clear();
    for (size_t i = 0; i < n; ++i) {
      const std::string_view h = views_.tensors[i].header;
      if (!headers_[i].ParseFromArray(h.data(), static_cast<int>(h.size()))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "malformed upload message (not a ckpt.v1.UploadRequest): the header of tensor ", i,
            " of the batch is not a ckpt.v1.UploadTensorHeader"));
      }
      batch_.push_back({&headers_[i], views_.tensors[i].data});
    }
    return HandleBatch();
  }

  // The tensors of batch_, each whole; the batch's bytes count as one data message's.
  absl::Status HandleBatch() {
    size_t size = 0;
    for (const BatchTensor& t : batch_) size += t.data.size();
    CKPT_RETURN_IF_ERROR(CheckData(size));
    // On an error the caller drops the upload, and with it what the batch collected.
    CKPT_RETURN_IF_ERROR(upload_->AddBatch(batch_));
    service_->CountUploadBytes(static_cast<int64_t>(size));
    return absl::OkStatus();
  }

  // A data message of `size` bytes may come now.
  absl::Status CheckData(size_t size) const {
    if (!upload_) return absl::InvalidArgumentError("the first message must be the header");
    if (static_cast<int64_t>(size) > service_->options().max_upload_message_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("data message of ", size, " bytes exceeds ",
                                                     service_->options().max_upload_message_bytes));
    }
    return absl::OkStatus();
  }

  void Complete() {
    if (ctx_->IsCancelled()) {
      upload_.reset();
      Done(absl::CancelledError("upload cancelled by the client"));
      return;
    }
    if (!upload_) {
      Done(absl::InvalidArgumentError("upload stream ended before its header"));
      return;
    }
    auto r = upload_->Finish();
    if (!r.ok()) {
      upload_.reset();
      Done(r.status());
      return;
    }
    if (r->committed()) service_->manager()->OnUploadFinished(header_.checkpoint_id());
    bool own_buffer = false;
    if (!grpc::SerializationTraits<v1::UploadResponse>::Serialize(*r, response_, &own_buffer)
             .ok()) {
      Done(absl::InternalError("cannot serialise the upload response"));
      return;
    }
    Done(absl::OkStatus(), r->committed());
  }

  // Logs and finishes; nothing may touch `this` afterwards (OnDone may run at once).
  void Done(const absl::Status& s, bool committed = false) {
    std::string detail =
        absl::StrCat("checkpoint=", header_.checkpoint_id(), " rank=", header_.rank());
    if (s.ok() && committed) detail += " committed=true";
    LogRpc("Upload", ctx_->peer(), s, upload_ ? upload_->bytes_received() : 0, absl::Now() - start_,
           detail);
    Audit(&principal_, FullMethodName("Upload"), ctx_->peer(),
          absl::StrCat("checkpoint=", header_.checkpoint_id(), " rank=", header_.rank()), s);
    // The slot is free before the client sees the status, so that its next upload may start.
    lease_ = LimitLease();
    service_->RpcFinished(s);
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      if (starting_read_) {  // OnReadDone finishes the call once its StartRead returned
        deferred_finish_ = s;
        return;
      }
    }
    Finish(ToGrpcStatus(s));
  }

  CheckpointServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const response_;  // an UploadResponse
  const absl::Time start_;
  std::mutex mu_;
  grpc::ByteBuffer incoming_;                    // the outstanding read's UploadRequest
  std::deque<grpc::ByteBuffer> waiting_;         // read, not yet handled; guarded by mu_
  bool reading_ = false;                         // a read is outstanding; guarded by mu_
  bool starting_read_ = false;                   // OnReadDone is starting one; guarded by mu_
  bool draining_ = false;                        // a Drain task is due or running; guarded by mu_
  bool ended_ = false;                           // the client half-closed; guarded by mu_
  bool finished_ = false;                        // Done was called; guarded by mu_
  std::optional<absl::Status> deferred_finish_;  // for OnReadDone to send; guarded by mu_
  grpc::ByteBuffer message_;  // the UploadRequest being handled (Drain's thread only)
  // The message being handled: its slices, views of a data message's bytes in them, and what
  // ReadUploadMessage read of it.
  std::vector<grpc::Slice> slices_;
  std::vector<std::string_view> data_;
  UploadMessageViews views_;
  std::vector<v1::UploadTensorHeader> headers_;  // parsed from views_.tensors, reused
  std::vector<BatchTensor> batch_;               // the batch's tensors, for RankUpload::AddBatch
  v1::UploadHeader header_;
  std::unique_ptr<RankUpload> upload_;
  const Principal principal_;
  LimitLease lease_;
};

}  // namespace

grpc::ServerReadReactor<grpc::ByteBuffer>* CheckpointServiceImpl::Upload(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) {
  absl::StatusOr<Principal> principal = auth().Authorize(*ctx, FullMethodName("Upload"));
  absl::StatusOr<LimitLease> lease =
      principal.ok() ? auth().Acquire(*principal, LimitKind::kUploads) : principal.status();
  if (!lease.ok()) {
    LogRpc("Upload", ctx->peer(), lease.status(), 0, absl::ZeroDuration());
    if (principal.ok())
      Audit(&*principal, FullMethodName("Upload"), ctx->peer(), "-", lease.status());
    return new RefusedReactor<grpc::ServerReadReactor<grpc::ByteBuffer>>(lease.status());
  }
  return new UploadReactor(this, ctx, resp, std::move(*principal), std::move(*lease));
}

}  // namespace ckpt
