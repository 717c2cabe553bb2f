// How a stored slice (one distinct source box) is cut into chunks. Pure geometry.
//
// A chunk is a tile of the slice: some rows of dim 0, every index of the middle dims, and a band
// of columns of the last dim. Cutting columns as well as rows keeps column re-splits from reading
// whole rows, and tiles of ~1 MiB keep row re-splits close to what they need. Chunks are numbered
// row-major over the tile grid, so one slice is a contiguous key range, and one band of tile rows
// (every column tile of some rows) is contiguous in the upload's row-major byte stream.
//
// A slice of at most one target chunk is cut into bands of rows only. Its column tiles would be
// chunks of a few KiB (a 300 KiB slice of 4 KiB rows would be 24 chunks of 16 KiB), whose per-chunk
// costs dominate every fetch of it, and they would keep row re-splits of it (the common case for
// such slices) from sending ranges of its chunks as they lie; a column re-split of it reads its
// rows whole, at most one target chunk per slice, as a row re-split reads a whole chunk at a
// boundary.
#ifndef CKPT_CORE_CHUNK_GRID_H_
#define CKPT_CORE_CHUNK_GRID_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/box.h"

namespace ckpt {

struct ChunkGridOptions {
  // Target bytes per chunk (a tile may be smaller at the edges, or larger when one row of one
  // column band already exceeds it). Default 1 MiB.
  int64_t target_chunk_bytes = int64_t{1} << 20;
  // Most column bands the last dim is cut into. Default 8.
  int64_t max_column_tiles = 8;
  // A column band is at least this many bytes wide, so that copies stay memcpy-efficient.
  int64_t min_column_bytes = 512;
  // A slice is cut into at least this many bands of rows (when chunks stay at least
  // min_chunk_bytes): a row re-split then re-reads at most one band per boundary, even when the
  // whole slice would fit one target-sized chunk.
  int64_t min_row_bands = 8;
  int64_t min_chunk_bytes = int64_t{16} << 10;
};

// Value type, immutable once made.
class ChunkGrid {
 public:
  // For a slice of `shape` with `elem_bits` bits per element (4 for Int4: then the last dim is
  // handled in byte pairs and tile column boundaries stay even).
  static absl::StatusOr<ChunkGrid> Make(const Shape& shape, int elem_bits,
                                        const ChunkGridOptions& options = {});
  // Rebuilds a grid recorded in a manifest (shape + tile shape).
  static absl::StatusOr<ChunkGrid> FromTile(const Shape& shape, const Shape& tile, int elem_bits);
  // FromTile into this grid, reusing its storage (hot loops). On an error the grid is left
  // unusable until the next successful Reset.
  absl::Status Reset(const Shape& shape, const Shape& tile, int elem_bits);

  const Shape& shape() const { return shape_; }
  const Shape& tile() const { return tile_; }
  int elem_bits() const { return elem_bits_; }
  // Tiles per dim and in total.
  const std::vector<int64_t>& tiles_per_dim() const { return tiles_per_dim_; }
  int64_t chunk_count() const { return chunk_count_; }
  // Number of chunks in one band of tile rows (= column tiles; middle dims are never cut).
  int64_t chunks_per_band() const;
  // Rows of dim 0 in each band (the last band may be shorter).
  int64_t band_rows() const { return tile_.empty() ? 1 : tile_[0]; }

  // The box (slice-local coordinates) of chunk `index`.
  Box ChunkBox(int64_t index) const;
  // The same into `*out`, reusing its storage (hot loops).
  void ChunkBox(int64_t index, Box* out) const;
  // Bytes of chunk `index`.
  int64_t ChunkBytes(int64_t index) const;
  // Total bytes of the slice.
  int64_t total_bytes() const { return total_bytes_; }
  // Indexes of the chunks overlapping `region` (slice-local coordinates), ascending.
  std::vector<int64_t> ChunksOverlapping(const Box& region) const;
  // The same into `*out` (cleared first), reusing its storage (hot loops).
  void ChunksOverlapping(const Box& region, std::vector<int64_t>* out) const;

 private:
  Shape shape_;
  Shape tile_;
  int elem_bits_ = 8;
  std::vector<int64_t> tiles_per_dim_;
  int64_t chunk_count_ = 1;
  int64_t total_bytes_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_CORE_CHUNK_GRID_H_
