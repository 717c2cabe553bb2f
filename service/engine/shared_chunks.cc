#include "service/engine/shared_chunks.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"
#include "core/status_macros.h"

namespace ckpt {

absl::Status StreamChunk::Verify() {
  int state = state_.load(std::memory_order_acquire);
  if (state == kGood) return absl::OkStatus();
  if (state == kUnknown) {
    std::lock_guard<std::mutex> lock(verify_mu_);
    state = state_.load(std::memory_order_relaxed);
    if (state == kUnknown) {
      absl::Status s = VerifyChunk(address, data->bytes(), checksum);
      if (!s.ok()) failure_ = std::move(s);
      state = failure_.ok() ? kGood : kCorrupt;
      state_.store(state, std::memory_order_release);
    }
  }
  if (state == kGood) return absl::OkStatus();
  return failure_;  // published before state_ became kCorrupt, never written again
}

SharedChunks::SharedChunks(CheckpointStore* store, int64_t cache_bytes,
                           absl::Duration straggler_bound, int64_t lone_ring_min_bytes)
    : store_(store),
      cache_bytes_(cache_bytes < 0 ? 0 : cache_bytes),
      straggler_bound_(straggler_bound),
      lone_ring_min_bytes_(lone_ring_min_bytes) {
  pace_thread_ = std::thread([this] { PaceLoop(); });
}

SharedChunks::~SharedChunks() {
  {
    std::lock_guard<std::mutex> lock(pace_mu_);
    pace_stop_ = true;
  }
  pace_cv_.notify_all();
  pace_thread_.join();
  Clear();  // kept chunks hold the cache's reference to themselves
}

absl::StatusOr<std::shared_ptr<StreamChunk>> SharedChunks::Get(const ChunkAddress& address,
                                                               uint64_t checksum,
                                                               const FetchCohort* cohort,
                                                               const void* taker) {
  const bool lone = LoneHint(cohort);
  if (lone) {
    Request request;
    request.address = address;
    request.checksum = checksum;
    if (TryLone(std::span<Request>(&request, 1), cohort)) return std::move(request.result);
  }
  const Key key{address.data_id, address.tensor, address.blob, address.chunk, checksum};
  return Finish(key, address, Share(key, taker, /*count=*/true), cohort, taker, lone);
}

absl::StatusOr<std::shared_ptr<StreamChunk>> SharedChunks::Finish(const Key& key,
                                                                  const ChunkAddress& address,
                                                                  Shared shared,
                                                                  const FetchCohort* cohort,
                                                                  const void* taker, bool lone) {
  if (!shared.kept_copy_damaged) {
    if (!shared.status.ok()) return shared.status;
    if (shared.chunk) return shared.chunk;
    return ReadForAll(key, address, std::move(shared.to_fill), cohort, taker, lone);
  }
  // The copy kept from an earlier read is damaged (and now forgotten): the store may hold good
  // bytes (the damage was mended, or was in memory only). Ask once more; what comes back is
  // verified here, so damage still in the store is DATA_LOSS from the server.
  shared = Share(key, taker, /*count=*/false);
  if (!shared.status.ok()) return shared.status;
  std::shared_ptr<StreamChunk> chunk = std::move(shared.chunk);
  if (!chunk) {
    absl::StatusOr<std::shared_ptr<StreamChunk>> read =
        ReadForAll(key, address, std::move(shared.to_fill), cohort, taker);
    if (!read.ok()) return read.status();
    chunk = *std::move(read);
    CKPT_RETURN_IF_ERROR(VerifyShared(key, chunk));
  }
  return chunk;
}

std::shared_ptr<StreamChunk> SharedChunks::LiveLocked(Entry& entry, const void* taker) {
  std::shared_ptr<StreamChunk> live = entry.live.lock();
  if (!live || live->corrupt()) return nullptr;
  if (live->kept_.cached) {
    ++stats_.cache_hits;
    table_used_ns_ = absl::GetCurrentTimeNanos();
    TakenLocked(*live, taker);
  } else {
    ++stats_.live_hits;
  }
  return live;
}

SharedChunks::Shared SharedChunks::Share(const Key& key, const void* taker, bool count) {
  Shared out;
  std::unique_lock<std::mutex> lock(mu_);
  if (count) ++stats_.requests;
  const size_t entries_before = entries_.size();
  Entry& entry = entries_[key];
  if (entries_.size() != entries_before) ++table_generation_;  // it may have moved the others
  if (std::shared_ptr<StreamChunk> live = LiveLocked(entry, taker)) {
    lock.unlock();
    out.status = VerifyShared(key, live);
    out.kept_copy_damaged = !out.status.ok();
    if (out.status.ok()) out.chunk = std::move(live);
    return out;
  }
  if (entry.in_flight) {
    // Another stream is reading it: wait for that read. The Read stays valid through our
    // reference even after the reader has erased it from the entry.
    std::shared_ptr<Read> joined = entry.in_flight;
    ++stats_.joined_reads;
    read_done_.wait(lock, [&] { return joined->done; });
    out.status = joined->status;
    if (!out.status.ok()) return out;
    std::shared_ptr<StreamChunk> chunk = joined->chunk;
    if (chunk->kept_.cached) TakenLocked(*chunk, taker);
    lock.unlock();
    // Bytes just read from the store: damage is the store's, and reading again would not help.
    out.status = VerifyShared(key, chunk);
    if (out.status.ok()) out.chunk = std::move(chunk);
    return out;
  }
  out.to_fill = std::make_shared<Read>();
  entry.in_flight = out.to_fill;
  MaybeSweepLocked();
  return out;
}

// GetMany's state for one call, kept per thread from call to call so that a call allocates
// nothing for its bookkeeping (GetMany does not re-enter itself).
struct SharedChunks::ManyScratch {
  // What the locked pass found for each request.
  enum class Found : uint8_t { kLive, kInFlight, kToRead };
  struct Pending {
    Key key;
    Found found;
    std::shared_ptr<StreamChunk> chunk;  // kLive
    Read* read = nullptr;                // kToRead: in `reads`
    Entry* entry = nullptr;              // kToRead: its slot, valid while generation is current
  };
  std::vector<Pending> pending;
  // SharedChunks::table_generation_ when the slots of `pending` were found: while it has not
  // changed, the table has moved no slot and they are still where they were.
  uint64_t generation = 0;
  // The Reads this call registers, one allocation for all (each handed out to the table by an
  // aliasing pointer, which keeps the block alive while any waiter holds one).
  std::shared_ptr<std::vector<Read>> reads;
  std::vector<size_t> to_read;  // indices of the kToRead requests, in order
  std::vector<ChunkAddress> addresses;
  std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>> data;
  std::vector<std::shared_ptr<StreamChunk>> read_chunks;

  // Drops every reference the call took, keeping the vectors' storage.
  void Clear() {
    pending.clear();
    reads.reset();
    to_read.clear();
    addresses.clear();
    data.clear();
    read_chunks.clear();
  }
};

void SharedChunks::GetMany(std::span<Request> requests, const FetchCohort* cohort,
                           const void* taker) {
  using Found = ManyScratch::Found;
  const bool lone = LoneHint(cohort);
  if (lone && TryLone(requests, cohort)) return;
  thread_local ManyScratch scratch;
  ManyScratch& m = scratch;
  m.Clear();
  m.pending.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const ChunkAddress& a = requests[i].address;
    m.pending[i].key = Key{a.data_id, a.tensor, a.blob, a.chunk, requests[i].checksum};
  }
  LookUpMany(m, taker);
  // This call's reads first: other streams may be waiting for them.
  if (!m.to_read.empty()) ReadMany(requests, m, cohort, taker, lone);
  size_t k = 0;
  for (size_t i = 0; i < m.pending.size(); ++i) {
    ManyScratch::Pending& p = m.pending[i];
    switch (p.found) {
      case Found::kToRead:
        // Read for this caller: unverified, as Get returns it.
        if (m.data[k].ok()) {
          requests[i].result = std::move(m.read_chunks[k]);
        } else {
          requests[i].result = m.data[k].status();
        }
        ++k;
        break;
      case Found::kLive: {
        // As Share does for a live copy: verified before it is shared.
        Shared shared;
        shared.status = VerifyShared(p.key, p.chunk);
        shared.kept_copy_damaged = !shared.status.ok();
        if (shared.status.ok()) shared.chunk = std::move(p.chunk);
        requests[i].result = Finish(p.key, requests[i].address, std::move(shared), cohort, taker);
        break;
      }
      case Found::kInFlight:
        requests[i].result =
            Finish(p.key, requests[i].address, Share(p.key, taker, /*count=*/false), cohort, taker);
        break;
    }
  }
  m.Clear();
}

void SharedChunks::LookUpMany(ManyScratch& m, const void* taker) {
  using Found = ManyScratch::Found;
  std::vector<ManyScratch::Pending>& pending = m.pending;
  std::shared_ptr<std::vector<Read>>& reads = m.reads;
  std::lock_guard<std::mutex> lock(mu_);
  // Room for every request first, so that inserting them moves no slot found before.
  entries_.reserve(entries_.size() + pending.size());
  // The table is large when many small chunks are kept: its slots are fetched a few requests
  // ahead so that their cache misses overlap.
  for (size_t i = 0; i < std::min(kPrefetchAhead, pending.size()); ++i) {
    entries_.prefetch(pending[i].key);
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    if (i + kPrefetchAhead < pending.size()) entries_.prefetch(pending[i + kPrefetchAhead].key);
    ManyScratch::Pending& p = pending[i];
    ++stats_.requests;
    Entry& entry = entries_[p.key];
    if (std::shared_ptr<StreamChunk> live = LiveLocked(entry, taker)) {
      p.found = Found::kLive;
      p.chunk = std::move(live);
    } else if (entry.in_flight) {
      p.found = Found::kInFlight;  // waited for below, once this call's own reads are filled
    } else {
      p.found = Found::kToRead;
      if (!reads) reads = std::make_shared<std::vector<Read>>(pending.size() - i);
      p.read = &(*reads)[m.to_read.size()];
      m.to_read.push_back(i);
      entry.in_flight = std::shared_ptr<Read>(reads, p.read);
      p.entry = &entry;
    }
  }
  MaybeSweepLocked();  // erases only: no slot moves
  m.generation = ++table_generation_;
}

void SharedChunks::ReadMany(std::span<Request> requests, ManyScratch& m, const FetchCohort* cohort,
                            const void* taker, bool lone) {
  for (size_t i : m.to_read) m.addresses.push_back(requests[i].address);
  store_->ReadChunksUnverified(m.addresses, &m.data);
  m.read_chunks.reserve(m.to_read.size());
  for (size_t k = 0; k < m.to_read.size(); ++k) {
    const size_t i = m.to_read[k];
    std::shared_ptr<StreamChunk> chunk;
    if (m.data[k].ok()) {
      chunk = NewChunk(requests[i].address, m.pending[i].key.checksum, *std::move(m.data[k]));
    }
    m.read_chunks.push_back(std::move(chunk));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = m.to_read.size();
    // The slots found by LookUpMany, unless another stream's insertions may have moved them.
    const bool slots_found = m.generation == table_generation_;
    for (size_t k = 0; !slots_found && k < std::min(kPrefetchAhead, n); ++k) {
      entries_.prefetch(m.pending[m.to_read[k]].key);
    }
    for (size_t k = 0; k < n; ++k) {
      if (!slots_found && k + kPrefetchAhead < n) {
        entries_.prefetch(m.pending[m.to_read[k + kPrefetchAhead]].key);
      }
      const ManyScratch::Pending& p = m.pending[m.to_read[k]];
      PublishLocked(p.key, *p.read, m.data[k], m.read_chunks[k], cohort, taker,
                    slots_found ? p.entry : nullptr, lone);
    }
  }
  read_done_.notify_all();
  if (lone) KeepLone(m.read_chunks, cohort, taker);
}

void SharedChunks::PublishLocked(const Key& key, Read& read,
                                 const absl::StatusOr<std::unique_ptr<ChunkData>>& data,
                                 const std::shared_ptr<StreamChunk>& chunk,
                                 const FetchCohort* cohort, const void* taker, Entry* slot,
                                 bool lone) {
  read.done = true;
  read.status = data.status();
  read.chunk = chunk;
  // The slot registered for the read (which keeps it in the table while in flight); looked up
  // again unless the caller knows it has not moved.
  Entry& entry = slot != nullptr ? *slot : entries_[key];
  entry.in_flight.reset();
  if (chunk) {
    ++stats_.store_reads;
    stats_.store_bytes_read += static_cast<int64_t>(chunk->data->bytes().size());
    entry.live = chunk;
    // A lone caller's chunk goes to the ring (KeepLone); any other is kept for the cohort's
    // other open members.
    if (lone) return;
    const int takers = cohort ? cohort->pacing() - 1 : 0;
    CacheLocked(chunk, takers, taker);
  }
}

absl::StatusOr<std::shared_ptr<StreamChunk>> SharedChunks::ReadForAll(
    const Key& key, const ChunkAddress& address, std::shared_ptr<Read> read,
    const FetchCohort* cohort, const void* taker, bool lone) {
  // This thread reads for every requester of the chunk. Nothing here depends on the stream that
  // asked first: the result goes to the Read, which the waiters hold.
  auto data = store_->ReadChunkUnverified(address);
  std::shared_ptr<StreamChunk> chunk;
  if (data.ok()) {
    chunk = NewChunk(address, key.checksum, *std::move(data));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    PublishLocked(key, *read, data, chunk, cohort, taker, nullptr, lone);
  }
  read_done_.notify_all();
  if (!data.ok()) return data.status();
  if (lone) KeepLone(std::span<const std::shared_ptr<StreamChunk>>(&chunk, 1), cohort, taker);
  return chunk;
}

absl::Status SharedChunks::VerifyShared(const Key& key, const std::shared_ptr<StreamChunk>& chunk) {
  if (chunk->verified()) return absl::OkStatus();
  const bool was_unknown = !chunk->corrupt();
  absl::Status s = chunk->Verify();
  if (was_unknown) {
    // Counted by whichever sharer got here first; the others found the result (a small
    // overcount when two sharers race past verified() before either hashed).
    verified_bytes_.fetch_add(static_cast<int64_t>(chunk->data->bytes().size()),
                              std::memory_order_relaxed);
  }
  if (!s.ok()) {
    corrupt_chunks_.fetch_add(was_unknown ? 1 : 0, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    ForgetLocked(key, chunk.get());
  }
  return s;
}

void SharedChunks::ForgetLocked(const Key& key, StreamChunk* chunk) {
  if (chunk->kept_.cached) UncacheLocked(*chunk);
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  std::shared_ptr<StreamChunk> live = entry.live.lock();
  if (live.get() != chunk) return;  // a fresh read replaced it already
  entry.live.reset();
  if (!entry.in_flight) entries_.erase(it);
}

void SharedChunks::CountKeptLocked(StreamChunk& chunk) {
  StreamChunk::Kept& k = chunk.kept_;
  k.bytes = static_cast<int64_t>(chunk.data->bytes().size());
  const ChunkData::Pin pin = chunk.data->pin();
  k.pin_id = pin.id;
  k.pin_bytes = pin.bytes;
  stats_.cached_bytes += k.bytes;
  table_kept_.fetch_add(1, std::memory_order_relaxed);
  if (pin.id == nullptr) return;
  if (pins_[pin.id]++ == 0) stats_.pinned_bytes += pin.bytes;
}

void SharedChunks::CountDroppedLocked(StreamChunk& chunk) {
  const StreamChunk::Kept& k = chunk.kept_;
  stats_.cached_bytes -= k.bytes;
  table_kept_.fetch_sub(1, std::memory_order_relaxed);
  if (k.pin_id == nullptr) return;
  auto it = pins_.find(k.pin_id);
  if (it == pins_.end() || --it->second > 0) return;
  pins_.erase(it);
  stats_.pinned_bytes -= k.pin_bytes;
}

void SharedChunks::List::PushFront(StreamChunk* c) {
  c->kept_.prev = nullptr;
  c->kept_.next = front;
  if (front != nullptr) {
    front->kept_.prev = c;
  } else {
    back = c;
  }
  front = c;
}

void SharedChunks::List::Unlink(StreamChunk* c) {
  StreamChunk::Kept& k = c->kept_;
  (k.prev != nullptr ? k.prev->kept_.next : front) = k.next;
  (k.next != nullptr ? k.next->kept_.prev : back) = k.prev;
  k.prev = k.next = nullptr;
}

std::shared_ptr<StreamChunk> SharedChunks::DropLocked(StreamChunk& chunk) {
  StreamChunk::Kept& k = chunk.kept_;
  CountDroppedLocked(chunk);
  (k.spare ? spare_ : wanted_).Unlink(&chunk);
  k.taken_by.clear();
  k.taken_by.shrink_to_fit();
  k.cached = false;
  k.spare = false;
  return std::move(k.self);
}

void SharedChunks::UncacheLocked(StreamChunk& chunk) {
  DropLocked(chunk);  // the caller's reference keeps `chunk` alive
}

void SharedChunks::TakenLocked(StreamChunk& chunk, const void* taker) {
  StreamChunk::Kept& k = chunk.kept_;
  List& list = k.spare ? spare_ : wanted_;
  list.Unlink(&chunk);
  list.PushFront(&chunk);
  if (k.spare) return;
  if (taker != nullptr) {
    if (std::find(k.taken_by.begin(), k.taken_by.end(), taker) != k.taken_by.end()) {
      return;  // it had the chunk already
    }
    k.taken_by.push_back(taker);
  }
  if (--k.takers_left > 0) return;
  // Every member expected to take it has it (those that still use it hold it themselves): it
  // becomes spare, kept only in room no cohort needs, for members that joined since.
  ++stats_.released_taken;
  wanted_.Unlink(&chunk);
  spare_.PushFront(&chunk);
  k.spare = true;
  k.taken_by.clear();
  k.taken_by.shrink_to_fit();
}

void SharedChunks::CacheLocked(std::shared_ptr<StreamChunk> chunk, int takers, const void* reader) {
  const auto size = static_cast<int64_t>(chunk->data->bytes().size());
  // Kept: every chunk that fits the budget, except a spare one whose mapping alone exceeds it.
  // Pins evict spare chunks only, so a wanted chunk stays whatever its mapping pins.
  if (size > cache_bytes_ || (takers <= 0 && chunk->data->pin().bytes > cache_bytes_)) return;
  StreamChunk& added = *chunk;
  StreamChunk::Kept& k = added.kept_;
  k.spare = takers <= 0;
  k.takers_left = takers;
  k.taken_by.clear();
  if (reader != nullptr && !k.spare) k.taken_by.push_back(reader);
  k.self = std::move(chunk);
  (k.spare ? spare_ : wanted_).PushFront(&added);
  k.cached = true;
  CountKeptLocked(added);
  table_used_ns_ = absl::GetCurrentTimeNanos();
  while (stats_.cached_bytes > cache_bytes_ || stats_.pinned_bytes > cache_bytes_) {
    // Spare chunks go first, and a new spare chunk never displaces a wanted one. The new chunk is
    // at the front of its list and fits the budget alone, so the victim is another one. Wanted
    // chunks are evicted for their bytes only: what they pin is bounded by pacing (the members of
    // a job read within the pace window of each other), and evicting them would make their
    // cohort read them again.
    const bool for_pins = stats_.cached_bytes <= cache_bytes_;
    List* from = &wanted_;
    if (!spare_.empty() && spare_.back != &added) {
      from = &spare_;
    } else if (k.spare) {
      if (for_pins) ++stats_.evicted_for_pins;
      UncacheLocked(added);  // the table's entry keeps it alive (live) while a stream holds it
      break;
    } else if (for_pins) {
      break;
    }
    if (for_pins) ++stats_.evicted_for_pins;
    // The chunk's entry stays while a stream holds the chunk (live) or reads it again.
    DropLocked(*from->back);  // the chunk goes here unless a stream holds it
  }
}

void SharedChunks::MaybeSweepLocked() {
  if (entries_.size() >= sweep_at_) SweepLocked();
}

void SharedChunks::SweepLocked() {
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = it->second;
    if (!e.in_flight && e.live.expired()) {  // a kept chunk is alive
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
  sweep_at_ = std::max<size_t>(1024, 2 * entries_.size());
}

void SharedChunks::Clear() {
  {
    std::lock_guard<std::mutex> solo(solo_mu_);
    while (!ring_.empty()) PopLoneLocked();
  }
  std::lock_guard<std::mutex> lock(mu_);
  while (!wanted_.empty()) DropLocked(*wanted_.front);
  while (!spare_.empty()) DropLocked(*spare_.front);
}

void SharedChunks::ForgetData(uint64_t data_id) {
  {
    std::lock_guard<std::mutex> solo(solo_mu_);
    std::deque<LoneChunk> kept;
    while (!ring_.empty()) {
      if (ring_.front().chunk->address.data_id != data_id) kept.push_back(ring_.front());
      PopLoneLocked();
    }
    for (LoneChunk& c : kept) PushLoneLocked(std::move(c.chunk), c.cohort_hash);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (List* list : {&wanted_, &spare_}) {
    for (StreamChunk* c = list->front; c != nullptr;) {
      StreamChunk* const next = c->kept_.next;
      if (c->address.data_id == data_id) {
        const Key key = KeyOf(*c);
        std::shared_ptr<StreamChunk> chunk = DropLocked(*c);
        auto entry = entries_.find(key);
        if (entry != entries_.end()) {
          entry->second.live.reset();
          if (!entry->second.in_flight) entries_.erase(entry);
        }
      }
      c = next;
    }
  }
}

SharedChunkStats SharedChunks::stats() const {
  SharedChunkStats s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = stats_;
  }
  {
    std::lock_guard<std::mutex> solo(solo_mu_);
    s.requests += lone_stats_.requests;
    s.store_reads += lone_stats_.store_reads;
    s.store_bytes_read += lone_stats_.store_bytes_read;
    s.evicted_for_pins += lone_stats_.evicted_for_pins;
    s.lone_reads = lone_stats_.lone_reads;
    s.idle_dropped = lone_stats_.idle_dropped;
    s.cached_bytes += ring_bytes_;
    s.pinned_bytes += ring_pinned_;
  }
  s.verified_bytes = verified_bytes_.load(std::memory_order_relaxed);
  s.corrupt_chunks = corrupt_chunks_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> pace(pace_mu_);
  s.pace_waits = pace_waits_;
  s.left_behind = left_behind_;
  s.pacing_now = static_cast<int64_t>(waiting_.size());
  return s;
}

}  // namespace ckpt
