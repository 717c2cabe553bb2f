// SegmentStore (segment_store.h): the online backup (a RocksDB checkpoint of the index plus hard
// links of the committed segment files) and the offline repair of a damaged index
// (RepairSegmentStore, checkpoint_store.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/utilities/checkpoint.h"
#include "rocksdb/write_batch.h"
#include "storage/confined_dir.h"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_directory.h"
#include "storage/internal/segment_store_support.h"
#include "storage/posix_io.h"
#include "storage/segment_store.h"

namespace ckpt {
namespace {

using segment_store_internal::BigEndian64;
using segment_store_internal::ColumnFamilies;
using segment_store_internal::DbOptions;
using segment_store_internal::DecodeBigEndian;
using segment_store_internal::FromRocks;
using segment_store_internal::kCheckpointPrefix;
using segment_store_internal::kCommittedPrefix;
using segment_store_internal::kCounterKey;
using segment_store_internal::kFormatKey;
using segment_store_internal::kSegmentsDir;
using segment_store_internal::kStoreFormatVersion;
using segment_store_internal::StoreLog;

// A RocksDB database with the store's column families, opened (read-only or for writing) and
// closed by the destructor. handles[1] is meta, handles[3] chunk_locations.
struct IndexDb {
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;

  static absl::StatusOr<std::unique_ptr<IndexDb>> Open(const std::string& dir, bool read_only,
                                                       std::string_view doing) {
    auto index = std::make_unique<IndexDb>();
    rocksdb::DBOptions options = DbOptions();
    options.create_if_missing = false;
    const auto families = ColumnFamilies(rocksdb::NewLRUCache(size_t{8} << 20));
    const rocksdb::Status s =
        read_only
            ? rocksdb::DB::OpenForReadOnly(options, dir, families, &index->handles, &index->db)
            : rocksdb::DB::Open(options, dir, families, &index->handles, &index->db);
    CKPT_RETURN_IF_ERROR(FromRocks(s, doing));
    return index;
  }
  ~IndexDb() {
    if (db == nullptr) return;
    for (rocksdb::ColumnFamilyHandle* h : handles) (void)db->DestroyColumnFamilyHandle(h);
    (void)db->Close();
    delete db;
  }
  rocksdb::ColumnFamilyHandle* meta() const { return handles.at(1); }
  rocksdb::ColumnFamilyHandle* locations() const { return handles.at(3); }
};

// Calls fn(key, value) for every meta key starting with `prefix`.
template <typename Fn>
absl::Status ScanMeta(const IndexDb& index, char prefix, std::string_view doing, Fn fn) {
  rocksdb::ReadOptions read_options;
  read_options.fill_cache = false;
  std::unique_ptr<rocksdb::Iterator> it(index.db->NewIterator(read_options, index.meta()));
  const std::string start(1, prefix);
  for (it->Seek(start); it->Valid() && it->key().starts_with(start); it->Next()) {
    CKPT_RETURN_IF_ERROR(fn(it->key().ToStringView(), it->value().ToStringView()));
  }
  return FromRocks(it->status(), doing);
}

// Makes `to` a hard link of `from`, or (another file system, or links refused) a copy. Sets
// *linked accordingly and adds the file's size to *bytes.
absl::Status LinkOrCopy(const std::string& from, const std::string& to, bool* linked,
                        int64_t* bytes) {
  struct stat st;
  if (::stat(from.c_str(), &st) != 0) {
    return absl::DataLossError(absl::StrCat(
        "segment file ", from,
        " of a committed checkpoint is missing: ", ErrnoToStatus(errno, "stat", from).message()));
  }
  *bytes += st.st_size;
  if (::link(from.c_str(), to.c_str()) == 0) {
    *linked = true;
    return absl::OkStatus();
  }
  if (errno != EXDEV && errno != EPERM && errno != EMLINK) return ErrnoToStatus(errno, "link", to);
  *linked = false;
  std::error_code ec;
  std::filesystem::copy_file(from, to, ec);
  if (ec) return ErrnoToStatus(ec.value(), "copy to", to);
  const int fd = ::open(to.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", to);
  const UniqueFd file(fd);
  if (::fsync(fd) != 0) return ErrnoToStatus(errno, "fsync", to);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BackupStats> SegmentStore::Backup(const std::string& target_dir) {
  const std::string doing = absl::StrCat("backing up the store in ", dir_, " to ", target_dir);
  std::error_code ec;
  if (std::filesystem::symlink_status(target_dir, ec).type() !=
      std::filesystem::file_type::not_found) {
    return absl::AlreadyExistsError(absl::StrCat(doing, ": the target exists"));
  }
  {
    std::lock_guard<std::mutex> lock(backup_mu_);
    ++backups_;
  }
  absl::Cleanup unpin = [this] { EndBackupPin(); };
  // The RocksDB checkpoint flushes the memtables (new table files): refused on a full disk.
  CKPT_RETURN_IF_ERROR(CheckFreeDisk(0, doing, /*fresh=*/true));

  // 1. The index: hard links of its table files, copies of its manifest and logs, all of one
  // consistent state (memtables flushed first: log_size_for_flush 0).
  rocksdb::Checkpoint* raw = nullptr;
  CKPT_RETURN_IF_ERROR(FromRocks(rocksdb::Checkpoint::Create(db_, &raw), doing));
  const std::unique_ptr<rocksdb::Checkpoint> checkpoint(raw);
  CKPT_RETURN_IF_ERROR(FromRocks(checkpoint->CreateCheckpoint(target_dir, 0), doing));

  // 2. The data ids committed in that state, read back from the copy itself.
  BackupStats stats;
  std::vector<uint64_t> committed;
  {
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<IndexDb> copy,
                          IndexDb::Open(target_dir, /*read_only=*/true, doing));
    CKPT_RETURN_IF_ERROR(
        ScanMeta(*copy, kCheckpointPrefix, doing, [&](std::string_view, std::string_view) {
          ++stats.checkpoints;
          return absl::OkStatus();
        }));
    CKPT_RETURN_IF_ERROR(
        ScanMeta(*copy, kCommittedPrefix, doing, [&](std::string_view key, std::string_view) {
          if (key.size() == 9) committed.push_back(DecodeBigEndian(key.data() + 1, 8));
          return absl::OkStatus();
        }));
  }

  // 3. Their segment files: immutable once committed, and pinned (not removed) until we return.
  const std::string segments_dir = absl::StrCat(target_dir, "/", kSegmentsDir);
  if (::mkdir(segments_dir.c_str(), 0777) != 0) {
    return ErrnoToStatus(errno, "mkdir", segments_dir);
  }
  for (uint64_t data_id : committed) {
    bool linked = false;
    CKPT_RETURN_IF_ERROR(
        LinkOrCopy(segments_->PathOf(data_id),
                   absl::StrCat(segments_dir, "/", segment_internal::SegmentFileName(data_id)),
                   &linked, &stats.segment_bytes));
    ++stats.segment_files;
    ++(linked ? stats.linked_files : stats.copied_files);
  }
  CKPT_RETURN_IF_ERROR(SyncDirectory(segments_dir));
  CKPT_RETURN_IF_ERROR(SyncDirectory(target_dir));
  StoreLog()->info(
      "event=backup dir={} target={} checkpoints={} segment_files={} linked={} copied={} "
      "segment_bytes={}",
      dir_, target_dir, stats.checkpoints, stats.segment_files, stats.linked_files,
      stats.copied_files, stats.segment_bytes);
  return stats;
}

void SegmentStore::EndBackupPin() {
  std::vector<uint64_t> deferred;
  {
    std::lock_guard<std::mutex> lock(backup_mu_);
    if (--backups_ > 0) return;
    deferred.swap(deferred_removals_);
  }
  for (uint64_t data_id : deferred) RemoveSegment(data_id);
}

namespace {

// Step 1 of RepairSegmentStore: RocksDB's own repair of the index files, then a note for each
// table it set aside (under lost/) because it could not read it.
absl::Status RepairIndexFiles(const std::string& dir, const std::string& doing,
                              std::vector<std::string>& notes) {
  std::error_code ec;
  {
    rocksdb::DBOptions options = DbOptions();
    options.create_if_missing = false;
    CKPT_RETURN_IF_ERROR(FromRocks(
        rocksdb::RepairDB(dir, options, ColumnFamilies(rocksdb::NewLRUCache(size_t{8} << 20))),
        doing));
  }
  if (std::filesystem::is_directory(std::filesystem::path(dir) / "lost", ec)) {
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(std::filesystem::path(dir) / "lost", ec)) {
      // RepairDB also moves the old manifest and the logs it converted to tables there; what
      // it could not read are tables.
      if (entry.is_regular_file(ec) && entry.path().extension() == ".sst") {
        notes.push_back(absl::StrCat("index table set aside as unreadable: ",
                                     entry.path().lexically_relative(dir).string()));
      }
    }
  }
  return absl::OkStatus();
}

// Step 2: every checkpoint record must name its data and that data must be marked committed.
// Deletes records too short to name their data and restores missing committed markers (into
// `batch`); raises *max_id to the highest data id named by a marker or a record.
absl::Status RestoreCommittedMarkers(const IndexDb& index, const std::string& doing,
                                     rocksdb::WriteBatch& batch, std::vector<std::string>& notes,
                                     uint64_t* max_id) {
  std::vector<uint64_t> marked;
  CKPT_RETURN_IF_ERROR(
      ScanMeta(index, kCommittedPrefix, doing, [&](std::string_view key, std::string_view) {
        if (key.size() == 9) marked.push_back(DecodeBigEndian(key.data() + 1, 8));
        return absl::OkStatus();
      }));
  std::sort(marked.begin(), marked.end());
  for (uint64_t id : marked) *max_id = std::max(*max_id, id);
  return ScanMeta(
      index, kCheckpointPrefix, doing, [&](std::string_view key, std::string_view value) {
        const std::string id(key.substr(1));
        if (value.size() < 8) {
          notes.push_back(
              absl::StrCat("checkpoint ", id, ": record too short to name its data, deleted"));
          return FromRocks(batch.Delete(index.meta(), segment_store_internal::ToSlice(key)), doing);
        }
        const uint64_t data_id = DecodeBigEndian(value.data(), 8);
        *max_id = std::max(*max_id, data_id);
        if (!std::binary_search(marked.begin(), marked.end(), data_id)) {
          notes.push_back(absl::StrCat("checkpoint ", id, ": committed marker of data id ", data_id,
                                       " restored"));
          return FromRocks(
              batch.Put(index.meta(), segment_store_internal::CommittedKey(data_id), ""), doing);
        }
        return absl::OkStatus();
      });
}

// Step 3: raises *max_id to the highest data id with chunk locations and to the highest segment
// file (an unreadable segments directory is skipped: the ids already found still count).
absl::Status RaiseToStoredDataIds(const IndexDb& index, const std::string& dir,
                                  const std::string& doing, uint64_t* max_id) {
  {
    std::unique_ptr<rocksdb::Iterator> it(
        index.db->NewIterator(rocksdb::ReadOptions(), index.locations()));
    it->SeekToLast();
    if (it->Valid() && it->key().size() >= 8) {
      *max_id = std::max(*max_id, DecodeBigEndian(it->key().data(), 8));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), doing));
  }
  absl::StatusOr<std::unique_ptr<segment_internal::SegmentDirectory>> segments =
      segment_internal::SegmentDirectory::Open(absl::StrCat(dir, "/", kSegmentsDir));
  if (segments.ok()) {
    absl::StatusOr<std::vector<uint64_t>> ids = (*segments)->List();
    if (ids.ok() && !ids->empty()) *max_id = std::max(*max_id, ids->back());
  }
  return absl::OkStatus();
}

// Step 4: the data id counter must be above every id in use, and the format version present;
// puts the fixes into `batch`.
absl::Status RestoreCounterAndFormat(const IndexDb& index, const std::string& doing,
                                     uint64_t max_id, rocksdb::WriteBatch& batch,
                                     std::vector<std::string>& notes) {
  std::string counter;
  const rocksdb::Status got =
      index.db->Get(rocksdb::ReadOptions(), index.meta(), kCounterKey, &counter);
  if (!got.ok() && !got.IsNotFound()) return FromRocks(got, doing);
  const uint64_t next = counter.size() == 8 ? DecodeBigEndian(counter.data(), 8) : 0;
  if (next <= max_id) {
    notes.push_back(absl::StrCat("data id counter set to ", max_id + 1));
    CKPT_RETURN_IF_ERROR(
        FromRocks(batch.Put(index.meta(), kCounterKey, BigEndian64(max_id + 1)), doing));
  }
  std::string format;
  const rocksdb::Status format_status =
      index.db->Get(rocksdb::ReadOptions(), index.meta(), kFormatKey, &format);
  if (format_status.IsNotFound()) {
    notes.push_back(absl::StrCat("store format version ", kStoreFormatVersion, " restored"));
    CKPT_RETURN_IF_ERROR(
        FromRocks(batch.Put(index.meta(), kFormatKey, BigEndian64(kStoreFormatVersion)), doing));
  } else if (!format_status.ok()) {
    return FromRocks(format_status, doing);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> RepairSegmentStore(const std::string& dir) {
  const std::string doing = absl::StrCat("repairing the RocksDB store in ", dir);
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(doing, ": no such directory"));
  }
  std::vector<std::string> notes;
  CKPT_RETURN_IF_ERROR(RepairIndexFiles(dir, doing, notes));
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<IndexDb> index,
                        IndexDb::Open(dir, /*read_only=*/false, doing));
  // The fixes of steps 2 and 4 go into one batch, written (synced) at the end.
  rocksdb::WriteBatch batch;
  uint64_t max_id = 0;
  CKPT_RETURN_IF_ERROR(RestoreCommittedMarkers(*index, doing, batch, notes, &max_id));
  CKPT_RETURN_IF_ERROR(RaiseToStoredDataIds(*index, dir, doing, &max_id));
  CKPT_RETURN_IF_ERROR(RestoreCounterAndFormat(*index, doing, max_id, batch, notes));
  rocksdb::WriteOptions write_options;
  write_options.sync = true;
  CKPT_RETURN_IF_ERROR(FromRocks(index->db->Write(write_options, &batch), doing));
  StoreLog()->info("event=repair dir={} changes={}", dir, notes.size());
  return notes;
}

}  // namespace ckpt
