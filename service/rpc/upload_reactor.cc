// The Upload RPC: one source rank's stream of raw (grpc::ByteBuffer) UploadRequest messages fed
// into a RankUpload.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "service/engine/upload_session.h"
#include "service/rpc/checkpoint_service.h"
#include "service/rpc/grpc_status.h"
#include "service/rpc/wire_format.h"

namespace ckpt {
namespace {

// One varint at the front of `in` (consumed); false when `in` does not start with one.
bool ReadVarint(std::string_view& in, uint64_t* value) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64 && !in.empty(); shift += 7) {
    const auto b = static_cast<uint8_t>(in.front());
    in.remove_prefix(1);
    v |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) {
      *value = v;
      return true;
    }
  }
  return false;
}

// One length-delimited field at the front of `in` (consumed): its field number and bytes; false
// when `in` does not start with one.
bool ReadLengthDelimited(std::string_view& in, uint64_t* field, std::string_view* bytes) {
  uint64_t tag = 0;
  uint64_t length = 0;
  if (!ReadVarint(in, &tag) || (tag & 7) != 2 || !ReadVarint(in, &length) ||
      length > in.size()) {
    return false;
  }
  *field = tag >> 3;
  *bytes = in.substr(0, static_cast<size_t>(length));
  in.remove_prefix(static_cast<size_t>(length));
  return true;
}

// One tensor of a batch as views of the message's bytes: its UploadTensorHeader's wire form and
// its data.
struct BatchEntry {
  std::string_view header;
  std::string_view data;
};

// When `message` is exactly UploadRequest{batch = UploadTensorBatch{tensors...}} with every
// UploadTensor holding at most one header and at most one data field and nothing else, its
// tensors as views (no copy, no message objects: a batch carries thousands of small tensors, and
// parsing it into messages costs allocations per tensor). False for any other form, which the
// generic parse then handles with protobuf's full semantics (repeated fields merged, unknown
// fields skipped).
bool PlainBatchViews(std::string_view message, std::vector<BatchEntry>* out) {
  out->clear();
  uint64_t field = 0;
  std::string_view batch;
  if (!ReadLengthDelimited(message, &field, &batch) || field != 4 || !message.empty()) {
    return false;
  }
  while (!batch.empty()) {
    std::string_view tensor;
    if (!ReadLengthDelimited(batch, &field, &tensor) || field != 1) return false;
    BatchEntry entry;
    bool header = false;
    bool data = false;
    while (!tensor.empty()) {
      std::string_view bytes;
      if (!ReadLengthDelimited(tensor, &field, &bytes)) return false;
      if (field == 1 && !header) {
        entry.header = bytes;
        header = true;
      } else if (field == 2 && !data) {
        entry.data = bytes;
        data = true;
      } else {
        return false;
      }
    }
    out->push_back(entry);
  }
  return true;
}

// Reads one rank's stream. Each message is handled on the executor, and the next read starts
// only after it was handled: backpressure towards the client. Deleted by gRPC in OnDone.
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
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // half-close by the client, or cancellation
      service_->executor()->Submit([this] { Complete(); });
      return;
    }
    service_->executor()->Submit([this] {
      const absl::Status s = Handle();
      request_.Clear();  // the message's bytes are chunked or copied by now
      slices_.clear();
      data_.clear();
      single_ = grpc::Slice();
      if (!s.ok()) {
        upload_.reset();  // undoes this rank's contributions
        Done(s);
        return;
      }
      StartRead(&request_);
    });
  }

  void OnDone() override {
    service_->UploadEnded();
    delete this;
  }

 private:
  absl::Status Handle() {
    if (UploadDataViews(request_, &slices_, &data_)) {
      size_t size = 0;
      for (std::string_view d : data_) size += d.size();
      CKPT_RETURN_IF_ERROR(CheckData(size));
      for (std::string_view d : data_) CKPT_RETURN_IF_ERROR(upload_->Append(d));
      service_->CountUploadBytes(static_cast<int64_t>(size));
      return absl::OkStatus();
    }
    // A batch of small tensors, read in place.
    if (request_.Length() > 0 && request_.DumpToSingleSlice(&single_).ok() &&
        PlainBatchViews(std::string_view(reinterpret_cast<const char*>(single_.begin()),
                                         single_.size()),
                        &entries_)) {
      return HandleBatchViews();
    }
    v1::UploadRequest request;
    if (!grpc::SerializationTraits<v1::UploadRequest>::Deserialize(&request_, &request).ok()) {
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
      case v1::UploadRequest::kBatch:
        return HandleBatch(request.batch());
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

  // Every tensor of the batch, each whole; the batch's bytes count as one data message's.
  absl::Status HandleBatch(const v1::UploadTensorBatch& batch) {
    return HandleTensors(
        batch.tensors_size(), [&](int i) -> const v1::UploadTensorHeader& {
          return batch.tensors(i).header();
        },
        [&](int i) -> std::string_view { return batch.tensors(i).data(); });
  }

  // HandleBatch for the tensors PlainBatchViews found in single_: every header is parsed (into
  // headers_, whose messages are reused from batch to batch) before any tensor is started, as
  // the generic parse refuses a malformed message before anything of it is used.
  absl::Status HandleBatchViews() {
    const int n = static_cast<int>(entries_.size());
    if (static_cast<int>(headers_.size()) < n) headers_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      const std::string_view h = entries_[static_cast<size_t>(i)].header;
      if (!headers_[static_cast<size_t>(i)].ParseFromArray(h.data(), static_cast<int>(h.size()))) {
        return absl::InvalidArgumentError(
            "malformed upload message (not a ckpt.v1.UploadRequest)");
      }
    }
    return HandleTensors(
        n, [&](int i) -> const v1::UploadTensorHeader& { return headers_[static_cast<size_t>(i)]; },
        [&](int i) { return entries_[static_cast<size_t>(i)].data; });
  }

  // The tensors of a batch: header(i) and data(i) for i in [0, n).
  template <typename HeaderFn, typename DataFn>
  absl::Status HandleTensors(int n, HeaderFn header, DataFn data) {
    size_t size = 0;
    for (int i = 0; i < n; ++i) size += data(i).size();
    CKPT_RETURN_IF_ERROR(CheckData(size));
    if (upload_->tensor_open()) {
      return absl::InvalidArgumentError(
          "a tensor batch came while a tensor's bytes were still due");
    }
    // On an error the caller drops the upload, and with it what the batch collected.
    upload_->BeginBatch();
    for (int i = 0; i < n; ++i) {
      const v1::UploadTensorHeader& h = header(i);
      const std::string_view d = data(i);
      CKPT_RETURN_IF_ERROR(upload_->StartTensor(h));
      if (!d.empty()) CKPT_RETURN_IF_ERROR(upload_->Append(d));
      if (upload_->tensor_open()) {
        return absl::InvalidArgumentError(
            absl::StrCat("batched tensor ", h.name(), " carries ", d.size(), " of its ",
                         h.total_bytes(), " bytes (a batch holds whole tensors)"));
      }
    }
    CKPT_RETURN_IF_ERROR(upload_->EndBatch());
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
    Finish(ToGrpcStatus(s));
  }

  CheckpointServiceImpl* const service_;
  grpc::CallbackServerContext* const ctx_;
  grpc::ByteBuffer* const response_;  // an UploadResponse
  const absl::Time start_;
  grpc::ByteBuffer request_;         // an UploadRequest
  std::vector<grpc::Slice> slices_;  // of a data message's request_, and views of its bytes
  std::vector<std::string_view> data_;
  grpc::Slice single_;                // a batch message's bytes, in one piece
  std::vector<BatchEntry> entries_;   // views into single_ (PlainBatchViews)
  std::vector<v1::UploadTensorHeader> headers_;  // parsed from entries_, reused
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
