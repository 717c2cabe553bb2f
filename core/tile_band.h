// Assembles a band of rows of a tensor slice from tiles: boxes of the slice with their row-major
// bytes, in any order. A Fetch client uses it for bands the server sends as the stored chunks'
// regions instead of assembling them itself (FetchData.tile_box): the copy moves from the server,
// whose one producer thread per stream is the bottleneck, to the client, and whole stored chunks
// reach the client with their stored checksums.
#ifndef CKPT_CORE_TILE_BAND_H_
#define CKPT_CORE_TILE_BAND_H_

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"

namespace ckpt {

// Rows [first_row, first_row + rows) (dim 0) of a row-major array of shape `local`, every other
// dim whole. Tiles must lie inside the band and not overlap; the band is complete once their
// volumes add up to its own, and then they tile it exactly. Assembled in a buffer of its own
// (Start) or in memory the caller lends (StartIn). Not thread-safe.
class TileBand {
 public:
  // Copies `n` bytes from `src` to `dst` (not overlapping).
  using CopyFn = void (*)(char* dst, const char* src, size_t n);

  // INVALID_ARGUMENT for a scalar or sub-byte dtype, rows outside `local`, or a band of more than
  // `max_bytes`.
  static absl::StatusOr<std::unique_ptr<TileBand>> Start(DType dtype, const Shape& local,
                                                         int64_t first_row, int64_t rows,
                                                         int64_t max_bytes);
  // As Start, but the band is assembled where it lies in `slice`, the memory of the whole
  // row-major array `local` (the caller's, which must stay valid while tiles are added), and
  // each run of bytes is copied with `copy` (memcpy when null), e.g. with streaming stores.
  static absl::StatusOr<std::unique_ptr<TileBand>> StartIn(DType dtype, const Shape& local,
                                                           int64_t first_row, int64_t rows,
                                                           int64_t max_bytes, char* slice,
                                                           CopyFn copy);

  // Copies a tile into place; `bytes` are its row-major bytes, possibly split into pieces.
  // INVALID_ARGUMENT naming the tile when it has the wrong rank, leaves the band, overlaps an
  // earlier tile, or its bytes do not match its volume; nothing is copied then.
  absl::Status Add(const Box& tile, const std::vector<std::string_view>& bytes);

  bool complete() const { return covered_ == volume_; }
  const Box& box() const { return band_; }
  // The band's row-major bytes (complete once complete()), in its own buffer or the lent memory.
  std::string_view bytes() const { return std::string_view(memory_, size_); }

 private:
  TileBand(DType dtype, Box band, int64_t volume, size_t size, char* memory, CopyFn copy)
      : dtype_(dtype),
        band_(std::move(band)),
        volume_(volume),
        size_(size),
        buffer_(memory == nullptr ? new char[size] : nullptr),
        memory_(memory == nullptr ? buffer_.get() : memory),
        copy_(copy) {}

  // The checks of Start; the band's box and its volume in elements.
  static absl::StatusOr<std::pair<Box, int64_t>> CheckBand(DType dtype, const Shape& local,
                                                           int64_t first_row, int64_t rows,
                                                           int64_t max_bytes);

  const DType dtype_;
  const Box band_;
  const int64_t volume_;                  // elements
  const size_t size_;                     // bytes
  const std::unique_ptr<char[]> buffer_;  // null when the memory is lent
  char* const memory_;                    // the band's first byte
  const CopyFn copy_;                     // null: memcpy
  std::vector<Box> tiles_;                // added so far
  int64_t covered_ = 0;                   // elements
};

}  // namespace ckpt

#endif  // CKPT_CORE_TILE_BAND_H_
