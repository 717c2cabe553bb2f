// Read-once fan-out of stored chunks. When several fetch streams need the same stored chunk at
// about the same time (the data-parallel replicas of a job's ranks starting together all want the
// same slices), the chunk is read from the store once and every stream is served from that one
// copy:
//
// - in flight: a stream asking for a chunk that another stream is reading waits for that read
//   instead of reading again; the read belongs to the shared slot, not to the stream that started
//   it, so that stream going away (a cancelled call) changes nothing for the others;
// - live: a chunk some stream still holds (in its band, its message queue or its own chunk LRU)
//   is handed out again at no memory cost;
// - recent: chunks kept, at most `cache_bytes` of them (`--shared-chunk-cache-mib`), for
//   replicas that lag behind the first reader.
//
// What is kept is decided by demand, not recency alone. Streams whose plans are identical (the
// data-parallel replicas of one rank) form a *cohort* (JoinCohort); a chunk read by a member is
// *wanted* until every member open at the time has taken it, and then becomes *spare*: spare
// chunks (those and a lone stream's) are kept only in room no wanted chunk needs and are evicted
// first, so the budget goes to chunks the laggards still need. (A least-recently-used order alone
// would keep the chunks the last replica has just used, touched most recently, and evict the ones
// it needs next.) Within each kind the least recent go first.
//
// Verification. A chunk's bytes are checked against their manifest checksum at most once for
// every stream that shares it (StreamChunk::Verify). Every chunk handed to a second stream is
// verified first, on the server: a chunk read once and used by one stream only is verified as
// before (by that stream where it copies or cuts the bytes, or by its client where a whole chunk
// leaves with its stored checksum), so a lone fetch hashes nothing more than it did, and a shared
// chunk costs one hash for all its sharers. A chunk that fails verification is DATA_LOSS for every
// stream that holds it or asks for it while it is shared, and is dropped from the cache and the
// in-flight and live tables at once: failures are never cached, a later request reads the chunk
// from the store again (and fails again if the stored bytes are damaged). Read errors (NOT_FOUND,
// I/O) are returned to the streams that waited for that read and not remembered either.
//
// Thread-safe: every method may be called from any thread. Get may block while another thread
// reads the same chunk from the store (a store read, never anything that waits on a stream), so
// waiting cannot deadlock. Does not own the store.
#ifndef CKPT_SERVICE_ENGINE_SHARED_CHUNKS_H_
#define CKPT_SERVICE_ENGINE_SHARED_CHUNKS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

// A stored chunk as read (CheckpointStore::ReadChunkUnverified), shared by every stream that
// needs it. `address`, `data` and `checksum` are set before the chunk is handed out and never
// change; the verification state is thread-safe. A chunk's bytes are verified against its
// manifest checksum before any of them are used or leave without that checksum; bytes that leave
// with it (a whole chunk as a message or part of its own, to a client) are verified by the client.
struct StreamChunk {
  ChunkAddress address;
  std::unique_ptr<ChunkData> data;
  uint64_t checksum = 0;  // from the manifest

  // Checks the bytes against `checksum` the first time any sharer asks; later calls (from any
  // thread) return the remembered result without hashing again: OK, or DATA_LOSS naming the
  // chunk.
  absl::Status Verify();
  bool verified() const { return state_.load(std::memory_order_acquire) == kGood; }
  bool corrupt() const { return state_.load(std::memory_order_acquire) == kCorrupt; }

 private:
  static constexpr int kUnknown = 0, kGood = 1, kCorrupt = 2;
  std::mutex verify_mu_;  // held while hashing, so that sharers wait instead of hashing too
  std::atomic<int> state_{kUnknown};
  absl::Status failure_;  // when kCorrupt; written before state_ is published
};

// The streams of one fetch cohort (SharedChunks::JoinCohort). Thread-safe.
class FetchCohort {
 public:
  // Streams of the cohort open now.
  int members() const { return members_.load(std::memory_order_relaxed); }

 private:
  friend class SharedChunks;
  std::atomic<int> members_{0};
};

// Counters since the layer was made (monotonic, except cached_bytes).
struct SharedChunkStats {
  int64_t requests = 0;          // Get calls
  int64_t store_reads = 0;       // chunks read from the store
  int64_t store_bytes_read = 0;  // their bytes
  int64_t joined_reads = 0;      // requests that waited for another stream's read
  int64_t live_hits = 0;         // requests served with a chunk another stream still held
  int64_t cache_hits = 0;        // requests served from the LRU of recent chunks
  int64_t verified_bytes = 0;    // bytes hashed by StreamChunk::Verify for shared chunks
  int64_t corrupt_chunks = 0;    // chunks that failed verification here
  int64_t cached_bytes = 0;      // bytes kept now
  int64_t released_taken = 0;    // wanted chunks that became spare, every expected taker served
};

class SharedChunks {
 public:
  // `cache_bytes`: the LRU's budget (0: no LRU; in-flight and live sharing still apply).
  SharedChunks(CheckpointStore* store, int64_t cache_bytes);
  SharedChunks(const SharedChunks&) = delete;
  SharedChunks& operator=(const SharedChunks&) = delete;

  // The chunk at `address` whose manifest checksum is `checksum`: shared with every other stream
  // that holds it or is reading it, read from the store otherwise. A chunk that another stream
  // also has is verified before it is returned (DATA_LOSS when damaged); a chunk read for this
  // caller alone is returned unverified. Errors of the store read are returned as the store gave
  // them, to every caller that waited for that read.
  // `cohort`: the caller's cohort (null: none), whose open members are the takers the chunk is
  // kept for; `taker` identifies the calling stream, so that a stream asking again for a chunk
  // it had is not counted as another taker.
  absl::StatusOr<std::shared_ptr<StreamChunk>> Get(const ChunkAddress& address, uint64_t checksum,
                                                   const FetchCohort* cohort = nullptr,
                                                   const void* taker = nullptr);

  // Joins the cohort named `key` (streams with identical plans of one checkpoint), creating it
  // if needed; the stream leaves when the returned handle is released.
  std::shared_ptr<const FetchCohort> JoinCohort(const std::string& key);

  // Drops every cached chunk.
  void Clear();
  // Drops the cached chunks of `data_id` (its checkpoint was deleted): streams still holding
  // them keep them, nobody else is handed them.
  void ForgetData(uint64_t data_id);

  SharedChunkStats stats() const;
  int64_t cache_budget() const { return cache_bytes_; }

 private:
  struct Key {
    uint64_t data_id;
    uint32_t tensor, blob, chunk;
    uint64_t checksum;
    friend bool operator==(const Key&, const Key&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.data_id, k.tensor, k.blob, k.chunk, k.checksum);
    }
  };
  // One store read that requesters wait for; the reading thread fills it and wakes them.
  struct Read {
    bool done = false;
    absl::Status status;
    std::shared_ptr<StreamChunk> chunk;
  };
  using List = std::list<std::pair<Key, std::shared_ptr<StreamChunk>>>;
  struct Entry {
    std::weak_ptr<StreamChunk> live;    // the chunk while anyone holds it
    std::shared_ptr<Read> in_flight;    // while it is being read
    bool cached = false;                // kept in wanted_ or spare_ (then lru_it is valid)
    bool spare = false;                 // in spare_
    int takers_left = 0;                // expected takers that have not had it yet
    std::vector<const void*> taken_by;  // the takers that have had it (while kept)
    List::iterator lru_it;
  };

  // Verifies `chunk` as the second or later sharer: counts the bytes hashed, and on DATA_LOSS
  // forgets the chunk so that nobody else is handed it.
  absl::Status VerifyShared(const Key& key, const std::shared_ptr<StreamChunk>& chunk);
  // Removes `key`'s entry if it still refers to `chunk` (mu_ held).
  void ForgetLocked(const Key& key, const StreamChunk* chunk);
  // Keeps `chunk` for `takers` more streams (spare when none) and evicts beyond the budget, spare
  // chunks first, least recent first (mu_ held).
  void CacheLocked(const Key& key, Entry& entry, std::shared_ptr<StreamChunk> chunk, int takers,
                   const void* reader);
  // Stops keeping `entry`'s chunk (mu_ held; entry.cached).
  void UncacheLocked(Entry& entry);
  // `taker` had the chunk: drops it once every expected taker has (mu_ held).
  void TakenLocked(Entry& entry, const void* taker);
  // Erases entries whose chunk is gone and that are neither cached nor being read, once the
  // table has doubled since the last sweep (mu_ held): the table stays proportional to the chunks
  // alive.
  void MaybeSweepLocked();

  CheckpointStore* const store_;
  const int64_t cache_bytes_;

  mutable std::mutex mu_;
  std::condition_variable read_done_;
  absl::flat_hash_map<Key, Entry> entries_;
  size_t sweep_at_ = 1024;
  List wanted_;  // chunks expected takers still need, most recent first
  List spare_;   // chunks no one else is expected to take, most recent first
  absl::flat_hash_map<std::string, std::weak_ptr<FetchCohort>> cohorts_;
  size_t cohort_sweep_at_ = 64;
  SharedChunkStats stats_;  // guarded by mu_, except verified_bytes and corrupt_chunks
  std::atomic<int64_t> verified_bytes_{0};
  std::atomic<int64_t> corrupt_chunks_{0};
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_SHARED_CHUNKS_H_
