// SegmentStore (segment_store.h): deleting the chunks of a data id (its location records, then its
// segment file) and collecting garbage: the chunks of data ids neither committed nor live.
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_directory.h"
#include "storage/internal/segment_reader.h"
#include "storage/internal/segment_store_support.h"
#include "storage/segment_store.h"

namespace ckpt {
namespace {

using segment_store_internal::CommittedKey;
using segment_store_internal::DataIdRange;
using segment_store_internal::DecodeBigEndian;
using segment_store_internal::FromRocks;
using segment_store_internal::kChunkKeyBytes;
using segment_store_internal::StoreLog;

}  // namespace

absl::Status SegmentStore::BatchDeleteChunks(rocksdb::WriteBatch* batch, uint64_t data_id,
                                             std::string_view doing) {
  const auto [begin, end] = DataIdRange(data_id);
  return FromRocks(batch->DeleteRange(locations_, begin, end), doing);
}

absl::Status SegmentStore::RemoveSegmentFile(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(backup_mu_);
  if (backups_ > 0) {
    // A backup may still link this file (its records were deleted after the backup copied the
    // index): removed when the last backup ends.
    deferred_removals_.push_back(data_id);
    return absl::OkStatus();
  }
  reader_->Forget(data_id);
  return segments_->Remove(data_id);
}

void SegmentStore::RemoveSegment(uint64_t data_id) {
  const absl::Status removed = RemoveSegmentFile(data_id);
  if (!removed.ok()) {
    StoreLog()->warn("event=segment_remove data_id={} error=\"{}\"", data_id,
                     std::string(removed.message()));
  }
}

absl::StatusOr<bool> SegmentStore::IsGarbage(uint64_t data_id) {
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    if (data_.contains(data_id)) return false;
  }
  const absl::StatusOr<std::string> marker =
      Get(meta_, CommittedKey(data_id), absl::StrCat("committed marker of data id ", data_id));
  if (marker.ok()) return false;
  if (absl::IsNotFound(marker.status())) return true;
  return marker.status();
}

absl::StatusOr<int64_t> SegmentStore::CollectGarbage() {
  // Deletes records and compacts (which writes new tables): refused on a full disk.
  CKPT_RETURN_IF_ERROR(
      CheckFreeDisk(0, absl::StrCat("collecting garbage in ", dir_), /*fresh=*/true));
  CKPT_ASSIGN_OR_RETURN(const int64_t collected, CollectLocations());
  // Segment files of garbage data ids: uploads that never committed, and files whose records a
  // delete or discard removed before this process stopped or failed to remove the file.
  int64_t files = 0;
  CKPT_ASSIGN_OR_RETURN(const std::vector<uint64_t> segment_ids, segments_->List());
  for (uint64_t data_id : segment_ids) {
    CKPT_ASSIGN_OR_RETURN(const bool garbage, IsGarbage(data_id));
    if (!garbage) continue;
    CKPT_RETURN_IF_ERROR(RemoveSegmentFile(data_id));
    ++files;
  }
  // Compact deleted ranges away. The locations' tables hold only keys and 16-byte values, so
  // this rewrites little. Ranges deleted while it runs are counted again and handled by the next
  // collection.
  const int64_t deleted = deleted_ranges_.exchange(0, std::memory_order_relaxed);
  if (deleted > 0) {
    rocksdb::CompactRangeOptions compact;
    compact.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
    const rocksdb::Status s = db_->CompactRange(compact, locations_, nullptr, nullptr);
    if (!s.ok()) {
      deleted_ranges_.fetch_add(deleted, std::memory_order_relaxed);
      return FromRocks(s, absl::StrCat("compacting deleted chunk locations in ", dir_));
    }
  }
  StoreLog()->info("event=gc collected={} segment_files_removed={} compacted_deletes={}", collected,
                   files, deleted);
  return collected;
}

absl::StatusOr<int64_t> SegmentStore::CollectLocations() {
  rocksdb::ReadOptions read_options;
  read_options.fill_cache = false;  // a one-off scan: do not evict the hot blocks
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, locations_));
  int64_t collected = 0;
  // Visit one key per data id: after deciding on an id, seek to the start of the next one. The
  // iterator's implicit snapshot does not see our own DeleteRange, which is fine: we skip past it.
  for (it->SeekToFirst(); it->Valid();) {
    const rocksdb::Slice key = it->key();
    if (key.size() != kChunkKeyBytes &&
        !segment_store_internal::IsPackKey(std::string_view(key.data(), key.size()))) {
      return absl::DataLossError(absl::StrCat("chunk key of ", key.size(), " bytes (expected ",
                                              kChunkKeyBytes, ") in RocksDB store in ", dir_));
    }
    const uint64_t data_id = DecodeBigEndian(key.data(), 8);
    CKPT_ASSIGN_OR_RETURN(const bool garbage, IsGarbage(data_id));
    const auto [begin, end] = DataIdRange(data_id);
    if (garbage) {
      const std::string doing = absl::StrCat("collecting chunks of data id ", data_id);
      rocksdb::WriteBatch batch;
      CKPT_RETURN_IF_ERROR(FromRocks(batch.DeleteRange(locations_, begin, end), doing));
      // Unsynced: a lost delete is simply redone by the next collection.
      CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/false, doing));
      deleted_ranges_.fetch_add(1, std::memory_order_relaxed);
      ++collected;
    }
    if (data_id == std::numeric_limits<uint64_t>::max()) break;
    it->Seek(end);
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), absl::StrCat("scanning chunks in ", dir_)));
  return collected;
}

}  // namespace ckpt
