#include "client/fetch_wire.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <algorithm>

#include "core/checksum.h"
#include "google/protobuf/io/coded_stream.h"

namespace ckpt {
namespace {

using google::protobuf::io::CodedInputStream;

// Field numbers and wire types of proto/ckpt.proto.
constexpr uint32_t kResponseData = (3 << 3) | 2;  // FetchResponse.data
constexpr uint32_t kDataBytes = (1 << 3) | 2;     // FetchData.data
constexpr uint32_t kPartBytes = (2 << 3) | 0;     // FetchData.part_bytes, one varint
constexpr uint32_t kPartBytesPacked = (2 << 3) | 2;
constexpr uint32_t kPartChecksum = (3 << 3) | 1;  // FetchData.part_checksums, one fixed64
constexpr uint32_t kPartChecksumsPacked = (3 << 3) | 2;
constexpr uint32_t kTileBox = (4 << 3) | 0;  // FetchData.tile_box, one varint
constexpr uint32_t kTileBoxPacked = (4 << 3) | 2;
constexpr uint32_t kBandRows = (5 << 3) | 0;  // FetchData.band_rows
constexpr uint32_t kResponseBatch = (4 << 3) | 2;  // FetchResponse.batch
constexpr uint32_t kBatchTensor = (1 << 3) | 2;    // FetchTensorBatch.tensors
constexpr uint32_t kBatchData = (2 << 3) | 2;      // FetchTensorBatch.data
constexpr uint32_t kBatchPartBytes = (3 << 3) | 0;
constexpr uint32_t kBatchPartBytesPacked = (3 << 3) | 2;
constexpr uint32_t kBatchPartChecksum = (4 << 3) | 1;
constexpr uint32_t kBatchPartChecksumsPacked = (4 << 3) | 2;

// Appends one varint to `out`.
template <typename T>
bool ReadVarint(CodedInputStream& in, std::vector<T>* out) {
  uint64_t v = 0;
  if (!in.ReadVarint64(&v)) return false;
  out->push_back(static_cast<T>(v));
  return true;
}

// Appends a packed run of varints (its length, then the values) to `out`.
template <typename T>
bool ReadPackedVarints(CodedInputStream& in, std::vector<T>* out) {
  uint32_t length = 0;
  if (!in.ReadVarint32(&length)) return false;
  const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  while (in.BytesUntilLimit() > 0) {
    uint64_t v = 0;
    if (!in.ReadVarint64(&v)) return false;
    out->push_back(static_cast<T>(v));
  }
  in.PopLimit(limit);
  return true;
}

// Appends a packed run of fixed64 values (its length, then the values) to `out`.
bool ReadPackedFixed64(CodedInputStream& in, std::vector<uint64_t>* out) {
  uint32_t length = 0;
  if (!in.ReadVarint32(&length) || length % 8 != 0) return false;
  for (uint32_t i = 0; i < length / 8; ++i) {
    uint64_t v = 0;
    if (!in.ReadLittleEndian64(&v)) return false;
    out->push_back(v);
  }
  return true;
}

// A bytes field's value (its length, then the bytes) as views of the received slices, into
// out->data and out->data_bytes; false if out already has data or on malformed input.
bool ReadDataViews(CodedInputStream& in, FetchWire* out, bool* have_data) {
  uint32_t n = 0;
  if (*have_data || !in.ReadVarint32(&n)) return false;
  *have_data = true;
  out->data_bytes = n;
  while (n > 0) {
    const void* bytes = nullptr;
    int size = 0;
    if (!in.GetDirectBufferPointer(&bytes, &size) || size <= 0) return false;
    const uint32_t take = std::min(n, static_cast<uint32_t>(size));
    out->data.emplace_back(static_cast<const char*>(bytes), take);
    if (!in.Skip(static_cast<int>(take))) return false;
    n -= take;
  }
  return true;
}

// The FetchData fields of `in` up to its limit; false on anything but the fields above (each
// once, repeated ones in either encoding) or on malformed input.
bool ReadFetchData(CodedInputStream& in, FetchWire* out) {
  bool have_data = false;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.BytesUntilLimit() == 0;  // the end, or an error before it
    switch (tag) {
      case kDataBytes:
        if (!ReadDataViews(in, out, &have_data)) return false;
        break;
      case kPartBytes:
        if (!ReadVarint(in, &out->part_bytes)) return false;
        break;
      case kPartBytesPacked:
        if (!ReadPackedVarints(in, &out->part_bytes)) return false;
        break;
      case kPartChecksum: {
        uint64_t v = 0;
        if (!in.ReadLittleEndian64(&v)) return false;
        out->part_checksums.push_back(v);
        break;
      }
      case kTileBox:
        if (!ReadVarint(in, &out->tile_box)) return false;
        break;
      case kTileBoxPacked:
        if (!ReadPackedVarints(in, &out->tile_box)) return false;
        break;
      case kBandRows: {
        uint64_t v = 0;
        if (!in.ReadVarint64(&v)) return false;
        out->band_rows = static_cast<int64_t>(v);
        break;
      }
      case kPartChecksumsPacked:
        if (!ReadPackedFixed64(in, &out->part_checksums)) return false;
        break;
      default:
        return false;
    }
  }
}

// The FetchTensorBatch fields of `in` up to its limit: each header parsed by protobuf into
// out->batch_headers (reusing the objects of earlier batches), the data as views; false on
// anything but the fields of FetchTensorBatch (data once, repeated ones in either encoding) or on
// malformed input.
bool ReadFetchBatch(CodedInputStream& in, FetchWire* out) {
  bool have_data = false;
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) return in.BytesUntilLimit() == 0;  // the end, or an error before it
    switch (tag) {
      case kBatchTensor: {
        uint32_t length = 0;
        if (!in.ReadVarint32(&length)) return false;
        if (out->batch_header_count == out->batch_headers.size()) out->batch_headers.emplace_back();
        v1::FetchTensorHeader& header = out->batch_headers[out->batch_header_count++];
        header.Clear();
        const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
        if (!header.MergeFromCodedStream(&in) || !in.ConsumedEntireMessage()) return false;
        in.PopLimit(limit);
        break;
      }
      case kBatchData:
        if (!ReadDataViews(in, out, &have_data)) return false;
        break;
      case kBatchPartBytes:
        if (!ReadVarint(in, &out->part_bytes)) return false;
        break;
      case kBatchPartBytesPacked:
        if (!ReadPackedVarints(in, &out->part_bytes)) return false;
        break;
      case kBatchPartChecksum: {
        uint64_t v = 0;
        if (!in.ReadLittleEndian64(&v)) return false;
        out->part_checksums.push_back(v);
        break;
      }
      case kBatchPartChecksumsPacked:
        if (!ReadPackedFixed64(in, &out->part_checksums)) return false;
        break;
      default:
        return false;
    }
  }
}

// Reads out->buffer as FetchResponse{data: FetchData} or FetchResponse{batch: FetchTensorBatch}
// in place (setting out->is_data or out->is_batch); false if it is anything else.
bool ReadDataInPlace(FetchWire* out) {
  out->reader = std::make_unique<grpc::ProtoBufferReader>(&out->buffer);
  if (!out->reader->status().ok()) return false;
  CodedInputStream in(out->reader.get());
  uint32_t length = 0;
  const uint32_t tag = in.ReadTag();
  if ((tag != kResponseData && tag != kResponseBatch) || !in.ReadVarint32(&length)) return false;
  const CodedInputStream::Limit limit = in.PushLimit(static_cast<int>(length));
  if (tag == kResponseData ? !ReadFetchData(in, out) : !ReadFetchBatch(in, out)) return false;
  in.PopLimit(limit);
  // Nothing may follow the data message.
  if (static_cast<uint64_t>(in.CurrentPosition()) != out->buffer.Length()) return false;
  out->is_data = tag == kResponseData;
  out->is_batch = tag == kResponseBatch;
  return true;
}

}  // namespace

grpc::Status ParseFetchWire(grpc::ByteBuffer* buffer, FetchWire* out) {
  out->reader.reset();  // before the buffer it reads
  out->buffer.Clear();
  out->buffer.Swap(buffer);
  auto reset = [out] {
    out->is_data = false;
    out->is_batch = false;
    out->batch_header_count = 0;
    out->data.clear();
    out->data_bytes = 0;
    out->part_bytes.clear();
    out->part_checksums.clear();
    out->tile_box.clear();
    out->band_rows = 0;
  };
  reset();
  if (ReadDataInPlace(out)) return grpc::Status::OK;
  reset();
  out->reader.reset();
  out->message.Clear();
  grpc::ProtoBufferReader reader(&out->buffer);  // reads the slices, shared with the buffer
  if (!reader.status().ok()) return reader.status();
  CodedInputStream in(&reader);
  if (!out->message.MergeFromCodedStream(&in)) {
    out->message.Clear();
    return grpc::Status(grpc::StatusCode::INTERNAL, "a fetch message does not parse");
  }
  return grpc::Status::OK;
}

uint64_t ViewCursor::Checksum(uint64_t n) { return ckpt::Checksum(Next(n)); }

const std::vector<std::string_view>& ViewCursor::Next(uint64_t n) {
  parts_.clear();
  while (n > 0 && view_ < views_.size()) {
    const std::string_view v = views_[view_];
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, v.size() - offset_));
    parts_.push_back(v.substr(offset_, take));
    n -= take;
    offset_ += take;
    if (offset_ == v.size()) {
      ++view_;
      offset_ = 0;
    }
  }
  return parts_;
}

}  // namespace ckpt
