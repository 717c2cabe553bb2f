#include "service/rpc/wire_format.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "google/protobuf/io/coded_stream.h"

namespace ckpt {
namespace {

// Releases the reference a grpc::Slice held on a data segment's owner.
void ReleaseSegment(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

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
  // (varint).
  using google::protobuf::io::CodedOutputStream;
  constexpr uint8_t kResponseData = (3 << 3) | 2;
  constexpr uint8_t kDataBytes = (1 << 3) | 2;
  constexpr uint8_t kPartBytes = (2 << 3) | 2;
  constexpr uint8_t kPartChecksums = (3 << 3) | 2;
  constexpr uint8_t kTileBox = (4 << 3) | 2;
  constexpr uint8_t kBandRows = (5 << 3) | 0;
  const auto length = static_cast<uint64_t>(piece.data_bytes);
  // The fields after the bytes: the parts' sizes and checksums, then the tiles.
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
    *tail_end++ = kPartBytes;
    tail_end = CodedOutputStream::WriteVarint64ToArray(sizes_length, tail_end);
    for (const ChecksumPart& p : piece.parts) {
      tail_end = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(p.bytes), tail_end);
    }
    *tail_end++ = kPartChecksums;
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
    tail_end = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(piece.band_rows),
                                                       tail_end);
  }
  const auto tail_size = static_cast<size_t>(tail_end - tail.data());
  const uint64_t inner = 1 + CodedOutputStream::VarintSize64(length) + length + tail_size;
  uint8_t head[2 * (1 + 10)];
  uint8_t* head_end = head;
  *head_end++ = kResponseData;
  head_end = CodedOutputStream::WriteVarint64ToArray(inner, head_end);
  *head_end++ = kDataBytes;
  head_end = CodedOutputStream::WriteVarint64ToArray(length, head_end);

  std::vector<grpc::Slice> slices;
  slices.reserve(piece.segments.size() + 2);
  slices.emplace_back(head, static_cast<size_t>(head_end - head));  // copied
  for (DataSegment& s : piece.segments) {
    // gRPC only reads the bytes; the owner keeps them alive until gRPC drops the slice.
    slices.emplace_back(const_cast<char*>(s.bytes.data()), s.bytes.size(), &ReleaseSegment,
                        new std::shared_ptr<const void>(std::move(s.owner)));
  }
  slices.emplace_back(tail.data(), tail_size);  // copied
  return grpc::ByteBuffer(slices.data(), slices.size());
}

bool UploadDataViews(const grpc::ByteBuffer& buffer, std::vector<grpc::Slice>* slices,
                     std::vector<std::string_view>* data) {
  slices->clear();
  data->clear();
  if (!buffer.Dump(slices).ok()) return false;
  // The tag and length: at most 1 + 10 bytes, which may span slices.
  uint8_t head[1 + 10];
  size_t head_size = 0;
  for (const grpc::Slice& slice : *slices) {
    const size_t n = std::min(slice.size(), sizeof(head) - head_size);
    if (n > 0) std::memcpy(head + head_size, slice.begin(), n);
    head_size += n;
    if (head_size == sizeof(head)) break;
  }
  google::protobuf::io::CodedInputStream in(head, static_cast<int>(head_size));
  constexpr uint32_t kRequestData = (3 << 3) | 2;  // UploadRequest.data (length-delimited)
  uint64_t length = 0;
  if (in.ReadTag() != kRequestData || !in.ReadVarint64(&length)) return false;
  size_t skip = static_cast<size_t>(in.CurrentPosition());
  if (length != buffer.Length() - skip) return false;  // more fields follow: not a plain one
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
