#include "storage/internal/location_cache.h"

#include <algorithm>

namespace ckpt::segment_store_internal {

LocationCache::Lookup LocationCache::Find(const ChunkAddress& address) {
  std::lock_guard<std::mutex> lock(mu_);
  return FindLocked(address);
}

void LocationCache::FindMany(std::span<const ChunkAddress> addresses, std::vector<Lookup>* out) {
  out->clear();
  out->reserve(addresses.size());
  std::lock_guard<std::mutex> lock(mu_);
  for (const ChunkAddress& a : addresses) out->push_back(FindLocked(a));
}

LocationCache::Lookup LocationCache::FindLocked(const ChunkAddress& address) {
  auto it = index_.find(BlobKey{address.data_id, address.tensor, address.blob});
  if (it == index_.end()) return {};
  lru_.splice(lru_.begin(), lru_, it->second);
  const Locations& locations = it->second->second;
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

void LocationCache::EraseData(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(mu_);
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
