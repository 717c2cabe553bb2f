// storage/internal/location_cache.h: the segment store's in-memory chunk locations of blobs.
#include "storage/internal/location_cache.h"

#include "gtest/gtest.h"

namespace ckpt::segment_store_internal {
namespace {

LocationCache::Locations Blob(size_t n, uint64_t base) {
  LocationCache::Locations locations;
  for (size_t i = 0; i < n; ++i) locations.push_back({base + 100 * i, 100});
  return locations;
}

TEST(LocationCacheTest, FindsKeptChunksAndTellsAKeptBlobFromAnUnknownOne) {
  LocationCache cache(100);
  EXPECT_FALSE(cache.Find({1, 2, 3, 0}).blob_cached);
  LocationCache::Locations locations = Blob(4, 1000);
  locations[2] = LocationCache::kNoChunk;  // a gap
  cache.Insert({1, 2, 3, 99}, locations);   // the address's chunk index is ignored
  LocationCache::Lookup got = cache.Find({1, 2, 3, 1});
  EXPECT_TRUE(got.blob_cached);
  ASSERT_TRUE(got.location.has_value());
  EXPECT_EQ(got.location->offset, 1100u);
  EXPECT_EQ(got.location->length, 100u);
  got = cache.Find({1, 2, 3, 2});
  EXPECT_TRUE(got.blob_cached);
  EXPECT_FALSE(got.location.has_value());
  got = cache.Find({1, 2, 3, 4});  // past the blob's chunks
  EXPECT_TRUE(got.blob_cached);
  EXPECT_FALSE(got.location.has_value());
  // Other blobs, tensors and data ids are not that blob.
  EXPECT_FALSE(cache.Find({1, 2, 4, 0}).blob_cached);
  EXPECT_FALSE(cache.Find({1, 3, 3, 0}).blob_cached);
  EXPECT_FALSE(cache.Find({2, 2, 3, 0}).blob_cached);
  EXPECT_EQ(cache.size(), 4u);
  // Inserting a blob again replaces it.
  cache.Insert({1, 2, 3, 0}, Blob(2, 5000));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Find({1, 2, 3, 1}).location->offset, 5100u);
  EXPECT_FALSE(cache.Find({1, 2, 3, 3}).location.has_value());
}

TEST(LocationCacheTest, StaysWithinItsBoundDroppingTheLeastRecentlyUsedBlobs) {
  LocationCache cache(10);
  cache.Insert({1, 0, 0, 0}, Blob(4, 0));
  cache.Insert({1, 0, 1, 0}, Blob(4, 0));
  EXPECT_TRUE(cache.Find({1, 0, 0, 0}).blob_cached);  // now the most recently used
  cache.Insert({1, 0, 2, 0}, Blob(4, 0));              // 12 > 10: blob 1 goes
  EXPECT_EQ(cache.size(), 8u);
  EXPECT_TRUE(cache.Find({1, 0, 0, 0}).blob_cached);
  EXPECT_FALSE(cache.Find({1, 0, 1, 0}).blob_cached);
  EXPECT_TRUE(cache.Find({1, 0, 2, 0}).blob_cached);
  // A blob without locations still counts one; one larger than the bound is not kept.
  cache.Insert({1, 0, 3, 0}, {});
  EXPECT_EQ(cache.size(), 9u);
  EXPECT_TRUE(cache.Find({1, 0, 3, 0}).blob_cached);
  cache.Insert({1, 0, 4, 0}, Blob(11, 0));
  EXPECT_FALSE(cache.Find({1, 0, 4, 0}).blob_cached);
  EXPECT_EQ(cache.size(), 9u);
}

TEST(LocationCacheTest, EraseDataDropsEveryBlobOfThatDataIdOnly) {
  LocationCache cache(100);
  for (uint32_t blob = 0; blob < 5; ++blob) {
    cache.Insert({7, 1, blob, 0}, Blob(3, 0));
    cache.Insert({8, 1, blob, 0}, Blob(2, 0));
  }
  EXPECT_EQ(cache.size(), 25u);
  cache.EraseData(7);
  EXPECT_EQ(cache.size(), 10u);
  for (uint32_t blob = 0; blob < 5; ++blob) {
    EXPECT_FALSE(cache.Find({7, 1, blob, 0}).blob_cached);
    EXPECT_TRUE(cache.Find({8, 1, blob, 0}).blob_cached);
  }
  cache.EraseData(9);  // nothing of it kept: nothing happens
  EXPECT_EQ(cache.size(), 10u);
}

}  // namespace
}  // namespace ckpt::segment_store_internal
