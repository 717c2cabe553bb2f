// Fuzz target: the client's side of a Fetch stream. The input is a sequence of records
// (fuzz_streams.h), each the bytes of one received FetchResponse message; each is handed to
// ParseFetchWire (client/fetch_wire.h, which reads data messages in place) as a two-slice
// grpc::ByteBuffer, then to the FetchChecker (client/fetch_checker.h), which checks order, sizes
// and part checksums and assembles bands of tiles. The stream stops at the first refusal, as the
// client does. A crash, leak or undefined behaviour is a finding.
//
// The first input byte is a mode: with its low bit set, the part checksums of every data message
// are recomputed before it is sent (where its parts lie inside its data), so that mutations get
// past the checksum check into the size checks and the assembly of tiles. With its second bit
// set, the visitor lends each tensor's memory (an InPlaceVisitor, as the Python client's is), so
// that the checker writes verified bytes and assembles tiles in that memory itself: a heap block
// of exactly the tensor's size, in which AddressSanitizer catches any write past the tensor.
#include <grpc/grpc.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>

#include "ckpt.pb.h"
#include "client/fetch_checker.h"
#include "client/fetch_wire.h"
#include "core/checksum.h"
#include "tests/fuzz/fuzz_streams.h"

namespace {

// Checks what the checker promises its visitor: data only inside a tensor, never more bytes than
// the tensor's header announced.
class SizeCheckingVisitor final : public ckpt::TensorVisitor {
 public:
  absl::Status OnSummary(const ckpt::v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const ckpt::v1::FetchTensorHeader& header) override {
    if (open_) abort();
    open_ = true;
    remaining_ = header.total_bytes();
    return absl::OkStatus();
  }
  absl::Status OnData(std::string_view data) override {
    if (!open_ || static_cast<int64_t>(data.size()) > remaining_) abort();
    remaining_ -= static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override {
    if (!open_ || remaining_ != 0) abort();
    open_ = false;
    return absl::OkStatus();
  }

 private:
  bool open_ = false;
  int64_t remaining_ = 0;
};

// SizeCheckingVisitor's checks for a visitor that lends each tensor's memory (tensors up to
// kMaxLent bytes; larger ones take the OnData path).
class LendingVisitor final : public ckpt::InPlaceVisitor {
 public:
  static constexpr int64_t kMaxLent = int64_t{64} << 20;

  absl::Status OnSummary(const ckpt::v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const ckpt::v1::FetchTensorHeader& header) override {
    if (open_) abort();
    open_ = true;
    remaining_ = header.total_bytes();
    memory_.reset();
    if (remaining_ >= 0 && remaining_ <= kMaxLent) {
      memory_ = std::make_unique<char[]>(static_cast<size_t>(remaining_));
    }
    return absl::OkStatus();
  }
  char* TensorMemory() override { return memory_.get(); }
  absl::Status OnPlaced(int64_t size) override {
    if (!open_ || memory_ == nullptr || size < 0 || size > remaining_) abort();
    remaining_ -= size;
    return absl::OkStatus();
  }
  bool StopRequested() const override { return false; }
  absl::Status OnData(std::string_view data) override {
    if (!open_ || memory_ != nullptr || static_cast<int64_t>(data.size()) > remaining_) abort();
    remaining_ -= static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override {
    if (!open_ || remaining_ != 0) abort();
    open_ = false;
    memory_.reset();
    return absl::OkStatus();
  }

 private:
  bool open_ = false;
  int64_t remaining_ = 0;
  std::unique_ptr<char[]> memory_;
};

// `record` with the checksums of its data message's parts recomputed, if it parses as one.
std::string WithPartChecksums(std::string_view record) {
  ckpt::v1::FetchResponse message;
  if (!message.ParseFromArray(record.data(), static_cast<int>(record.size())) ||
      !message.has_data()) {
    return std::string(record);
  }
  ckpt::v1::FetchData* data = message.mutable_data();
  const std::string_view bytes = data->data();
  uint64_t offset = 0;
  for (int i = 0; i < data->part_bytes_size() && i < data->part_checksums_size(); ++i) {
    const uint64_t part = data->part_bytes(i);
    if (part > bytes.size() - offset) break;
    data->set_part_checksums(i, ckpt::Checksum(bytes.substr(offset, part)));
    offset += part;
  }
  return message.SerializeAsString();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool fix_checksums = (data[0] & 1) != 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  const bool lend_memory = (data[0] & 2) != 0;
  SizeCheckingVisitor plain;
  LendingVisitor lending;
  ckpt::FetchChecker checker(lend_memory ? static_cast<ckpt::TensorVisitor*>(&lending) : &plain,
                             "fuzz");
  ckpt::FetchWire message;
  for (std::string_view original : ckpt::fuzz::SplitRecords(input, 256)) {
    const std::string fixed = fix_checksums ? WithPartChecksums(original) : std::string();
    const std::string_view record = fix_checksums ? std::string_view(fixed) : original;
    // Two slices, so that in-place views span slice boundaries as gRPC's do.
    const size_t half = record.size() / 2;
    grpc::Slice slices[2] = {grpc::Slice(record.data(), half),
                             grpc::Slice(record.data() + half, record.size() - half)};
    grpc::ByteBuffer buffer(slices, 2);
    if (!ckpt::ParseFetchWire(&buffer, &message).ok()) return 0;
    if (!checker.Consume(message).ok()) return 0;
  }
  (void)checker.End();
  return 0;
}
