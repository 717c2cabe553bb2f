#include "storage/internal/location_cache.h"

#include <algorithm>
#include <array>
#include <tuple>

namespace ckpt::segment_store_internal {

LocationCache::Lookup LocationCache::Find(const ChunkAddress& address) {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(address);
}

void LocationCache::FindMany(std::span<const ChunkAddress> addresses, std::vector<Lookup>* out) {
  out->clear();
  out->reserve(addresses.size());
  std::lock_guard<std::mutex> lock(mu_);
  // For each of the last few data ids asked for, its packs and the position after the entry last
  // found there: a fetch asks for addresses in about the packs' order, but a destination tensor
  // that spans source ranks takes turns among their data ids, so each data id's position is kept
  // and every address is found by stepping on from its own (FindPackedFrom) rather than by a
  // search of the whole table.
  struct Cursor {
    uint64_t data_id = 0;
    const Packs* packs = nullptr;  // null: the slot is unused
    size_t hint = 0;
  };
  std::array<Cursor, 8> cursors;
  size_t next_cursor = 0;  // the slot a data id not among them takes
  for (const ChunkAddress& a : addresses) {
    if (!index_.empty()) {
      if (auto it = index_.find(BlobKey{a.data_id, a.tensor, a.blob}); it != index_.end()) {
        out->push_back(FromBlobLocked(it->second, a));
        continue;
      }
    }
    Cursor* cursor = nullptr;
    for (Cursor& c : cursors) {
      if (c.packs != nullptr && c.data_id == a.data_id) {
        cursor = &c;
        break;
      }
    }
    if (cursor == nullptr) {
      auto it = packs_index_.find(a.data_id);
      if (it == packs_index_.end()) {
        out->push_back({});
        continue;
      }
      packs_lru_.splice(packs_lru_.begin(), packs_lru_, it->second);
      cursor = &cursors[next_cursor];
      next_cursor = (next_cursor + 1) % cursors.size();
      *cursor = {a.data_id, &it->second->second, 0};
    }
    std::optional<ChunkLocation> location = FindPackedFrom(*cursor->packs, a, &cursor->hint);
    out->push_back({location.has_value(), location, true});
  }
}

namespace {
bool Before(const PackEntry& e, const ChunkAddress& a) {
  return std::tie(e.tensor, e.blob, e.chunk) < std::tie(a.tensor, a.blob, a.chunk);
}
}  // namespace

std::optional<ChunkLocation> LocationCache::FindPacked(const Packs& packs,
                                                       const ChunkAddress& address) {
  size_t hint = 0;
  return FindPackedFrom(packs, address, &hint);
}

std::optional<ChunkLocation> LocationCache::FindPackedFrom(const Packs& packs,
                                                           const ChunkAddress& address,
                                                           size_t* hint) {
  // The first entry not before `address`: searched in [lo, hi).
  size_t lo = 0;
  size_t hi = packs.size();
  const size_t from = std::min(*hint, packs.size());
  if (from > 0 && !Before(packs[from - 1], address)) {
    hi = from;  // behind the hint: a search of what precedes it
  } else {
    // At or after the hint: steps of 1, 2, 4, ... bound it, then a search between the last two.
    lo = from;
    size_t step = 1;
    while (lo + step <= packs.size() && Before(packs[lo + step - 1], address)) {
      lo += step;
      step *= 2;
    }
    hi = std::min(packs.size(), lo + step);
  }
  auto at = std::lower_bound(packs.begin() + static_cast<std::ptrdiff_t>(lo),
                             packs.begin() + static_cast<std::ptrdiff_t>(hi), address, Before);
  *hint = static_cast<size_t>(at - packs.begin());
  if (at == packs.end() || at->tensor != address.tensor || at->blob != address.blob ||
      at->chunk != address.chunk) {
    return std::nullopt;
  }
  ++*hint;
  return at->location;
}

LocationCache::Lookup LocationCache::FindLocked(const ChunkAddress& address) {
  auto it = index_.find(BlobKey{address.data_id, address.tensor, address.blob});
  if (it == index_.end()) {
    auto packs = packs_index_.find(address.data_id);
    if (packs == packs_index_.end()) return {};
    packs_lru_.splice(packs_lru_.begin(), packs_lru_, packs->second);
    std::optional<ChunkLocation> location = FindPacked(packs->second->second, address);
    return {location.has_value(), location, true};
  }
  return FromBlobLocked(it->second, address);
}

LocationCache::Lookup LocationCache::FromBlobLocked(std::list<Entry>::iterator blob,
                                                    const ChunkAddress& address) {
  lru_.splice(lru_.begin(), lru_, blob);
  const Locations& locations = blob->second;
  if (address.chunk >= locations.size()) return {true, std::nullopt};
  const ChunkLocation& location = locations[address.chunk];
  if (location.offset == kNoChunk.offset && location.length == kNoChunk.length) {
    return {true, std::nullopt};
  }
  return {true, location};
}

namespace {
// What an entry counts against the bound: a blob without locations (no chunk stored) still counts
// one, so that such entries are bounded too.
size_t Weight(const LocationCache::Locations& locations) {
  return std::max<size_t>(1, locations.size());
}
}  // namespace

void LocationCache::Insert(const ChunkAddress& address, Locations locations) {
  if (Weight(locations) > max_locations_) return;
  const BlobKey key{address.data_id, address.tensor, address.blob};
  std::lock_guard<std::mutex> lock(mu_);
  if (auto old = index_.find(key); old != index_.end()) EraseLocked(old->second);
  locations_ += Weight(locations);
  lru_.emplace_front(key, std::move(locations));
  index_[key] = lru_.begin();
  while (locations_ > max_locations_) EraseLocked(std::prev(lru_.end()));
}

void LocationCache::InsertPacks(uint64_t data_id, Packs packs) {
  const size_t weight = std::max<size_t>(1, packs.size());
  if (weight > max_locations_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto old = packs_index_.find(data_id); old != packs_index_.end()) {
    ErasePacksLocked(old->second);
  }
  packed_ += weight;
  packs_lru_.emplace_front(data_id, std::move(packs));
  packs_index_[data_id] = packs_lru_.begin();
  while (packed_ > max_locations_) ErasePacksLocked(std::prev(packs_lru_.end()));
}

void LocationCache::ErasePacksLocked(std::list<PacksEntry>::iterator it) {
  packed_ -= std::max<size_t>(1, it->second.size());
  packs_index_.erase(it->first);
  packs_lru_.erase(it);
}

void LocationCache::EraseData(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto packs = packs_index_.find(data_id); packs != packs_index_.end()) {
    ErasePacksLocked(packs->second);
  }
  for (auto it = lru_.begin(); it != lru_.end();) {
    auto next = std::next(it);
    if (it->first.data_id == data_id) EraseLocked(it);
    it = next;
  }
}

size_t LocationCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return locations_;
}

void LocationCache::EraseLocked(std::list<Entry>::iterator it) {
  locations_ -= Weight(it->second);
  index_.erase(it->first);
  lru_.erase(it);
}

}  // namespace ckpt::segment_store_internal
