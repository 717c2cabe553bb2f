// The segment store's packs of sole-chunk locations (storage/internal/index_records.h): one index
// record per PutChunks call for the chunks marked sole_chunk, read back live, committed, after a
// reopen, after a rewrite; stores whose chunks all have a record each (format 1) still read.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "storage/checkpoint_store.h"
#include "storage/internal/index_records.h"
#include "tests/testing/raw_store_db.h"
#include "tests/testing/scratch_store.h"

namespace ckpt {
namespace {

using segment_store_internal::IsPackKey;
using segment_store_internal::kChunkKeyBytes;
using ::testing::HasSubstr;

#define PACKS_ASSERT_OK(expr)               \
  do {                                      \
    const ::absl::Status packs_s_ = (expr); \
    ASSERT_TRUE(packs_s_.ok()) << packs_s_; \
  } while (0)

struct Written {
  ChunkAddress address;
  std::string bytes;
};

// The keys of the closed store in `dir`'s chunk_locations family, with their values.
std::vector<std::pair<std::string, std::string>> LocationRecords(const std::string& dir) {
  std::vector<std::pair<std::string, std::string>> records;
  testing::WithRawDb(dir, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                              const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    rocksdb::ColumnFamilyHandle* locations =
        testing::Family(names, handles, segment_store_internal::kLocationsFamily);
    ASSERT_NE(locations, nullptr);
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), locations));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      records.emplace_back(it->key().ToString(), it->value().ToString());
    }
  });
  return records;
}

// Replaces the value of every record of `dir`'s chunk_locations family for which pick(key) holds,
// and sets the format version record to `version` when given.
template <typename Pick>
void RewriteRecords(const std::string& dir, Pick pick, const std::string& value,
                    std::optional<uint64_t> version) {
  testing::WithRawDb(dir, [&](rocksdb::DB* db, const std::vector<std::string>& names,
                              const std::vector<rocksdb::ColumnFamilyHandle*>& handles) {
    rocksdb::ColumnFamilyHandle* locations =
        testing::Family(names, handles, segment_store_internal::kLocationsFamily);
    ASSERT_NE(locations, nullptr);
    std::vector<std::string> keys;
    std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions(), locations));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      if (pick(it->key().ToString())) keys.push_back(it->key().ToString());
    }
    for (const std::string& k : keys) {
      EXPECT_TRUE(db->Put(rocksdb::WriteOptions(), locations, k, value).ok());
    }
    if (version) {
      EXPECT_TRUE(db->Put(rocksdb::WriteOptions(),
                          testing::Family(names, handles, segment_store_internal::kMetaFamily),
                          segment_store_internal::kFormatKey,
                          segment_store_internal::BigEndian64(*version))
                      .ok());
    }
  });
}

class SegmentPacksTest : public testing::ScratchStoreTest {
 protected:
  // Writes `chunks` (marked sole_chunk as `sole`) with one PutChunks.
  void Put(const std::vector<Written>& chunks, bool sole) {
    std::vector<ChunkWrite> writes;
    for (const Written& w : chunks) writes.push_back({w.address, w.bytes, 3, sole});
    PACKS_ASSERT_OK(store_->PutChunks(writes));
  }

  void ExpectChunk(const Written& w) {
    absl::StatusOr<std::unique_ptr<ChunkData>> data =
        store_->ReadChunk(w.address, Checksum(w.bytes));
    ASSERT_TRUE(data.ok()) << w.address.ToString() << ": " << data.status();
    EXPECT_EQ(std::string((*data)->bytes()), w.bytes) << w.address.ToString();
  }

  // Sole chunks of blobs (tensor t, blob b) for t in [0, tensors), b in [0, blobs).
  static std::vector<Written> SoleChunks(uint64_t id, uint32_t tensors, uint32_t blobs,
                                         uint32_t first_tensor = 0) {
    std::vector<Written> chunks;
    for (uint32_t t = first_tensor; t < first_tensor + tensors; ++t) {
      for (uint32_t b = 0; b < blobs; ++b) {
        chunks.push_back({{id, t, b, 0}, absl::StrCat("tensor ", t, " blob ", b, " of ", id)});
      }
    }
    return chunks;
  }
};

// Each call's sole chunks share one record; the other chunks have one each. Every chunk reads
// back while its data is live, once committed, and after a reopen, in any order.
TEST_F(SegmentPacksTest, SoleChunksShareOneRecordPerCall) {
  absl::StatusOr<uint64_t> id = store_->BeginData();
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<Written> first = SoleChunks(*id, 20, 3);
  std::vector<Written> second = SoleChunks(*id, 10, 3, /*first_tensor=*/20);
  std::vector<Written> banded;
  for (uint32_t c = 0; c < 3; ++c) banded.push_back({{*id, 7, 9, c}, std::string(100 + c, 'x')});
  Put(first, true);
  Put(banded, false);
  Put(second, true);
  std::vector<Written> all = first;
  all.insert(all.end(), second.begin(), second.end());
  all.insert(all.end(), banded.begin(), banded.end());
  for (const Written& w : all) ASSERT_NO_FATAL_FAILURE(ExpectChunk(w));
  PACKS_ASSERT_OK(store_->CommitCheckpoint("c", "manifest", *id));
  std::mt19937 random(7);
  std::shuffle(all.begin(), all.end(), random);
  for (const Written& w : all) ASSERT_NO_FATAL_FAILURE(ExpectChunk(w));
  absl::StatusOr<std::unique_ptr<ChunkData>> absent = store_->ReadChunk({*id, 0, 0, 1}, 0);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound) << absent.status();
  store_.reset();

  int packs = 0, chunk_records = 0;
  for (const auto& [key, value] : LocationRecords(dir_)) {
    if (IsPackKey(key)) {
      ++packs;
    } else {
      EXPECT_EQ(key.size(), kChunkKeyBytes);
      ++chunk_records;
    }
  }
  EXPECT_EQ(packs, 2);
  EXPECT_EQ(chunk_records, 3);

  ASSERT_NO_FATAL_FAILURE(Open());
  std::shuffle(all.begin(), all.end(), random);
  for (const Written& w : all) ASSERT_NO_FATAL_FAILURE(ExpectChunk(w));
}

// A sole chunk written again (a slice whose first write never completed) reads as its last write,
// live, committed and after a reopen.
TEST_F(SegmentPacksTest, ASoleChunkWrittenAgainReadsAsItsLastWrite) {
  absl::StatusOr<uint64_t> id = store_->BeginData();
  ASSERT_TRUE(id.ok()) << id.status();
  const Written old_write{{*id, 4, 1, 0}, "the first write"};
  const Written other{{*id, 4, 2, 0}, "another blob"};
  const Written new_write{{*id, 4, 1, 0}, "the second write, longer"};
  Put({old_write, other}, true);
  Put({new_write}, true);
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(new_write));
  PACKS_ASSERT_OK(store_->CommitCheckpoint("c", "manifest", *id));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(new_write));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(other));
  store_.reset();
  ASSERT_NO_FATAL_FAILURE(Open());
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(other));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(new_write));
}

// A store of format 1, whose every chunk has a record of its own (the form chunks not marked
// sole_chunk still get), opens, reads its chunks, is recorded as format 2 and takes packs beside
// them.
TEST_F(SegmentPacksTest, StoresOfFormatOneReadAndTakePacks) {
  absl::StatusOr<uint64_t> id = store_->BeginData();
  ASSERT_TRUE(id.ok()) << id.status();
  const std::vector<Written> old_form = SoleChunks(*id, 50, 2);
  Put(old_form, false);
  PACKS_ASSERT_OK(store_->CommitCheckpoint("old", "manifest", *id));
  store_.reset();
  const auto records = LocationRecords(dir_);
  ASSERT_EQ(records.size(), old_form.size());
  for (const auto& [key, value] : records) {
    EXPECT_EQ(key.size(), kChunkKeyBytes);
    EXPECT_EQ(value.size(), segment_store_internal::kLocationBytes);
  }
  RewriteRecords(
      dir_, [](const std::string&) { return false; }, "", /*version=*/1);

  ASSERT_NO_FATAL_FAILURE(Open());
  for (const Written& w : old_form) ASSERT_NO_FATAL_FAILURE(ExpectChunk(w));
  absl::StatusOr<uint64_t> next = store_->BeginData();
  ASSERT_TRUE(next.ok()) << next.status();
  const std::vector<Written> packed = SoleChunks(*next, 5, 2);
  Put(packed, true);
  PACKS_ASSERT_OK(store_->CommitCheckpoint("new", "manifest", *next));
  store_.reset();
  ASSERT_NO_FATAL_FAILURE(Open());
  for (const Written& w : packed) ASSERT_NO_FATAL_FAILURE(ExpectChunk(w));
  for (const Written& w : old_form) ASSERT_NO_FATAL_FAILURE(ExpectChunk(w));
}

// Deleting a checkpoint removes its packs; the packs of an upload that never committed are
// collected at open; a damaged pack is DATA_LOSS naming it, not a missing chunk.
TEST_F(SegmentPacksTest, PacksAreDeletedCollectedAndCheckedForDamage) {
  absl::StatusOr<uint64_t> deleted = store_->BeginData();
  absl::StatusOr<uint64_t> crashed = store_->BeginData();
  absl::StatusOr<uint64_t> damaged = store_->BeginData();
  ASSERT_TRUE(deleted.ok() && crashed.ok() && damaged.ok());
  const std::vector<Written> deleted_chunks = SoleChunks(*deleted, 3, 1);
  Put(deleted_chunks, true);
  Put(SoleChunks(*crashed, 3, 1), true);
  const std::vector<Written> damaged_chunks = SoleChunks(*damaged, 3, 1);
  Put(damaged_chunks, true);
  PACKS_ASSERT_OK(store_->CommitCheckpoint("deleted", "m", *deleted));
  PACKS_ASSERT_OK(store_->CommitCheckpoint("damaged", "m", *damaged));
  ASSERT_NO_FATAL_FAILURE(ExpectChunk(deleted_chunks[0]));
  PACKS_ASSERT_OK(store_->DeleteCheckpoint("deleted"));
  absl::StatusOr<std::unique_ptr<ChunkData>> gone =
      store_->ReadChunkUnverified(deleted_chunks[1].address);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  store_.reset();  // `crashed` never committed

  const std::string damaged_prefix = segment_store_internal::BigEndian64(*damaged);
  RewriteRecords(
      dir_, [&](const std::string& key) { return key.compare(0, 8, damaged_prefix) == 0; },
      "\x01short", std::nullopt);
  ASSERT_NO_FATAL_FAILURE(Open());
  absl::StatusOr<int64_t> collected = store_->CollectGarbage();
  EXPECT_TRUE(collected.ok()) << collected.status();
  absl::StatusOr<std::unique_ptr<ChunkData>> bad =
      store_->ReadChunkUnverified(damaged_chunks[0].address);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat("pack of chunk locations 2 of data id ", *damaged,
                                     " is damaged (6 bytes)")));
  store_.reset();
  for (const auto& [key, value] : LocationRecords(dir_)) {
    EXPECT_EQ(key.compare(0, 8, damaged_prefix), 0) << "a record of another data id is left";
  }
}

}  // namespace
}  // namespace ckpt
