// The RocksDB CheckpointStore (the server's store). Layout: storage/internal/
// rocksdb_store_internal.h. Chunk bytes live in one segment file per data id
// (storage/internal/segment_writer.h), indexed by location records in RocksDB. Durability: records
// (strategies, manifests, jobs, the data-id counter) are written with sync=true; chunk bytes and
// locations are not: a commit first syncs the data id's segment file, and its synced batch also
// syncs every earlier WAL record (the locations). An upload that never commits is garbage anyway.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/slice.h"
#include "rocksdb/status.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "spdlog/spdlog.h"
#include "storage/checkpoint_store.h"
#include "storage/file_stream.h"
#include "storage/internal/location_cache.h"
#include "storage/internal/index_records.h"
#include "storage/internal/segment_writer.h"

namespace ckpt {
namespace rocksdb_store_internal {
namespace {

void AppendBigEndian(std::string* out, uint64_t value, int bytes) {
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// The `bytes`-byte big-endian integer at `p` (AppendBigEndian's inverse).
uint64_t DecodeBigEndian(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

}  // namespace

std::string ChunkKey(const ChunkAddress& address) {
  std::string key;
  key.reserve(kChunkKeyBytes);
  AppendBigEndian(&key, address.data_id, 8);
  AppendBigEndian(&key, address.tensor, 4);
  AppendBigEndian(&key, address.blob, 4);
  AppendBigEndian(&key, address.chunk, 4);
  return key;
}

std::string EncodeLocation(const ChunkLocation& location) {
  std::string value;
  value.reserve(kLocationBytes);
  AppendBigEndian(&value, location.offset, 8);
  AppendBigEndian(&value, location.length, 8);
  return value;
}

std::optional<ChunkLocation> DecodeLocation(std::string_view value) {
  if (value.size() != kLocationBytes) return std::nullopt;
  return ChunkLocation{DecodeBigEndian(value.data(), 8), DecodeBigEndian(value.data() + 8, 8)};
}

}  // namespace rocksdb_store_internal

namespace {

using rocksdb_store_internal::AppendBigEndian;
using rocksdb_store_internal::DecodeBigEndian;
using rocksdb_store_internal::kChunkKeyBytes;

constexpr char kLoggerName[] = "storage";

// Meta record-type prefixes (see rocksdb_store_internal.h).
constexpr char kStrategyPrefix = 's';
constexpr char kCheckpointPrefix = 'c';
constexpr char kCommittedPrefix = 'd';
constexpr char kCounterKey[] = "n";
constexpr char kFormatKey[] = "v";
// Shared by all column families; keys, index and filter blocks (chunk bytes live in segment files).
constexpr size_t kBlockCacheBytes = size_t{64} << 20;
// Free space is re-measured (statvfs) after this long or this many bytes written, whichever comes
// first; in between it is estimated as "measured minus written since".
constexpr auto kDiskRecheckInterval = std::chrono::seconds(1);
constexpr int64_t kDiskRecheckBytes = int64_t{64} << 20;

std::shared_ptr<spdlog::logger> Log() {
  if (auto logger = spdlog::get(kLoggerName)) return logger;
  // The service may register its own "storage" logger (sinks, format) before opening the store;
  // otherwise inherit the default logger's sinks.
  auto logger = spdlog::default_logger()->clone(kLoggerName);
  try {
    spdlog::register_logger(logger);
  } catch (const spdlog::spdlog_ex&) {
    // Registered concurrently by another thread: use that one.
    if (auto existing = spdlog::get(kLoggerName)) return existing;
  }
  return logger;
}

// The one function that reads a rocksdb::Status (DESIGN.md §5). `doing` says what was being done
// ("reading chunk data 7 tensor 0 blob 0 chunk 3") and prefixes the message.
absl::Status FromRocks(const rocksdb::Status& status, std::string_view doing) {
  if (status.ok()) return absl::OkStatus();
  const std::string text = status.ToString();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (status.IsNoSpace() ||
      (status.IsIOError() && text.find("No space left on device") != std::string::npos)) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (status.IsCorruption()) {
    code = absl::StatusCode::kDataLoss;
  } else if (status.IsNotFound()) {
    code = absl::StatusCode::kNotFound;
  }
  return absl::Status(code, absl::StrCat(Sv(doing), ": ", text));
}

std::string BigEndian64(uint64_t value) {
  std::string out;
  out.reserve(8);
  AppendBigEndian(&out, value, 8);
  return out;
}

std::string MetaKey(char prefix, std::string_view name) {
  std::string key(1, prefix);
  key.append(name);
  return key;
}

std::string CommittedKey(uint64_t data_id) {
  return MetaKey(kCommittedPrefix, BigEndian64(data_id));
}

// [begin, end) of every chunk key of `data_id`. Data ids come from a counter starting at 1, so
// data_id + 1 never overflows in practice; the maximum id maps to an end past every key.
std::pair<std::string, std::string> DataIdRange(uint64_t data_id) {
  std::string end = data_id == std::numeric_limits<uint64_t>::max()
                        ? std::string(kChunkKeyBytes + 1, '\xff')
                        : BigEndian64(data_id + 1);
  return {BigEndian64(data_id), std::move(end)};
}

absl::Status NotLive(uint64_t data_id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "data id ", data_id, " is not live (never begun, already committed or discarded)"));
}

rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

rocksdb::ColumnFamilyOptions FamilyOptions(const std::shared_ptr<rocksdb::Cache>& block_cache) {
  rocksdb::ColumnFamilyOptions options;
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = block_cache;
  // Point lookups dominate (ReadChunk, Get*); a Bloom filter makes misses (NOT_FOUND, the
  // ALREADY_EXISTS checks) skip the data blocks.
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  return options;
}

// Thread-safe. Owns the DB and its column-family handles. Locks:
//   meta_mu_  serialises check-then-write on meta (strategy create/delete, commit, checkpoint
//             delete), so e.g. two commits of one id cannot both pass the existence check.
//   id_mu_    serialises data-id allocation (a synced counter write).
//   data_mu_  guards the live data ids; held only briefly (never across RocksDB I/O).
//   disk_mu_  guards the cached free-space measurement.
// The only nesting is meta_mu_ -> data_mu_ (CommitCheckpoint claiming its data id); PutChunks,
// which a commit may wait for, never takes meta_mu_, so the wait cannot deadlock.
class RocksDbStore final : public CheckpointStore {
 public:
  static absl::StatusOr<std::unique_ptr<RocksDbStore>> Open(const std::string& dir,
                                                            const StoreOptions& options);
  ~RocksDbStore() override;
  RocksDbStore(const RocksDbStore&) = delete;
  RocksDbStore& operator=(const RocksDbStore&) = delete;

  absl::Status PutStrategy(const std::string& name, std::string_view record,
                           bool overwrite) override;
  absl::StatusOr<std::string> GetStrategy(const std::string& name) override;
  absl::StatusOr<std::vector<std::string>> ListStrategies() override;
  absl::Status DeleteStrategy(const std::string& name) override;

  absl::StatusOr<uint64_t> BeginData() override;
  absl::Status PutChunks(const std::vector<ChunkWrite>& chunks) override;
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override;
  absl::Status DiscardData(uint64_t data_id) override;

  absl::Status CommitCheckpoint(const std::string& id, std::string_view manifest,
                                uint64_t data_id) override;
  absl::StatusOr<std::string> GetManifest(const std::string& id) override;
  absl::StatusOr<std::vector<std::string>> ListCheckpoints() override;
  absl::Status DeleteCheckpoint(const std::string& id) override;

  absl::Status PutJob(const std::string& id, std::string_view record) override;
  absl::StatusOr<std::string> GetJob(const std::string& id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs() override;

  absl::StatusOr<int64_t> CollectGarbage() override;
  absl::Status Flush() override;
  StoreStats stats() const override;

 private:
  // A begun data id. kClosing: a commit or discard has claimed it; PutChunks refuses it and the
  // claimant waits until `writers` (PutChunks calls in flight) drops to zero, so no chunk can land
  // after the commit or the discard's DeleteRange.
  enum class DataState { kLive, kClosing };
  struct DataEntry {
    DataState state = DataState::kLive;
    int writers = 0;
  };

  RocksDbStore(std::string dir, StoreOptions options, std::shared_ptr<rocksdb::Cache> block_cache,
               rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*> handles,
               std::unique_ptr<segment_internal::SegmentFiles> segments);

  // Deletes every chunk location record of `data_id` in `batch`.
  absl::Status BatchDeleteChunks(rocksdb::WriteBatch* batch, uint64_t data_id,
                                 std::string_view doing);
  // Removes the segment file of a data id whose records are gone; a failure is logged (the file
  // is garbage and CollectGarbage retries).
  void RemoveSegment(uint64_t data_id);
  // Whether `data_id` is begun and not yet committed or discarded (its chunks may still change).
  bool IsLive(uint64_t data_id);
  // Reads the locations of every chunk of the blob of `address` with one scan and keeps them in
  // location_cache_; returns the one of `address` (nullopt when absent, or when the scan failed:
  // the chunk is then looked up alone).
  std::optional<rocksdb_store_internal::ChunkLocation> ScanBlobLocations(
      const ChunkAddress& address);
  // CollectGarbage's pass over the chunk locations: deletes the records of garbage data ids.
  absl::StatusOr<int64_t> CollectLocations();

  // Checks the store's format version (kStoreFormatVersion), recording it in a new, empty store:
  // FAILED_PRECONDITION naming the problem for any other store.
  absl::Status CheckFormat();
  absl::Status LoadCounter();

  // Value of `key` in `family`; NOT_FOUND (message from the caller's `what`, e.g. "strategy x")
  // when absent.
  absl::StatusOr<std::string> Get(rocksdb::ColumnFamilyHandle* family, const std::string& key,
                                  std::string_view what);
  // Calls `fn(key without prefix, value)` for every key of `family` starting with `prefix`
  // (every key when empty), in key order.
  template <typename Fn>
  absl::Status ScanPrefix(rocksdb::ColumnFamilyHandle* family, std::string_view prefix,
                          std::string_view doing, Fn fn);
  absl::Status Write(rocksdb::WriteBatch* batch, bool sync, std::string_view doing);

  // Moves a live data id to kClosing and waits for its in-flight PutChunks calls to finish.
  absl::Status ClaimLiveData(uint64_t data_id);
  // Finishes a claim: forgets the data id, or (the commit failed) makes it live again.
  void ReleaseClaim(uint64_t data_id, bool forget);
  // Garbage unless begun in this process (live or being claimed) or committed. Checks memory
  // first: an id leaves memory only after its committed marker is written, so the marker is then
  // certain to be visible.
  absl::StatusOr<bool> IsGarbage(uint64_t data_id);

  absl::Status CheckFreeDisk(int64_t incoming_bytes);
  void NoteWritten(int64_t bytes);

  const std::string dir_;
  const StoreOptions options_;
  const std::shared_ptr<rocksdb::Cache> block_cache_;
  rocksdb::DB* const db_;  // owned; closed and deleted by the destructor
  // owned; default, meta, jobs, chunk_locations
  const std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* const meta_;
  rocksdb::ColumnFamilyHandle* const jobs_;
  rocksdb::ColumnFamilyHandle* const locations_;
  const std::unique_ptr<segment_internal::SegmentFiles> segments_;
  // At most 1 Mi chunk locations (16 MiB) kept in memory.
  static constexpr size_t kMaxCachedLocations = size_t{1} << 20;
  rocksdb_store_internal::LocationCache location_cache_{kMaxCachedLocations};

  std::mutex meta_mu_;

  std::mutex id_mu_;
  uint64_t next_data_id_ = 1;  // guarded by id_mu_

  std::mutex data_mu_;
  std::condition_variable data_cv_;               // signalled when writers drops
  std::unordered_map<uint64_t, DataEntry> data_;  // guarded by data_mu_

  std::mutex disk_mu_;
  bool disk_measured_ = false;                         // guarded by disk_mu_
  int64_t measured_free_bytes_ = 0;                    // guarded by disk_mu_
  int64_t written_since_measure_ = 0;                  // guarded by disk_mu_
  std::chrono::steady_clock::time_point measured_at_;  // guarded by disk_mu_

  std::atomic<int64_t> chunk_bytes_read_{0};
  std::atomic<int64_t> chunks_read_{0};
  std::atomic<int64_t> chunk_bytes_written_{0};
  std::atomic<int64_t> chunks_written_{0};
  // Chunk ranges deleted since the last compaction by CollectGarbage.
  std::atomic<int64_t> deleted_ranges_{0};
};

absl::StatusOr<std::unique_ptr<RocksDbStore>> RocksDbStore::Open(const std::string& dir,
                                                                 const StoreOptions& options) {
  const std::string doing = absl::StrCat("cannot open RocksDB store in ", dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    const absl::Status status = ErrnoToStatus(ec.value(), "create directory", dir);
    return absl::Status(status.code(), absl::StrCat(doing, ": ", status.message()));
  }

  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  // Sized for the 2-core machines ckptd runs on: two background threads (max_background_jobs 2)
  // shared by flushes and compactions, leaving the cores mostly to request handling.
  db_options.IncreaseParallelism(2);
  db_options.max_background_flushes = 2;
  db_options.env->SetBackgroundThreads(2, rocksdb::Env::Priority::HIGH);
  // Chunk bytes go to segment files; records and chunk locations use the WAL. Bound it so idle
  // families (meta, jobs) get flushed and old WAL files deleted, which also bounds recovery time.
  db_options.max_total_wal_size = uint64_t{512} << 20;
  // Sync in the background as data is written, so the synced commit does not stall on a large
  // backlog of dirty pages.
  db_options.wal_bytes_per_sync = 1 << 20;
  db_options.bytes_per_sync = 1 << 20;
  db_options.keep_log_file_num = 5;
  db_options.max_log_file_size = 16 << 20;

  auto block_cache = rocksdb::NewLRUCache(kBlockCacheBytes);
  rocksdb::ColumnFamilyOptions record_options = FamilyOptions(block_cache);
  record_options.write_buffer_size = 8 << 20;  // small records: keep memory and replay small

  using rocksdb_store_internal::kJobsFamily;
  using rocksdb_store_internal::kLocationsFamily;
  using rocksdb_store_internal::kMetaFamily;
  const std::vector<rocksdb::ColumnFamilyDescriptor> families = {
      {rocksdb::kDefaultColumnFamilyName, record_options},
      {kMetaFamily, record_options},
      {kJobsFamily, record_options},
      // 16-byte values, one per chunk: small records.
      {kLocationsFamily, record_options},
  };
  if (options.mapped_bytes_budget < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        doing, ": mapped bytes budget ", options.mapped_bytes_budget, " is negative"));
  }
  segment_internal::SegmentOptions segment_options;
  segment_options.window_budget_bytes = options.mapped_bytes_budget;
  absl::StatusOr<std::unique_ptr<segment_internal::SegmentFiles>> segments =
      segment_internal::SegmentFiles::Open(
          absl::StrCat(dir, "/", rocksdb_store_internal::kSegmentsDir), segment_options);
  if (!segments.ok()) {
    return absl::Status(segments.status().code(),
                        absl::StrCat(doing, ": ", segments.status().message()));
  }
  // An existing database must have exactly this layout's column families. A "chunks" family
  // means chunk bytes kept in RocksDB, a layout this version does not read: refused by name
  // rather than opened (RocksDB would only say that a family was not opened).
  std::vector<std::string> existing;
  if (rocksdb::DB::ListColumnFamilies(db_options, dir, &existing).ok()) {
    if (std::find(existing.begin(), existing.end(), rocksdb_store_internal::kChunkBytesFamily) !=
        existing.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          doing, ": it has a \"", rocksdb_store_internal::kChunkBytesFamily,
          "\" column family, which holds chunk bytes in RocksDB: that layout is not readable by "
          "this version of ckptd, which keeps chunk bytes in segment files (move the directory "
          "away and upload the checkpoints again)"));
    }
  }
  rocksdb::DB* db = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  CKPT_RETURN_IF_ERROR(
      FromRocks(rocksdb::DB::Open(db_options, dir, families, &handles, &db), doing));

  std::unique_ptr<RocksDbStore> store(new RocksDbStore(
      dir, options, std::move(block_cache), db, std::move(handles), *std::move(segments)));
  if (absl::Status format = store->CheckFormat(); !format.ok()) {
    return absl::Status(format.code(), absl::StrCat(doing, ": ", format.message()));
  }
  CKPT_RETURN_IF_ERROR(store->LoadCounter());
  // Nothing is live yet, so this removes every upload that was in progress when the previous
  // process stopped.
  CKPT_RETURN_IF_ERROR(store->CollectGarbage().status());
  Log()->info("event=store_open dir={} format={} next_data_id={}", dir,
              rocksdb_store_internal::kStoreFormatVersion, store->next_data_id_);
  return store;
}

RocksDbStore::RocksDbStore(std::string dir, StoreOptions options,
                           std::shared_ptr<rocksdb::Cache> block_cache, rocksdb::DB* db,
                           std::vector<rocksdb::ColumnFamilyHandle*> handles,
                           std::unique_ptr<segment_internal::SegmentFiles> segments)
    : dir_(std::move(dir)),
      options_(std::move(options)),
      block_cache_(std::move(block_cache)),
      db_(db),
      handles_(std::move(handles)),
      meta_(handles_.at(1)),
      jobs_(handles_.at(2)),
      locations_(handles_.at(3)),
      segments_(std::move(segments)) {}

RocksDbStore::~RocksDbStore() {
  for (rocksdb::ColumnFamilyHandle* handle : handles_) {
    const absl::Status status =
        FromRocks(db_->DestroyColumnFamilyHandle(handle), "releasing a column family");
    if (!status.ok())
      Log()->warn("event=store_close dir={} error=\"{}\"", dir_, std::string(status.message()));
  }
  // Close() reports errors that deleting alone would swallow (e.g. a failed final WAL sync).
  const absl::Status status =
      FromRocks(db_->Close(), absl::StrCat("closing RocksDB store in ", dir_));
  if (!status.ok())
    Log()->warn("event=store_close dir={} error=\"{}\"", dir_, std::string(status.message()));
  delete db_;
}

absl::Status RocksDbStore::CheckFormat() {
  using rocksdb_store_internal::kStoreFormatVersion;
  absl::StatusOr<std::string> value = Get(meta_, kFormatKey, "store format version");
  if (value.ok()) {
    if (value->size() != 8) {
      return absl::DataLossError(
          absl::StrCat("its format version record has ", value->size(), " bytes, expected 8"));
    }
    const uint64_t version = DecodeBigEndian(value->data(), 8);
    if (version != kStoreFormatVersion) {
      return absl::FailedPreconditionError(absl::StrCat(
          "it is in store format ", version, "; this version of ckptd reads format ",
          kStoreFormatVersion, " only"));
    }
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(value.status())) return value.status();
  // No version: a new store (or one whose creation stopped before its first record) gets one;
  // anything else was not written by this version.
  for (rocksdb::ColumnFamilyHandle* family : {meta_, jobs_, locations_}) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), family));
    it->SeekToFirst();
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "checking whether the store is new"));
    if (it->Valid()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "it holds records but no store format version (expected format ", kStoreFormatVersion,
          "): not a store this version of ckptd can read"));
    }
  }
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(meta_, kFormatKey, BigEndian64(kStoreFormatVersion)),
                                 "batching the store format version"));
  return Write(&batch, /*sync=*/true, "recording the store format version");
}

absl::Status RocksDbStore::LoadCounter() {
  absl::StatusOr<std::string> value = Get(meta_, kCounterKey, "data id counter");
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

absl::StatusOr<std::string> RocksDbStore::Get(rocksdb::ColumnFamilyHandle* family,
                                              const std::string& key, std::string_view what) {
  std::string value;
  const absl::Status status = FromRocks(db_->Get(rocksdb::ReadOptions(), family, key, &value),
                                        absl::StrCat("reading ", Sv(what)));
  if (absl::IsNotFound(status)) return absl::NotFoundError(absl::StrCat(Sv(what), " not found"));
  if (!status.ok()) return status;
  return value;
}

template <typename Fn>
absl::Status RocksDbStore::ScanPrefix(rocksdb::ColumnFamilyHandle* family, std::string_view prefix,
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

absl::Status RocksDbStore::Write(rocksdb::WriteBatch* batch, bool sync, std::string_view doing) {
  rocksdb::WriteOptions write_options;
  write_options.sync = sync;
  return FromRocks(db_->Write(write_options, batch), doing);
}

// --- Strategies ---------------------------------------------------------------------------------

absl::Status RocksDbStore::PutStrategy(const std::string& name, std::string_view record,
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

absl::StatusOr<std::string> RocksDbStore::GetStrategy(const std::string& name) {
  return Get(meta_, MetaKey(kStrategyPrefix, name), absl::StrCat("strategy ", name));
}

absl::StatusOr<std::vector<std::string>> RocksDbStore::ListStrategies() {
  std::vector<std::string> names;
  CKPT_RETURN_IF_ERROR(
      ScanPrefix(meta_, std::string(1, kStrategyPrefix), "listing strategies",
                 [&](std::string_view name, std::string_view) { names.emplace_back(name); }));
  return names;
}

absl::Status RocksDbStore::DeleteStrategy(const std::string& name) {
  const std::string key = MetaKey(kStrategyPrefix, name);
  const std::string what = absl::StrCat("strategy ", name);
  std::lock_guard<std::mutex> lock(meta_mu_);
  CKPT_RETURN_IF_ERROR(Get(meta_, key, what).status());
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Delete(meta_, key), "batching delete of " + what));
  return Write(&batch, /*sync=*/true, "deleting " + what);
}

// --- Chunks -------------------------------------------------------------------------------------

absl::StatusOr<uint64_t> RocksDbStore::BeginData() {
  uint64_t data_id = 0;
  {
    std::lock_guard<std::mutex> lock(id_mu_);
    data_id = next_data_id_;
    // Persist before handing the id out: after a crash the id must not be handed out again, or a
    // new upload could inherit chunks (or a committed marker) of an old one.
    rocksdb::WriteBatch batch;
    CKPT_RETURN_IF_ERROR(
        FromRocks(batch.Put(meta_, kCounterKey, BigEndian64(data_id + 1)), "batching data id"));
    CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/true, "persisting the data id counter"));
    next_data_id_ = data_id + 1;
  }
  std::lock_guard<std::mutex> lock(data_mu_);
  data_.emplace(data_id, DataEntry{});
  return data_id;
}

absl::Status RocksDbStore::PutChunks(const std::vector<ChunkWrite>& chunks) {
  if (chunks.empty()) return absl::OkStatus();
  int64_t incoming = 0;
  std::vector<uint64_t> ids;
  for (const ChunkWrite& c : chunks) {
    incoming += static_cast<int64_t>(c.bytes.size());
    ids.push_back(c.address.data_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());

  // Register as a writer of every data id, so a commit or discard waits for this write.
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    for (uint64_t id : ids) {
      auto it = data_.find(id);
      if (it == data_.end() || it->second.state != DataState::kLive) return NotLive(id);
    }
    for (uint64_t id : ids) ++data_[id].writers;
  }
  absl::Cleanup unregister = [&] {
    {
      std::lock_guard<std::mutex> lock(data_mu_);
      for (uint64_t id : ids) --data_[id].writers;
    }
    data_cv_.notify_all();
  };

  CKPT_RETURN_IF_ERROR(CheckFreeDisk(incoming));
  // The bytes go to each data id's segment file; the batch records where (unsynced: the commit
  // syncs the segment file, then its synced batch syncs the WAL that holds these records).
  rocksdb::WriteBatch batch(/*reserved_bytes=*/chunks.size() *
                            (kChunkKeyBytes + rocksdb_store_internal::kLocationBytes + 16));
  // One append per data id and stream (usually one in all).
  std::vector<std::pair<uint64_t, uint32_t>> lanes;
  for (const ChunkWrite& c : chunks) lanes.push_back({c.address.data_id, c.stream});
  std::sort(lanes.begin(), lanes.end());
  lanes.erase(std::unique(lanes.begin(), lanes.end()), lanes.end());
  std::vector<std::string_view> pieces;
  for (const auto& [id, stream] : lanes) {
    auto in_lane = [&](const ChunkWrite& c) {
      return c.address.data_id == id && c.stream == stream;
    };
    pieces.clear();
    for (const ChunkWrite& c : chunks) {
      if (in_lane(c)) pieces.push_back(c.bytes);
    }
    const std::string doing = absl::StrCat("writing ", pieces.size(), " chunks of data id ", id);
    absl::StatusOr<std::vector<uint64_t>> offsets = segments_->Append(id, pieces, stream);
    if (!offsets.ok()) {
      return absl::Status(offsets.status().code(),
                          absl::StrCat(doing, ": ", offsets.status().message()));
    }
    size_t k = 0;
    for (const ChunkWrite& c : chunks) {
      if (!in_lane(c)) continue;
      const rocksdb_store_internal::ChunkLocation location{(*offsets)[k++], c.bytes.size()};
      CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(locations_,
                                               rocksdb_store_internal::ChunkKey(c.address),
                                               rocksdb_store_internal::EncodeLocation(location)),
                                     absl::StrCat("batching chunk ", c.address.ToString())));
    }
  }
  CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/false,
                             absl::StrCat("recording ", chunks.size(), " chunks (", incoming,
                                          " bytes) of data id ", chunks.front().address.data_id)));
  NoteWritten(incoming);
  chunks_written_.fetch_add(static_cast<int64_t>(chunks.size()), std::memory_order_relaxed);
  chunk_bytes_written_.fetch_add(incoming, std::memory_order_relaxed);
  return absl::OkStatus();
}

bool RocksDbStore::IsLive(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(data_mu_);
  return data_.contains(data_id);
}

std::optional<rocksdb_store_internal::ChunkLocation> RocksDbStore::ScanBlobLocations(
    const ChunkAddress& address) {
  using rocksdb_store_internal::LocationCache;
  ChunkAddress first = address;
  first.chunk = 0;
  const std::string from = rocksdb_store_internal::ChunkKey(first);
  const rocksdb::Slice blob(from.data(), rocksdb_store_internal::kChunkKeyBytes - 4);
  LocationCache::Locations locations;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), locations_));
  for (it->Seek(from); it->Valid() && it->key().starts_with(blob); it->Next()) {
    if (it->key().size() != rocksdb_store_internal::kChunkKeyBytes) return std::nullopt;
    const uint64_t chunk =  // the key's last 4 bytes (ChunkKey)
        DecodeBigEndian(it->key().data() + rocksdb_store_internal::kChunkKeyBytes - 4, 4);
    // A damaged record stays out: its chunk is then looked up alone, which reports it.
    const std::optional<rocksdb_store_internal::ChunkLocation> location =
        rocksdb_store_internal::DecodeLocation(std::string_view(it->value().data(),
                                                                it->value().size()));
    if (chunk >= kMaxCachedLocations) return std::nullopt;  // too large to keep
    if (chunk >= locations.size()) locations.resize(size_t{chunk} + 1, LocationCache::kNoChunk);
    locations[chunk] = location.value_or(LocationCache::kNoChunk);
  }
  if (!it->status().ok()) return std::nullopt;  // the lookup alone reports the error
  std::optional<rocksdb_store_internal::ChunkLocation> found;
  if (address.chunk < locations.size() &&
      locations[address.chunk].offset != LocationCache::kNoChunk.offset) {
    found = locations[address.chunk];
  }
  location_cache_.Insert(address, std::move(locations));
  return found;
}

absl::StatusOr<std::unique_ptr<ChunkData>> RocksDbStore::ReadChunkUnverified(
    const ChunkAddress& address) {
  // The chunk is named only when something went wrong: no string is built per read.
  auto what = [&] { return absl::StrCat("reading chunk ", address.ToString()); };
  // Chunks of committed data: their blob's locations, read with one scan for the whole blob.
  // Chunks of data being uploaded may still be added: those are looked up one by one, and so is
  // a chunk its cached blob lacks (which is then not found).
  const rocksdb_store_internal::LocationCache::Lookup cached = location_cache_.Find(address);
  std::optional<rocksdb_store_internal::ChunkLocation> location = cached.location;
  if (!cached.blob_cached && !IsLive(address.data_id)) location = ScanBlobLocations(address);
  std::string key;  // built only when needed
  rocksdb::Status found = rocksdb::Status::OK();
  if (!location) {
    key = rocksdb_store_internal::ChunkKey(address);
    rocksdb::PinnableSlice value;
    found = db_->Get(rocksdb::ReadOptions(), locations_, key, &value);
    if (found.ok()) {
      location =
          rocksdb_store_internal::DecodeLocation(std::string_view(value.data(), value.size()));
      if (!location) {
        return absl::DataLossError(absl::StrCat(what(), ": location record of ", value.size(),
                                                " bytes, expected ",
                                                rocksdb_store_internal::kLocationBytes));
      }
    }
  }
  if (location) {
    absl::StatusOr<std::unique_ptr<ChunkData>> data =
        segments_->Read(address.data_id, location->offset, location->length, "");
    if (absl::IsDataLoss(data.status())) {
      // The checkpoint may have been deleted between the lookup and the read (its segment file
      // goes right after its records): that is NOT_FOUND, not damage.
      if (key.empty()) key = rocksdb_store_internal::ChunkKey(address);
      rocksdb::PinnableSlice again;
      if (db_->Get(rocksdb::ReadOptions(), locations_, key, &again).IsNotFound()) {
        return absl::NotFoundError(
            absl::StrCat("chunk ", address.ToString(), " not found (deleted while being read)"));
      }
    }
    if (!data.ok()) {
      return absl::Status(data.status().code(),
                          absl::StrCat(what(), ": ", data.status().message()));
    }
    chunks_read_.fetch_add(1, std::memory_order_relaxed);
    chunk_bytes_read_.fetch_add(static_cast<int64_t>(location->length), std::memory_order_relaxed);
    return *std::move(data);
  }
  if (!found.IsNotFound()) return FromRocks(found, what());
  return absl::NotFoundError(absl::StrCat("chunk ", address.ToString(), " not found"));
}

absl::Status RocksDbStore::ClaimLiveData(uint64_t data_id) {
  std::unique_lock<std::mutex> lock(data_mu_);
  auto it = data_.find(data_id);
  if (it == data_.end() || it->second.state != DataState::kLive) return NotLive(data_id);
  it->second.state = DataState::kClosing;
  // unordered_map references stay valid across other insertions and erasures.
  DataEntry& entry = it->second;
  data_cv_.wait(lock, [&] { return entry.writers == 0; });
  return absl::OkStatus();
}

void RocksDbStore::ReleaseClaim(uint64_t data_id, bool forget) {
  std::lock_guard<std::mutex> lock(data_mu_);
  if (forget) {
    data_.erase(data_id);
  } else {
    data_[data_id].state = DataState::kLive;
  }
}

absl::Status RocksDbStore::DiscardData(uint64_t data_id) {
  CKPT_RETURN_IF_ERROR(ClaimLiveData(data_id));
  // Forget first: if the delete below fails, the chunks are garbage and CollectGarbage retries.
  ReleaseClaim(data_id, /*forget=*/true);
  rocksdb::WriteBatch batch;
  const std::string doing = absl::StrCat("discarding chunks of data id ", data_id);
  CKPT_RETURN_IF_ERROR(BatchDeleteChunks(&batch, data_id, doing));
  // Unsynced: if lost in a crash, the chunks belong to an uncommitted id and are collected at open.
  CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/false, doing));
  deleted_ranges_.fetch_add(1, std::memory_order_relaxed);
  RemoveSegment(data_id);
  return absl::OkStatus();
}

// --- Checkpoints --------------------------------------------------------------------------------

absl::Status RocksDbStore::CommitCheckpoint(const std::string& id, std::string_view manifest,
                                            uint64_t data_id) {
  const std::string key = MetaKey(kCheckpointPrefix, id);
  const std::string what = absl::StrCat("checkpoint ", id);
  // Held from the existence check to the write, so two commits of one id cannot both win.
  std::lock_guard<std::mutex> lock(meta_mu_);
  absl::StatusOr<std::string> existing = Get(meta_, key, what);
  if (existing.ok()) return absl::AlreadyExistsError(absl::StrCat(what, " exists"));
  if (!absl::IsNotFound(existing.status())) return existing.status();

  CKPT_RETURN_IF_ERROR(ClaimLiveData(data_id));
  // The chunk bytes were written unsynced (PutChunks): make them durable before the commit that
  // references them. The synced batch below syncs the WAL, and with it their location records.
  absl::Status synced = segments_->Sync(data_id);
  if (!synced.ok()) {
    ReleaseClaim(data_id, /*forget=*/false);
    return absl::Status(synced.code(),
                        absl::StrCat("syncing the chunks of ", what, ": ", synced.message()));
  }
  std::string value = BigEndian64(data_id);
  value.append(manifest);
  rocksdb::WriteBatch batch;
  absl::Status status = FromRocks(batch.Put(meta_, key, value), "batching " + what);
  if (status.ok()) {
    status = FromRocks(batch.Put(meta_, CommittedKey(data_id), rocksdb::Slice()),
                       "batching the committed marker of " + what);
  }
  if (status.ok()) status = Write(&batch, /*sync=*/true, "committing " + what);
  // On failure the upload stays live: the caller may retry the commit or discard it.
  ReleaseClaim(data_id, /*forget=*/status.ok());
  return status;
}

absl::StatusOr<std::string> RocksDbStore::GetManifest(const std::string& id) {
  const std::string what = absl::StrCat("checkpoint ", id);
  CKPT_ASSIGN_OR_RETURN(std::string value, Get(meta_, MetaKey(kCheckpointPrefix, id), what));
  if (value.size() < 8) {
    return absl::DataLossError(
        absl::StrCat(what, " has a truncated record (", value.size(), " bytes) in ", dir_));
  }
  value.erase(0, 8);
  return value;
}

absl::StatusOr<std::vector<std::string>> RocksDbStore::ListCheckpoints() {
  std::vector<std::string> ids;
  CKPT_RETURN_IF_ERROR(
      ScanPrefix(meta_, std::string(1, kCheckpointPrefix), "listing checkpoints",
                 [&](std::string_view id, std::string_view) { ids.emplace_back(id); }));
  return ids;
}

absl::Status RocksDbStore::DeleteCheckpoint(const std::string& id) {
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
  location_cache_.EraseData(data_id);
  deleted_ranges_.fetch_add(1, std::memory_order_relaxed);
  RemoveSegment(data_id);
  return absl::OkStatus();
}

absl::Status RocksDbStore::BatchDeleteChunks(rocksdb::WriteBatch* batch, uint64_t data_id,
                                             std::string_view doing) {
  const auto [begin, end] = DataIdRange(data_id);
  return FromRocks(batch->DeleteRange(locations_, begin, end), doing);
}

void RocksDbStore::RemoveSegment(uint64_t data_id) {
  const absl::Status removed = segments_->Remove(data_id);
  if (!removed.ok()) {
    Log()->warn("event=segment_remove data_id={} error=\"{}\"", data_id,
                std::string(removed.message()));
  }
}

// --- Jobs ---------------------------------------------------------------------------------------

absl::Status RocksDbStore::PutJob(const std::string& id, std::string_view record) {
  const std::string doing = absl::StrCat("writing job ", id);
  rocksdb::WriteBatch batch;
  CKPT_RETURN_IF_ERROR(FromRocks(batch.Put(jobs_, id, ToSlice(record)), doing));
  return Write(&batch, /*sync=*/true, doing);
}

absl::StatusOr<std::string> RocksDbStore::GetJob(const std::string& id) {
  return Get(jobs_, id, absl::StrCat("job ", id));
}

absl::StatusOr<std::vector<JobRecord>> RocksDbStore::ListJobs() {
  std::vector<JobRecord> jobs;
  CKPT_RETURN_IF_ERROR(
      ScanPrefix(jobs_, "", "listing jobs", [&](std::string_view id, std::string_view record) {
        jobs.push_back(JobRecord{std::string(id), std::string(record)});
      }));
  return jobs;
}

// --- Maintenance --------------------------------------------------------------------------------

absl::StatusOr<bool> RocksDbStore::IsGarbage(uint64_t data_id) {
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

absl::StatusOr<int64_t> RocksDbStore::CollectGarbage() {
  CKPT_ASSIGN_OR_RETURN(const int64_t collected, CollectLocations());
  // Segment files of garbage data ids: uploads that never committed, and files whose records a
  // delete or discard removed before this process stopped or failed to remove the file.
  int64_t files = 0;
  CKPT_ASSIGN_OR_RETURN(const std::vector<uint64_t> segment_ids, segments_->List());
  for (uint64_t data_id : segment_ids) {
    CKPT_ASSIGN_OR_RETURN(const bool garbage, IsGarbage(data_id));
    if (!garbage) continue;
    CKPT_RETURN_IF_ERROR(segments_->Remove(data_id));
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
  Log()->info("event=gc collected={} segment_files_removed={} compacted_deletes={}", collected,
              files, deleted);
  return collected;
}

absl::StatusOr<int64_t> RocksDbStore::CollectLocations() {
  rocksdb::ReadOptions read_options;
  read_options.fill_cache = false;  // a one-off scan: do not evict the hot blocks
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(read_options, locations_));
  int64_t collected = 0;
  // Visit one key per data id: after deciding on an id, seek to the start of the next one. The
  // iterator's implicit snapshot does not see our own DeleteRange, which is fine: we skip past it.
  for (it->SeekToFirst(); it->Valid();) {
    const rocksdb::Slice key = it->key();
    if (key.size() != kChunkKeyBytes) {
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

absl::Status RocksDbStore::Flush() {
  rocksdb::FlushOptions flush_options;
  flush_options.wait = true;
  CKPT_RETURN_IF_ERROR(FromRocks(db_->Flush(flush_options, handles_),
                                 absl::StrCat("flushing RocksDB store in ", dir_)));
  return FromRocks(db_->SyncWAL(), absl::StrCat("syncing the WAL of RocksDB store in ", dir_));
}

StoreStats RocksDbStore::stats() const {
  StoreStats stats;
  stats.chunk_bytes_read = chunk_bytes_read_.load(std::memory_order_relaxed);
  stats.chunks_read = chunks_read_.load(std::memory_order_relaxed);
  stats.chunk_bytes_written = chunk_bytes_written_.load(std::memory_order_relaxed);
  stats.chunks_written = chunks_written_.load(std::memory_order_relaxed);
  stats.chunk_bytes_copied = segments_->bytes_copied();
  stats.mapped_bytes = segments_->mapped_bytes();
  return stats;
}

absl::Status RocksDbStore::CheckFreeDisk(int64_t incoming_bytes) {
  int64_t free_bytes = 0;
  if (options_.free_disk_bytes) {
    // Injected (tests): asked every time so that a change takes effect at once.
    CKPT_ASSIGN_OR_RETURN(free_bytes, options_.free_disk_bytes());
  } else {
    std::lock_guard<std::mutex> lock(disk_mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!disk_measured_ || now - measured_at_ >= kDiskRecheckInterval ||
        written_since_measure_ >= kDiskRecheckBytes) {
      CKPT_ASSIGN_OR_RETURN(measured_free_bytes_, FreeDiskBytes(dir_));
      measured_at_ = now;
      written_since_measure_ = 0;
      disk_measured_ = true;
    }
    free_bytes = measured_free_bytes_ - written_since_measure_;
  }
  // Concurrent writers may each pass with the same estimate; the reserve (1 GiB by default) is
  // meant to absorb that, as well as WAL and compaction overhead.
  if (free_bytes - incoming_bytes < options_.min_free_disk_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "refusing to write %d bytes of chunks: %d bytes free on %s, below the reserve of %d bytes "
        "(StoreOptions.min_free_disk_bytes)",
        incoming_bytes, free_bytes, dir_, options_.min_free_disk_bytes));
  }
  return absl::OkStatus();
}

void RocksDbStore::NoteWritten(int64_t bytes) {
  std::lock_guard<std::mutex> lock(disk_mu_);
  written_since_measure_ += bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenRocksDbStore(const std::string& dir,
                                                                  const StoreOptions& options) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RocksDbStore> store, RocksDbStore::Open(dir, options));
  return std::unique_ptr<CheckpointStore>(std::move(store));
}

}  // namespace ckpt
