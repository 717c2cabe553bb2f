// Checking and assembling a Fetch stream on the client: message order, sizes, every part checksum
// of each data message and batch, and bands of tiles assembled into rows before a TensorVisitor
// sees them.
#ifndef CKPT_CLIENT_FETCH_CHECKER_H_
#define CKPT_CLIENT_FETCH_CHECKER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "ckpt.pb.h"
#include "client/client.h"
#include "client/fetch_wire.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/tile_band.h"

namespace ckpt {

// A TensorVisitor that lends the checker the memory each tensor's bytes go to (the Python client's
// NumPy arrays). The checker then writes every verified data message there itself, and assembles
// bands of tiles in place rather than in a band of its own that OnData would then copy: one pass
// over every byte fewer. (CkptClient::Fetch receives the stream of any visitor on a thread of its
// own, so that receiving the next messages overlaps checking and placing this one; the visitor's
// methods are still all called on the thread that called Fetch.)
class InPlaceVisitor : public TensorVisitor {
 public:
  // The memory of the tensor OnTensor just announced: exactly its total_bytes bytes, writable
  // until that tensor's OnTensorEnd or the end of the fetch. nullptr: the tensor's bytes go to
  // OnData as for any visitor. Called once per tensor, right after OnTensor succeeded.
  virtual char* TensorMemory() = 0;
  // `size` more bytes of the current tensor (a message's, or a band's once it is complete) were
  // verified and written to its memory. An error aborts the fetch.
  virtual absl::Status OnPlaced(int64_t size) = 0;
  // Whether the caller asked the fetch to stop (thread-safe); polled while no message arrives,
  // so that the fetch ends within a fraction of a second even when the server sends nothing.
  virtual bool StopRequested() const = 0;
};

namespace fetch_checker_internal {

// Copies `n` bytes to `dst` (not overlapping `src`); with streaming (non-temporal) stores where
// the CPU has them when `streaming`, which write a cache line without first reading it from
// memory, so a copy into memory that is not cached moves each byte across the memory bus once
// instead of twice. The streaming stores are not fenced: call StoreFence before the bytes are
// handed on (fencing every small copy would cost more than the copies).
void CopyBytes(char* dst, const char* src, size_t n, bool streaming);
// CopyBytes with streaming stores (a TileBand::CopyFn).
void StreamingCopy(char* dst, const char* src, size_t n);
// Orders the streaming stores before it before any later store (the hand-over).
void StoreFence();

// The tensor a FetchChecker is receiving (one object, reset for each tensor).
struct Tensor {
  std::string name;
  int64_t total = 0;
  int64_t received = 0;
  // For tiles (FetchData.tile_box): the slice's dtype and shape, and the band being assembled.
  std::optional<DType> dtype;
  Shape local;
  // The band of tiles being assembled: in `memory` when the visitor lent it, else in its own
  // buffer.
  std::unique_ptr<TileBand> band;
  // For an InPlaceVisitor that lent the tensor's memory: that memory.
  char* memory = nullptr;

  bool in_band() const { return band != nullptr; }
};

}  // namespace fetch_checker_internal

// Checks the order and sizes of a Fetch stream and verifies every part checksum of each data
// message before handing its bytes to the visitor. Any message a server may send is accepted or
// refused with a status naming the problem. Not thread-safe (one stream); `visitor` must outlive
// the checker.
class FetchChecker {
 public:
  // `checkpoint` names the fetched checkpoint in checksum errors.
  FetchChecker(TensorVisitor* visitor, std::string checkpoint)
      : visitor_(visitor),
        in_place_(dynamic_cast<InPlaceVisitor*>(visitor)),
        checkpoint_(std::move(checkpoint)) {}

  absl::Status Consume(const FetchWire& message);
  absl::Status Consume(const v1::FetchResponse& message);
  // After the server closed the stream successfully.
  absl::Status End();

 private:
  using Current = fetch_checker_internal::Tensor;
  // The largest band of tiles the client assembles (the server's bands are about 1 MiB).
  static constexpr int64_t kMaxBandBytes = int64_t{256} << 20;
  // Tensors at least this large are written to lent memory with streaming stores: a tensor
  // larger than a core's cache would not stay cached for the caller anyway. Smaller ones are
  // copied with memcpy and stay in the cache.
  static constexpr int64_t kStreamingMinBytes = int64_t{4} << 20;

  absl::Status OnSummary(const v1::FetchPlanSummary& summary);
  absl::Status OnTensor(const v1::FetchTensorHeader& header);
  absl::Status OnData(const v1::FetchData& data);
  absl::Status OnBatch(const v1::FetchTensorBatch& batch);
  // A batch of `headers` whose data are the concatenated `views` (`size` bytes), cut into parts
  // `part_bytes` with `part_checksums`: verifies every part, then delivers each tensor as its
  // header and its total_bytes bytes.
  template <typename Headers>
  absl::Status OnBatch(const Headers& headers, const std::vector<std::string_view>& views,
                       uint64_t size, absl::Span<const uint64_t> part_bytes,
                       absl::Span<const uint64_t> part_checksums);
  // A data message of `size` bytes, the concatenated `views`.
  absl::Status OnData(const std::vector<std::string_view>& views, uint64_t size,
                      absl::Span<const uint64_t> part_bytes,
                      absl::Span<const uint64_t> part_checksums, absl::Span<const int64_t> tile_box,
                      int64_t band_rows);
  // Places a verified message of tiles (part i is tile i) into the current band, opening it at
  // the first row not yet delivered; hands the band on once its tiles cover it.
  absl::Status AddTiles(const std::vector<std::string_view>& views,
                        absl::Span<const uint64_t> part_bytes, absl::Span<const int64_t> tile_box,
                        int64_t band_rows);
  // Checks `actual`, the checksum of the `size` bytes at `offset` in the current data message.
  absl::Status Verify(uint64_t actual, uint64_t offset, uint64_t size, uint64_t expected) const;
  // Closes the open tensor (if any) at `where` followed by `what` ("the header of tensor " and a
  // name: the two are joined only for an error, since every tensor of a batch of thousands passes
  // here), checking it got all its bytes.
  absl::Status EndTensor(std::string_view where, std::string_view what = {});
  // Hands the current tensor's next `size` verified bytes, the concatenated `views`, on: written
  // to the tensor's lent memory, or to the visitor's OnData.
  absl::Status Deliver(absl::Span<const std::string_view> views, uint64_t size);

  TensorVisitor* visitor_;
  InPlaceVisitor* const in_place_;  // visitor_, when it lends memory; else null
  const std::string checkpoint_;
  std::optional<v1::FetchPlanSummary> summary_;
  // The open tensor: &tensor_, or null between tensors.
  Current tensor_;
  Current* current_ = nullptr;
  int64_t tensors_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_FETCH_CHECKER_H_
