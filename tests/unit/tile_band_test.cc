#include "core/tile_band.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// Brute force: the row-major bytes of `box` inside a row-major array of `shape` whose elements
// are `elem` bytes, gathered element by element.
std::string Gather(const std::string& array, const Shape& shape, const Box& box, int elem) {
  std::string out;
  std::vector<int64_t> index = box.lo;
  do {
    int64_t offset = 0;
    for (size_t d = 0; d < shape.size(); ++d) offset = offset * shape[d] + index[d];
    out.append(array, static_cast<size_t>(offset * elem), static_cast<size_t>(elem));
  } while (NextIndex(index, box.lo, box.hi));
  return out;
}

// Cuts `box` into random disjoint boxes that cover it (guillotine cuts on random dims).
void Cut(const Box& box, std::mt19937_64& rng, int depth, std::vector<Box>* out) {
  std::vector<size_t> cuttable;
  for (size_t d = 0; d < box.rank(); ++d) {
    if (box.extent(d) > 1) cuttable.push_back(d);
  }
  if (cuttable.empty() || depth == 0 || rng() % 4 == 0) {
    out->push_back(box);
    return;
  }
  const size_t d = cuttable[rng() % cuttable.size()];
  const int64_t at = box.lo[d] + 1 + static_cast<int64_t>(rng() % (box.extent(d) - 1));
  Box a = box, b = box;
  a.hi[d] = at;
  b.lo[d] = at;
  Cut(a, rng, depth - 1, out);
  Cut(b, rng, depth - 1, out);
}

// Random slices, bands and tilings, tiles added in random order with their bytes split into
// random pieces: the band must equal the brute-force gather of its rows, and be complete exactly
// when the last tile arrives.
TEST(TileBandTest, RandomTilingsAssembleTheBand) {
  const uint64_t seed = testing::PropertySeed(11);
  std::mt19937_64 rng(seed);
  const DType dtypes[] = {DType::kFloat32, DType::kBFloat16, DType::kUInt8, DType::kFloat64};
  for (int trial = 0; trial < 500; ++trial) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " trial " << trial);
    const DType dtype = dtypes[rng() % 4];
    const int elem = ElementBits(dtype) / 8;
    Shape local(1 + rng() % 3);
    for (int64_t& d : local) d = 1 + static_cast<int64_t>(rng() % 9);
    int64_t elements = 1;
    for (int64_t d : local) elements *= d;
    std::string array(static_cast<size_t>(elements * elem), '\0');
    for (char& c : array) c = static_cast<char>(rng());
    const int64_t first = static_cast<int64_t>(rng() % local[0]);
    const int64_t rows = 1 + static_cast<int64_t>(rng() % (local[0] - first));
    auto band = TileBand::Start(dtype, local, first, rows, int64_t{1} << 20);
    ASSERT_TRUE(band.ok()) << band.status();
    std::vector<Box> tiles;
    Cut((*band)->box(), rng, 6, &tiles);
    std::shuffle(tiles.begin(), tiles.end(), rng);
    for (size_t i = 0; i < tiles.size(); ++i) {
      ASSERT_FALSE((*band)->complete());
      const std::string bytes = Gather(array, local, tiles[i], elem);
      std::vector<std::string_view> pieces;
      for (size_t pos = 0; pos < bytes.size();) {
        const size_t n = std::min(bytes.size() - pos, 1 + static_cast<size_t>(rng() % 16));
        pieces.push_back(std::string_view(bytes).substr(pos, n));
        pos += n;
      }
      ASSERT_TRUE((*band)->Add(tiles[i], pieces).ok()) << tiles[i].ToString();
    }
    ASSERT_TRUE((*band)->complete());
    EXPECT_EQ((*band)->bytes(), Gather(array, local, (*band)->box(), elem));
  }
}

// Random boxes inside a band, added one by one: each is refused as overlapping exactly when a
// brute-force comparison with every box accepted before finds an overlap (the band keeps its
// tiles grouped by their extent in the leading dims, so groups of equal, intersecting and
// disjoint leading extents all occur), and the message names an earlier tile it overlaps.
TEST(TileBandTest, OverlapsAreFoundExactlyAsByBruteForce) {
  const uint64_t seed = testing::PropertySeed(12);
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " trial " << trial);
    Shape local(1 + rng() % 3);
    for (int64_t& d : local) d = 1 + static_cast<int64_t>(rng() % 6);
    auto band = TileBand::Start(DType::kUInt8, local, 0, local[0], int64_t{1} << 20);
    ASSERT_TRUE(band.ok()) << band.status();
    // Leading extents drawn from a few choices, so that tiles often share them.
    std::vector<Box> accepted;
    for (int i = 0; i < 40 && !(*band)->complete(); ++i) {
      Box tile = (*band)->box();
      for (size_t d = 0; d < local.size(); ++d) {
        const int64_t extent = (*band)->box().extent(d);
        const bool coarse = d + 1 < local.size() && rng() % 2 == 0;
        const int64_t a = coarse ? 0 : static_cast<int64_t>(rng() % extent);
        const int64_t b = coarse ? extent : a + 1 + static_cast<int64_t>(rng() % (extent - a));
        tile.lo[d] = a;
        tile.hi[d] = b;
      }
      bool overlaps = false;
      for (const Box& earlier : accepted) overlaps = overlaps || Intersect(earlier, tile);
      const std::string bytes(static_cast<size_t>(*tile.Volume()), 't');
      const absl::Status s = (*band)->Add(tile, {bytes});
      if (overlaps) {
        EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << tile.ToString();
        // The named tile is one accepted before that the new one overlaps.
        const std::string message(s.message());
        bool named = false;
        for (const Box& earlier : accepted) {
          named =
              named || (Intersect(earlier, tile) &&
                        message.find("overlaps tile " + earlier.ToString()) != std::string::npos);
        }
        EXPECT_TRUE(named) << message;
      } else {
        ASSERT_TRUE(s.ok()) << tile.ToString() << ": " << s;
        accepted.push_back(tile);
      }
    }
    int64_t covered = 0;
    for (const Box& t : accepted) covered += *t.Volume();
    EXPECT_EQ((*band)->complete(), covered == *(*band)->box().Volume());
  }
}

// Tiles of rank above the inline odometer's (8 dims) assemble as well.
TEST(TileBandTest, HighRankTilesAssemble) {
  const Shape local = {2, 1, 2, 1, 1, 2, 1, 1, 1, 3};  // rank 10
  int64_t elements = 1;
  for (int64_t d : local) elements *= d;
  std::string array(static_cast<size_t>(elements * 2), '\0');
  for (size_t i = 0; i < array.size(); ++i) array[i] = static_cast<char>('a' + i % 26);
  auto band = TileBand::Start(DType::kFloat16, local, 0, 2, 1 << 20);
  ASSERT_TRUE(band.ok()) << band.status();
  std::mt19937_64 rng(7);
  std::vector<Box> tiles;
  Cut((*band)->box(), rng, 8, &tiles);
  for (const Box& t : tiles) {
    ASSERT_TRUE((*band)->Add(t, {Gather(array, local, t, 2)}).ok()) << t.ToString();
  }
  ASSERT_TRUE((*band)->complete());
  EXPECT_EQ((*band)->bytes(), array);
}

TEST(TileBandTest, BadTilesAndBandsAreRefusedNamingThem) {
  auto band = TileBand::Start(DType::kFloat32, {4, 6}, 1, 2, 1 << 20);  // rows [1, 3)
  ASSERT_TRUE(band.ok()) << band.status();
  const Box left{{1, 0}, {3, 3}};
  const std::string left_bytes(2 * 3 * 4, 'a');
  ASSERT_TRUE((*band)->Add(left, {left_bytes}).ok());
  struct Case {
    Box tile;
    size_t bytes;
    const char* error;
  };
  const Case cases[] = {
      {{{1, 2}, {3, 6}}, 2 * 4 * 4, "overlaps tile [1:3, 0:3]"},
      {{{0, 3}, {2, 6}}, 2 * 3 * 4, "is not inside band [1:3, 0:6]"},
      {{{1, 3}, {3, 7}}, 2 * 4 * 4, "is not inside band"},
      {{{1}, {3}}, 2 * 4, "is not inside band"},    // wrong rank
      {{{1, 3}, {3, 3}}, 0, "is not inside band"},  // empty
      {{{1, 3}, {3, 6}}, 2 * 3 * 4 - 1, "has 23 bytes, expected 24"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tile.ToString());
    const std::string bytes(c.bytes, 'b');
    const absl::Status s = (*band)->Add(c.tile, {bytes});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.error));
  }
  EXPECT_FALSE((*band)->complete());  // nothing of the refused tiles counted
  ASSERT_TRUE((*band)->Add({{1, 3}, {3, 6}}, {std::string(24, 'c')}).ok());
  EXPECT_TRUE((*band)->complete());
  EXPECT_EQ((*band)->bytes(), std::string(12, 'a') + std::string(12, 'c') + std::string(12, 'a') +
                                  std::string(12, 'c'));

  EXPECT_THAT(std::string(TileBand::Start(DType::kFloat32, {}, 0, 1, 1 << 20).status().message()),
              HasSubstr("scalar"));
  EXPECT_THAT(std::string(TileBand::Start(DType::kInt4, {4, 6}, 0, 1, 1 << 20).status().message()),
              HasSubstr("sub-byte"));
  EXPECT_THAT(
      std::string(TileBand::Start(DType::kFloat32, {4, 6}, 3, 2, 1 << 20).status().message()),
      HasSubstr("outside a slice of 4 rows"));
  EXPECT_THAT(std::string(TileBand::Start(DType::kFloat32, {4, 6}, 0, 4, 95).status().message()),
              HasSubstr("of 96 bytes exceeds the limit of 95"));
}

size_t copied_by_hook = 0;
void CountingCopy(char* dst, const char* src, size_t n) {
  copied_by_hook += n;
  std::memcpy(dst, src, n);
}

// In lent memory the band's rows land where they lie in the slice, through the caller's copy
// function, and nothing outside the band's rows is touched, refused tiles included.
TEST(TileBandTest, LentMemoryGetsTheBandInPlace) {
  // A 4 x 6 float32 slice; the band is rows [1, 3), tiled as two column halves.
  std::string slice(4 * 6 * 4, '.');
  copied_by_hook = 0;
  auto band =
      TileBand::StartIn(DType::kFloat32, {4, 6}, 1, 2, 1 << 20, slice.data(), &CountingCopy);
  ASSERT_TRUE(band.ok()) << band.status();
  EXPECT_EQ((*band)->bytes().data(), slice.data() + 6 * 4);  // row 1
  EXPECT_FALSE((*band)->Add({{1, 2}, {3, 9}}, {std::string(2 * 7 * 4, 'x')}).ok());
  ASSERT_TRUE((*band)->Add({{1, 3}, {3, 6}}, {std::string(24, 'r')}).ok());
  ASSERT_TRUE((*band)->Add({{1, 0}, {3, 3}}, {std::string(12, 'l'), std::string(12, 'l')}).ok());
  EXPECT_TRUE((*band)->complete());
  EXPECT_EQ(copied_by_hook, 48u);
  const std::string row = std::string(12, 'l') + std::string(12, 'r');
  EXPECT_EQ(slice, std::string(24, '.') + row + row + std::string(24, '.'));
  // The checks of Start hold in lent memory too.
  EXPECT_THAT(
      std::string(TileBand::StartIn(DType::kFloat32, {4, 6}, 3, 2, 1 << 20, slice.data(), nullptr)
                      .status()
                      .message()),
      HasSubstr("outside a slice of 4 rows"));
}

// A slice shape from the wire may have a negative first dimension: no band of it exists, and
// finding that out must not overflow (local[0] - first_row for local[0] = INT64_MIN).
TEST(TileBandTest, NegativeRowCountsHaveNoBands) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  for (int64_t first : {int64_t{0}, int64_t{1}, int64_t{5}}) {
    auto band = TileBand::Start(DType::kInt8, {kMin, 1}, first, 1, 1 << 20);
    EXPECT_EQ(band.status().code(), absl::StatusCode::kInvalidArgument) << first;
    EXPECT_THAT(std::string(band.status().message()), HasSubstr("outside a slice of")) << first;
  }
  EXPECT_FALSE(TileBand::Start(DType::kInt8, {-3, 1}, 0, 1, 1 << 20).ok());
}

}  // namespace
}  // namespace ckpt
