// AppendBatchTensorHeader (fetch_stream.h): a batch's tensor headers written as protobuf writes
// them, without a message object per tensor; and FetchStream's batches: BatchPiece (tensors
// assembled band by band) and DirectBatchPiece (tensors whose bytes are ranges of stored chunks,
// FetchLayout).
#include <cassert>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "service/engine/fetch_stream.h"

namespace ckpt {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedOutputStream;

// Size and writer of a length-delimited field (a string, bytes, a packed repeated field or a
// message) whose payload is `payload` bytes; protobuf's own encoders (io/coded_stream.h,
// wire_format_lite.h) write the tag and the length.
size_t DelimitedFieldSize(int field, size_t payload) {
  return WireFormatLite::TagSize(field, WireFormatLite::TYPE_BYTES) +
         CodedOutputStream::VarintSize64(payload) + payload;
}

uint8_t* WriteDelimitedHead(int field, size_t payload, uint8_t* at) {
  at = WireFormatLite::WriteTagToArray(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED, at);
  return CodedOutputStream::WriteVarint64ToArray(payload, at);
}

// A string field, omitted when empty (proto3).
uint8_t* WriteStringField(int field, std::string_view bytes, uint8_t* at) {
  if (bytes.empty()) return at;
  at = WriteDelimitedHead(field, bytes.size(), at);
  std::memcpy(at, bytes.data(), bytes.size());
  return at + bytes.size();
}

size_t StringFieldSize(int field, std::string_view bytes) {
  return bytes.empty() ? 0 : DelimitedFieldSize(field, bytes.size());
}

// The payload of a packed repeated int64 field of the `n` values `value(i)`.
template <typename F>
size_t PackedPayload(size_t n, F value) {
  size_t size = 0;
  for (size_t i = 0; i < n; ++i) size += WireFormatLite::Int64Size(value(i));
  return size;
}

// That field, omitted when empty.
template <typename F>
uint8_t* WritePackedField(int field, size_t n, size_t payload, F value, uint8_t* at) {
  if (n == 0) return at;
  at = WriteDelimitedHead(field, payload, at);
  for (size_t i = 0; i < n; ++i) at = WireFormatLite::WriteInt64NoTagToArray(value(i), at);
  return at;
}

}  // namespace

void AppendBatchTensorHeader(std::string_view name, std::string_view dtype, const Box& box,
                             std::span<const int64_t> global_shape, int64_t total_bytes,
                             bool verbatim, std::string* out) {
  const size_t rank = box.lo.size();
  auto local_shape = [&](size_t i) { return box.hi[i] - box.lo[i]; };
  auto global = [&](size_t i) { return global_shape[i]; };
  auto lo = [&](size_t i) { return box.lo[i]; };
  auto hi = [&](size_t i) { return box.hi[i]; };
  const size_t local_payload = PackedPayload(rank, local_shape);
  const size_t global_payload = PackedPayload(global_shape.size(), global);
  const size_t lo_payload = PackedPayload(rank, lo);
  const size_t hi_payload = PackedPayload(rank, hi);
  auto packed_size = [](int field, size_t n, size_t payload) {
    return n == 0 ? 0 : DelimitedFieldSize(field, payload);
  };
  // The header's size first: FetchTensorBatch.tensors (field 1) is length-delimited.
  const size_t header =
      StringFieldSize(1, name) + StringFieldSize(2, dtype) + packed_size(3, rank, local_payload) +
      packed_size(4, global_shape.size(), global_payload) + packed_size(5, rank, lo_payload) +
      packed_size(6, rank, hi_payload) +
      (total_bytes != 0 ? WireFormatLite::TagSize(7, WireFormatLite::TYPE_INT64) +
                              WireFormatLite::Int64Size(total_bytes)
                        : 0) +
      (verbatim ? WireFormatLite::TagSize(8, WireFormatLite::TYPE_BOOL) + WireFormatLite::kBoolSize
                : 0);
  const size_t start = out->size();
  out->resize(start + DelimitedFieldSize(1, header));
  uint8_t* at = reinterpret_cast<uint8_t*>(out->data() + start);
  at = WriteDelimitedHead(1, header, at);
  at = WriteStringField(1, name, at);
  at = WriteStringField(2, dtype, at);
  at = WritePackedField(3, rank, local_payload, local_shape, at);
  at = WritePackedField(4, global_shape.size(), global_payload, global, at);
  at = WritePackedField(5, rank, lo_payload, lo, at);
  at = WritePackedField(6, rank, hi_payload, hi, at);
  if (total_bytes != 0) at = WireFormatLite::WriteInt64ToArray(7, total_bytes, at);
  if (verbatim) at = WireFormatLite::WriteBoolToArray(8, true, at);
  assert(reinterpret_cast<char*>(at) == out->data() + out->size());
}

// Direct tensors' bytes are chunk ranges known from the layout: the batch is their headers as
// serialised when the layout was built, and views of the chunks, got with one GetMany. The other
// tensors of the batch (rare among many small ones) are assembled band by band.
bool FetchStream::Batchable(int64_t bytes) const {
  return options_.batches && bytes <= options_.batch_tensor_bytes &&
         bytes <= options_.max_message_bytes;
}

absl::Status FetchStream::BatchPiece(FetchPiece* out) {
  if (!layout_) {
    layout_ = checkpoint_->fetch_layouts.Get(
        *checkpoint_, plan_, std::min(options_.batch_tensor_bytes, options_.max_message_bytes));
  }
  if (options_.direct_batches && tensor_ < layout_->tensors.size() &&
      layout_->tensors[tensor_].direct) {
    return DirectBatchPiece(*layout_, out);
  }
  // The headers go to out->batch_headers, serialised as they come; the message holds the batch.
  out->message.mutable_batch();
  int count = 0;
  // A batch's tensors come as rows: bands that stored chunks do not stack into are assembled here.
  const bool tiles = tiles_;
  tiles_ = false;
  absl::Cleanup restore = [this, tiles] { tiles_ = tiles; };
  if (batch_tensors_ == 0) batch_tensors_ = std::max(1, options_.batch_first_tensors);
  PrefetchBatch();
  absl::Cleanup release_prefetched = [this] { ReleasePrefetched(); };
  while (tensor_ < plan_->tensors.size() && count < batch_tensors_) {
    const TensorPlan& t = plan_->tensors[tensor_];
    const int64_t bytes = TensorBytes(t);
    if (!Batchable(bytes) || (count > 0 && out->data_bytes + bytes > options_.max_message_bytes) ||
        (count > 0 && options_.direct_batches &&
         layout_->tensors[tensor_].direct)) {  // the next batch is a direct one
      break;
    }
    ++count;
    CKPT_RETURN_IF_ERROR(AppendBatchTensor(t, bytes, out));
    ++tensor_;
  }
  header_sent_ = false;
  batch_tensors_ = std::min(2 * batch_tensors_, std::max(1, options_.batch_max_tensors));
  CKPT_RETURN_IF_ERROR(ChecksumMessage(FetchReader::kClient, out));
  bytes_produced_ += out->data_bytes;
  return absl::OkStatus();
}

absl::Status FetchStream::AppendBatchTensor(const TensorPlan& t, int64_t bytes, FetchPiece* out) {
  StartTensor();
  AppendHeader(t, &out->batch_headers);
  int64_t produced = 0;
  while (!tensor_done_) {
    CKPT_RETURN_IF_ERROR(BuildBand());
    for (DataSegment& s : band_) {
      if (s.bytes.empty()) continue;
      // Verified now, while errors still name this tensor; whole chunks that become parts of
      // their own leave with their stored checksum for the client to verify.
      if (s.chunk &&
          !(s.stored_checksum && static_cast<int64_t>(s.bytes.size()) >= options_.min_part_bytes)) {
        CKPT_RETURN_IF_ERROR(Verify(*s.chunk));
      }
      produced += static_cast<int64_t>(s.bytes.size());
      out->segments.push_back(std::move(s));
    }
    band_.clear();
    band_tiles_.clear();
    band_left_ = 0;
  }
  if (produced != bytes) {
    return Annotate(absl::InternalError(
        absl::StrCat("assembled ", produced, " bytes of ", bytes, " for a batch")));
  }
  out->data_bytes += bytes;
  return absl::OkStatus();
}

absl::Status FetchStream::DirectBatchPiece(const FetchLayout& layout, FetchPiece* out) {
  out->message.mutable_batch();
  // A batch's tensors come as rows (AppendBatchTensor).
  const bool tiles = tiles_;
  tiles_ = false;
  absl::Cleanup restore = [this, tiles] { tiles_ = tiles; };
  if (batch_tensors_ == 0) batch_tensors_ = std::max(1, options_.batch_first_tensors);
  // The tensors BatchPiece would take.
  const size_t first = tensor_;
  size_t end = first;
  size_t last_direct = first;
  int64_t batch_bytes = 0;
  size_t header_bytes = 0;  // of the direct tensors
  while (end < layout.tensors.size() && end - first < static_cast<size_t>(batch_tensors_)) {
    const FetchLayout::Tensor& lt = layout.tensors[end];
    const int64_t bytes = lt.direct ? lt.bytes : TensorBytes(plan_->tensors[end]);
    if (!Batchable(bytes) || (end > first && batch_bytes + bytes > options_.max_message_bytes)) {
      break;
    }
    if (lt.direct) {
      last_direct = end;
      header_bytes += lt.header_length;
    }
    batch_bytes += bytes;
    ++end;
  }
  // The headers are appended one by one: one allocation for them rather than one per doubling
  // (the message takes the string, so each batch starts from an empty one).
  out->batch_headers.reserve(out->batch_headers.size() + header_bytes);
  // The direct tensors' refs are consecutive in the layout, in tensor order.
  const size_t ref_begin = layout.tensors[first].first_ref;
  const size_t ref_end =
      layout.tensors[last_direct].first_ref + layout.tensors[last_direct].ref_count;
  std::vector<SharedChunks::Request>& requests = direct_requests_;
  requests.resize(ref_end - ref_begin);
  for (size_t j = ref_begin; j < ref_end; ++j) {
    SharedChunks::Request& q = requests[j - ref_begin];
    q.address = layout.refs[j].address;
    q.checksum = layout.refs[j].checksum;
  }
  // The chunks go with the message's segments; the requests let go of them however this returns.
  absl::Cleanup release = [&requests] { requests.clear(); };  // keeps the vector's storage
  chunks_->GetMany(std::span<SharedChunks::Request>(requests),
                   member_ ? member_->cohort() : nullptr, this);
  if (member_) {
    int64_t got = 0;
    for (const SharedChunks::Request& q : requests) {
      if (q.result.ok()) got += static_cast<int64_t>((*q.result)->data->bytes().size());
    }
    if (got > 0) member_->Advanced(got);
  }
  out->segments.reserve(requests.size());
  for (size_t k = first; k < end; ++k) {
    tensor_ = k;  // errors name this tensor
    const FetchLayout::Tensor& lt = layout.tensors[k];
    if (!lt.direct) {
      const TensorPlan& t = plan_->tensors[k];
      CKPT_RETURN_IF_ERROR(AppendBatchTensor(t, TensorBytes(t), out));
      continue;
    }
    CKPT_RETURN_IF_ERROR(AppendDirectTensor(layout, lt, requests, ref_begin, out));
  }
  tensor_ = end;
  header_sent_ = false;
  batch_tensors_ = std::min(2 * batch_tensors_, std::max(1, options_.batch_max_tensors));
  CKPT_RETURN_IF_ERROR(ChecksumMessage(FetchReader::kClient, out));
  bytes_produced_ += out->data_bytes;
  return absl::OkStatus();
}

absl::Status FetchStream::AppendDirectTensor(const FetchLayout& layout,
                                             const FetchLayout::Tensor& lt,
                                             std::span<const SharedChunks::Request> requests,
                                             size_t ref_begin, FetchPiece* out) {
  StartTensor();
  out->batch_headers.append(layout.headers, lt.header_offset, lt.header_length);
  for (size_t j = lt.first_ref; j < lt.first_ref + lt.ref_count; ++j) {
    const FetchLayout::ChunkRef& ref = layout.refs[j];
    const absl::StatusOr<std::shared_ptr<StreamChunk>>& result = requests[j - ref_begin].result;
    if (!result.ok()) return Annotate(result.status());
    const std::shared_ptr<StreamChunk>& chunk = *result;
    const std::string_view bytes = chunk->data->bytes();
    if (bytes.size() != ref.chunk_bytes) {
      return Annotate(
          absl::DataLossError(absl::StrCat("chunk ", ref.address.chunk, " has ", bytes.size(),
                                           " bytes, expected ", ref.chunk_bytes)));
    }
    // The segment keeps the chunk alive (owner) without naming it (chunk): it is verified
    // here, now, while errors still name this tensor, unless it is a whole chunk that becomes
    // a part of its own and leaves with its stored checksum for the client to verify.
    DataSegment s{chunk, bytes.substr(ref.offset, ref.length), std::nullopt, nullptr};
    if (ref.offset == 0 && ref.length == bytes.size()) s.stored_checksum = chunk->checksum;
    if (!(s.stored_checksum && static_cast<int64_t>(ref.length) >= options_.min_part_bytes)) {
      CKPT_RETURN_IF_ERROR(Verify(*chunk));
    }
    out->segments.push_back(std::move(s));
  }
  out->data_bytes += lt.bytes;
  ++direct_tensors_;
  return absl::OkStatus();
}

}  // namespace ckpt
