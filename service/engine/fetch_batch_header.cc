// AppendBatchTensorHeader (fetch_stream.h): a batch's tensor headers written as protobuf writes
// them, without a message object per tensor.
#include <cassert>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

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

}  // namespace ckpt
