// gRPC byte buffers for wire-format tests: the same bytes over slices cut anywhere.
#ifndef CKPT_TESTS_TESTING_BYTE_BUFFERS_H_
#define CKPT_TESTS_TESTING_BYTE_BUFFERS_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <string>
#include <vector>

namespace ckpt::testing {

// `bytes` as a ByteBuffer of slices cut at `cuts` (increasing offsets); the slices are copies.
inline grpc::ByteBuffer SlicedByteBuffer(const std::string& bytes,
                                         const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.data() + from, cut - from);
    from = cut;
  }
  slices.emplace_back(bytes.data() + from, bytes.size() - from);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_BYTE_BUFFERS_H_
