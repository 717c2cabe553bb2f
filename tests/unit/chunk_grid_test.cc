#include "core/chunk_grid.h"

#include <set>

#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

TEST(ChunkGridTest, CutsColumnsAndRows) {
  // [4096, 4096] Float32 = 64 MiB: 8 column bands of 512, rows so that a tile is 1 MiB.
  auto g = ChunkGrid::Make({4096, 4096}, 32);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tile(), (Shape{512, 512}));
  EXPECT_EQ(g->chunk_count(), 64);
  EXPECT_EQ(g->chunks_per_band(), 8);
  EXPECT_EQ(g->ChunkBytes(0), 1 << 20);
  EXPECT_EQ(g->total_bytes(), int64_t{64} << 20);
}

TEST(ChunkGridTest, SlicesOfOneTargetChunkGetRowBandsOnly) {
  auto g = ChunkGrid::Make({300, 512}, 32);  // 600 KiB
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->tile()[1], 512);                  // whole rows
  EXPECT_EQ(g->tile()[0], 38);                   // ceil(300 / 8) rows
  auto exact = ChunkGrid::Make({512, 512}, 32);  // exactly 1 MiB
  ASSERT_TRUE(exact.ok());
  EXPECT_EQ(exact->tile()[1], 512);
  EXPECT_EQ(exact->tile()[0], 64);
}

TEST(ChunkGridTest, SlicesBeyondOneTargetChunkGetColumnBands) {
  auto g = ChunkGrid::Make({600, 512}, 32);  // 1.17 MiB
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->tile()[1], 128);                 // 4 column bands of 512 bytes
  EXPECT_EQ(g->tile()[0], 75);                  // ceil(600 / 8) rows
  auto int4 = ChunkGrid::Make({513, 4096}, 4);  // 1 MiB + one row of 2 KiB
  ASSERT_TRUE(int4.ok());
  EXPECT_EQ(int4->tile()[1], 1024);  // 4 column bands of 512 bytes
}

TEST(ChunkGridTest, ScalarsAndVectors) {
  auto s = ChunkGrid::Make({}, 64);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->chunk_count(), 1);
  EXPECT_EQ(s->ChunkBytes(0), 8);
  EXPECT_EQ(s->ChunksOverlapping(Box::Whole({})), std::vector<int64_t>{0});
  auto v = ChunkGrid::Make({1 << 20}, 8);  // 1 MiB of bytes: 8 bands of 128 KiB
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(v->chunk_count(), 8);
}

TEST(ChunkGridTest, Int4KeepsEvenColumnBoundaries) {
  auto g = ChunkGrid::Make(
      {64, 4098}, 4, {.target_chunk_bytes = 4096, .max_column_tiles = 8, .min_column_bytes = 16});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->tile()[1] % 2, 0);
  for (int64_t c = 0; c < g->chunk_count(); ++c) {
    const Box b = g->ChunkBox(c);
    EXPECT_EQ(b.lo[1] % 2, 0);
    EXPECT_EQ((b.hi[1] - b.lo[1]) % 2, 0);
  }
  EXPECT_FALSE(ChunkGrid::Make({4, 5}, 4).ok());  // odd last dim cannot be packed
}

TEST(ChunkGridTest, FromTileRejectsBadRecords) {
  EXPECT_FALSE(ChunkGrid::FromTile({4, 4}, {4}, 32).ok());
  EXPECT_FALSE(ChunkGrid::FromTile({4, 4}, {0, 4}, 32).ok());
  EXPECT_FALSE(ChunkGrid::FromTile({4, 4}, {5, 4}, 32).ok());
  EXPECT_FALSE(ChunkGrid::FromTile({4, 4, 4}, {2, 2, 4}, 32).ok());  // middle dims are never cut
  EXPECT_FALSE(ChunkGrid::FromTile({4}, {2}, 12).ok());
  EXPECT_FALSE(ChunkGrid::Make({0, 4}, 32).ok());
}

// Chunks tile the slice exactly, and ChunksOverlapping returns exactly the chunks meeting a
// random region (brute force).
TEST(ChunkGridPropertyTest, ChunksTileAndOverlapQueriesAreExact) {
  const uint64_t seed = testing::PropertySeed(23);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  testing::Rng rng(seed);
  for (int iter = 0; iter < 1000; ++iter) {
    const size_t rank = 1 + rng() % 3;
    Shape shape(rank);
    for (auto& d : shape) d = 1 + static_cast<int64_t>(rng() % 40);
    ChunkGridOptions opts;
    opts.target_chunk_bytes = 1 + static_cast<int64_t>(rng() % 4096);
    opts.min_column_bytes = 1 + static_cast<int64_t>(rng() % 64);
    opts.min_chunk_bytes = 1 + static_cast<int64_t>(rng() % 256);
    auto g = ChunkGrid::Make(shape, 32, opts);
    ASSERT_TRUE(g.ok()) << g.status();
    int64_t volume = 0, bytes = 0;
    Box reused{{7, 7, 7, 7}, {9, 9, 9, 9}};  // the in-place form overwrites whatever it held
    for (int64_t c = 0; c < g->chunk_count(); ++c) {
      const Box b = g->ChunkBox(c);
      ASSERT_TRUE(Box::Whole(shape).Contains(b));
      ASSERT_FALSE(b.empty());
      g->ChunkBox(c, &reused);
      ASSERT_EQ(reused, b);
      volume += *b.Volume();
      ASSERT_EQ(g->ChunkBytes(c), *b.Volume() * 4);  // 32-bit elements
      bytes += g->ChunkBytes(c);
      for (int64_t d = c + 1; d < g->chunk_count(); ++d) {
        ASSERT_FALSE(Intersect(b, g->ChunkBox(d)).has_value()) << "chunks overlap";
      }
    }
    ASSERT_EQ(volume, *NumElements(shape));
    ASSERT_EQ(bytes, g->total_bytes());
    Box region;
    for (size_t i = 0; i < rank; ++i) {
      const int64_t lo = static_cast<int64_t>(rng() % shape[i]);
      region.lo.push_back(lo);
      region.hi.push_back(lo + 1 + static_cast<int64_t>(rng() % (shape[i] - lo)));
    }
    std::vector<int64_t> want;
    for (int64_t c = 0; c < g->chunk_count(); ++c) {
      if (Intersect(g->ChunkBox(c), region)) want.push_back(c);
    }
    ASSERT_EQ(g->ChunksOverlapping(region), want) << "iteration " << iter;
    // A round trip through the recorded tile gives the same grid.
    auto again = ChunkGrid::FromTile(shape, g->tile(), 32);
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->chunk_count(), g->chunk_count());
  }
}

}  // namespace
}  // namespace ckpt
