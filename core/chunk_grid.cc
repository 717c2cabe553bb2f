#include "core/chunk_grid.h"

#include <algorithm>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes of `elements` elements of `elem_bits` bits (Int4 counts are even by construction).
int64_t BytesOf(int64_t elements, int elem_bits) { return elements * elem_bits / 8; }

}  // namespace

absl::StatusOr<ChunkGrid> ChunkGrid::Make(const Shape& shape, int elem_bits,
                                          const ChunkGridOptions& options) {
  if (options.target_chunk_bytes < 1 || options.max_column_tiles < 1 ||
      options.min_column_bytes < 1 || options.min_row_bands < 1 || options.min_chunk_bytes < 1) {
    return absl::InvalidArgumentError("chunk grid options must be positive");
  }
  Shape tile = shape;
  const size_t rank = shape.size();
  if (rank == 0) return FromTile(shape, tile, elem_bits);
  for (int64_t d : shape) {
    if (d < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot chunk a slice of shape ", ShapeToString(shape)));
    }
  }
  // Int4: tile boundaries on the last dim must fall on whole bytes.
  const int64_t col_align = elem_bits == 4 ? 2 : 1;
  // A slice of at most one target chunk is cut into bands of rows only (see the header).
  CKPT_ASSIGN_OR_RETURN(const int64_t slice_elems, NumElements(shape));
  CKPT_ASSIGN_OR_RETURN(const int64_t slice_bits, CheckedMul(slice_elems, elem_bits, "slice size"));
  if (rank >= 2 && slice_bits / 8 > options.target_chunk_bytes) {
    const int64_t last = shape[rank - 1];
    const int64_t last_bytes = BytesOf(last, elem_bits);
    int64_t cols = std::min(options.max_column_tiles,
                            std::max<int64_t>(1, last_bytes / options.min_column_bytes));
    int64_t width = CeilDiv(last, cols);
    width = CeilDiv(width, col_align) * col_align;
    tile[rank - 1] = std::min(width, last);
  }
  // Rows of dim 0 so that a tile is about target_chunk_bytes.
  CKPT_ASSIGN_OR_RETURN(int64_t row_elems, NumElements(Shape(tile.begin() + 1, tile.end())));
  const int64_t row_bytes = std::max<int64_t>(1, BytesOf(row_elems, elem_bits));
  int64_t rows = std::max<int64_t>(1, options.target_chunk_bytes / row_bytes);
  if (options.min_row_bands > 1) {
    const int64_t banded = CeilDiv(shape[0], options.min_row_bands);
    const int64_t floor_rows = CeilDiv(options.min_chunk_bytes, row_bytes);
    rows = std::min(rows, std::max(banded, floor_rows));
  }
  if (rank == 1) rows = CeilDiv(rows, col_align) * col_align;  // 1-D Int4: even element counts
  tile[0] = std::min(rows, shape[0]);
  return FromTile(shape, tile, elem_bits);
}

absl::StatusOr<ChunkGrid> ChunkGrid::FromTile(const Shape& shape, const Shape& tile,
                                              int elem_bits) {
  ChunkGrid g;
  CKPT_RETURN_IF_ERROR(g.Reset(shape, tile, elem_bits));
  return g;
}

absl::Status ChunkGrid::Reset(const Shape& shape, const Shape& tile, int elem_bits) {
  if (tile.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tile ", ShapeToString(tile), " does not match slice shape ", ShapeToString(shape)));
  }
  if (elem_bits != 4 && (elem_bits < 8 || elem_bits % 8 != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported element size ", elem_bits, " bits"));
  }
  ChunkGrid& g = *this;
  g.chunk_count_ = 1;
  g.total_bytes_ = 0;
  g.shape_ = shape;
  g.tile_ = tile;
  g.elem_bits_ = elem_bits;
  g.tiles_per_dim_.resize(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (tile[i] < 1 || tile[i] > shape[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tile ", ShapeToString(tile), " does not fit slice ", ShapeToString(shape)));
    }
    if (i > 0 && i + 1 < shape.size() && tile[i] != shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tile ", ShapeToString(tile), " cuts a middle dim of ", ShapeToString(shape)));
    }
    g.tiles_per_dim_[i] = CeilDiv(shape[i], tile[i]);
    CKPT_ASSIGN_OR_RETURN(g.chunk_count_,
                          CheckedMul(g.chunk_count_, g.tiles_per_dim_[i], "chunk count"));
  }
  if (elem_bits == 4 && !shape.empty()) {
    if (shape.back() % 2 != 0 || (tile.back() % 2 != 0 && tile.back() != shape.back())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Int4 slice ", ShapeToString(shape), " needs an even last dim and even tile columns"));
    }
  }
  CKPT_ASSIGN_OR_RETURN(int64_t elements, NumElements(shape));
  CKPT_RETURN_IF_ERROR(CheckedMul(elements, 8, "slice bytes").status());
  g.total_bytes_ = BytesOf(elements, elem_bits);
  return absl::OkStatus();
}

int64_t ChunkGrid::chunks_per_band() const {
  return tiles_per_dim_.empty() ? 1 : chunk_count_ / tiles_per_dim_[0];
}

Box ChunkGrid::ChunkBox(int64_t index) const {
  Box box;
  ChunkBox(index, &box);
  return box;
}

namespace {

// Calls fn(dim, lo, hi) with chunk `index`'s extent [lo, hi) in each dim, the last dim first
// (chunks are numbered row-major over the tile grid). Allocates nothing: ChunkBox and ChunkBytes
// run per chunk on the fetch path.
template <typename Fn>
void ForEachChunkExtent(const Shape& shape, const Shape& tile,
                        const std::vector<int64_t>& tiles_per_dim, int64_t index, Fn&& fn) {
  for (size_t i = shape.size(); i-- > 0;) {
    const int64_t lo = index % tiles_per_dim[i] * tile[i];
    index /= tiles_per_dim[i];
    fn(i, lo, std::min(shape[i], lo + tile[i]));
  }
}

}  // namespace

void ChunkGrid::ChunkBox(int64_t index, Box* out) const {
  out->lo.resize(shape_.size());
  out->hi.resize(shape_.size());
  ForEachChunkExtent(shape_, tile_, tiles_per_dim_, index, [out](size_t i, int64_t lo, int64_t hi) {
    out->lo[i] = lo;
    out->hi[i] = hi;
  });
}

int64_t ChunkGrid::ChunkBytes(int64_t index) const {
  int64_t elements = 1;
  ForEachChunkExtent(shape_, tile_, tiles_per_dim_, index,
                     [&elements](size_t, int64_t lo, int64_t hi) { elements *= hi - lo; });
  return BytesOf(elements, elem_bits_);
}

std::vector<int64_t> ChunkGrid::ChunksOverlapping(const Box& region) const {
  std::vector<int64_t> out;
  ChunksOverlapping(region, &out);
  return out;
}

void ChunkGrid::ChunksOverlapping(const Box& region, std::vector<int64_t>* out) const {
  out->clear();
  const size_t rank = shape_.size();
  if (rank == 0) {
    out->push_back(0);
    return;
  }
  if (region.rank() != rank || region.empty()) return;
  absl::InlinedVector<int64_t, 8> lo(rank), end(rank);  // tile index range [lo, end) per dim
  for (size_t i = 0; i < rank; ++i) {
    const int64_t a = std::max<int64_t>(0, region.lo[i]);
    const int64_t b = std::min(shape_[i], region.hi[i]);
    if (b <= a) return;
    lo[i] = a / tile_[i];
    end[i] = (b - 1) / tile_[i] + 1;
  }
  absl::InlinedVector<int64_t, 8> idx = lo;
  while (true) {
    int64_t id = 0;
    for (size_t i = 0; i < rank; ++i) id = id * tiles_per_dim_[i] + idx[i];
    out->push_back(id);
    // The next index, row-major (the last dim fastest).
    size_t i = rank;
    while (i-- > 0) {
      if (++idx[i] < end[i]) break;
      idx[i] = lo[i];
    }
    if (i == static_cast<size_t>(-1)) return;
  }
}

}  // namespace ckpt
