#include "service/rpc/wire_format.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "google/protobuf/io/coded_stream.h"
#include "service/engine/upload_wire.h"

namespace ckpt {
namespace {

// Releases the reference a grpc::Slice held on a data segment's owner.
void ReleaseSegment(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }
// Releases a buffer a grpc::Slice owned.
void ReleaseString(void* owned) { delete static_cast<std::string*>(owned); }

// Segments smaller than this are copied into the message rather than referenced.
constexpr size_t kCopiedSegmentBytes = size_t{4} << 10;

// The fields of a data message after its bytes: the parts' sizes (`part_bytes_tag`) and
// checksums (`part_checksums_tag`), then the tiles (FetchData.tile_box = 4, band_rows = 5).
std::vector<uint8_t> EncodeTail(const FetchPiece& piece, uint8_t part_bytes_tag,
                                uint8_t part_checksums_tag) {
  using google::protobuf::io::CodedOutputStream;
  constexpr uint8_t kTileBox = (4 << 3) | 2;
  constexpr uint8_t kBandRows = (5 << 3) | 0;
  uint64_t sizes_length = 0;
  for (const ChecksumPart& p : piece.parts) {
    sizes_length += CodedOutputStream::VarintSize64(static_cast<uint64_t>(p.bytes));
  }
  const uint64_t sums_length = 8 * piece.parts.size();
  uint64_t tiles_length = 0;
  for (int64_t v : piece.tile_box) {
    tiles_length += CodedOutputStream::VarintSize64(static_cast<uint64_t>(v));
  }
  std::vector<uint8_t> tail(4 * (1 + 10) + sizes_length + sums_length + tiles_length);
  uint8_t* tail_end = tail.data();
  if (!piece.parts.empty()) {
    *tail_end++ = part_bytes_tag;
    tail_end = CodedOutputStream::WriteVarint64ToArray(sizes_length, tail_end);
    for (const ChecksumPart& p : piece.parts) {
      tail_end = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(p.bytes), tail_end);
    }
    *tail_end++ = part_checksums_tag;
    tail_end = CodedOutputStream::WriteVarint64ToArray(sums_length, tail_end);
    for (const ChecksumPart& p : piece.parts) {
      tail_end = CodedOutputStream::WriteLittleEndian64ToArray(p.checksum, tail_end);
    }
  }
  if (!piece.tile_box.empty()) {
    *tail_end++ = kTileBox;
    tail_end = CodedOutputStream::WriteVarint64ToArray(tiles_length, tail_end);
    for (int64_t v : piece.tile_box) {
      tail_end = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(v), tail_end);
    }
    *tail_end++ = kBandRows;
    tail_end =
        CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(piece.band_rows), tail_end);
  }
  tail.resize(static_cast<size_t>(tail_end - tail.data()));
  return tail;
}

// Appends `segments` to `out`: runs of small segments (a batch's tensors) copied into one
// buffer, since a slice per segment would cost gRPC more than copying them does; larger ones
// referenced, their owners kept alive until gRPC drops the slice. `length`: their total bytes.
void AppendSegmentSlices(std::vector<DataSegment>& segments, uint64_t length,
                         std::vector<grpc::Slice>* out) {
  std::vector<grpc::Slice>& slices = *out;
  std::string run;
  auto end_run = [&] {
    if (run.empty()) return;
    auto* owned = new std::string(std::move(run));
    slices.emplace_back(owned->data(), owned->size(), &ReleaseString, owned);
    run = std::string();
  };
  for (DataSegment& s : segments) {
    if (s.bytes.size() < kCopiedSegmentBytes) {
      if (run.empty()) run.reserve(std::min<size_t>(length, size_t{1} << 20));
      run.append(s.bytes);
      continue;
    }
    end_run();
    // gRPC only reads the bytes; the owner keeps them alive until gRPC drops the slice.
    slices.emplace_back(const_cast<char*>(s.bytes.data()), s.bytes.size(), &ReleaseSegment,
                        new std::shared_ptr<const void>(std::move(s.owner)));
  }
  end_run();
}

}  // namespace

grpc::ByteBuffer EncodeFetchResponse(FetchPiece piece) {
  if (piece.segments.empty()) {
    std::string bytes = piece.message.SerializeAsString();
    grpc::Slice slice(bytes);
    return grpc::ByteBuffer(&slice, 1);
  }
  // Field numbers and wire types of ckpt.proto: FetchResponse.data = 3, FetchData.data = 1
  // (length-delimited), FetchData.part_bytes = 2 (packed varints), FetchData.part_checksums = 3
  // (packed fixed64), FetchData.tile_box = 4 (packed varints) and FetchData.band_rows = 5
  // (varint). A batch: FetchResponse.batch = 4, its headers (FetchTensorBatch.tensors = 1,
  // serialised by protobuf) first, then FetchTensorBatch.data = 2, part_bytes = 3 and
  // part_checksums = 4, packed as above.
  using google::protobuf::io::CodedOutputStream;
  const bool batch = piece.message.has_batch();
  const uint8_t kResponseData = batch ? (4 << 3) | 2 : (3 << 3) | 2;
  const uint8_t kDataBytes = batch ? (2 << 3) | 2 : (1 << 3) | 2;
  const uint8_t kPartBytes = batch ? (3 << 3) | 2 : (2 << 3) | 2;
  const uint8_t kPartChecksums = batch ? (4 << 3) | 2 : (3 << 3) | 2;
  // A batch's headers, as protobuf writes FetchTensorBatch{tensors} (field 1 of each).
  std::string headers;
  if (batch) {
    headers = std::move(piece.batch_headers);
    headers.append(piece.message.batch().SerializeAsString());
  }
  const auto length = static_cast<uint64_t>(piece.data_bytes);
  // The fields after the bytes: the parts' sizes and checksums, then the tiles.
  const std::vector<uint8_t> tail = EncodeTail(piece, kPartBytes, kPartChecksums);
  const size_t tail_size = tail.size();
  const uint64_t inner =
      headers.size() + 1 + CodedOutputStream::VarintSize64(length) + length + tail_size;
  uint8_t head[2 * (1 + 10)];
  uint8_t* head_end = head;
  *head_end++ = kResponseData;
  head_end = CodedOutputStream::WriteVarint64ToArray(inner, head_end);
  uint8_t data_head[1 + 10];
  uint8_t* data_head_end = data_head;
  *data_head_end++ = kDataBytes;
  data_head_end = CodedOutputStream::WriteVarint64ToArray(length, data_head_end);

  std::vector<grpc::Slice> slices;
  slices.reserve(piece.segments.size() + 3);
  if (!batch) {
    head_end = std::copy(data_head, data_head_end, head_end);
    slices.emplace_back(head, static_cast<size_t>(head_end - head));  // copied
  } else {
    std::string first(reinterpret_cast<const char*>(head), static_cast<size_t>(head_end - head));
    first.append(headers);
    first.append(reinterpret_cast<const char*>(data_head),
                 static_cast<size_t>(data_head_end - data_head));
    slices.emplace_back(first);  // copied
  }
  AppendSegmentSlices(piece.segments, length, &slices);
  slices.emplace_back(tail.data(), tail_size);  // copied
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool UploadDataViews(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices,
                     std::vector<std::string_view>* data) {
  slices->clear();
  data->clear();
  if (!buffer.Dump(slices).ok()) return false;
  // The tag and length: at most 1 + 10 bytes, which may span slices.
  char head[1 + 10];
  size_t head_size = 0;
  for (const grpc::Slice& slice : *slices) {
    const size_t n = std::min(slice.size(), sizeof(head) - head_size);
    if (n > 0) std::memcpy(head + head_size, slice.begin(), n);
    head_size += n;
    if (head_size == sizeof(head)) break;
  }
  size_t skip = UploadDataOffset(std::string_view(head, head_size), buffer.Length());
  if (skip == 0) return false;
  for (const grpc::Slice& slice : *slices) {
    std::string_view bytes(reinterpret_cast<const char*>(slice.begin()), slice.size());
    const size_t n = std::min(skip, bytes.size());
    bytes.remove_prefix(n);
    skip -= n;
    if (!bytes.empty()) data->push_back(bytes);
  }
  return true;
}

}  // namespace ckpt
