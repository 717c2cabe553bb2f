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
// Pacing. Kept chunks only help streams that run within the budget of each other, so the
// streams of one job (one checkpoint fetched for one destination: a *pace group*, JoinCohort's
// `pace_key`) pace themselves. A stream's position is the stored bytes it has requested through
// this layer; streams of a job read their chunks in the same order (the replicas of a rank the
// same chunks, tensor-parallel ranks of a tensor split across them the same chunks too, or
// chunks of the same size), so positions compare. A member more than the pace window ahead of
// the slowest pacing member of its group waits (CohortMember::MayProceed) until that member
// catches up. The window is cache_bytes / (2 x the cohorts with a pacing member): while every
// member is within it, the chunks the group has read and still needs, one run per cohort, fit
// the budget. A job's streams start at different moments (its clients are scheduled apart), so a
// job starts by *gathering*: once a second stream of it has joined, and until all of its
// `expected_members` have or min(straggler_bound, 1 s) has passed since the first, no member goes
// beyond cache_bytes / (2 x expected_members) (the window were each stream a cohort of its own).
// A job whose streams did not all come within that bound does not gather again for a minute (a
// user fetching a few ranks of a large destination by hand pays the bound once). A lone stream
// never gathers. A stream leaves its cohort and group once it has produced everything
// (FetchStream::NextPiece), not when its call ends. A member that has made no progress for
// `straggler_bound` while another waits for it is left behind: nobody waits for it nor keeps chunks
// for it, and it reads what it no longer finds for itself, until it catches up with the slowest
// pacing member again. Waiting never blocks a thread: the waiter is called back (on the thread of
// the member that caught up, or of the pacing timer). A lone stream, or one whose peers are within
// the window, never waits.
//
// A lone stream. A stream that is the only open member (a worker fetching alone, a CI job, the
// ranks of a destination fetched one after another) reads around the table while the table keeps
// no chunk: a batch of its chunks is one store call, and what it reads is kept, within the same
// budget, in the *lone ring* (oldest first), with no lookup, in-flight slot or sharing
// bookkeeping per chunk. Only chunks of at least `lone_ring_min_bytes` go to the ring: reading a
// chunk of a few hundred bytes again (a location lookup and a view of a mapping, or a small copy)
// costs a later stream about what keeping it costs the lone one (its objects held among thousands
// of others of a checkpoint of many small tensors, and freed long after, cold), so a stream that
// joins later reads such chunks again. JoinCohort hands the ring over to the table (its chunks
// become spare) when a second member opens, or when the one joining belongs to a cohort whose
// chunks the ring holds (a replica starting after the first has finished), so that what the first
// stream of a storm read before the others came is found as before. While the table still keeps
// chunks (spare ones of earlier streams, or chunks kept for a cohort whose other members are gone),
// a lone stream looks its chunks up there as any stream does and keeps what it reads in the ring;
// the table's spare chunks, older than the ring's, are evicted first, so the table empties. Once
// the table has kept no new chunk and handed out none of its kept ones for `straggler_bound`
// while a lone stream is open (the streams of a storm are gone, and the lone stream needs none of
// what they left), the lone stream drops everything the table keeps and reads around it from then
// on: the chunks were kept for streams that have not come within that bound. A chunk in the ring is
// not shared with callers outside every cohort (a member its group left behind) until the ring is
// handed over.
//
// Verification. A chunk's bytes are checked against their manifest checksum at most once for
// every stream that shares it (StreamChunk::Verify). Every chunk handed to a second stream is
// verified first, on the server: a chunk read once and used by one stream only is verified as
// before (by that stream where it copies or cuts the bytes, or by its client where a whole chunk
// leaves with its stored checksum), so a lone fetch hashes nothing more than it did, and a shared
// chunk costs one hash for all its sharers. A chunk that fails verification is DATA_LOSS for every
// stream that holds it or asks for it while it is shared, and is dropped from the cache and the
// in-flight and live tables at once: failures are never cached, a later request reads the chunk
// from the store again (and fails again if the stored bytes are damaged). A chunk kept in the
// cache after a lone stream sent it whole (its client, not the server, found the damage) is found
// damaged only when the next stream asks for it: that stream forgets it and reads the store once
// more, so mended bytes are served rather than the old damage. Read errors (NOT_FOUND,
// I/O) are returned to the streams that waited for that read and not remembered either.
//
// Memory. What the cache keeps must cost what it counts. A chunk the store hands out as a view of
// a mapping (ChunkData::pin: the segment store's windows) keeps that mapping, and every unit of it
// that was populated, resident while the view lives: that is the store's map budget, beyond which
// it reads chunks as copies. A cache of small views spread over many windows (a column re-split's
// chunks of tens of KiB) would pin many times its budget of mapped windows and leave every later
// read to a copy. So the cache counts, besides its chunks' bytes, the bytes of the mappings its
// chunks pin (each mapping once, however many of its chunks are kept), and while those pins
// exceed `cache_bytes` evicts spare chunks, least recent first. Wanted chunks are
// evicted for their bytes only: pacing bounds the span of the file a job's members read ahead of
// each other, hence the windows its wanted chunks pin, and evicting them would break read-once.
// Chunks are never copied for the cache: a copy of every chunk read costs more CPU than the
// copies it saves. The lone ring counts its chunks' bytes and pins the same way; the table's
// cache and the ring together stay within `cache_bytes`.
//
// Thread-safe: every method may be called from any thread. Get may block while another thread
// reads the same chunk from the store (a store read, never anything that waits on a stream), so
// waiting cannot deadlock. Does not own the store.
#ifndef CKPT_SERVICE_ENGINE_SHARED_CHUNKS_H_
#define CKPT_SERVICE_ENGINE_SHARED_CHUNKS_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/chunk_arena.h"
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

  // The chunk's place in the SharedChunks cache that read it, guarded by that SharedChunks' mu_.
  // Kept on the chunk rather than in the layer's table, so that evicting a chunk needs no table
  // lookup, and linked through the chunk, so that keeping one allocates nothing; `bytes` and
  // `pin` are copied from `data` when it is kept, so that counting it out reads nothing else.
  friend class SharedChunks;
  struct Kept {
    bool cached = false;                // in wanted_ or spare_ (then self, prev, next are set)
    bool spare = false;                 // in spare_
    int takers_left = 0;                // expected takers that have not had it yet
    std::vector<const void*> taken_by;  // the takers that have had it (while wanted)
    std::shared_ptr<StreamChunk> self;  // the cache's reference
    StreamChunk* prev = nullptr;        // the next more recent in its list
    StreamChunk* next = nullptr;        // the next less recent
    int64_t bytes = 0;
    const void* pin_id = nullptr;
    int64_t pin_bytes = 0;
  };
  Kept kept_;
};

class CohortMember;
class SharedChunks;

// The streams of one fetch cohort (SharedChunks::JoinCohort). Thread-safe.
class FetchCohort {
 public:
  // Streams of the cohort open now.
  int members() const { return members_.load(std::memory_order_relaxed); }
  // Of them, those pacing with their group (not left behind): the takers a chunk is kept for.
  int pacing() const { return pacing_.load(std::memory_order_relaxed); }

 private:
  friend class SharedChunks;
  friend class CohortMember;
  std::atomic<int> members_{0};
  std::atomic<int> pacing_{0};  // written under SharedChunks::pace_mu_
  uint64_t key_hash_ = 0;       // of the cohort's key: a lone ring's chunks are tagged with it
};

// The streams of one job that pace together (see the file comment). Guarded by
// SharedChunks::pace_mu_.
struct PaceGroup {
  std::string key;
  std::list<CohortMember*> members;
  int expected = 1;        // the streams the job has (the destination's ranks)
  int joined = 0;          // streams that ever joined
  int64_t created_ns = 0;  // when the first joined
  bool gathered = false;   // gathering is over (everyone came, or the bound passed)
  int waiting = 0;         // members waiting now (with a wake_)
  // At most the position of every pacing member (positions only grow; a member starting to pace
  // lowers it to its own): the slowest as last found.
  int64_t slowest_bound = 0;
};

// One stream's membership of its cohort and pace group (SharedChunks::JoinCohort); leaving them
// is destroying it. The stream reports its progress (Advanced, Touch) and asks before each piece
// whether it may go on (MayProceed). Thread-safe; must not outlive the SharedChunks that made it.
class CohortMember {
 public:
  ~CohortMember();
  CohortMember(const CohortMember&) = delete;
  CohortMember& operator=(const CohortMember&) = delete;

  // The cohort, for SharedChunks::Get; null while the member is left behind (the chunks it reads
  // then are kept for nobody else).
  const FetchCohort* cohort() const;
  // The stream got `bytes` more stored bytes through the shared layer (its position): wakes the
  // members waiting for it that may now go on.
  void Advanced(int64_t bytes);
  // The stream produced something now (lock-free): it is not stalled.
  void Touch();
  // True when the stream may produce its next piece now. Otherwise false, and `wake` is called
  // once, later, from another thread, when it may (the slower members caught up, left, or were
  // left behind); not at all if the member is destroyed first. A later call replaces a pending
  // `wake`.
  bool MayProceed(std::function<void()> wake);
  bool left_behind() const { return left_behind_.load(std::memory_order_relaxed); }

 private:
  friend class SharedChunks;
  CohortMember(SharedChunks* owner, std::shared_ptr<FetchCohort> cohort,
               std::shared_ptr<PaceGroup> group);

  SharedChunks* const owner_;
  const std::shared_ptr<FetchCohort> cohort_;
  const std::shared_ptr<PaceGroup> group_;
  // Guarded by owner_->pace_mu_:
  std::list<CohortMember*>::iterator it_;
  int64_t position_ = 0;
  std::function<void()> wake_;  // set while waiting
  std::list<CohortMember*>::iterator waiting_it_;
  // Lock-free:
  std::atomic<int64_t> last_progress_ns_;
  std::atomic<bool> left_behind_{false};
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
  int64_t pace_waits = 0;        // times a member waited for slower members of its cohort
  int64_t left_behind = 0;       // members left behind after straggler_bound without progress
  int64_t pacing_now = 0;        // members waiting for their cohort now
  int64_t pinned_bytes = 0;      // bytes of the store's mappings the kept chunks pin now
  int64_t evicted_for_pins = 0;  // spare chunks evicted to keep pinned_bytes within budget
  int64_t lone_reads = 0;        // of store_reads, those of a lone stream around the table
  int64_t idle_dropped = 0;      // kept chunks a lone stream dropped, the table unused (see above)
};

class SharedChunks {
 public:
  // `cache_bytes`: the LRU's budget (0: no LRU; in-flight and live sharing still apply).
  // `straggler_bound`: how long a member of a cohort may make no progress while others wait for
  // it before it is left behind, and how long the table's kept chunks may go unused while a lone
  // stream is open before it drops them.
  // `lone_ring_min_bytes`: chunks smaller than this are not kept in the lone ring (see the file
  // comment); 0 keeps every chunk.
  SharedChunks(CheckpointStore* store, int64_t cache_bytes,
               absl::Duration straggler_bound = absl::Seconds(3),
               int64_t lone_ring_min_bytes = kLoneRingMinBytes);
  // The default of lone_ring_min_bytes.
  static constexpr int64_t kLoneRingMinBytes = int64_t{4} << 10;
  ~SharedChunks();
  SharedChunks(const SharedChunks&) = delete;
  SharedChunks& operator=(const SharedChunks&) = delete;

  // The chunk at `address` whose manifest checksum is `checksum`: shared with every other stream
  // that holds it or is reading it, read from the store otherwise. A chunk that another stream
  // also has is verified before it is returned (DATA_LOSS when damaged); a chunk read for this
  // caller alone is returned unverified. A damaged copy kept from an earlier read is forgotten
  // and the chunk read again from the store, once, and verified, before DATA_LOSS is returned.
  // Errors of the store read are returned as the store gave them, to every caller that waited
  // for that read.
  // `cohort`: the caller's cohort (null: none), whose open members are the takers the chunk is
  // kept for; `taker` identifies the calling stream, so that a stream asking again for a chunk
  // it had is not counted as another taker.
  absl::StatusOr<std::shared_ptr<StreamChunk>> Get(const ChunkAddress& address, uint64_t checksum,
                                                   const FetchCohort* cohort = nullptr,
                                                   const void* taker = nullptr);

  // One chunk of GetMany: in, its address and manifest checksum; out, what Get would return.
  struct Request {
    ChunkAddress address;
    uint64_t checksum = 0;
    absl::StatusOr<std::shared_ptr<StreamChunk>> result;
  };
  // Get for each of `requests`, with the table looked up for all of them under one lock (the
  // slots prefetched ahead), the chunks no one has read read with one
  // CheckpointStore::ReadChunksUnverified and published under one lock: for streams of many
  // small chunks, whose cost is this bookkeeping. Every result is what Get would have returned
  // (verified when shared, DATA_LOSS when damaged, the store's error), each independent of the
  // others. Reads of this call are all filled before it waits for any other stream's read, so
  // callers never wait on each other in a cycle.
  void GetMany(std::span<Request> requests, const FetchCohort* cohort = nullptr,
               const void* taker = nullptr);

  // Joins the cohort named `key` (streams with identical plans of one checkpoint) and the pace
  // group named `pace_key` (the streams of one job), creating them if needed; the stream leaves
  // when the returned membership is destroyed. A member joins pacing, at position 0.
  // `expected_members`: the streams the job has (the destination's ranks; 1 for a merged fetch).
  std::unique_ptr<CohortMember> JoinCohort(const std::string& key, const std::string& pace_key,
                                           int expected_members = 1);
  // The pace window now (see the file comment), bytes.
  int64_t pace_window() const;

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
  // Kept chunks, most recent first, linked through their StreamChunk::kept_ (which holds the
  // cache's reference to each).
  struct List {
    StreamChunk* front = nullptr;
    StreamChunk* back = nullptr;
    bool empty() const { return front == nullptr; }
    void PushFront(StreamChunk* c);
    void Unlink(StreamChunk* c);
  };
  // A chunk's slot in the table: small, since the table holds one per chunk alive or being read.
  struct Entry {
    std::weak_ptr<StreamChunk> live;  // the chunk while anyone holds it (the cache too)
    std::shared_ptr<Read> in_flight;  // while it is being read
  };
  // A chunk as read from the store, to be shared; placed in `arena` while it has room.
  static std::shared_ptr<StreamChunk> NewChunk(const ChunkAddress& address, uint64_t checksum,
                                               std::unique_ptr<ChunkData> data,
                                               ChunkArena* arena = nullptr) {
    auto chunk = arena != nullptr
                     ? std::allocate_shared<StreamChunk>(ArenaAllocator<StreamChunk>(arena))
                     : std::make_shared<StreamChunk>();
    chunk->address = address;
    chunk->data = std::move(data);
    chunk->checksum = checksum;
    return chunk;
  }
  static Key KeyOf(const StreamChunk& chunk) {
    const ChunkAddress& a = chunk.address;
    return Key{a.data_id, a.tensor, a.blob, a.chunk, chunk.checksum};
  }

  // What Share found for a key: an error, a chunk to share, or (neither) a Read the caller is
  // to fill from the store.
  struct Shared {
    absl::Status status;
    std::shared_ptr<StreamChunk> chunk;
    std::shared_ptr<Read> to_fill;
    bool kept_copy_damaged = false;  // status: DATA_LOSS of a copy kept from an earlier read
  };
  // Looks `key` up: a live or cached copy (verified), another stream's read in flight (waited
  // for, verified), or else registers a Read in flight for the caller. `count`: counts a request.
  Shared Share(const Key& key, const void* taker, bool count);
  // Get's steps after Share: the chunk shared, or read for every waiter, or (a damaged kept
  // copy) read once more and verified.
  // `lone`: the caller may be the only open member (LoneHint): what it reads is kept in the
  // ring (KeepLone).
  absl::StatusOr<std::shared_ptr<StreamChunk>> Finish(const Key& key, const ChunkAddress& address,
                                                      Shared shared, const FetchCohort* cohort,
                                                      const void* taker, bool lone = false);
  // GetMany's steps: looking every request up under one lock (registering the reads this call
  // is to do), and doing those reads and publishing them under one lock.
  struct ManyScratch;
  void LookUpMany(ManyScratch& m, const void* taker);
  void ReadMany(std::span<Request> requests, ManyScratch& m, const FetchCohort* cohort,
                const void* taker, bool lone);
  // Table slots are prefetched this many requests ahead where many are looked up together.
  static constexpr size_t kPrefetchAhead = 8;
  // A lone call places its chunks this many to a ChunkArena, each in a slot of this many bytes
  // (the chunk and its control block; one that does not fit goes to the heap).
  static constexpr size_t kArenaChunks = 32;
  static constexpr size_t kArenaSlotBytes = (sizeof(StreamChunk) + 32 + 15) / 16 * 16;
  // Publishes the result of reading `key` for every requester waiting on `read`: keeps the chunk
  // for the cohort (mu_ held; the caller notifies read_done_). `slot`: key's entry when the
  // caller knows where it is (null: looked up). `lone`: the chunk is not kept in the table's
  // cache (the lone caller hands it to KeepLone).
  void PublishLocked(const Key& key, Read& read,
                     const absl::StatusOr<std::unique_ptr<ChunkData>>& data,
                     const std::shared_ptr<StreamChunk>& chunk, const FetchCohort* cohort,
                     const void* taker, Entry* slot = nullptr, bool lone = false);
  // Reads `key` from the store for every requester waiting on `read`, keeps it for the cohort,
  // and returns it unverified.
  absl::StatusOr<std::shared_ptr<StreamChunk>> ReadForAll(const Key& key,
                                                          const ChunkAddress& address,
                                                          std::shared_ptr<Read> read,
                                                          const FetchCohort* cohort,
                                                          const void* taker, bool lone = false);
  // Verifies `chunk` as the second or later sharer: counts the bytes hashed, and on DATA_LOSS
  // forgets the chunk so that nobody else is handed it.
  absl::Status VerifyShared(const Key& key, const std::shared_ptr<StreamChunk>& chunk);
  // Stops keeping `chunk` and removes `key`'s entry if it still refers to it (mu_ held).
  void ForgetLocked(const Key& key, StreamChunk* chunk);
  // Keeps `chunk` for `takers` more streams (spare when none) and evicts beyond the budget, spare
  // chunks first, least recent first (mu_ held).
  void CacheLocked(std::shared_ptr<StreamChunk> chunk, int takers, const void* reader);
  // Stops keeping `chunk` (mu_ held; chunk.kept_.cached). The caller holds a reference to it.
  void UncacheLocked(StreamChunk& chunk);
  // UncacheLocked, returning the cache's reference (the chunk goes when it is dropped, unless
  // someone else holds it).
  std::shared_ptr<StreamChunk> DropLocked(StreamChunk& chunk);
  // Counts `chunk` as kept (recording its bytes and pin in chunk.kept_), or as no longer kept
  // (mu_ held).
  void CountKeptLocked(StreamChunk& chunk);
  void CountDroppedLocked(StreamChunk& chunk);
  // `taker` had the kept chunk: drops it once every expected taker has (mu_ held).
  void TakenLocked(StreamChunk& chunk, const void* taker);
  // `entry`'s chunk when one is alive and not found damaged, counted as a cache or live hit and
  // taken by `taker`; null otherwise (mu_ held).
  std::shared_ptr<StreamChunk> LiveLocked(Entry& entry, const void* taker);
  // Erases entries whose chunk is gone and that are neither cached nor being read, once the
  // table has doubled since the last sweep (mu_ held): the table stays proportional to the chunks
  // alive.
  void MaybeSweepLocked();
  void SweepLocked();  // MaybeSweepLocked's sweep, now

  // The lone path (see the file comment). Whether a caller in `cohort` may be the only open
  // member (a hint without a lock: TryLone and KeepLone check again under solo_mu_).
  bool LoneHint(const FetchCohort* cohort) const {
    return cohort != nullptr && cache_bytes_ > 0 &&
           open_members_.load(std::memory_order_relaxed) == 1;
  }
  // Serves `requests` around the table, keeping what it reads in the ring, when the caller is
  // the only open member and the table keeps no chunk (or kept chunks unused for
  // straggler_bound_, which it drops first); false, having done nothing, otherwise.
  bool TryLone(std::span<Request> requests, const FetchCohort* cohort);
  // solo_mu_ held, the caller the only open member: whether the table keeps no chunk, having
  // dropped every chunk it kept when none was kept or handed out for straggler_bound_.
  bool TableIdleOrEmptyLocked();
  // Keeps the chunks a lone caller read through the table (published there, live) in the ring;
  // in the table's cache instead when a second member has joined since the caller looked up.
  void KeepLone(std::span<const std::shared_ptr<StreamChunk>> chunks, const FetchCohort* cohort,
                const void* taker);
  // solo_mu_ held: appends `chunk` (read by a member of the cohort whose key hashes to
  // `cohort_hash`) to the ring, unless it is smaller than lone_ring_min_bytes_ or alone exceeds
  // the budget; drops the oldest; trims the ring to what the budget leaves it
  // (the table's spare chunks, which are older, go first); whether the ring holds chunks of that
  // cohort; hands every chunk of the ring over to the table's cache (spare) and empties it.
  void PushLoneLocked(std::shared_ptr<StreamChunk> chunk, uint64_t cohort_hash);
  void PopLoneLocked();
  void TrimLoneLocked();
  bool RingHasCohortLocked(uint64_t cohort_hash) const;
  void MigrateLoneLocked();

  friend class CohortMember;
  // Pacing (pace_mu_ held): the window; the two slowest positions of `group`'s pacing members
  // (none: INT64_MAX), so that the slowest other than any one member is known after one pass over
  // the group (CollectReadyLocked checks every waiter against it), which also sets the group's
  // slowest_bound; whether `m` may go on now, leaving behind the stalled members that hold it
  // back; starting or stopping `m`'s pacing; collecting the wakes of `group`'s waiters that may
  // go on now (removing them from waiting_); no longer waiting (returns the wake it had, empty if
  // it was not waiting).
  int64_t PaceWindowLocked() const;
  struct Slowest {
    int64_t first = std::numeric_limits<int64_t>::max();
    int64_t second = std::numeric_limits<int64_t>::max();
    const CohortMember* first_member = nullptr;
    // The earliest last progress of a pacing member: none was stalled before it.
    int64_t oldest_progress_ns = std::numeric_limits<int64_t>::max();
    int64_t Except(const CohortMember* m) const { return m == first_member ? second : first; }
  };
  Slowest SlowestTwoLocked(PaceGroup& group) const;
  // `known` (optional): the group's Slowest, kept up to date if members are left behind.
  bool MayProceedLocked(CohortMember& m, int64_t now_ns, Slowest* known = nullptr);
  void SetPacingLocked(CohortMember& m, bool pacing);
  void CollectReadyLocked(PaceGroup& group, int64_t now_ns,
                          std::vector<std::function<void()>>* wake);
  std::function<void()> StopWaitingLocked(CohortMember& m);
  // Whether `group` is gathering now (see the file comment); ends it once over.
  bool GatheringLocked(PaceGroup& group, int64_t now_ns);
  // The pacing timer: while members wait, checks them every few milliseconds so that a stalled
  // member holding them back is left behind after straggler_bound.
  void PaceLoop();

  CheckpointStore* const store_;
  const int64_t cache_bytes_;
  const absl::Duration straggler_bound_;
  const int64_t lone_ring_min_bytes_;

  mutable std::mutex pace_mu_;  // never held with mu_
  std::condition_variable pace_cv_;
  std::list<CohortMember*> waiting_;  // members waiting now
  int pacing_cohorts_ = 0;            // cohorts with a pacing member
  absl::flat_hash_map<std::string, std::weak_ptr<PaceGroup>> pace_groups_;
  // Jobs that did not gather within the bound, and until when they do not gather again.
  absl::flat_hash_map<std::string, int64_t> no_gathering_until_;
  size_t pace_group_sweep_at_ = 64;
  int64_t pace_waits_ = 0;
  int64_t left_behind_ = 0;
  bool pace_stop_ = false;
  std::thread pace_thread_;

  mutable std::mutex mu_;
  std::condition_variable read_done_;
  absl::flat_hash_map<Key, Entry> entries_;
  // Counts the insertions that may have moved slots of entries_ (GetMany keeps its slots while
  // it has not changed).
  uint64_t table_generation_ = 0;
  size_t sweep_at_ = 1024;
  List wanted_;  // chunks expected takers still need, most recent first
  List spare_;   // chunks no one else is expected to take, most recent first
  absl::flat_hash_map<std::string, std::weak_ptr<FetchCohort>> cohorts_;
  size_t cohort_sweep_at_ = 64;
  // The mappings kept chunks pin (ChunkData::Pin::id): how many kept chunks pin each.
  absl::flat_hash_map<const void*, int> pins_;
  SharedChunkStats stats_;  // guarded by mu_, except verified_bytes and corrupt_chunks
  std::atomic<int64_t> verified_bytes_{0};
  std::atomic<int64_t> corrupt_chunks_{0};
  // Chunks the table's cache keeps (wanted_ and spare_): written under mu_, read without it by
  // the lone path, which reads around the table only while it keeps none.
  std::atomic<int64_t> table_kept_{0};
  // When the table's cache last kept a chunk or handed out a kept one (guarded by mu_).
  int64_t table_used_ns_ = 0;

  // The lone ring. solo_mu_ is taken before mu_ (never the other way) and never with pace_mu_.
  struct LoneChunk {
    std::shared_ptr<StreamChunk> chunk;
    uint64_t cohort_hash;  // FetchCohort::key_hash_ of the member that read it
    int64_t bytes;         // copied from the chunk, so that dropping it reads nothing else
    const void* pin_id;
    int64_t pin_bytes;
  };
  mutable std::mutex solo_mu_;
  // Open CohortMembers: incremented under solo_mu_ (JoinCohort hands the ring over under it),
  // decremented without it.
  std::atomic<int> open_members_{0};
  std::deque<LoneChunk> ring_;  // oldest first; guarded by solo_mu_, as the rest of this block
  int64_t ring_bytes_ = 0;
  int64_t ring_pinned_ = 0;
  absl::flat_hash_map<const void*, int> ring_pins_;  // as pins_, for the ring's chunks
  // The lone path's share of SharedChunkStats (requests, store_reads, store_bytes_read,
  // evicted_for_pins, lone_reads), added to the table's in stats().
  SharedChunkStats lone_stats_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_SHARED_CHUNKS_H_
