#include "core/tile_band.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"

namespace ckpt {

absl::StatusOr<std::pair<Box, int64_t>> TileBand::CheckBand(DType dtype, const Shape& local,
                                                            int64_t first_row, int64_t rows,
                                                            int64_t max_bytes) {
  if (local.empty()) return absl::InvalidArgumentError("a scalar has no bands of rows");
  if (ElementBits(dtype) % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bands of ", std::string(DTypeName(dtype)),
                                                   " (sub-byte elements) are not tiled"));
  }
  // first_row <= local[0] first, so that local[0] - first_row cannot overflow.
  if (first_row < 0 || rows <= 0 || first_row > local[0] || rows > local[0] - first_row) {
    return absl::InvalidArgumentError(absl::StrCat("band of ", rows, " rows from row ", first_row,
                                                   " outside a slice of ", local[0], " rows"));
  }
  Box band = Box::Whole(local);
  band.lo[0] = first_row;
  band.hi[0] = first_row + rows;
  CKPT_ASSIGN_OR_RETURN(const int64_t volume, band.Volume());
  CKPT_ASSIGN_OR_RETURN(const int64_t size, ByteSizeOf(dtype, volume));
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("band ", band.ToString(), " of ", size,
                                                   " bytes exceeds the limit of ", max_bytes));
  }
  return std::pair<Box, int64_t>(std::move(band), volume);
}

absl::StatusOr<std::unique_ptr<TileBand>> TileBand::Start(DType dtype, const Shape& local,
                                                          int64_t first_row, int64_t rows,
                                                          int64_t max_bytes) {
  CKPT_ASSIGN_OR_RETURN(auto band, CheckBand(dtype, local, first_row, rows, max_bytes));
  CKPT_ASSIGN_OR_RETURN(const int64_t size, ByteSizeOf(dtype, band.second));
  return std::unique_ptr<TileBand>(new TileBand(dtype, std::move(band.first), band.second,
                                                static_cast<size_t>(size), nullptr, nullptr));
}

absl::StatusOr<std::unique_ptr<TileBand>> TileBand::StartIn(DType dtype, const Shape& local,
                                                            int64_t first_row, int64_t rows,
                                                            int64_t max_bytes, char* slice,
                                                            CopyFn copy) {
  CKPT_ASSIGN_OR_RETURN(auto band, CheckBand(dtype, local, first_row, rows, max_bytes));
  CKPT_ASSIGN_OR_RETURN(const int64_t size, ByteSizeOf(dtype, band.second));
  // The band's rows are whole rows of the slice: its bytes start first_row rows into it.
  CKPT_ASSIGN_OR_RETURN(const int64_t first, ByteSizeOf(dtype, band.second / rows * first_row));
  return std::unique_ptr<TileBand>(new TileBand(dtype, std::move(band.first), band.second,
                                                static_cast<size_t>(size), slice + first, copy));
}

absl::Status TileBand::Add(const Box& tile, const std::vector<std::string_view>& bytes) {
  if (tile.rank() != band_.rank() || tile.empty() || !band_.Contains(tile)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", tile.ToString(), " is not inside band ", band_.ToString()));
  }
  for (const Box& earlier : tiles_) {
    if (Intersect(earlier, tile)) {
      return absl::InvalidArgumentError(absl::StrCat("tile ", tile.ToString(), " overlaps tile ",
                                                     earlier.ToString(), " of the band"));
    }
  }
  CKPT_ASSIGN_OR_RETURN(const int64_t volume, tile.Volume());
  CKPT_ASSIGN_OR_RETURN(const int64_t expected, ByteSizeOf(dtype_, volume));
  size_t got = 0;
  for (std::string_view b : bytes) got += b.size();
  if (got != static_cast<size_t>(expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", tile.ToString(), " has ", got, " bytes, expected ", expected));
  }
  // The tile's rows (runs along the last dim) in order, each copied straight from the pieces to
  // its place in the band: no gathering copy when the bytes come in several pieces.
  const size_t rank = band_.rank();
  const int64_t elem = ElementBits(dtype_) / 8;
  const auto run = static_cast<size_t>(tile.extent(rank - 1) * elem);
  std::vector<int64_t> lo(tile.lo.begin(), tile.lo.end() - 1);
  std::vector<int64_t> hi(tile.hi.begin(), tile.hi.end() - 1);
  std::vector<int64_t> index = lo;
  size_t piece = 0, offset = 0;
  do {
    int64_t at = 0;  // element offset of the run in the band
    for (size_t d = 0; d + 1 < rank; ++d) at = at * band_.extent(d) + (index[d] - band_.lo[d]);
    at = at * band_.extent(rank - 1) + (tile.lo[rank - 1] - band_.lo[rank - 1]);
    char* dst = memory_ + at * elem;
    for (size_t left = run; left > 0;) {
      const size_t take = std::min(left, bytes[piece].size() - offset);
      if (copy_ != nullptr) {
        copy_(dst, bytes[piece].data() + offset, take);
      } else {
        std::memcpy(dst, bytes[piece].data() + offset, take);
      }
      dst += take;
      left -= take;
      offset += take;
      if (offset == bytes[piece].size()) {
        ++piece;
        offset = 0;
      }
    }
  } while (NextIndex(index, lo, hi));
  tiles_.push_back(tile);
  covered_ += volume;
  return absl::OkStatus();
}

}  // namespace ckpt
