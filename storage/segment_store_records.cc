// SegmentStore (segment_store.h): the records kept in RocksDB: strategies, checkpoints (manifest
// and committed marker), jobs.
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "storage/internal/index_records.h"
#include "storage/internal/location_cache.h"
#include "storage/internal/segment_store_support.h"
#include "storage/internal/segment_writer.h"
#include "storage/segment_store.h"

namespace ckpt {

using segment_store_internal::BigEndian64;
using segment_store_internal::CommittedKey;
using segment_store_internal::DecodeBigEndian;
using segment_store_internal::FromRocks;
using segment_store_internal::kCheckpointPrefix;
using segment_store_internal::kStrategyPrefix;
using segment_store_internal::MetaKey;
using segment_store_internal::ToSlice;

template <typename Fn>
absl::Status SegmentStore::ScanPrefix(rocksdb::ColumnFamilyHandle* family, std::string_view prefix,
                                      std::string_view doing, Fn fn) {
  rocksdb::ReadOptions read_options;
  // Prefixes are one byte below 0xff, so incrementing that byte gives the exclusive end.
  std::string upper;
  rocksdb::Slice upper_slice;
  if (!prefix.empty()) {
    upper.assign(prefix);
    upper.back() = static_cast<char>(upper.back() + 1);
    upper_slice = rocksdb::Slice(upper);
    read_options.iterate_upper_bound = &upper_slice;
  }
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, family));
  for (it->Seek(ToSlice(prefix)); it->Valid(); it->Next()) {
    const rocksdb::Slice key = it->key();
    const rocksdb::Slice value = it->value();
    fn(std::string_view(key.data() + prefix.size(), key.size() - prefix.size()),
       std::string_view(value.data(), value.size()));
  }
  return FromRocks(it->status(), doing);
}

// --- Strategies ---------------------------------------------------------------------------------

absl::Status SegmentStore::PutStrategy(const std::string& name, std::string_view record,
                                       bool overwrite) {
  const std::string key = MetaKey(kStrategyPrefix, name);
  const std::string what = absl::StrCat("strategy ", name);
  std::lock_guard<std::mutex> lock(meta_mu_);  // no create may slip between check and write
  if (!overwrite) {
    absl::StatusOr<std::string> existing = Get(meta_, key, what);
    if (existing.ok()) return absl::AlreadyExistsError(absl::StrCat(what, " exists"));
    if (!absl::IsNotFound(existing.status())) return existing.status();
  }
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(meta_, key, ToSlice(record)), "batching " + what));
  return Write(&batch, /*sync=*/true, "writing " + what);
}

absl::StatusOr<std::string> SegmentStore::GetStrategy(const std::string& name) {
  return Get(meta_, MetaKey(kStrategyPrefix, name), absl::StrCat("strategy ", name));
}

absl::StatusOr<std::vector<std::string>> SegmentStore::ListStrategies() {
  std::vector<std::string> names;
  CKPT_RETURN_IF_ERROR(
      ScanPrefix(meta_, std::string(1, kStrategyPrefix), "listing strategies",
                 [&](std::string_view name, std::string_view) { names.emplace_back(name); }));
  return names;
}

absl::Status SegmentStore::DeleteStrategy(const std::string& name) {
  const std::string key = MetaKey(kStrategyPrefix, name);
  const std::string what = absl::StrCat("strategy ", name);
  std::lock_guard<std::mutex> lock(meta_mu_);
  CKPT_RETURN_IF_ERROR(Get(meta_, key, what).status());
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Delete(meta_, key), "batching delete of " + what));
  return Write(&batch, /*sync=*/true, "deleting " + what);
}

// --- Checkpoints --------------------------------------------------------------------------------

absl::Status SegmentStore::CommitCheckpoint(const std::string& id, std::string_view manifest,
                                            uint64_t data_id) {
  const std::string key = MetaKey(kCheckpointPrefix, id);
  const std::string what = absl::StrCat("checkpoint ", id);
  // Held from the existence check to the write, so two commits of one id cannot both win.
  std::lock_guard<std::mutex> lock(meta_mu_);
  absl::StatusOr<std::string> existing = Get(meta_, key, what);
  if (existing.ok()) return absl::AlreadyExistsError(absl::StrCat(what, " exists"));
  if (!absl::IsNotFound(existing.status())) return existing.status();

  // Syncing writes the data id's last, partly filled blocks: checked before, on a full disk.
  CKPT_RETURN_IF_ERROR(CheckFreeDisk(0, "committing " + what, /*fresh=*/true));
  CKPT_RETURN_IF_ERROR(ClaimLiveData(data_id));
  // The chunk bytes were written unsynced (PutChunks): make them durable before the commit that
  // references them. The synced batch below syncs the write-ahead log, and with it their
  // location records.
  absl::Status synced = writer_->Sync(data_id);
  if (!synced.ok()) {
    ReleaseClaim(data_id, /*forget=*/false);
    return absl::Status(synced.code(),
                        absl::StrCat("syncing the chunks of ", what, ": ", synced.message()));
  }
  // The record is the data id then the manifest, put from its two parts (the manifest of a
  // checkpoint of many tensors is megabytes: not copied into one string first).
  const std::string data_id_bytes = BigEndian64(data_id);
  const rocksdb::Slice key_part(key);
  const rocksdb::Slice value_parts[2] = {rocksdb::Slice(data_id_bytes),
                                         rocksdb::Slice(manifest.data(), manifest.size())};
  rocksdb::WriteBatch batch;
  absl::Status status = FromRocks(
      batch.Put(meta_, rocksdb::SliceParts(&key_part, 1), rocksdb::SliceParts(value_parts, 2)),
      "batching " + what);
  if (status.ok()) {
    status = FromRocks(batch.Put(meta_, CommittedKey(data_id), rocksdb::Slice()),
                       "batching the committed marker of " + what);
  }
  if (status.ok()) status = Write(&batch, /*sync=*/true, "committing " + what);
  // On failure the upload stays live: the caller may retry the commit or discard it.
  ReleaseClaim(data_id, /*forget=*/status.ok());
  return status;
}

absl::StatusOr<std::string> SegmentStore::GetManifest(const std::string& id) {
  const std::string what = absl::StrCat("checkpoint ", id);
  CKPT_ASSIGN_OR_RETURN(std::string value, Get(meta_, MetaKey(kCheckpointPrefix, id), what));
  if (value.size() < 8) {
    return absl::DataLossError(
        absl::StrCat(what, " has a truncated record (", value.size(), " bytes) in ", dir_));
  }
  value.erase(0, 8);
  return value;
}

absl::StatusOr<std::vector<std::string>> SegmentStore::ListCheckpoints() {
  std::vector<std::string> ids;
  CKPT_RETURN_IF_ERROR(
      ScanPrefix(meta_, std::string(1, kCheckpointPrefix), "listing checkpoints",
                 [&](std::string_view id, std::string_view) { ids.emplace_back(id); }));
  return ids;
}

absl::Status SegmentStore::DeleteCheckpoint(const std::string& id) {
  const std::string key = MetaKey(kCheckpointPrefix, id);
  const std::string what = absl::StrCat("checkpoint ", id);
  std::lock_guard<std::mutex> lock(meta_mu_);
  CKPT_ASSIGN_OR_RETURN(const std::string value, Get(meta_, key, what));
  if (value.size() < 8) {
    return absl::DataLossError(
        absl::StrCat(what, " has a truncated record (", value.size(), " bytes) in ", dir_));
  }
  const uint64_t data_id = DecodeBigEndian(value.data(), 8);
  const std::string doing = "deleting " + what;
  // One synced batch: the manifest, the marker and the chunk records disappear together; the
  // segment file goes after it (if this process stops in between, CollectGarbage removes it).
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Delete(meta_, key), doing));
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Delete(meta_, CommittedKey(data_id)), doing));
  CKPT_RETURN_IF_ERROR(BatchDeleteChunks(&batch, data_id, doing));
  CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/true, doing));
  location_cache_->EraseData(data_id);
  deleted_ranges_.fetch_add(1, std::memory_order_relaxed);
  RemoveSegment(data_id);
  return absl::OkStatus();
}

// --- Jobs ---------------------------------------------------------------------------------------

absl::Status SegmentStore::PutJob(const std::string& id, std::string_view record) {
  const std::string doing = absl::StrCat("writing job ", id);
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(jobs_, id, ToSlice(record)), doing));
  return Write(&batch, /*sync=*/true, doing);
}

absl::StatusOr<std::string> SegmentStore::GetJob(const std::string& id) {
  return Get(jobs_, id, absl::StrCat("job ", id));
}

absl::Status SegmentStore::DeleteJob(const std::string& id) {
  const std::string doing = absl::StrCat("deleting job ", id);
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Delete(jobs_, id), doing));
  return Write(&batch, /*sync=*/true, doing);
}

absl::StatusOr<std::vector<JobRecord>> SegmentStore::ListJobs() {
  std::vector<JobRecord> jobs;
  CKPT_RETURN_IF_ERROR(
      ScanPrefix(jobs_, "", "listing jobs", [&](std::string_view id, std::string_view record) {
        jobs.push_back(JobRecord{std::string(id), std::string(record)});
      }));
  return jobs;
}

}  // namespace ckpt
