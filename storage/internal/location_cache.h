// Chunk locations of whole blobs, kept in memory for the segment store (segment_store.h): a
// fetch reads a blob's chunks one by one, and a RocksDB lookup per chunk would cost more than the
// read itself for small chunks; the store instead reads all of a blob's locations with one
// iterator scan the first time one of its chunks is read, and keeps them here. Only for data ids
// whose chunks cannot change any more (committed); the store drops a data id's entries when it
// deletes it. Bounded: least recently used blobs go first. Beside the blobs it keeps the packed
// locations of data ids (index_records.h: pack records), each data id's merged into one sorted
// table, read whole the first time a chunk of the data id is looked up; bounded likewise, least
// recently used data ids first. Thread-safe. Private to the store.
#ifndef CKPT_STORAGE_INTERNAL_LOCATION_CACHE_H_
#define CKPT_STORAGE_INTERNAL_LOCATION_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "storage/checkpoint_store.h"
#include "storage/internal/index_records.h"

namespace ckpt::segment_store_internal {

class LocationCache {
 public:
  // A blob's locations by chunk index; kNoChunk where the blob has no such chunk.
  static constexpr ChunkLocation kNoChunk{~uint64_t{0}, ~uint64_t{0}};
  using Locations = std::vector<ChunkLocation>;

  // Holds at most `max_locations` locations, a blob without any counting one (a blob larger than
  // that is not kept).
  explicit LocationCache(size_t max_locations) : max_locations_(max_locations) {}

  // A data id's packed locations, sorted by (tensor, blob, chunk), one per address.
  using Packs = std::vector<PackEntry>;

  struct Lookup {
    bool blob_cached = false;               // the blob of the address is kept here
    std::optional<ChunkLocation> location;  // and has the chunk, there
    // The packed locations of the address's data id are kept here: when the address is among
    // them, blob_cached is true and location is its location.
    bool packs_known = false;
  };
  Lookup Find(const ChunkAddress& address);
  // Find of each of `addresses`, under one lock, into `out` (replacing its contents).
  void FindMany(std::span<const ChunkAddress> addresses, std::vector<Lookup>* out);
  // Keeps the locations of the blob of `address` (its chunk index is ignored), replacing any
  // kept before, and drops least recently used blobs beyond the bound.
  void Insert(const ChunkAddress& address, Locations locations);
  // Keeps `packs` (sorted, one entry per address) as the packed locations of `data_id`,
  // replacing any kept before, and drops least recently used data ids' packs beyond the bound
  // (entries, a data id without any counting one; a larger table is not kept).
  void InsertPacks(uint64_t data_id, Packs packs);
  // The location of `address` in sorted `packs`, if there.
  static std::optional<ChunkLocation> FindPacked(const Packs& packs, const ChunkAddress& address);
  // FindPacked, searching from `*hint` (an index into `packs`) outwards, and setting `*hint` to
  // just after the entry found (or to where it would be): for addresses asked for in about the
  // packs' order, each found in a few steps.
  static std::optional<ChunkLocation> FindPackedFrom(const Packs& packs,
                                                     const ChunkAddress& address, size_t* hint);
  // Drops every blob and the packs of `data_id`.
  void EraseData(uint64_t data_id);
  // Locations held now (as counted against the bound).
  size_t size() const;

 private:
  struct BlobKey {
    uint64_t data_id;
    uint32_t tensor;
    uint32_t blob;
    friend bool operator==(const BlobKey&, const BlobKey&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const BlobKey& k) {
      return H::combine(std::move(h), k.data_id, k.tensor, k.blob);
    }
  };
  using Entry = std::pair<BlobKey, Locations>;
  using PacksEntry = std::pair<uint64_t, Packs>;

  void EraseLocked(std::list<Entry>::iterator it);
  void ErasePacksLocked(std::list<PacksEntry>::iterator it);
  // Find with mu_ held.
  Lookup FindLocked(const ChunkAddress& address);
  // FindLocked's answer for an address of the kept `blob`.
  Lookup FromBlobLocked(std::list<Entry>::iterator blob, const ChunkAddress& address);

  const size_t max_locations_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first; guarded by mu_
  absl::flat_hash_map<BlobKey, std::list<Entry>::iterator> index_;  // guarded by mu_
  size_t locations_ = 0;                                            // guarded by mu_
  std::list<PacksEntry> packs_lru_;  // most recently used first; guarded by mu_
  absl::flat_hash_map<uint64_t, std::list<PacksEntry>::iterator> packs_index_;  // guarded by mu_
  size_t packed_ = 0;  // entries of packs_lru_ as counted against the bound; guarded by mu_
};

}  // namespace ckpt::segment_store_internal

#endif  // CKPT_STORAGE_INTERNAL_LOCATION_CACHE_H_
