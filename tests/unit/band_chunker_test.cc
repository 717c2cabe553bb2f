#include "core/band_chunker.h"

#include <iostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

// Brute force: the bytes of `box` (element coordinates) of a row-major slice of `shape`, gathered
// byte by byte. Elements are whole bytes, or Int4 pairs along an even-bounded last dim, so the
// slice is treated as a byte array whose last dim is scaled by the element size.
std::string GatherBox(const std::string& slice, const Shape& shape, const Box& box, int bits) {
  if (shape.empty()) return slice;
  Shape bytes_shape = shape;
  Box bytes_box = box;
  bytes_shape.back() = shape.back() * bits / 8;
  bytes_box.lo.back() = box.lo.back() * bits / 8;
  bytes_box.hi.back() = box.hi.back() * bits / 8;
  std::string out;
  std::vector<int64_t> index = bytes_box.lo;
  const size_t rank = shape.size();
  while (true) {
    int64_t offset = 0;
    for (size_t d = 0; d < rank; ++d) offset = offset * bytes_shape[d] + index[d];
    out.push_back(slice[static_cast<size_t>(offset)]);
    size_t d = rank;
    while (d > 0) {
      --d;
      if (++index[d] < bytes_box.hi[d]) break;
      index[d] = bytes_box.lo[d];
      if (d == 0) return out;
    }
  }
}

TEST(BandChunkerTest, RandomGridsAndCutsMatchBruteForce) {
  const uint64_t seed = testing::PropertySeed(5);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  std::cout << "BandChunkerTest.RandomGridsAndCutsMatchBruteForce seed " << seed << "\n";
  testing::Rng rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int tested = 0, column_tiles = 0, middle_dims_and_tiles = 0, int4_tiles = 0, short_last = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int bits = std::vector<int>{4, 8, 16, 32, 64}[uniform(0, 4)];
    Shape shape(static_cast<size_t>(uniform(0, 4)));
    for (size_t d = 0; d < shape.size(); ++d) {
      shape[d] = d + 1 == shape.size() ? uniform(1, 160) : d == 0 ? uniform(1, 24) : uniform(1, 5);
    }
    if (bits == 4 && !shape.empty() && shape.back() % 2 != 0) ++shape.back();
    ChunkGridOptions options;
    options.target_chunk_bytes = uniform(16, 4096);
    options.max_column_tiles = uniform(1, 8);
    options.min_column_bytes = uniform(1, 16);
    options.min_row_bands = uniform(1, 8);
    options.min_chunk_bytes = uniform(1, 256);
    auto grid = ChunkGrid::Make(shape, bits, options);
    ASSERT_TRUE(grid.ok()) << grid.status();
    std::string slice(static_cast<size_t>(grid->total_bytes()), '\0');
    for (char& c : slice) c = static_cast<char>(rng());

    BandChunker chunker(*grid);
    if (chunker.chunks_per_band() > 1) {
      ++column_tiles;
      if (shape.size() >= 3) ++middle_dims_and_tiles;
      if (bits == 4) ++int4_tiles;
    }
    if (!shape.empty() && shape[0] % grid->band_rows() != 0) ++short_last;
    int64_t offset = 0;  // of the band in the slice's row-major bytes
    for (int64_t band = 0; band < chunker.bands(); ++band) {
      chunker.Start(band);
      ASSERT_EQ(chunker.band(), band);
      const int64_t band_bytes = chunker.band_bytes();
      while (!chunker.full()) {
        // Pieces of any size; offering more than the band needs must take only the band's part.
        const int64_t piece = uniform(1, std::max<int64_t>(1, band_bytes / 3) + 8);
        const std::string_view offered = std::string_view(slice).substr(
            static_cast<size_t>(offset + chunker.filled()), static_cast<size_t>(piece));
        const int64_t before = chunker.filled();
        const size_t took = chunker.Add(offered);
        ASSERT_EQ(static_cast<int64_t>(took),
                  std::min<int64_t>(static_cast<int64_t>(offered.size()), band_bytes - before));
        ASSERT_EQ(chunker.filled(), before + static_cast<int64_t>(took));
      }
      EXPECT_EQ(chunker.Add("x"), 0u);  // a full band takes nothing more
      int64_t sum = 0;
      for (int64_t k = 0; k < chunker.chunks_per_band(); ++k) {
        const int64_t index = chunker.ChunkIndex(k);
        ASSERT_EQ(chunker.chunk(k), GatherBox(slice, shape, grid->ChunkBox(index), bits))
            << "shape rank " << shape.size() << " bits " << bits << " band " << band << " chunk "
            << index;
        sum += static_cast<int64_t>(chunker.chunk(k).size());
      }
      EXPECT_EQ(sum, band_bytes);
      offset += band_bytes;
    }
    EXPECT_EQ(offset, grid->total_bytes());
    ++tested;
  }
  EXPECT_EQ(tested, 600);
  // The draws cover every kind of band.
  EXPECT_GT(column_tiles, 100);
  EXPECT_GT(middle_dims_and_tiles, 30);
  EXPECT_GT(int4_tiles, 10);
  EXPECT_GT(short_last, 50);
}

TEST(BandChunkerTest, ColumnTilesOfAMatrix) {
  // 8 x 12 bytes, tiles of 4 rows x 4 columns: 2 bands of 3 chunks.
  auto grid = ChunkGrid::FromTile({8, 12}, {4, 4}, 8);
  ASSERT_TRUE(grid.ok()) << grid.status();
  BandChunker chunker(*grid);
  ASSERT_EQ(chunker.bands(), 2);
  ASSERT_EQ(chunker.chunks_per_band(), 3);
  std::string rows;
  for (int r = 0; r < 4; ++r) rows += std::string("aaaabbbbcccc");
  for (char c : rows) ASSERT_EQ(chunker.Add(std::string_view(&c, 1)), 1u);
  ASSERT_TRUE(chunker.full());
  EXPECT_EQ(chunker.chunk(0), std::string(16, 'a'));
  EXPECT_EQ(chunker.chunk(1), std::string(16, 'b'));
  EXPECT_EQ(chunker.chunk(2), std::string(16, 'c'));
  chunker.Start(1);
  EXPECT_EQ(chunker.ChunkIndex(0), 3);
  EXPECT_EQ(chunker.filled(), 0);
}

// In place, each chunk's bytes go to the places it was given, across their boundaries (here a
// chunk split into places of 5, 1 and 10 bytes), in the order they arrive, and nothing is kept in
// the chunker; the next Start goes back to its buffers.
TEST(BandChunkerTest, InPlaceBandsFillTheGivenPlaces) {
  auto grid = ChunkGrid::FromTile({8, 12}, {4, 4}, 8);
  ASSERT_TRUE(grid.ok()) << grid.status();
  BandChunker chunker(*grid);
  std::string memory(48, '.');
  char* m = memory.data();
  // Chunk 0 of band 1 in three places, chunk 1 in one, chunk 2 in two (out of order in memory).
  const std::vector<std::vector<std::span<char>>> places = {
      {{m, 5}, {m + 5, 1}, {m + 6, 10}}, {{m + 16, 16}}, {{m + 40, 8}, {m + 32, 8}}};
  std::vector<std::span<const std::span<char>>> by_chunk(places.begin(), places.end());
  chunker.StartInPlace(1, by_chunk);
  EXPECT_TRUE(chunker.in_place());
  EXPECT_EQ(chunker.ChunkIndex(0), 3);
  std::string rows;
  for (int r = 0; r < 4; ++r) rows += "abcdefghijkl";
  // Pieces of 7 bytes: they cut across lines, segments and places.
  for (size_t at = 0; at < rows.size(); at += 7) {
    const std::string_view piece = std::string_view(rows).substr(at, 7);
    ASSERT_EQ(chunker.Add(piece), piece.size());
  }
  ASSERT_TRUE(chunker.full());
  EXPECT_EQ(memory.substr(0, 16), "abcdabcdabcdabcd");
  EXPECT_EQ(memory.substr(16, 16), "efghefghefghefgh");
  EXPECT_EQ(memory.substr(40, 8) + memory.substr(32, 8), "ijklijklijklijkl");
  EXPECT_EQ(chunker.chunk(0), "");
  EXPECT_EQ(chunker.places(1).size(), 1u);
  chunker.Start(0);
  EXPECT_FALSE(chunker.in_place());
  EXPECT_TRUE(chunker.places(0).empty());
  ASSERT_EQ(chunker.Add(rows), rows.size());
  EXPECT_EQ(chunker.chunk(2), "ijklijklijklijkl");
}

}  // namespace
}  // namespace ckpt
