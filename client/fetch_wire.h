// Fetch messages as the client receives them. A data message (FetchResponse{data: FetchData}) or a
// batch of small tensors (FetchResponse{batch: FetchTensorBatch}) is read in place: its bytes stay
// in the slices gRPC received them in, instead of protobuf copying every byte into a string, which
// would be a large share of the fetch client's CPU (it does little else than move bytes). Any
// other message, or a data message or batch with fields this version does not know, is parsed by
// protobuf.
#ifndef CKPT_CLIENT_FETCH_WIRE_H_
#define CKPT_CLIENT_FETCH_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/status.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ckpt.pb.h"
#include "core/checksum.h"

namespace ckpt {

// One received Fetch message. Not thread-safe; the views are valid until the next parse into
// (or the destruction of) the object, which owns what they point into.
struct FetchWire {
  // True: a data message, read in place into the fields below; false: `message`.
  bool is_data = false;
  // True: a batch (FetchResponse{batch: FetchTensorBatch}), read in place: its headers in
  // `batch_headers`, its data, part_bytes and part_checksums in the fields below.
  bool is_batch = false;
  v1::FetchResponse message;
  // A batch's tensor headers (FetchTensorBatch.tensors), parsed by protobuf into objects kept
  // from batch to batch (the first batch_header_count are this batch's).
  std::vector<v1::FetchTensorHeader> batch_headers;
  size_t batch_header_count = 0;
  // FetchData.data (a batch: FetchTensorBatch.data) as views of the received bytes, in order (no
  // view is empty).
  std::vector<std::string_view> data;
  uint64_t data_bytes = 0;
  std::vector<uint64_t> part_bytes;
  std::vector<uint64_t> part_checksums;
  std::vector<int64_t> tile_box;
  int64_t band_rows = 0;

  // What the views point into (the reader may hold a decompressed copy of the buffer).
  grpc::ByteBuffer buffer;
  std::unique_ptr<grpc::ProtoBufferReader> reader;
};

// Parses `buffer` (taken over) into `out`.
grpc::Status ParseFetchWire(grpc::ByteBuffer* buffer, FetchWire* out);

// Reads views front to back. Borrows the views.
class ViewCursor {
 public:
  explicit ViewCursor(const std::vector<std::string_view>& views) : views_(views) {}
  // The next `n` bytes, as views (valid until the next call); n must not exceed what is left.
  const std::vector<std::string_view>& Next(uint64_t n);
  // Checksum (core/checksum.h) of the next `n` bytes; n must not exceed what is left.
  uint64_t Checksum(uint64_t n);

 private:
  const std::vector<std::string_view>& views_;
  size_t view_ = 0;
  size_t offset_ = 0;                     // in views_[view_]
  std::vector<std::string_view> parts_;  // of the range last taken (reused)
};

}  // namespace ckpt

template <>
class grpc::SerializationTraits<ckpt::FetchWire> {
 public:
  // Only ever received.
  static grpc::Status Serialize(const ckpt::FetchWire&, grpc::ByteBuffer*, bool*) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "FetchWire is never sent");
  }
  static grpc::Status Deserialize(grpc::ByteBuffer* buffer, ckpt::FetchWire* message) {
    return ckpt::ParseFetchWire(buffer, message);
  }
};

#endif  // CKPT_CLIENT_FETCH_WIRE_H_
