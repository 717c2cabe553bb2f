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
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "ckpt.pb.h"
#include "client/client.h"
#include "client/fetch_wire.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/tile_band.h"

namespace ckpt {

namespace fetch_checker_internal {

// The tensor a FetchChecker is receiving. Outside the class so that it is complete where
// std::optional checks that it is default-constructible.
struct Tensor {
  std::string name;
  int64_t total = 0;
  int64_t received = 0;
  // For tiles (FetchData.tile_box): the slice's dtype and shape, and the band being assembled.
  std::optional<DType> dtype;
  Shape local;
  std::unique_ptr<TileBand> band;
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
      : visitor_(visitor), checkpoint_(std::move(checkpoint)) {}

  absl::Status Consume(const FetchWire& message);
  absl::Status Consume(const v1::FetchResponse& message);
  // After the server closed the stream successfully.
  absl::Status End();

 private:
  using Current = fetch_checker_internal::Tensor;
  // The largest band of tiles the client assembles (the server's bands are about 1 MiB).
  static constexpr int64_t kMaxBandBytes = int64_t{256} << 20;

  absl::Status OnSummary(const v1::FetchPlanSummary& summary);
  absl::Status OnTensor(const v1::FetchTensorHeader& header);
  absl::Status OnData(const v1::FetchData& data);
  absl::Status OnBatch(const v1::FetchTensorBatch& batch);
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
  // Closes the open tensor (if any) at `where`, checking it got all its bytes.
  absl::Status EndTensor(std::string_view where);

  TensorVisitor* visitor_;
  const std::string checkpoint_;
  std::optional<v1::FetchPlanSummary> summary_;
  std::optional<Current> current_;
  int64_t tensors_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_FETCH_CHECKER_H_
