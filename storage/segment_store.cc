// SegmentStore (segment_store.h): opening the store (RocksDB options, column families, the
// format check), the RocksDB helpers the other parts use, the free-disk reserve and the stats.
#include "storage/segment_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "storage/file_stream.h"
#include "storage/internal/index_records.h"
#include "storage/internal/location_cache.h"
#include "storage/internal/segment_directory.h"
#include "storage/internal/segment_reader.h"
#include "storage/internal/segment_store_support.h"
#include "storage/internal/segment_writer.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace {

using segment_store_internal::BigEndian64;
using segment_store_internal::DecodeBigEndian;
using segment_store_internal::FromRocks;
using segment_store_internal::StoreLog;

// Shared by all column families; keys, index and filter blocks (chunk bytes live in segment files).
constexpr size_t kBlockCacheBytes = size_t{64} << 20;
// Free space is re-measured (statvfs) after this long or this many bytes written, whichever comes
// first; in between it is estimated as "measured minus written since".
constexpr auto kDiskRecheckInterval = std::chrono::seconds(1);
constexpr int64_t kDiskRecheckBytes = int64_t{64} << 20;

// `status` with `doing: ` in front.
absl::Status Doing(std::string_view doing, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(Sv(doing), ": ", status.message()));
}

// The process holding RocksDB's lock on `lock_path` (a POSIX record lock on the whole file), or
// 0 when none does (or the file cannot be checked).
pid_t LockHolder(const std::string& lock_path) {
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct flock lock = {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  const int got = ::fcntl(fd, F_GETLK, &lock);
  ::close(fd);
  return got == 0 && lock.l_type != F_UNLCK ? lock.l_pid : 0;
}

// Deletes the empty write-ahead logs older than the one `db` (just opened on `dir` for writing)
// writes to; returns how many it deleted. RocksDB before 8.3 (Debian 12 ships 7.8) does not
// retire the log of an open in which nothing was written until a later memtable flush, so a store
// that restarts often without writes (a serving ckptd under rolling restarts, or one in a crash
// loop) would keep one empty `NNNNNN.log` per start, each read again at every open. An empty log
// holds no record, and RocksDB does not track logs in its manifest
// (track_and_verify_wals_in_manifest is off), so deleting it loses nothing; this is upstream's
// workaround for the bug. Best effort: a log that cannot be deleted stays, with a warning.
int DeleteEmptyOldLogs(rocksdb::DB* db, const std::string& dir) {
  std::unique_ptr<rocksdb::LogFile> current;
  if (!db->GetCurrentWalFile(&current).ok() || current == nullptr) return 0;
  int deleted = 0;
  std::error_code ec;
  // Incremented with an error code: a directory that cannot be read ends the scan, not ckptd.
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    uint64_t number = 0;
    if (!name.ends_with(".log") || !absl::SimpleAtoi(name.substr(0, name.size() - 4), &number) ||
        number >= current->LogNumber()) {
      continue;
    }
    std::error_code stat_ec;
    if (!entry.is_regular_file(stat_ec) || entry.file_size(stat_ec) != 0 || stat_ec) continue;
    if (std::error_code remove_ec; !std::filesystem::remove(entry.path(), remove_ec)) {
      StoreLog()->warn("event=store_open dir={} error=\"cannot delete the empty old log {}: {}\"",
                       dir, name, remove_ec.message());
      continue;
    }
    ++deleted;
  }
  return deleted;
}

}  // namespace

namespace segment_store_internal {

rocksdb::DBOptions DbOptions() {
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  // Sized for the 2-core machines ckptd runs on: two background threads (max_background_jobs 2)
  // shared by flushes and compactions, leaving the cores mostly to request handling.
  db_options.IncreaseParallelism(2);
  db_options.max_background_flushes = 2;
  db_options.env->SetBackgroundThreads(2, rocksdb::Env::Priority::HIGH);
  // Records and chunk locations go through the write-ahead log. Bound it so that idle families
  // (meta, jobs) get flushed and old log files deleted, which also bounds recovery time.
  db_options.max_total_wal_size = uint64_t{512} << 20;
  // Sync in the background as data is written, so the synced commit does not stall on a large
  // backlog of dirty pages.
  db_options.wal_bytes_per_sync = 1 << 20;
  db_options.bytes_per_sync = 1 << 20;
  // The info log goes to ckptd's own log rather than a LOG file in the store (see
  // NewRocksDbLogger).
  db_options.info_log = segment_store_internal::NewRocksDbLogger();
  db_options.keep_log_file_num = 5;
  db_options.max_log_file_size = 16 << 20;
  return db_options;
}

// The column families of index_records.h, all of small records.
std::vector<rocksdb::ColumnFamilyDescriptor> ColumnFamilies(
    const std::shared_ptr<rocksdb::Cache>& block_cache) {
  rocksdb::ColumnFamilyOptions options;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = block_cache;
  // Point lookups dominate (ReadChunk, Get*); a Bloom filter makes misses (NOT_FOUND, the
  // ALREADY_EXISTS checks) skip the data blocks.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  options.write_buffer_size = 8 << 20;  // small records: keep memory and replay small
  return {
      {rocksdb::kDefaultColumnFamilyName, options},
      {segment_store_internal::kMetaFamily, options},
      {segment_store_internal::kJobsFamily, options},
      // 16-byte values, one per chunk.
      {segment_store_internal::kLocationsFamily, options},
  };
}

}  // namespace segment_store_internal

namespace {

using segment_store_internal::ColumnFamilies;
using segment_store_internal::DbOptions;

// An existing database must have exactly this layout's column families. A "chunks" family means
// chunk bytes kept in RocksDB, a layout this version does not read: refused by name rather than
// opened (RocksDB would only say that a family was not opened).
absl::Status RefuseChunkBytesFamily(const rocksdb::DBOptions& db_options, const std::string& dir) {
  using segment_store_internal::kChunkBytesFamily;
  std::vector<std::string> existing;
  if (!rocksdb::DB::ListColumnFamilies(db_options, dir, &existing).ok()) return absl::OkStatus();
  if (std::find(existing.begin(), existing.end(), kChunkBytesFamily) == existing.end()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "it has a \"", kChunkBytesFamily,
      "\" column family, which holds chunk bytes in RocksDB: that layout is not readable by "
      "this version of ckptd, which keeps chunk bytes in segment files (move the directory "
      "away and upload the checkpoints again)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SegmentStore>> SegmentStore::Open(const std::string& dir,
                                                                 const StoreOptions& options) {
  const std::string doing = absl::StrCat("cannot open RocksDB store in ", dir);
  std::error_code ec;
  if (options.read_only) {
    // Nothing is created: a store that is not there is an error.
    if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec)) {
      return absl::NotFoundError(absl::StrCat(doing, ": no store exists there"));
    }
    // A read-only open takes no lock; a store a running ckptd writes to would be read while it
    // changes.
    if (const pid_t holder = LockHolder(absl::StrCat(dir, "/LOCK")); holder != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(doing, ": it is in use by a running ckptd (process ", holder,
                       "); stop it first, or verify a backup of it (ckptctl backup)"));
    }
  } else {
    std::filesystem::create_directories(dir, ec);
    if (ec) return Doing(doing, ErrnoToStatus(ec.value(), "create directory", dir));
  }

  const rocksdb::DBOptions db_options = DbOptions();
  auto block_cache = rocksdb::NewLRUCache(kBlockCacheBytes);
  const std::vector<rocksdb::ColumnFamilyDescriptor> families = ColumnFamilies(block_cache);
  if (options.mapped_bytes_budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(doing, ": mapped bytes budget ", options.mapped_bytes_budget, " is negative"));
  }
  segment_internal::SegmentOptions segment_options;
  segment_options.window_budget_bytes = options.mapped_bytes_budget;
  absl::StatusOr<std::unique_ptr<segment_internal::SegmentDirectory>> segments =
      segment_internal::SegmentDirectory::Open(
          absl::StrCat(dir, "/", segment_store_internal::kSegmentsDir), segment_options);
  if (!segments.ok()) return Doing(doing, segments.status());
  if (absl::Status refused = RefuseChunkBytesFamily(db_options, dir); !refused.ok()) {
    return Doing(doing, refused);
  }
  // Opening a RocksDB database for writing writes (a new manifest, log and options file): on a
  // disk below the reserve it is opened read-only instead, and serves what it holds.
  // (A failed measurement opens it for writing: each write then measures again, and is refused
  // while that fails.)
  absl::StatusOr<int64_t> free_bytes =
      options.free_disk_bytes ? options.free_disk_bytes() : FreeDiskBytes(dir);
  std::string read_only_reason;
  if (options.read_only) {
    read_only_reason =
        absl::StrCat("the store in ", dir, " was opened read-only (for verification)");
  } else if (free_bytes.ok() && *free_bytes < options.min_free_disk_bytes) {
    read_only_reason = absl::StrFormat(
        "the store in %s was opened read-only because its disk had %d bytes free, below the "
        "free-space reserve of %d bytes (ckptd --min-free-disk-mib); free space and restart "
        "ckptd to write again",
        dir, *free_bytes, options.min_free_disk_bytes);
    if (!std::filesystem::exists(std::filesystem::path(dir) / "CURRENT", ec)) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s: no store exists there yet, and its disk has %d bytes free, below the free-space "
          "reserve of %d bytes (ckptd --min-free-disk-mib)",
          doing, *free_bytes, options.min_free_disk_bytes));
    }
  }
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  if (read_only_reason.empty()) {
    CKPT_RETURN_IF_ERROR(
        FromRocks(rocksdb::DB::Open(db_options, dir, families, &handles, &db), doing));
  } else {
    CKPT_RETURN_IF_ERROR(
        FromRocks(rocksdb::DB::OpenForReadOnly(db_options, dir, families, &handles, &db), doing));
  }

  std::unique_ptr<SegmentStore> store(new SegmentStore(dir, options, std::move(block_cache), db,
                                                       std::move(handles), *std::move(segments),
                                                       read_only_reason));
  if (absl::Status format = store->CheckFormat(); !format.ok()) return Doing(doing, format);
  CKPT_RETURN_IF_ERROR(store->LoadCounter());
  if (options.read_only) {
    StoreLog()->info("event=store_open dir={} format={} mode=read-only", dir,
                     segment_store_internal::kStoreFormatVersion);
    return store;
  }
  if (!read_only_reason.empty()) {
    StoreLog()->warn(
        "event=store_open dir={} format={} mode=read-only free_bytes={} "
        "reserve_bytes={} (below the free-space reserve: writes are refused)",
        dir, segment_store_internal::kStoreFormatVersion, *free_bytes, options.min_free_disk_bytes);
    return store;
  }
  const int deleted_logs = DeleteEmptyOldLogs(store->db_, dir);
  // Nothing is live yet, so this removes every upload that was in progress when the previous
  // process stopped. Skipped when the disk cannot take its writes now (the periodic collection
  // does it later: an upload of a previous process is never live again).
  if (absl::Status room = store->CheckFreeDisk(0, "collecting garbage at open", true); room.ok()) {
    CKPT_RETURN_IF_ERROR(store->CollectGarbage().status());
  } else {
    StoreLog()->warn("event=store_open dir={} gc=skipped error=\"{}\"", dir,
                     std::string(room.message()));
  }
  StoreLog()->info("event=store_open dir={} format={} next_data_id={} empty_logs_deleted={}", dir,
                   segment_store_internal::kStoreFormatVersion, store->next_data_id_, deleted_logs);
  return store;
}

SegmentStore::SegmentStore(std::string dir, StoreOptions options,
                           std::shared_ptr<rocksdb::Cache> block_cache, rocksdb::DB* db,
                           std::vector<rocksdb::ColumnFamilyHandle*> handles,
                           std::unique_ptr<segment_internal::SegmentDirectory> segments,
                           std::string read_only_reason)
    : dir_(std::move(dir)),
      options_(std::move(options)),
      read_only_reason_(std::move(read_only_reason)),
      block_cache_(std::move(block_cache)),
      db_(db),
      handles_(std::move(handles)),
      meta_(handles_.at(1)),
      jobs_(handles_.at(2)),
      locations_(handles_.at(3)),
      segments_(std::move(segments)),
      writer_(std::make_unique<segment_internal::SegmentWriter>(segments_.get())),
      reader_(std::make_unique<segment_internal::SegmentReader>(segments_.get())),
      location_cache_(
          std::make_unique<segment_store_internal::LocationCache>(kMaxCachedLocations)) {}

SegmentStore::~SegmentStore() {
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    const absl::Status status =
        FromRocks(db_->DestroyColumnFamilyHandle(handle), "releasing a column family");
    if (!status.ok()) {
      StoreLog()->warn("event=store_close dir={} error=\"{}\"", dir_,
                       std::string(status.message()));
    }
  }
  // Close() reports errors that deleting alone would swallow (e.g. a failed final log sync).
  const absl::Status status =
      FromRocks(db_->Close(), absl::StrCat("closing RocksDB store in ", dir_));
  if (!status.ok()) {
    StoreLog()->warn("event=store_close dir={} error=\"{}\"", dir_, std::string(status.message()));
  }
  delete db_;
}

absl::Status SegmentStore::CheckFormat() {
  using segment_store_internal::kFormatKey;
  using segment_store_internal::kStoreFormatVersion;
  absl::StatusOr<std::string> value = Get(meta_, kFormatKey, "store format version");
  if (value.ok()) {
    if (value->size() != 8) {
      return absl::DataLossError(
          absl::StrCat("its format version record has ", value->size(), " bytes, expected 8"));
    }
    const uint64_t version = DecodeBigEndian(value->data(), 8);
    using segment_store_internal::kOldestReadableFormatVersion;
    if (version < kOldestReadableFormatVersion || version > kStoreFormatVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("it is in store format ", version, "; this version of ckptd reads formats ",
                       kOldestReadableFormatVersion, " to ", kStoreFormatVersion));
    }
    // An older format is a subset of this one: recorded as this one, since records of this
    // format may be written from now on (an older ckptd then refuses the store rather than
    // misreading it). A read-only store gets no records, so it keeps its format.
    if (version == kStoreFormatVersion || !read_only_reason_.empty()) return absl::OkStatus();
    rocksdb::WriteBatch batch;
    CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(meta_, kFormatKey, BigEndian64(kStoreFormatVersion)),
                                   "batching the store format version"));
    return Write(&batch, /*sync=*/true, "recording the store format version");
  }
  if (!absl::IsNotFound(value.status())) return value.status();
  // No version: a new store (or one whose creation stopped before its first record) gets one;
  // anything else was not written by this version.
  for (rocksdb::ColumnFamilyHandle* family : {meta_, jobs_, locations_}) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), family));
    it->SeekToFirst();
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "checking whether the store is new"));
    if (it->Valid()) {
      return absl::FailedPreconditionError(
          absl::StrCat("it holds records but no store format version (expected format ",
                       kStoreFormatVersion, "): not a store this version of ckptd can read"));
    }
  }
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(meta_, kFormatKey, BigEndian64(kStoreFormatVersion)),
                                 "batching the store format version"));
  return Write(&batch, /*sync=*/true, "recording the store format version");
}

absl::Status SegmentStore::LoadCounter() {
  absl::StatusOr<std::string> value =
      Get(meta_, segment_store_internal::kCounterKey, "data id counter");
  if (absl::IsNotFound(value.status())) return absl::OkStatus();  // a new store
  if (!value.ok()) return value.status();
  if (value->size() != 8) {
    return absl::DataLossError(
        absl::StrCat("data id counter in ", dir_, " has ", value->size(), " bytes, expected 8"));
  }
  std::lock_guard<std::mutex> lock(id_mu_);
  next_data_id_ = DecodeBigEndian(value->data(), 8);
  return absl::OkStatus();
}

absl::StatusOr<std::string> SegmentStore::Get(rocksdb::ColumnFamilyHandle* family,
                                              const std::string& key, std::string_view what) {
  std::string value;
  const absl::Status status = FromRocks(db_->Get(rocksdb::ReadOptions(), family, key, &value),
                                        absl::StrCat("reading ", Sv(what)));
  if (absl::IsNotFound(status)) return absl::NotFoundError(absl::StrCat(Sv(what), " not found"));
  if (!status.ok()) return status;
  return value;
}

absl::Status SegmentStore::Write(rocksdb::WriteBatch* batch, bool sync, std::string_view doing) {
  // Every RocksDB write passes here: refused while the reserve is breached, before RocksDB can
  // meet a full disk (the reserve absorbs the records' own few bytes; chunk bytes were counted
  // by PutChunks). Synced writes are records (rare): the free space is measured for them.
  CKPT_RETURN_IF_ERROR(CheckFreeDisk(0, doing, sync));
  rocksdb::WriteOptions write_options;
  write_options.sync = sync;
  // A batch's keys are mostly ascending (PutChunks: one stream's slices in tensor order), while
  // several streams write into the same key range at once: each batch keeps its own insert
  // positions in the memtable instead of searching from the top for every key.
  write_options.memtable_insert_hint_per_batch = true;
  return FromRocks(db_->Write(write_options, batch), doing);
}

absl::Status SegmentStore::Flush() {
  // Writes table files: refused on a full disk (the write-ahead log keeps the records).
  CKPT_RETURN_IF_ERROR(CheckFreeDisk(0, absl::StrCat("flushing RocksDB store in ", dir_), true));
  rocksdb::FlushOptions flush_options;
  flush_options.wait = true;
  CKPT_RETURN_IF_ERROR(FromRocks(db_->Flush(flush_options, handles_),
                                 absl::StrCat("flushing RocksDB store in ", dir_)));
  return FromRocks(db_->SyncWAL(), absl::StrCat("syncing the WAL of RocksDB store in ", dir_));
}

StoreStats SegmentStore::stats() const {
  StoreStats stats;
  stats.chunk_bytes_read = chunk_bytes_read_.load(std::memory_order_relaxed);
  stats.chunks_read = chunks_read_.load(std::memory_order_relaxed);
  stats.chunk_bytes_written = chunk_bytes_written_.load(std::memory_order_relaxed);
  stats.chunks_written = chunks_written_.load(std::memory_order_relaxed);
  stats.chunk_bytes_copied = reader_->bytes_copied();
  stats.mapped_bytes = reader_->mapped_bytes();
  return stats;
}

absl::Status SegmentStore::CheckFreeDisk(int64_t incoming_bytes, std::string_view doing,
                                         bool fresh) {
  if (!read_only_reason_.empty()) {
    return absl::ResourceExhaustedError(absl::StrCat(Sv(doing), " refused: ", read_only_reason_));
  }
  int64_t free_bytes = 0;
  if (options_.free_disk_bytes) {
    // Injected (tests): asked every time so that a change takes effect at once.
    CKPT_ASSIGN_OR_RETURN(free_bytes, options_.free_disk_bytes());
  } else {
    std::lock_guard<std::mutex> lock(disk_mu_);
    const auto now = std::chrono::steady_clock::now();
    if (fresh || !disk_measured_ || now - measured_at_ >= kDiskRecheckInterval ||
        written_since_measure_ >= kDiskRecheckBytes) {
      CKPT_ASSIGN_OR_RETURN(measured_free_bytes_, FreeDiskBytes(dir_));
      measured_at_ = now;
      written_since_measure_ = 0;
      disk_measured_ = true;
    }
    free_bytes = measured_free_bytes_ - written_since_measure_;
  }
  // Concurrent writers may each pass with the same estimate; the reserve (1 GiB by default) is
  // meant to absorb that, as well as write-ahead-log and compaction overhead.
  if (free_bytes - incoming_bytes < options_.min_free_disk_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s refused (%d bytes): %d bytes free on %s, below the free-space reserve of %d bytes "
        "(ckptd --min-free-disk-mib)",
        doing, incoming_bytes, free_bytes, dir_, options_.min_free_disk_bytes));
  }
  return absl::OkStatus();
}

void SegmentStore::NoteWritten(int64_t bytes) {
  std::lock_guard<std::mutex> lock(disk_mu_);
  written_since_measure_ += bytes;
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenSegmentStore(const std::string& dir,
                                                                  const StoreOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<SegmentStore> store, SegmentStore::Open(dir, options));
  return std::unique_ptr<CheckpointStore>(std::move(store));
}

}  // namespace ckpt
