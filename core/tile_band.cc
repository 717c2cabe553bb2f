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
  if (tile.lo.size() != tile.hi.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", tile.ToString(), " is not inside band ", band_.ToString()));
  }
  return Add(absl::MakeConstSpan(tile.lo), absl::MakeConstSpan(tile.hi), bytes);
}

std::optional<Box> TileBand::FindOverlap(absl::Span<const int64_t> lo,
                                         absl::Span<const int64_t> hi) const {
  const size_t outer = lo.size() - 1;  // dims of a group's key
  const int64_t a = lo[outer], b = hi[outer];
  for (const Group& g : groups_) {
    // Tiles of the group meet the new one in dims [0, outer) iff the group's key does.
    bool meets = true;
    for (size_t d = 0; d < outer && meets; ++d) meets = g.lo[d] < hi[d] && lo[d] < g.hi[d];
    if (!meets) continue;
    // The group's intervals are disjoint and sorted: the first one ending after `a` is the only
    // candidate to start before `b`.
    auto it = std::upper_bound(
        g.intervals.begin(), g.intervals.end(), a,
        [](int64_t v, const std::pair<int64_t, int64_t>& iv) { return v < iv.second; });
    if (it == g.intervals.end() || it->first >= b) continue;
    Box earlier;
    earlier.lo.assign(g.lo.begin(), g.lo.end());
    earlier.hi.assign(g.hi.begin(), g.hi.end());
    earlier.lo.push_back(it->first);
    earlier.hi.push_back(it->second);
    return earlier;
  }
  return std::nullopt;
}

void TileBand::Record(absl::Span<const int64_t> lo, absl::Span<const int64_t> hi) {
  const size_t outer = lo.size() - 1;
  Group* group = nullptr;
  for (Group& g : groups_) {
    if (std::equal(g.lo.begin(), g.lo.end(), lo.begin()) &&
        std::equal(g.hi.begin(), g.hi.end(), hi.begin())) {
      group = &g;
      break;
    }
  }
  if (group == nullptr) {
    group = &groups_.emplace_back();
    group->lo.assign(lo.begin(), lo.begin() + outer);
    group->hi.assign(hi.begin(), hi.begin() + outer);
  }
  // Disjoint from every interval of the group (FindOverlap), so sorted by either bound.
  const std::pair<int64_t, int64_t> interval(lo[outer], hi[outer]);
  group->intervals.insert(
      std::lower_bound(group->intervals.begin(), group->intervals.end(), interval), interval);
}

absl::Status TileBand::Add(absl::Span<const int64_t> lo, absl::Span<const int64_t> hi,
                           const std::vector<std::string_view>& bytes) {
  const size_t rank = band_.rank();
  auto tile_string = [&] {
    Box tile;
    tile.lo.assign(lo.begin(), lo.end());
    tile.hi.assign(hi.begin(), hi.end());
    return tile.ToString();
  };
  // Inside the band (so not empty, and its volume fits in the band's).
  bool inside = lo.size() == rank && hi.size() == rank;
  for (size_t d = 0; d < rank && inside; ++d) {
    inside = band_.lo[d] <= lo[d] && lo[d] < hi[d] && hi[d] <= band_.hi[d];
  }
  if (!inside) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", tile_string(), " is not inside band ", band_.ToString()));
  }
  if (std::optional<Box> earlier = FindOverlap(lo, hi)) {
    return absl::InvalidArgumentError(absl::StrCat("tile ", tile_string(), " overlaps tile ",
                                                   earlier->ToString(), " of the band"));
  }
  int64_t volume = 1;
  for (size_t d = 0; d < rank; ++d) volume *= hi[d] - lo[d];
  const int64_t elem = ElementBits(dtype_) / 8;
  const int64_t expected = volume * elem;
  size_t got = 0;
  for (std::string_view b : bytes) got += b.size();
  if (got != static_cast<size_t>(expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tile ", tile_string(), " has ", got, " bytes, expected ", expected));
  }
  // The tile's runs in row-major order, each copied straight from the pieces to its place in the
  // band: no gathering copy when the bytes come in several pieces. A run is the tile's extent of
  // the last dim, and of the dims before it while the tile spans them whole (dims [outer, rank)).
  size_t outer = rank - 1;
  int64_t run_elements = hi[outer] - lo[outer];
  while (outer > 0 && lo[outer] == band_.lo[outer] && hi[outer] == band_.hi[outer]) {
    --outer;
    run_elements *= hi[outer] - lo[outer];
  }
  const auto run = static_cast<size_t>(run_elements * elem);
  // Element strides of the band, and the odometer over dims [0, outer) (no allocation for ranks
  // up to kInlineRank).
  constexpr size_t kInlineRank = 8;
  int64_t stride_inline[kInlineRank], index_inline[kInlineRank];
  std::vector<int64_t> stride_heap, index_heap;
  int64_t* stride = stride_inline;
  int64_t* index = index_inline;
  if (rank > kInlineRank) {
    stride_heap.resize(rank);
    index_heap.resize(rank);
    stride = stride_heap.data();
    index = index_heap.data();
  }
  stride[rank - 1] = 1;
  for (size_t d = rank - 1; d-- > 0;) stride[d] = stride[d + 1] * band_.extent(d + 1);
  int64_t at = 0;  // element offset of the current run in the band
  for (size_t d = 0; d < rank; ++d) at += (lo[d] - band_.lo[d]) * stride[d];
  for (size_t d = 0; d < outer; ++d) index[d] = lo[d];
  size_t piece = 0, offset = 0;
  while (true) {
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
    if (outer == 0) break;  // one run
    // The next run: advance the odometer over dims [0, outer).
    bool advanced = false;
    for (size_t d = outer; d-- > 0;) {
      if (++index[d] < hi[d]) {
        at += stride[d];
        advanced = true;
        break;
      }
      at -= (hi[d] - 1 - lo[d]) * stride[d];
      index[d] = lo[d];
    }
    if (!advanced) break;
  }
  Record(lo, hi);
  covered_ += volume;
  return absl::OkStatus();
}

}  // namespace ckpt
