// SharedChunks' lone path: a stream that is the only open fetch stream reads around the shared
// table, keeping what it reads in the lone ring, which JoinCohort hands over to the table (see
// the file comment of shared_chunks.h).
#include <memory>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "service/engine/shared_chunks.h"

namespace ckpt {

bool SharedChunks::TryLone(std::span<Request> requests, const FetchCohort* cohort) {
  std::lock_guard<std::mutex> solo(solo_mu_);
  // A member joining takes solo_mu_ to count itself: while it is held, the caller stays alone.
  if (open_members_.load(std::memory_order_relaxed) != 1 || !TableIdleOrEmptyLocked()) {
    return false;
  }
  // Kept per thread from call to call, so that a call allocates nothing for its bookkeeping.
  thread_local std::vector<ChunkAddress> addresses;
  thread_local std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>> data;
  addresses.clear();
  for (const Request& r : requests) addresses.push_back(r.address);
  store_->ReadChunksUnverified(addresses, &data);
  lone_stats_.requests += static_cast<int64_t>(requests.size());
  // The chunks are placed kArenaChunks to an arena: one allocation for them, and at most that
  // many chunks' objects kept in memory by one chunk that outlives the rest of its arena.
  ChunkArena* arena = nullptr;
  size_t placed = 0;  // in arena
  absl::Cleanup release_arena = [&arena] {
    if (arena != nullptr) arena->Release();
  };
  for (size_t k = 0; k < requests.size(); ++k) {
    if (!data[k].ok()) {
      requests[k].result = data[k].status();
      continue;
    }
    if (arena == nullptr || placed == kArenaChunks) {
      if (arena != nullptr) arena->Release();
      arena = ChunkArena::Make(kArenaChunks * kArenaSlotBytes);  // one size: arenas are reused
      placed = 0;
    }
    ++placed;
    std::shared_ptr<StreamChunk> chunk =
        NewChunk(requests[k].address, requests[k].checksum, *std::move(data[k]), arena);
    ++lone_stats_.store_reads;
    ++lone_stats_.lone_reads;
    lone_stats_.store_bytes_read += static_cast<int64_t>(chunk->data->bytes().size());
    PushLoneLocked(chunk, cohort->key_hash_);
    requests[k].result = std::move(chunk);  // read for this caller alone: unverified
  }
  data.clear();
  TrimLoneLocked();
  return true;
}

bool SharedChunks::TableIdleOrEmptyLocked() {
  if (table_kept_.load(std::memory_order_acquire) == 0) return true;
  std::vector<std::shared_ptr<StreamChunk>> dropped;  // released after mu_
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::GetCurrentTimeNanos() - table_used_ns_ < absl::ToInt64Nanoseconds(straggler_bound_)) {
      return false;
    }
    for (List* list : {&wanted_, &spare_}) {
      while (!list->empty()) dropped.push_back(DropLocked(*list->front));
    }
  }
  lone_stats_.idle_dropped += static_cast<int64_t>(dropped.size());
  dropped.clear();
  // The entries of the chunks gone with them would stay until the table is used again.
  std::lock_guard<std::mutex> lock(mu_);
  SweepLocked();
  return true;
}

void SharedChunks::KeepLone(std::span<const std::shared_ptr<StreamChunk>> chunks,
                            const FetchCohort* cohort, const void* taker) {
  std::lock_guard<std::mutex> solo(solo_mu_);
  if (open_members_.load(std::memory_order_relaxed) == 1) {
    for (const std::shared_ptr<StreamChunk>& c : chunks) {
      if (c) PushLoneLocked(c, cohort->key_hash_);
    }
    TrimLoneLocked();
    return;
  }
  // A member joined after the caller looked its chunks up: they are kept for the cohort, as
  // PublishLocked keeps any other read.
  std::lock_guard<std::mutex> lock(mu_);
  const int takers = cohort->pacing() - 1;
  for (const std::shared_ptr<StreamChunk>& c : chunks) {
    if (c && !c->kept_.cached && !c->corrupt()) CacheLocked(c, takers, taker);
  }
}

void SharedChunks::PushLoneLocked(std::shared_ptr<StreamChunk> chunk, uint64_t cohort_hash) {
  const auto bytes = static_cast<int64_t>(chunk->data->bytes().size());
  if (bytes < lone_ring_min_bytes_) return;  // cheaper to read again than to keep
  const ChunkData::Pin pin = chunk->data->pin();
  // As CacheLocked keeps a spare chunk: not one that alone exceeds the budget, nor its mapping.
  if (bytes > cache_bytes_ || pin.bytes > cache_bytes_) return;
  ring_bytes_ += bytes;
  if (pin.id != nullptr && ring_pins_[pin.id]++ == 0) ring_pinned_ += pin.bytes;
  ring_.push_back(LoneChunk{std::move(chunk), cohort_hash, bytes, pin.id, pin.bytes});
}

void SharedChunks::PopLoneLocked() {
  const LoneChunk& c = ring_.front();
  ring_bytes_ -= c.bytes;
  if (c.pin_id != nullptr) {
    auto it = ring_pins_.find(c.pin_id);
    if (it != ring_pins_.end() && --it->second == 0) {
      ring_pins_.erase(it);
      ring_pinned_ -= c.pin_bytes;
    }
  }
  ring_.pop_front();  // the chunk goes here unless its stream still holds it
}

void SharedChunks::TrimLoneLocked() {
  int64_t table_bytes = 0, table_pinned = 0;
  if (table_kept_.load(std::memory_order_acquire) > 0) {
    // The table's spare chunks were kept before any of the ring's (a second member hands the
    // ring over to the table, and a lone caller keeps nothing there): they go first.
    std::lock_guard<std::mutex> lock(mu_);
    while (!spare_.empty() && (stats_.cached_bytes + ring_bytes_ > cache_bytes_ ||
                               stats_.pinned_bytes + ring_pinned_ > cache_bytes_)) {
      if (stats_.cached_bytes + ring_bytes_ <= cache_bytes_) ++stats_.evicted_for_pins;
      DropLocked(*spare_.back);
    }
    table_bytes = stats_.cached_bytes;
    table_pinned = stats_.pinned_bytes;
  }
  while (!ring_.empty() &&
         (ring_bytes_ + table_bytes > cache_bytes_ || ring_pinned_ + table_pinned > cache_bytes_)) {
    if (ring_bytes_ + table_bytes <= cache_bytes_) ++lone_stats_.evicted_for_pins;
    PopLoneLocked();
  }
}

bool SharedChunks::RingHasCohortLocked(uint64_t cohort_hash) const {
  for (const LoneChunk& c : ring_) {
    if (c.cohort_hash == cohort_hash) return true;
  }
  return false;
}

void SharedChunks::MigrateLoneLocked() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Oldest first, so that the most recent end at the front of the spare list.
    for (LoneChunk& c : ring_) {
      StreamChunk& chunk = *c.chunk;
      if (chunk.kept_.cached || chunk.corrupt()) continue;
      const Key key = KeyOf(chunk);
      const size_t entries_before = entries_.size();
      Entry& entry = entries_[key];
      if (entries_.size() != entries_before) ++table_generation_;
      std::shared_ptr<StreamChunk> live = entry.live.lock();
      if (live && live != c.chunk) continue;  // another copy is shared already
      entry.live = c.chunk;
      CacheLocked(std::move(c.chunk), /*takers=*/0, nullptr);
    }
    MaybeSweepLocked();
  }
  while (!ring_.empty()) PopLoneLocked();
}

}  // namespace ckpt
