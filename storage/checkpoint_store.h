// The persistent state of ckptd behind one interface: strategies, committed checkpoint manifests,
// the chunks of tensor bytes they reference, and job records. Two implementations: the segment
// store (OpenSegmentStore below, the default: a RocksDB index beside segment files holding the
// chunk bytes, segment_store.h) and in-memory (NewMemoryStore, for tests); one conformance suite
// (tests/unit/store_conformance_test.cc) runs against both.
//
// Records (strategies, manifests, jobs) are opaque bytes to the store: the service encodes them
// (proto/ckpt_records.proto). Chunks belong to a *data id*: every upload allocates one, writes its
// chunks under it, and either commits a manifest that references it (atomically, synced) or
// discards it. Chunks of a data id that no manifest references and that no live upload holds are
// garbage (CollectGarbage).
//
// No RocksDB type appears here. Implementations are thread-safe: every method may be called from
// any thread concurrently.
#ifndef CKPT_STORAGE_CHECKPOINT_STORE_H_
#define CKPT_STORAGE_CHECKPOINT_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// Where one chunk lives: upload data id, tensor index in the manifest, stored-slice (blob) index
// within the tensor, chunk index within the slice. Keys sort in this order, so one slice — and one
// tensor — is a contiguous key range.
struct ChunkAddress {
  uint64_t data_id = 0;
  uint32_t tensor = 0;
  uint32_t blob = 0;
  uint32_t chunk = 0;
  std::string ToString() const;  // "data 7 tensor 3 blob 1 chunk 12"
  friend bool operator==(const ChunkAddress&, const ChunkAddress&) = default;
};

// One chunk to write. `bytes` must stay valid for the duration of the call.
struct ChunkWrite {
  ChunkAddress address;
  std::string_view bytes;
  // The writer's stream (an upload's source rank): a store keeps the chunks of one stream
  // together where it can (the segment store: in extents of its segment file of their own), so
  // that a stored slice is not interleaved with the slices other streams upload at the same time.
  uint32_t stream = 0;
  // The chunk is the only one of its blob, and every write of this address says the same. The
  // segment store then records its location together with the call's other sole chunks, one
  // index record for all of them, instead of one record each (a later write of the address
  // still replaces an earlier one).
  bool sole_chunk = false;
};

// Room for one chunk whose bytes the writer puts in place (CheckpointStore::ReserveChunks).
struct ChunkSpace {
  ChunkAddress address;
  int64_t bytes = 0;
  uint32_t stream = 0;      // as ChunkWrite::stream
  bool sole_chunk = false;  // as ChunkWrite::sole_chunk
};

// Room a store has reserved for chunks (CheckpointStore::ReserveChunks): the caller writes each
// chunk's bytes to its places, in order, and Commit records the chunks as PutChunks of the same
// bytes would (the same errors; the chunks are readable from then on). Destroyed without a
// successful Commit, nothing is recorded: the room stays unreferenced, as after a failed
// PutChunks. Not thread-safe: one owner, who must not outlive the store.
class ChunkReservation {
 public:
  virtual ~ChunkReservation() = default;
  // Chunks reserved, in the order asked for.
  size_t size() const { return first_.empty() ? 0 : first_.size() - 1; }
  // Where chunk `i`'s bytes go, in order: spans whose sizes add up to its bytes (one, or a few
  // where the store's room is not contiguous). Valid until Commit or destruction.
  std::span<const std::span<char>> places(size_t i) const {
    return std::span<const std::span<char>>(places_.data() + first_[i], first_[i + 1] - first_[i]);
  }
  // Once, after every chunk's bytes are in place.
  virtual absl::Status Commit() = 0;

 protected:
  // Chunk i's places are places_[first_[i]] .. places_[first_[i + 1] - 1].
  std::vector<std::span<char>> places_;
  std::vector<size_t> first_;
};

// Bytes of one chunk as read. May reference storage-owned memory (no copy); valid while the
// object lives. Not thread-safe.
class ChunkData {
 public:
  // What holding a chunk keeps resident beyond its own bytes: for a view of a mapping the store
  // made (the segment store's windows), the mapping (`id`, the same for every chunk of it) and the
  // most bytes of it that can be resident while any chunk of it is held. A cache of chunks counts
  // a mapping once however many of its chunks it keeps. {nullptr, 0} for bytes of its own.
  struct Pin {
    const void* id = nullptr;
    int64_t bytes = 0;
  };

  virtual ~ChunkData() = default;
  virtual std::string_view bytes() const = 0;
  virtual Pin pin() const { return {}; }
};

// A chunk's Checksum (core/checksum.h) is recorded in its manifest at upload and verified on
// every read: by ReadChunk, or by whoever reads with ReadChunkUnverified (VerifyChunk).

// DATA_LOSS naming `address` when the Checksum of `bytes` is not `expected_checksum`.
absl::Status VerifyChunk(const ChunkAddress& address, std::string_view bytes,
                         uint64_t expected_checksum);

// FAILED_PRECONDITION naming `data_id`: what every store's data-id calls (PutChunks, Commit,
// Discard) return for an id that is not live.
absl::Status DataIdNotLive(uint64_t data_id);

// Counters for tests and the benchmark (monotonic since open).
struct StoreStats {
  int64_t chunk_bytes_read = 0;
  int64_t chunks_read = 0;
  int64_t chunk_bytes_written = 0;
  int64_t chunks_written = 0;
  // Segment store: bytes of chunks read as copies (pread) because mapping them would have
  // exceeded StoreOptions::mapped_bytes_budget (or they are larger than a window), and bytes of
  // segment files' pages mapped now.
  int64_t chunk_bytes_copied = 0;
  int64_t mapped_bytes = 0;
};

// What CheckpointStore::Backup copied.
struct BackupStats {
  int64_t checkpoints = 0;    // committed checkpoints in the copy
  int64_t segment_files = 0;  // segment files in the copy: hard-linked + copied
  int64_t linked_files = 0;   // hard links to the store's own (immutable) segment files
  int64_t copied_files = 0;   // copies, where a hard link is impossible (another file system)
  int64_t segment_bytes = 0;  // sizes of those segment files
};

struct JobRecord {
  std::string id;
  std::string record;  // opaque, encoded by the service
};

class CheckpointStore {
 public:
  virtual ~CheckpointStore() = default;

  // --- Strategies (name -> encoded record) ---
  // ALREADY_EXISTS when `name` exists and !overwrite.
  virtual absl::Status PutStrategy(const std::string& name, std::string_view record,
                                   bool overwrite) = 0;
  // NOT_FOUND naming the strategy.
  virtual absl::StatusOr<std::string> GetStrategy(const std::string& name) = 0;
  // Names, ascending.
  virtual absl::StatusOr<std::vector<std::string>> ListStrategies() = 0;
  // NOT_FOUND when absent.
  virtual absl::Status DeleteStrategy(const std::string& name) = 0;

  // --- Chunks ---
  // A fresh data id, never returned before (persisted across restarts), registered as live until
  // CommitCheckpoint or DiscardData.
  virtual absl::StatusOr<uint64_t> BeginData() = 0;
  // Writes chunks (unsynced: the commit syncs). FAILED_PRECONDITION when the data id is not live;
  // RESOURCE_EXHAUSTED when free disk would fall below the reserve (nothing is written then).
  virtual absl::Status PutChunks(const std::vector<ChunkWrite>& chunks) = 0;
  // Room for `chunks`, whose bytes the caller then writes in place and commits
  // (ChunkReservation), sparing the copy PutChunks makes of bytes the caller has assembled
  // elsewhere. Errors as PutChunks' (checked here, for the data id's state again at Commit). The
  // segment store places the chunks of one call one after the other in their stream's part of
  // the segment file, in the order given, and keeps the memory they go to until Commit; this
  // default gives the chunks one buffer of its own and commits with PutChunks.
  virtual absl::StatusOr<std::unique_ptr<ChunkReservation>> ReserveChunks(
      const std::vector<ChunkSpace>& chunks);
  // Reads one chunk and verifies it against `expected_checksum`: DATA_LOSS naming the address on
  // mismatch (never wrong bytes), NOT_FOUND when absent.
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunk(const ChunkAddress& address,
                                                       uint64_t expected_checksum);
  // Reads one chunk as stored, not verified; NOT_FOUND when absent. Only for a reader that
  // verifies the bytes (VerifyChunk) before it uses them, or hands them on together with their
  // manifest checksum to a reader that verifies them (a Fetch client, which verifies every part):
  // a Fetch of whole chunks then hashes each byte once, on the client, instead of twice.
  virtual absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) = 0;
  // ReadChunkUnverified of each of `addresses`, in order, into `out` (replacing its contents):
  // each result is what ReadChunkUnverified gives, independent of the others. The segment store
  // looks the locations of many chunks up at once; this default reads them one by one.
  virtual void ReadChunksUnverified(std::span<const ChunkAddress> addresses,
                                    std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>>* out);
  // Deletes every chunk of a live data id and forgets it.
  virtual absl::Status DiscardData(uint64_t data_id) = 0;

  // --- Checkpoints (id -> encoded manifest referencing one data id) ---
  // Atomically (one synced write) makes checkpoint `id` visible with its manifest and marks
  // `data_id` committed. ALREADY_EXISTS if `id` exists (nothing changes then);
  // FAILED_PRECONDITION if the data id is not live.
  virtual absl::Status CommitCheckpoint(const std::string& id, std::string_view manifest,
                                        uint64_t data_id) = 0;
  // NOT_FOUND naming the checkpoint.
  virtual absl::StatusOr<std::string> GetManifest(const std::string& id) = 0;
  // Ids, ascending.
  virtual absl::StatusOr<std::vector<std::string>> ListCheckpoints() = 0;
  // Removes the manifest and every chunk of its data id. NOT_FOUND when absent.
  virtual absl::Status DeleteCheckpoint(const std::string& id) = 0;

  // --- Jobs ---
  virtual absl::Status PutJob(const std::string& id, std::string_view record) = 0;  // synced
  virtual absl::StatusOr<std::string> GetJob(const std::string& id) = 0;            // NOT_FOUND
  virtual absl::StatusOr<std::vector<JobRecord>> ListJobs() = 0;                    // by id
  // Removes a job record (synced); OK when there is none.
  virtual absl::Status DeleteJob(const std::string& id) = 0;

  // --- Maintenance ---
  // Deletes the chunks of every data id that is neither committed nor live (uploads that never
  // committed, e.g. after a crash: at open no data id is live). Returns the number of data ids
  // collected. Also gives back the disk space of chunks deleted since the last call (segment
  // store: removes their segment files and compacts their deleted location records away).
  virtual absl::StatusOr<int64_t> CollectGarbage() = 0;
  // Flushes everything to stable storage.
  virtual absl::Status Flush() = 0;
  // Writes a consistent copy of the store to the new directory `target_dir` (which must not
  // exist; its parent must), while every other method keeps working: the copy holds exactly the
  // checkpoints committed at one moment during the call (all those committed before it began),
  // each complete, and opens as a store of its own. Segment store: a RocksDB checkpoint of the
  // index plus hard links (copies across file systems) of the committed segment files, whose
  // removal is deferred until the call returns. On failure `target_dir` may be left partial:
  // the caller writes to a temporary name and renames. UNIMPLEMENTED for stores without it.
  virtual absl::StatusOr<BackupStats> Backup(const std::string& target_dir);
  virtual StoreStats stats() const = 0;
};

// Options shared by the implementations.
struct StoreOptions {
  // Writes are refused with RESOURCE_EXHAUSTED while free space on the data directory's
  // filesystem is below this (Debian's RocksDB 7.8 aborts on ENOSPC). Default 1 GiB.
  int64_t min_free_disk_bytes = int64_t{1} << 30;
  // How free space is measured. Null: statvfs of the data directory (segment store), unlimited
  // (memory store). Tests inject a function to exercise RESOURCE_EXHAUSTED.
  std::function<absl::StatusOr<int64_t>()> free_disk_bytes;
  // Segment store: chunks are read as views of mapped windows of their segment files while at
  // most this many bytes of their pages are mapped (what the mappings may add to the process's
  // RSS; pages are mapped 2 MiB at a time), as copies beyond it. Default 192 MiB.
  int64_t mapped_bytes_budget = int64_t{192} << 20;
  // Segment store: open without writing anything (no garbage collection, every write refused
  // with RESOURCE_EXHAUSTED): for `ckptd --verify`. NOT_FOUND when no store exists in the
  // directory.
  bool read_only = false;
};

// Opens (creating if needed) the segment store in `dir`; collects garbage of uploads that never
// committed before returning.
absl::StatusOr<std::unique_ptr<CheckpointStore>> OpenSegmentStore(const std::string& dir,
                                                                  const StoreOptions& options = {});
// Offline salvage of a segment store whose index RocksDB cannot open or read (`ckptd --salvage`):
// runs RocksDB's RepairDB on the index in `dir` (tables it cannot read are moved to `dir/lost`,
// with every record they held), then restores what the store's invariants need from what is
// left: the committed marker of every checkpoint record (so garbage collection keeps its chunks),
// a data-id counter above every data id in use, the format version; a checkpoint record too short
// to name its data id is deleted. Returns one line per change. The store must not be open (the
// lock is taken). It does not verify chunks: the caller verifies every checkpoint afterwards and
// deletes the damaged ones. NOT_FOUND when `dir` holds no store.
absl::StatusOr<std::vector<std::string>> RepairSegmentStore(const std::string& dir);
// A store in memory (tests).
std::unique_ptr<CheckpointStore> NewMemoryStore(const StoreOptions& options = {});

}  // namespace ckpt

#endif  // CKPT_STORAGE_CHECKPOINT_STORE_H_
