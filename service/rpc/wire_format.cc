#include "service/rpc/wire_format.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "google/protobuf/io/coded_stream.h"
#include "service/engine/upload_wire.h"

namespace ckpt {
namespace {

// Releases the reference a grpc::Slice held on a data segment's owner.
void ReleaseSegment(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

// Segments smaller than this are copied into the message rather than referenced.
constexpr size_t kCopiedSegmentBytes = size_t{4} << 10;

// The memory of the bytes a message copies (its framing, a batch's headers, runs of small
// segments, the tail), shared by the slices cut from it and freed when gRPC has dropped them
// all. Blocks of a batch's size are reused from message to message (a process-wide free list of
// at most kIdleBlocks), so that a stream of batches allocates, and faults in, no new megabyte
// per message. Thread-safe: gRPC drops slices on its own threads.
class CopyBlock {
 public:
  // A block of at least `bytes`, holding one reference (the caller's; Release drops it).
  static CopyBlock* Take(size_t bytes) {
    if (bytes < kPooledMinBytes || bytes > kPooledBytes) return new CopyBlock(bytes, false);
    {
      Pool& pool = IdlePool();
      std::lock_guard<std::mutex> lock(pool.mu);
      if (!pool.idle.empty()) {
        CopyBlock* block = pool.idle.back();
        pool.idle.pop_back();
        block->refs_.store(1, std::memory_order_relaxed);
        return block;
      }
    }
    return new CopyBlock(kPooledBytes, true);
  }
  char* data() { return data_.get(); }
  // A slice of `n` bytes from `offset`, which holds a reference on the block.
  grpc::Slice Cut(size_t offset, size_t n) {
    refs_.fetch_add(1, std::memory_order_relaxed);
    return grpc::Slice(data_.get() + offset, n, &Unref, this);
  }
  void Release() { Unref(this); }

 private:
  static constexpr size_t kPooledMinBytes = size_t{64} << 10;
  // A batch's data (FetchOptions::max_message_bytes), its headers and its tail.
  static constexpr size_t kPooledBytes = size_t{3} << 19;
  static constexpr size_t kIdleBlocks = 8;

  CopyBlock(size_t capacity, bool pooled) : pooled_(pooled), data_(new char[capacity]) {}

  static void Unref(void* p) {
    auto* block = static_cast<CopyBlock*>(p);
    if (block->refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (block->pooled_) {
      Pool& pool = IdlePool();
      std::lock_guard<std::mutex> lock(pool.mu);
      if (pool.idle.size() < kIdleBlocks) {
        pool.idle.push_back(block);
        return;
      }
    }
    delete block;
  }

  std::atomic<int> refs_{1};
  const bool pooled_;
  std::unique_ptr<char[]> data_;

  struct Pool {
    std::mutex mu;
    std::vector<CopyBlock*> idle;
  };
  // The idle blocks. Never destroyed: gRPC may drop a slice on its own thread while the process
  // exits, and the blocks stay reachable (not reported as leaks) through this pointer.
  static Pool& IdlePool() {
    static Pool* const pool = new Pool;
    return *pool;
  }
};

// The fields of a data message after its bytes: the parts' sizes (`part_bytes_tag`) and
// checksums (`part_checksums_tag`), then the tiles (FetchData.tile_box = 4, band_rows = 5).
// Sized first (bytes) and then written (Write) straight into the message's copy block,
// so that a message allocates nothing for them.
class Tail {
 public:
  explicit Tail(const FetchPiece& piece) : piece_(piece) {
    using google::protobuf::io::CodedOutputStream;
    for (const ChecksumPart& p : piece.parts) {
      sizes_length_ += CodedOutputStream::VarintSize64(static_cast<uint64_t>(p.bytes));
    }
    sums_length_ = 8 * piece.parts.size();
    for (int64_t v : piece.tile_box) {
      tiles_length_ += CodedOutputStream::VarintSize64(static_cast<uint64_t>(v));
    }
  }

  // The tail's exact size.
  size_t bytes() const {
    using google::protobuf::io::CodedOutputStream;
    size_t n = 0;
    if (!piece_.parts.empty()) {
      n += 1 + CodedOutputStream::VarintSize64(sizes_length_) + sizes_length_;
      n += 1 + CodedOutputStream::VarintSize64(sums_length_) + sums_length_;
    }
    if (!piece_.tile_box.empty()) {
      n += 1 + CodedOutputStream::VarintSize64(tiles_length_) + tiles_length_;
      n += 1 + CodedOutputStream::VarintSize64(static_cast<uint64_t>(piece_.band_rows));
    }
    return n;
  }

  // Writes the bytes() bytes at `out`; returns the end.
  uint8_t* Write(uint8_t part_bytes_tag, uint8_t part_checksums_tag, uint8_t* out) const {
    using google::protobuf::io::CodedOutputStream;
    constexpr uint8_t kTileBox = (4 << 3) | 2;
    constexpr uint8_t kBandRows = (5 << 3) | 0;
    if (!piece_.parts.empty()) {
      *out++ = part_bytes_tag;
      out = CodedOutputStream::WriteVarint64ToArray(sizes_length_, out);
      for (const ChecksumPart& p : piece_.parts) {
        out = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(p.bytes), out);
      }
      *out++ = part_checksums_tag;
      out = CodedOutputStream::WriteVarint64ToArray(sums_length_, out);
      for (const ChecksumPart& p : piece_.parts) {
        out = CodedOutputStream::WriteLittleEndian64ToArray(p.checksum, out);
      }
    }
    if (!piece_.tile_box.empty()) {
      *out++ = kTileBox;
      out = CodedOutputStream::WriteVarint64ToArray(tiles_length_, out);
      for (int64_t v : piece_.tile_box) {
        out = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(v), out);
      }
      *out++ = kBandRows;
      out = CodedOutputStream::WriteVarint64ToArray(static_cast<uint64_t>(piece_.band_rows), out);
    }
    return out;
  }

 private:
  const FetchPiece& piece_;
  uint64_t sizes_length_ = 0;
  uint64_t sums_length_ = 0;
  uint64_t tiles_length_ = 0;
};

// The bytes of `segments` a message copies: those of segments under kCopiedSegmentBytes.
size_t CopiedBytes(const std::vector<DataSegment>& segments) {
  size_t n = 0;
  for (const DataSegment& s : segments) {
    if (s.bytes.size() < kCopiedSegmentBytes) n += s.bytes.size();
  }
  return n;
}

// Appends `segments` to `out`: runs of small segments (a batch's tensors) copied into `block`
// from `*at` on, after the `*run_start` bytes already there (a slice of the block ends each
// run), since a slice per segment would cost gRPC more than copying them does; larger ones
// referenced, their owners kept alive until gRPC drops the slice.
void AppendSegmentSlices(std::vector<DataSegment>& segments, CopyBlock* block, size_t* run_start,
                         size_t* at, std::vector<grpc::Slice>* out) {
  for (DataSegment& s : segments) {
    if (s.bytes.size() < kCopiedSegmentBytes) {
      std::memcpy(block->data() + *at, s.bytes.data(), s.bytes.size());
      *at += s.bytes.size();
      continue;
    }
    if (*at > *run_start) out->push_back(block->Cut(*run_start, *at - *run_start));
    *run_start = *at;
    // gRPC only reads the bytes; the owner keeps them alive until gRPC drops the slice.
    out->emplace_back(const_cast<char*>(s.bytes.data()), s.bytes.size(), &ReleaseSegment,
                      new std::shared_ptr<const void>(std::move(s.owner)));
  }
}

}  // namespace

grpc::ByteBuffer EncodeFetchResponse(FetchPiece* out) {
  FetchPiece& piece = *out;
  // Without data: the message as protobuf writes it, except a batch whose tensors are all empty
  // (its headers are in batch_headers).
  if (piece.segments.empty() && piece.batch_headers.empty()) {
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
  // A batch's headers, as protobuf writes FetchTensorBatch{tensors} (field 1 of each): those
  // in batch_headers, then any in the message.
  const std::string more_headers = batch ? piece.message.batch().SerializeAsString() : "";
  const size_t headers_size = batch ? piece.batch_headers.size() + more_headers.size() : 0;
  const auto length = static_cast<uint64_t>(piece.data_bytes);
  // The fields after the bytes: the parts' sizes and checksums, then the tiles.
  const Tail tail(piece);
  const size_t tail_size = tail.bytes();
  const uint64_t inner =
      headers_size + 1 + CodedOutputStream::VarintSize64(length) + length + tail_size;
  uint8_t head[3 * (1 + 10)];
  uint8_t* head_end = head;
  *head_end++ = kResponseData;
  head_end = CodedOutputStream::WriteVarint64ToArray(inner, head_end);
  const auto head_size = static_cast<size_t>(head_end - head);
  uint8_t* data_head = head_end;
  *head_end++ = kDataBytes;
  head_end = CodedOutputStream::WriteVarint64ToArray(length, head_end);
  const auto data_head_size = static_cast<size_t>(head_end - data_head);

  // Everything but the referenced segments is written once, into one block.
  CopyBlock* block = CopyBlock::Take(head_size + headers_size + data_head_size +
                                     CopiedBytes(piece.segments) + tail_size);
  char* const base = block->data();
  size_t at = 0;
  auto put = [&](const void* bytes, size_t n) {
    if (n > 0) std::memcpy(base + at, bytes, n);
    at += n;
  };
  put(head, head_size);
  if (batch) {
    put(piece.batch_headers.data(), piece.batch_headers.size());
    put(more_headers.data(), more_headers.size());
  }
  put(data_head, data_head_size);
  // Kept per thread from message to message: a batch of thousands of small tensors has as many
  // segments, and a vector sized for them would be a large allocation per message.
  thread_local std::vector<grpc::Slice> slices;
  size_t run_start = 0;
  AppendSegmentSlices(piece.segments, block, &run_start, &at, &slices);
  at = static_cast<size_t>(
      tail.Write(kPartBytes, kPartChecksums, reinterpret_cast<uint8_t*>(base + at)) -
      reinterpret_cast<uint8_t*>(base));
  if (at > run_start) slices.push_back(block->Cut(run_start, at - run_start));
  block->Release();
  piece.segments.clear();  // the copied ones' owners go now; the referenced ones' with gRPC
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  slices.clear();  // the buffer holds its own references
  return buffer;
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
