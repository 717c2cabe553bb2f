// Assembles a band of rows of a tensor slice from tiles: boxes of the slice with their row-major
// bytes, in any order. A Fetch client uses it for bands the server sends as the stored chunks'
// regions instead of assembling them itself (FetchData.tile_box): the copy moves from the server,
// whose one producer thread per stream is the bottleneck, to the client, and whole stored chunks
// reach the client with their stored checksums.
#ifndef CKPT_CORE_TILE_BAND_H_
#define CKPT_CORE_TILE_BAND_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/box.h"
#include "core/dtype.h"

namespace ckpt {

// Rows [first_row, first_row + rows) (dim 0) of a row-major array of shape `local`, every other
// dim whole. Tiles must lie inside the band and not overlap; the band is complete once their
// volumes add up to its own, and then they tile it exactly. Assembled in a buffer of its own
// (Start) or in memory the caller lends (StartIn). Not thread-safe.
//
// A band of a column re-split holds dozens of tiles of a few KiB each, so the per-tile work is
// kept small: adding a tile allocates only to start a new group of tiles or grow a group's list
// (amortised), and finding an overlap costs O(groups x log tiles). Tiles are grouped by their
// extent in every dim but the last (the stack of chunk rows they come from); a group's last-dim
// intervals are kept sorted and disjoint, so the one earlier tile of a group that could overlap
// a new one is found by binary search.
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
  // The same, for the tile with corners `lo` and `hi` (given without building a Box).
  absl::Status Add(absl::Span<const int64_t> lo, absl::Span<const int64_t> hi,
                   const std::vector<std::string_view>& bytes);

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

  // Tiles added so far with the same extent in dims [0, rank - 1): their last-dim intervals,
  // sorted by lower bound and disjoint (so sorted by upper bound too).
  struct Group {
    std::vector<int64_t> lo, hi;                         // dims [0, rank - 1)
    std::vector<std::pair<int64_t, int64_t>> intervals;  // [lo, hi) of the last dim
  };

  // The earlier tile that overlaps the tile (lo, hi), if any, as a Box (for the message).
  std::optional<Box> FindOverlap(absl::Span<const int64_t> lo, absl::Span<const int64_t> hi) const;
  // Records an added tile (after FindOverlap found none).
  void Record(absl::Span<const int64_t> lo, absl::Span<const int64_t> hi);

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
  std::vector<Group> groups_;             // the tiles added so far
  int64_t covered_ = 0;                   // elements
};

}  // namespace ckpt

#endif  // CKPT_CORE_TILE_BAND_H_
