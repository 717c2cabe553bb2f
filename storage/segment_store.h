// SegmentStore: the CheckpointStore ckptd uses (OpenSegmentStore in checkpoint_store.h). RocksDB
// holds what is small, ordered and must change atomically: strategies, manifests, jobs, the
// data-id counter and every chunk's location (storage/internal/index_records.h). Chunk bytes live
// in one append-only segment file per upload data id (storage/internal/segment_directory.h),
// written by the segment writer and read, as views of mapped windows, by the segment reader.
//
// A full disk: every write path (strategies, manifests and commits, jobs, deletes, data ids,
// chunk writes, garbage collection, the flush at shutdown) first checks the free-space reserve
// (StoreOptions::min_free_disk_bytes) and fails with RESOURCE_EXHAUSTED while it is breached, so
// that RocksDB itself never runs out of space mid-write. A store whose disk is below the reserve
// when it is opened is opened read-only: reads work, every write is refused.
//
// Durability: records (strategies, manifests, jobs, the data-id counter) are written with
// sync=true; chunk bytes and locations are not: a commit first syncs the data id's segment file,
// and its synced batch also makes every earlier RocksDB write-ahead-log record durable (the
// locations). An upload that never commits is garbage anyway.
//
// The implementation is split by concept: segment_store.cc (open, format check, RocksDB helpers,
// free-disk reserve, stats), segment_store_records.cc (strategies, checkpoints, jobs),
// segment_store_chunks.cc (data ids, chunk writes and reads), segment_store_gc.cc (deleting
// chunks, garbage collection), segment_store_backup.cc (online backup, offline repair). No RocksDB
// header is included here: RocksDB types appear only as pointers to forward-declared classes.
#ifndef CKPT_STORAGE_SEGMENT_STORE_H_
#define CKPT_STORAGE_SEGMENT_STORE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"

namespace rocksdb {
class Cache;
class ColumnFamilyHandle;
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace ckpt {
namespace segment_internal {
class SegmentDirectory;
class ReadCursor;
class SegmentReader;
class SegmentWriter;
}  // namespace segment_internal
namespace segment_store_internal {
class LocationCache;
struct ChunkLocation;
}  // namespace segment_store_internal

// Thread-safe. Owns the DB, its column-family handles and the segment files. Locks:
//   meta_mu_  serialises check-then-write on meta (strategy create/delete, commit, checkpoint
//             delete), so e.g. two commits of one id cannot both pass the existence check.
//   id_mu_    serialises data-id allocation (a synced counter write).
//   data_mu_  guards the live data ids; held only briefly (never across RocksDB I/O).
//   disk_mu_  guards the cached free-space measurement.
// The only nesting is meta_mu_ -> data_mu_ (CommitCheckpoint claiming its data id); PutChunks,
// which a commit may wait for, never takes meta_mu_, so the wait cannot deadlock.
class SegmentStore final : public CheckpointStore {
 public:
  // Opens (creating if needed) the store in `dir` and collects the garbage of uploads that never
  // committed. FAILED_PRECONDITION for a directory in another store format.
  static absl::StatusOr<std::unique_ptr<SegmentStore>> Open(const std::string& dir,
                                                            const StoreOptions& options);
  ~SegmentStore() override;
  SegmentStore(const SegmentStore&) = delete;
  SegmentStore& operator=(const SegmentStore&) = delete;

  absl::Status PutStrategy(const std::string& name, std::string_view record,
                           bool overwrite) override;
  absl::StatusOr<std::string> GetStrategy(const std::string& name) override;
  absl::StatusOr<std::vector<std::string>> ListStrategies() override;
  absl::Status DeleteStrategy(const std::string& name) override;

  absl::StatusOr<uint64_t> BeginData() override;
  absl::Status PutChunks(const std::vector<ChunkWrite>& chunks) override;
  // Chunks of one data id and stream are placed in its segment file's write blocks (the
  // segment writer's Reserve); others get the default's buffers.
  absl::StatusOr<std::unique_ptr<ChunkReservation>> ReserveChunks(
      const std::vector<ChunkSpace>& chunks) override;
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override;
  void ReadChunksUnverified(std::span<const ChunkAddress> addresses,
                            std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>>* out) override;
  absl::Status DiscardData(uint64_t data_id) override;

  absl::Status CommitCheckpoint(const std::string& id, std::string_view manifest,
                                uint64_t data_id) override;
  absl::StatusOr<std::string> GetManifest(const std::string& id) override;
  absl::StatusOr<std::vector<std::string>> ListCheckpoints() override;
  absl::Status DeleteCheckpoint(const std::string& id) override;

  absl::Status PutJob(const std::string& id, std::string_view record) override;
  absl::StatusOr<std::string> GetJob(const std::string& id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs() override;
  absl::Status DeleteJob(const std::string& id) override;

  absl::StatusOr<int64_t> CollectGarbage() override;
  absl::Status Flush() override;
  absl::StatusOr<BackupStats> Backup(const std::string& target_dir) override;
  StoreStats stats() const override;

 private:
  class Reservation;

  // A begun data id. kClosing: a commit or discard has claimed it; PutChunks refuses it and the
  // claimant waits until `writers` (PutChunks calls in flight) drops to zero, so no chunk can land
  // after the commit or the discard's DeleteRange.
  enum class DataState { kLive, kClosing };
  struct DataEntry {
    DataState state = DataState::kLive;
    int writers = 0;
  };

  // At most 1 Mi chunk locations (16 MiB) kept in memory.
  static constexpr size_t kMaxCachedLocations = size_t{1} << 20;

  SegmentStore(std::string dir, StoreOptions options, std::shared_ptr<rocksdb::Cache> block_cache,
               rocksdb::DB* db, std::vector<rocksdb::ColumnFamilyHandle*> handles,
               std::unique_ptr<segment_internal::SegmentDirectory> segments,
               std::string read_only_reason);

  // --- Open (segment_store.cc) ---
  // Checks the store's format version (kStoreFormatVersion), recording it in a new, empty store:
  // FAILED_PRECONDITION naming the problem for any other store.
  absl::Status CheckFormat();
  absl::Status LoadCounter();

  // --- RocksDB helpers ---
  // Value of `key` in `family`; NOT_FOUND (message from the caller's `what`, e.g. "strategy x")
  // when absent (segment_store.cc).
  absl::StatusOr<std::string> Get(rocksdb::ColumnFamilyHandle* family, const std::string& key,
                                  std::string_view what);
  // Calls `fn(key without prefix, value)` for every key of `family` starting with `prefix`
  // (every key when empty), in key order (segment_store_records.cc, its only user).
  template <typename Fn>
  absl::Status ScanPrefix(rocksdb::ColumnFamilyHandle* family, std::string_view prefix,
                          std::string_view doing, Fn fn);
  absl::Status Write(rocksdb::WriteBatch* batch, bool sync, std::string_view doing);

  // --- Chunks (segment_store_chunks.cc) ---
  // Whether `data_id` is begun and not yet committed or discarded (its chunks may still change).
  bool IsLive(uint64_t data_id);
  // Appends the chunks of each (data id, stream) to its segment file and records their
  // locations in `batch`.
  absl::Status AppendChunks(const std::vector<ChunkWrite>& chunks, rocksdb::WriteBatch* batch);
  // Records in `batch` where the chunks of one data id are: chunks[i] (a ChunkWrite or
  // ChunkSpace) at offsets[i], `sizes[i]` bytes. Sole chunks go to one pack record, the others to
  // a record each.
  template <typename Chunk>
  absl::Status BatchLocations(uint64_t data_id, const std::vector<Chunk>& chunks,
                              const std::vector<uint64_t>& offsets,
                              const std::vector<int64_t>& sizes, rocksdb::WriteBatch* batch);
  // Counts a PutChunks (or a reservation's commit) as a writer of each of the sorted `ids`, so
  // that a commit or discard of one waits for it; FAILED_PRECONDITION (nothing counted) when one
  // is not live. EndWrite undoes it.
  absl::Status BeginWrite(const std::vector<uint64_t>& ids);
  void EndWrite(const std::vector<uint64_t>& ids);
  // Reads the locations of every chunk of the blob of `address` with one scan and keeps them in
  // location_cache_; returns the one of `address` (nullopt when absent, or when the scan failed:
  // the chunk is then looked up alone).
  std::optional<segment_store_internal::ChunkLocation> ScanBlobLocations(
      const ChunkAddress& address);
  // Reads the packs of the data id of committed `address` (index_records.h) and keeps them in
  // location_cache_ (when not too many); returns the location of `address` if packed. DATA_LOSS
  // when a pack record is damaged.
  absl::StatusOr<std::optional<segment_store_internal::ChunkLocation>> LoadPacks(
      const ChunkAddress& address);
  // The location of `address` in its data id's packs, read on every call and not cached (live
  // data, whose packs may still grow); nullopt when not packed. DATA_LOSS when a pack record is
  // damaged.
  absl::StatusOr<std::optional<segment_store_internal::ChunkLocation>> FindInPacks(
      const ChunkAddress& address);
  // Calls fn(const PackEntry&) for every entry of every pack of `data_id`, in key order.
  template <typename Fn>
  absl::Status ScanPacks(uint64_t data_id, Fn fn);
  // Reads the chunk at `address` from `location` (ReadChunkUnverified's last step); `cursor`:
  // kept from the previous chunk of a run of reads (null: none).
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadLocated(
      const ChunkAddress& address, const segment_store_internal::ChunkLocation& location,
      segment_internal::ReadCursor* cursor = nullptr);
  // Moves a live data id to kClosing and waits for its in-flight PutChunks calls to finish.
  absl::Status ClaimLiveData(uint64_t data_id);
  // Finishes a claim: forgets the data id, or (the commit failed) makes it live again.
  void ReleaseClaim(uint64_t data_id, bool forget);

  // --- Deleting chunks, garbage (segment_store_gc.cc) ---
  // Deletes every chunk location record of `data_id` in `batch`.
  absl::Status BatchDeleteChunks(rocksdb::WriteBatch* batch, uint64_t data_id,
                                 std::string_view doing);
  // Removes the segment file of a data id whose records are gone (and the reader's windows of it).
  absl::Status RemoveSegmentFile(uint64_t data_id);
  // Ends a backup's pin on segment files (Backup, segment_store_backup.cc): the last backup to
  // end removes the files whose removal was deferred meanwhile.
  void EndBackupPin();
  // RemoveSegmentFile, a failure only logged (the file is garbage and CollectGarbage retries).
  void RemoveSegment(uint64_t data_id);
  // Garbage unless begun in this process (live or being claimed) or committed. Checks memory
  // first: an id leaves memory only after its committed marker is written, so the marker is then
  // certain to be visible.
  absl::StatusOr<bool> IsGarbage(uint64_t data_id);
  // CollectGarbage's pass over the chunk locations: deletes the records of garbage data ids.
  absl::StatusOr<int64_t> CollectLocations();

  // --- Free-disk reserve (segment_store.cc) ---
  // RESOURCE_EXHAUSTED, naming `doing` and the reserve, when writing `incoming_bytes` would leave
  // less than options_.min_free_disk_bytes free, or when the store was opened read-only. `fresh`
  // measures the free space now (metadata writes, which are rare) instead of using the estimate
  // kept between measurements (chunk writes).
  absl::Status CheckFreeDisk(int64_t incoming_bytes, std::string_view doing, bool fresh = false);
  void NoteWritten(int64_t bytes);

  const std::string dir_;
  const StoreOptions options_;
  // Non-empty when the store was opened read-only (the disk was below the reserve at open): why.
  // Every write is then refused with RESOURCE_EXHAUSTED.
  const std::string read_only_reason_;
  const std::shared_ptr<rocksdb::Cache> block_cache_;
  rocksdb::DB* const db_;  // owned; closed and deleted by the destructor
  // owned; default, meta, jobs, chunk_locations
  const std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::ColumnFamilyHandle* const meta_;
  rocksdb::ColumnFamilyHandle* const jobs_;
  rocksdb::ColumnFamilyHandle* const locations_;
  // The segment files, and their writer and reader (which use the directory: declared after it).
  const std::unique_ptr<segment_internal::SegmentDirectory> segments_;
  const std::unique_ptr<segment_internal::SegmentWriter> writer_;
  const std::unique_ptr<segment_internal::SegmentReader> reader_;
  const std::unique_ptr<segment_store_internal::LocationCache> location_cache_;

  std::mutex meta_mu_;

  std::mutex id_mu_;
  uint64_t next_data_id_ = 1;  // guarded by id_mu_

  std::mutex data_mu_;
  std::condition_variable data_cv_;               // signalled when writers drops
  std::unordered_map<uint64_t, DataEntry> data_;  // guarded by data_mu_

  // Backups in progress pin every segment file: RemoveSegmentFile defers removals while
  // backups_ > 0 and holds backup_mu_ while it removes, so a backup that has taken its pin
  // (before it copies the index) finds every file its copy of the index names.
  std::mutex backup_mu_;
  int backups_ = 0;                          // guarded by backup_mu_
  std::vector<uint64_t> deferred_removals_;  // guarded by backup_mu_

  std::mutex disk_mu_;
  bool disk_measured_ = false;                         // guarded by disk_mu_
  int64_t measured_free_bytes_ = 0;                    // guarded by disk_mu_
  int64_t written_since_measure_ = 0;                  // guarded by disk_mu_
  std::chrono::steady_clock::time_point measured_at_;  // guarded by disk_mu_

  std::atomic<int64_t> chunk_bytes_read_{0};
  std::atomic<int64_t> chunks_read_{0};
  std::atomic<int64_t> chunk_bytes_written_{0};
  std::atomic<int64_t> chunks_written_{0};
  // The sequence of the next pack record (index_records.h): increasing in write order, so that a
  // later write of a sole chunk is in a later pack. Data ids are never written across restarts,
  // so the sequence need not persist.
  std::atomic<uint64_t> next_pack_{0};
  // Chunk ranges deleted since the last compaction by CollectGarbage.
  std::atomic<int64_t> deleted_ranges_{0};
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_SEGMENT_STORE_H_
