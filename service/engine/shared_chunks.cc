#include "service/engine/shared_chunks.h"

#include <algorithm>
#include <utility>

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

SharedChunks::SharedChunks(CheckpointStore* store, int64_t cache_bytes)
    : store_(store), cache_bytes_(cache_bytes < 0 ? 0 : cache_bytes) {}

absl::StatusOr<std::shared_ptr<StreamChunk>> SharedChunks::Get(const ChunkAddress& address,
                                                               uint64_t checksum,
                                                               const FetchCohort* cohort,
                                                               const void* taker) {
  const Key key{address.data_id, address.tensor, address.blob, address.chunk, checksum};
  std::shared_ptr<Read> read;
  {
    std::unique_lock<std::mutex> lock(mu_);
    ++stats_.requests;
    Entry& entry = entries_[key];
    if (std::shared_ptr<StreamChunk> live = entry.live.lock(); live && !live->corrupt()) {
      if (entry.cached) {
        ++stats_.cache_hits;
        TakenLocked(entry, taker);
      } else {
        ++stats_.live_hits;
      }
      lock.unlock();
      if (absl::Status s = VerifyShared(key, live); !s.ok()) return s;
      return live;
    }
    if (entry.in_flight) {
      // Another stream is reading it: wait for that read. The Read stays valid through our
      // reference even after the reader has erased it from the entry.
      std::shared_ptr<Read> joined = entry.in_flight;
      ++stats_.joined_reads;
      read_done_.wait(lock, [&] { return joined->done; });
      if (!joined->status.ok()) return joined->status;
      std::shared_ptr<StreamChunk> chunk = joined->chunk;
      // The table may have changed while waiting: find the entry again.
      if (auto it = entries_.find(key);
          it != entries_.end() && it->second.cached && it->second.live.lock() == chunk) {
        TakenLocked(it->second, taker);
      }
      lock.unlock();
      if (absl::Status s = VerifyShared(key, chunk); !s.ok()) return s;
      return chunk;
    }
    read = std::make_shared<Read>();
    entry.in_flight = read;
    MaybeSweepLocked();
  }

  // This thread reads for every requester of the chunk. Nothing here depends on the stream that
  // asked first: the result goes to the Read, which the waiters hold.
  auto data = store_->ReadChunkUnverified(address);
  std::shared_ptr<StreamChunk> chunk;
  if (data.ok()) {
    chunk = std::make_shared<StreamChunk>();
    chunk->address = address;
    chunk->data = *std::move(data);
    chunk->checksum = checksum;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    read->done = true;
    read->status = data.status();
    read->chunk = chunk;
    Entry& entry = entries_[key];  // references into the table may have moved meanwhile
    entry.in_flight.reset();
    if (chunk) {
      ++stats_.store_reads;
      stats_.store_bytes_read += static_cast<int64_t>(chunk->data->bytes().size());
      entry.live = chunk;
      // Kept for the cohort's other open members.
      const int takers = cohort ? cohort->members() - 1 : 0;
      CacheLocked(key, entry, chunk, takers, taker);
    }
  }
  read_done_.notify_all();
  if (!data.ok()) return data.status();
  return chunk;
}

std::shared_ptr<const FetchCohort> SharedChunks::JoinCohort(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  std::shared_ptr<FetchCohort> cohort = cohorts_[key].lock();
  if (!cohort) {
    cohort = std::make_shared<FetchCohort>();
    cohorts_[key] = cohort;
  }
  if (cohorts_.size() >= cohort_sweep_at_) {
    for (auto it = cohorts_.begin(); it != cohorts_.end();) {
      if (it->second.expired()) {
        cohorts_.erase(it++);
      } else {
        ++it;
      }
    }
    cohort_sweep_at_ = std::max<size_t>(64, 2 * cohorts_.size());
  }
  cohort->members_.fetch_add(1, std::memory_order_relaxed);
  // The handle leaves the cohort when released; it keeps the cohort alive meanwhile.
  return std::shared_ptr<const FetchCohort>(cohort.get(), [cohort](const FetchCohort*) {
    cohort->members_.fetch_sub(1, std::memory_order_relaxed);
  });
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

void SharedChunks::ForgetLocked(const Key& key, const StreamChunk* chunk) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  std::shared_ptr<StreamChunk> live = entry.live.lock();
  if (live.get() != chunk) return;  // a fresh read replaced it already
  if (entry.cached) UncacheLocked(entry);
  entry.live.reset();
  if (!entry.in_flight) entries_.erase(it);
}

void SharedChunks::UncacheLocked(Entry& entry) {
  stats_.cached_bytes -= static_cast<int64_t>(entry.lru_it->second->data->bytes().size());
  (entry.spare ? spare_ : wanted_).erase(entry.lru_it);
  entry.taken_by.clear();
  entry.taken_by.shrink_to_fit();
  entry.cached = false;
  entry.spare = false;
}

void SharedChunks::TakenLocked(Entry& entry, const void* taker) {
  List& list = entry.spare ? spare_ : wanted_;
  list.splice(list.begin(), list, entry.lru_it);
  if (entry.spare) return;
  if (taker != nullptr) {
    if (std::find(entry.taken_by.begin(), entry.taken_by.end(), taker) != entry.taken_by.end()) {
      return;  // it had the chunk already
    }
    entry.taken_by.push_back(taker);
  }
  if (--entry.takers_left > 0) return;
  // Every member expected to take it has it (those that still use it hold it themselves): it
  // becomes spare, kept only in room no cohort needs, for members that joined since.
  ++stats_.released_taken;
  spare_.splice(spare_.begin(), wanted_, entry.lru_it);
  entry.spare = true;
  entry.taken_by.clear();
  entry.taken_by.shrink_to_fit();
}

void SharedChunks::CacheLocked(const Key& key, Entry& entry, std::shared_ptr<StreamChunk> chunk,
                               int takers, const void* reader) {
  const auto size = static_cast<int64_t>(chunk->data->bytes().size());
  if (size > cache_bytes_) return;
  entry.spare = takers <= 0;
  entry.takers_left = takers;
  entry.taken_by.clear();
  if (reader != nullptr && !entry.spare) entry.taken_by.push_back(reader);
  List& list = entry.spare ? spare_ : wanted_;
  list.emplace_front(key, std::move(chunk));
  entry.cached = true;
  entry.lru_it = list.begin();
  stats_.cached_bytes += size;
  while (stats_.cached_bytes > cache_bytes_) {
    // Spare chunks go first, and a new spare chunk never displaces a wanted one. The new chunk is
    // at the front of its list and fits the budget alone, so the victim is another one.
    List* from = &wanted_;
    if (!spare_.empty() && spare_.back().second.get() != entry.lru_it->second.get()) {
      from = &spare_;
    } else if (entry.spare) {
      UncacheLocked(entry);
      break;
    }
    auto& [old_key, old] = from->back();
    stats_.cached_bytes -= static_cast<int64_t>(old->data->bytes().size());
    // The entry stays while a stream holds the chunk (live) or reads it again.
    auto it = entries_.find(old_key);
    if (it != entries_.end()) {
      it->second.cached = false;
      it->second.spare = false;
    }
    from->pop_back();
  }
}

void SharedChunks::MaybeSweepLocked() {
  if (entries_.size() < sweep_at_) return;
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& e = it->second;
    if (!e.in_flight && !e.cached && e.live.expired()) {
      entries_.erase(it++);
    } else {
      ++it;
    }
  }
  sweep_at_ = std::max<size_t>(1024, 2 * entries_.size());
}

void SharedChunks::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (List* list : {&wanted_, &spare_}) {
    for (auto& [key, chunk] : *list) {
      auto it = entries_.find(key);
      if (it != entries_.end()) {
        it->second.cached = false;
        it->second.spare = false;
      }
    }
    list->clear();
  }
  stats_.cached_bytes = 0;
}

void SharedChunks::ForgetData(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (List* list : {&wanted_, &spare_}) {
    for (auto it = list->begin(); it != list->end();) {
      if (it->first.data_id != data_id) {
        ++it;
        continue;
      }
      stats_.cached_bytes -= static_cast<int64_t>(it->second->data->bytes().size());
      auto entry = entries_.find(it->first);
      it = list->erase(it);
      if (entry != entries_.end()) {
        entry->second.cached = false;
        entry->second.spare = false;
        entry->second.live.reset();
        if (!entry->second.in_flight) entries_.erase(entry);
      }
    }
  }
}

SharedChunkStats SharedChunks::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SharedChunkStats s = stats_;
  s.verified_bytes = verified_bytes_.load(std::memory_order_relaxed);
  s.corrupt_chunks = corrupt_chunks_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ckpt
