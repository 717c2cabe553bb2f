// storage/internal/location_cache.h: the segment store's in-memory chunk locations of blobs.
#include "storage/internal/location_cache.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "storage/internal/index_records.h"

namespace ckpt::segment_store_internal {
namespace {

LocationCache::Locations Blob(size_t n, uint64_t base) {
  LocationCache::Locations locations;
  for (size_t i = 0; i < n; ++i) locations.push_back({base + 100 * i, 100});
  return locations;
}

// FindMany gives, in order, what Find gives for each address.
// The write path's fixed-array encodings are the same bytes as the string ones the readers
// decode (keys stay in the same order and format).
TEST(IndexRecordsTest, ArrayEncodingsEqualTheStringOnes) {
  for (const ChunkAddress& a :
       {ChunkAddress{1, 0, 0, 0}, ChunkAddress{0x0102030405060708ull, 0x090a0b0c, 0xfffffffe, 7},
        ChunkAddress{~uint64_t{0}, ~uint32_t{0}, 0, ~uint32_t{0}}}) {
    const auto key = ChunkKeyArray(a);
    EXPECT_EQ(std::string(key.data(), key.size()), ChunkKey(a)) << a.ToString();
  }
  for (const ChunkLocation& l : {ChunkLocation{0, 0}, ChunkLocation{0x0102030405060708ull, 4096},
                                 ChunkLocation{~uint64_t{0}, uint64_t{1} << 40}}) {
    const auto value = EncodeLocationArray(l);
    EXPECT_EQ(std::string(value.data(), value.size()), EncodeLocation(l));
    const auto decoded = DecodeLocation(std::string_view(value.data(), value.size()));
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(decoded->offset, l.offset);
    EXPECT_EQ(decoded->length, l.length);
  }
}

TEST(LocationCacheTest, FindManyIsFindOfEach) {
  LocationCache cache(100);
  LocationCache::Locations locations = Blob(3, 1000);
  locations[1] = LocationCache::kNoChunk;
  cache.Insert({1, 2, 3, 0}, locations);
  cache.Insert({1, 2, 4, 0}, Blob(1, 7000));
  const std::vector<ChunkAddress> addresses = {{1, 2, 3, 2}, {1, 2, 3, 1}, {1, 2, 5, 0},
                                               {1, 2, 4, 0}, {1, 2, 3, 9}, {1, 2, 3, 0}};
  std::vector<LocationCache::Lookup> many = {LocationCache::Lookup{}};  // replaced
  cache.FindMany(addresses, &many);
  ASSERT_EQ(many.size(), addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    const LocationCache::Lookup one = cache.Find(addresses[i]);
    EXPECT_EQ(many[i].blob_cached, one.blob_cached) << i;
    ASSERT_EQ(many[i].location.has_value(), one.location.has_value()) << i;
    if (one.location) {
      EXPECT_EQ(many[i].location->offset, one.location->offset) << i;
    }
  }
  EXPECT_EQ(many[0].location->offset, 1200u);
  EXPECT_FALSE(many[1].location.has_value());
  EXPECT_FALSE(many[2].blob_cached);
  EXPECT_EQ(many[3].location->offset, 7000u);
}

// FindMany finds packed locations by stepping on from the previous address's entry: in order,
// out of order, repeated, missing, and across data ids, it answers as FindPacked does.
TEST(LocationCacheTest, FindManyOfPackedAddressesInAnyOrderIsFindPackedOfEach) {
  LocationCache cache(100000);
  LocationCache::Packs packs;
  for (uint32_t t = 0; t < 300; ++t) {
    for (uint32_t b = 0; b < 3; ++b) {
      if ((t + b) % 7 == 3) continue;  // gaps
      packs.push_back({t, b, 0, {uint64_t{t} * 1000 + b * 10, 5 + b}});
    }
  }
  cache.InsertPacks(4, packs);
  cache.InsertPacks(5, {{0, 0, 0, {77, 1}}});
  std::vector<ChunkAddress> addresses;
  for (uint32_t t = 0; t < 300; ++t) addresses.push_back({4, t, t % 3, 0});  // in order
  for (uint32_t t = 300; t-- > 0;) addresses.push_back({4, t, 1, 0});        // backwards
  for (uint32_t t = 0; t < 300; t += 37) {
    addresses.push_back({4, t, 2, 0});
    addresses.push_back({4, t, 2, 0});  // twice
    addresses.push_back({5, 0, 0, 0});  // another data id between
    addresses.push_back({4, t, 2, 1});  // a chunk index not stored
    addresses.push_back({4, (t * 97) % 300, 0, 0});
  }
  addresses.push_back({4, 999, 0, 0});  // past the last entry
  addresses.push_back({6, 0, 0, 0});    // a data id without packs
  // Turns among more data ids than FindMany keeps its place in (a tensor spanning many source
  // ranks), each with a table of its own.
  std::map<uint64_t, LocationCache::Packs> others;
  for (uint64_t id = 10; id < 22; ++id) {
    for (uint32_t t = 0; t < 40; ++t) {
      others[id].push_back({t, 0, 0, {id * 100000 + t * 10, 3}});
    }
    cache.InsertPacks(id, others[id]);
  }
  for (uint32_t t = 0; t < 40; ++t) {
    for (uint64_t id = 10; id < 22; ++id) {
      if ((t + id) % 5 != 0) addresses.push_back({id, t, 0, 0});
    }
    addresses.push_back({4, t, t % 3, 0});
  }
  std::vector<LocationCache::Lookup> many;
  cache.FindMany(addresses, &many);
  ASSERT_EQ(many.size(), addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    const ChunkAddress& a = addresses[i];
    std::optional<ChunkLocation> want;
    if (a.data_id == 4) {
      want = LocationCache::FindPacked(packs, a);
    } else if (a.data_id == 5) {
      if (a.tensor == 0) want = ChunkLocation{77, 1};
    } else if (others.contains(a.data_id)) {
      want = LocationCache::FindPacked(others[a.data_id], a);
      ASSERT_TRUE(want.has_value()) << a.ToString();
    }
    EXPECT_EQ(many[i].packs_known, a.data_id != 6) << a.ToString();
    EXPECT_EQ(many[i].blob_cached, want.has_value()) << a.ToString();
    ASSERT_EQ(many[i].location.has_value(), want.has_value()) << a.ToString();
    if (want) {
      EXPECT_EQ(many[i].location->offset, want->offset) << a.ToString();
      EXPECT_EQ(many[i].location->length, want->length) << a.ToString();
    }
  }
  // And FindPackedFrom itself, from every hint, for every address.
  for (size_t hint = 0; hint <= packs.size(); hint += 13) {
    for (const ChunkAddress& a : addresses) {
      if (a.data_id != 4) continue;
      size_t h = hint;
      const std::optional<ChunkLocation> got = LocationCache::FindPackedFrom(packs, a, &h);
      const std::optional<ChunkLocation> want = LocationCache::FindPacked(packs, a);
      ASSERT_EQ(got.has_value(), want.has_value()) << a.ToString() << " from " << hint;
      if (want) {
        EXPECT_EQ(got->offset, want->offset) << a.ToString() << " from " << hint;
      }
      EXPECT_LE(h, packs.size());
    }
  }
}

TEST(LocationCacheTest, FindsKeptChunksAndTellsAKeptBlobFromAnUnknownOne) {
  LocationCache cache(100);
  EXPECT_FALSE(cache.Find({1, 2, 3, 0}).blob_cached);
  LocationCache::Locations locations = Blob(4, 1000);
  locations[2] = LocationCache::kNoChunk;  // a gap
  cache.Insert({1, 2, 3, 99}, locations);  // the address's chunk index is ignored
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
  cache.Insert({1, 0, 2, 0}, Blob(4, 0));             // 12 > 10: blob 1 goes
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

// Packs: a data id's sorted table answers for every address of it (found or not), blobs kept
// whole come first, EraseData drops the table, and tables beyond the bound go least recently used
// first.
TEST(LocationCacheTest, PacksAnswerForTheirDataId) {
  LocationCache cache(10);
  LocationCache::Packs packs = {{0, 1, 0, {100, 10}}, {0, 2, 0, {200, 20}}, {3, 0, 0, {300, 30}}};
  EXPECT_FALSE(cache.Find({5, 0, 1, 0}).packs_known);
  cache.InsertPacks(5, packs);
  LocationCache::Lookup hit = cache.Find({5, 0, 2, 0});
  EXPECT_TRUE(hit.packs_known);
  EXPECT_TRUE(hit.blob_cached);
  ASSERT_TRUE(hit.location.has_value());
  EXPECT_EQ(hit.location->offset, 200u);
  EXPECT_EQ(hit.location->length, 20u);
  LocationCache::Lookup miss = cache.Find({5, 0, 3, 0});
  EXPECT_TRUE(miss.packs_known);
  EXPECT_FALSE(miss.blob_cached);
  EXPECT_FALSE(miss.location.has_value());
  EXPECT_FALSE(cache.Find({5, 3, 0, 1}).location.has_value());
  EXPECT_EQ(cache.Find({5, 3, 0, 0}).location->offset, 300u);
  EXPECT_FALSE(cache.Find({6, 0, 1, 0}).packs_known);
  // A blob kept whole answers before the packs.
  cache.Insert({5, 0, 1, 0}, Blob(1, 9000));
  EXPECT_EQ(cache.Find({5, 0, 1, 0}).location->offset, 9000u);
  // An empty table (a data id without packs) counts one.
  cache.InsertPacks(6, {});
  EXPECT_TRUE(cache.Find({6, 0, 0, 0}).packs_known);
  cache.Find({5, 0, 2, 0});                                    // 5 used last: 6 goes first
  cache.InsertPacks(7, LocationCache::Packs(7, PackEntry{}));  // 3 + 1 + 7 > 10
  EXPECT_FALSE(cache.Find({6, 0, 0, 0}).packs_known);
  EXPECT_TRUE(cache.Find({5, 0, 2, 0}).packs_known);
  EXPECT_TRUE(cache.Find({7, 0, 0, 0}).packs_known);
  cache.InsertPacks(8, LocationCache::Packs(11, PackEntry{}));  // beyond the bound: not kept
  EXPECT_FALSE(cache.Find({8, 0, 0, 0}).packs_known);
  cache.EraseData(5);
  EXPECT_FALSE(cache.Find({5, 0, 2, 0}).packs_known);
  EXPECT_FALSE(cache.Find({5, 0, 1, 0}).blob_cached);
}

TEST(IndexRecordsTest, PackRecordsRoundTripAndSortAfterChunkKeys) {
  std::string value(1, kPackTag);
  const std::vector<PackEntry> entries = {{1, 2, 3, {4, 5}},
                                          {~uint32_t{0}, 0, 7, {~uint64_t{0}, uint64_t{1} << 40}}};
  for (const PackEntry& e : entries) AppendPackEntry(&value, e);
  std::vector<PackEntry> decoded;
  ASSERT_TRUE(ForEachPackEntry(value, [&](const PackEntry& e) { decoded.push_back(e); }));
  ASSERT_EQ(decoded.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(decoded[i].tensor, entries[i].tensor);
    EXPECT_EQ(decoded[i].blob, entries[i].blob);
    EXPECT_EQ(decoded[i].chunk, entries[i].chunk);
    EXPECT_EQ(decoded[i].location.offset, entries[i].location.offset);
    EXPECT_EQ(decoded[i].location.length, entries[i].location.length);
  }
  EXPECT_FALSE(ForEachPackEntry(value.substr(0, value.size() - 1), [](const PackEntry&) {}));
  EXPECT_FALSE(ForEachPackEntry(value.substr(1), [](const PackEntry&) {}));
  EXPECT_TRUE(ForEachPackEntry(std::string(1, kPackTag), [](const PackEntry&) {}));
  const auto key = PackKeyArray(9, 3);
  const std::string pack(key.data(), key.size());
  EXPECT_TRUE(IsPackKey(pack));
  EXPECT_EQ(pack.compare(0, PackRangeStart(9).size(), PackRangeStart(9)), 0);
  EXPECT_FALSE(IsPackKey(ChunkKey({9, ~uint32_t{0}, ~uint32_t{0}, ~uint32_t{0}})));
  // After every chunk key of its data id, before the next data id's.
  EXPECT_LT(ChunkKey({9, ~uint32_t{0}, ~uint32_t{0}, ~uint32_t{0}}), pack);
  EXPECT_LT(PackRangeStart(9), pack);
  EXPECT_LT(pack, ChunkKey({10, 0, 0, 0}));
  const auto later = PackKeyArray(9, 4);
  EXPECT_LT(pack, std::string(later.data(), later.size()));
}

}  // namespace
}  // namespace ckpt::segment_store_internal
