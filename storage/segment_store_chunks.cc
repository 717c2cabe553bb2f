// SegmentStore (segment_store.h): data ids, chunk writes (bytes to the segment writer, locations
// to RocksDB) and chunk reads (locations from the cache or RocksDB, bytes from the segment
// reader).
#include <algorithm>
#include <array>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "storage/internal/index_records.h"
#include "storage/internal/location_cache.h"
#include "storage/internal/segment_reader.h"
#include "storage/internal/segment_store_support.h"
#include "storage/internal/segment_writer.h"
#include "storage/segment_store.h"

namespace ckpt {
namespace {

using segment_store_internal::AppendPackEntry;
using segment_store_internal::BigEndian64;
using segment_store_internal::ChunkKey;
using segment_store_internal::ChunkKeyArray;
using segment_store_internal::ChunkLocation;
using segment_store_internal::DecodeBigEndian;
using segment_store_internal::DecodeLocation;
using segment_store_internal::EncodeLocationArray;
using segment_store_internal::FromRocks;
using segment_store_internal::IsPackKey;
using segment_store_internal::kChunkKeyBytes;
using segment_store_internal::kLocationBytes;
using segment_store_internal::kPackEntryBytes;
using segment_store_internal::LocationCache;
using segment_store_internal::PackEntry;

}  // namespace

absl::StatusOr<uint64_t> SegmentStore::BeginData() {
  uint64_t data_id = 0;
  {
    std::lock_guard<std::mutex> lock(id_mu_);
    data_id = next_data_id_;
    // Persist before handing the id out: after a crash the id must not be handed out again, or a
    // new upload could inherit chunks (or a committed marker) of an old one.
    rocksdb::WriteBatch batch;
    CKPT_RETURN_IF_ERROR(
        FromRocks(batch.Put(meta_, segment_store_internal::kCounterKey, BigEndian64(data_id + 1)),
                  "batching data id"));
    CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/true, "persisting the data id counter"));
    next_data_id_ = data_id + 1;
  }
  std::lock_guard<std::mutex> lock(data_mu_);
  data_.emplace(data_id, DataEntry{});
  return data_id;
}

absl::Status SegmentStore::BeginWrite(const std::vector<uint64_t>& ids) {
  std::lock_guard<std::mutex> lock(data_mu_);
  for (uint64_t id : ids) {
    auto it = data_.find(id);
    if (it == data_.end() || it->second.state != DataState::kLive) return DataIdNotLive(id);
  }
  for (uint64_t id : ids) ++data_[id].writers;
  return absl::OkStatus();
}

void SegmentStore::EndWrite(const std::vector<uint64_t>& ids) {
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    for (uint64_t id : ids) --data_[id].writers;
  }
  data_cv_.notify_all();
}

absl::Status SegmentStore::PutChunks(const std::vector<ChunkWrite>& chunks) {
  if (chunks.empty()) return absl::OkStatus();
  int64_t incoming = 0;
  std::vector<uint64_t> ids;
  for (const ChunkWrite& c : chunks) {
    incoming += static_cast<int64_t>(c.bytes.size());
    ids.push_back(c.address.data_id);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());

  // Register as a writer of every data id, so a commit or discard waits for this write.
  CKPT_RETURN_IF_ERROR(BeginWrite(ids));
  absl::Cleanup unregister = [&] { EndWrite(ids); };

  CKPT_RETURN_IF_ERROR(CheckFreeDisk(
      incoming, absl::StrCat("writing ", chunks.size(), " chunks of data id ", ids.front())));
  // The bytes go to each data id's segment file; the batch records where (unsynced: the commit
  // syncs the segment file, then its synced batch syncs the write-ahead log that holds these
  // records).
  rocksdb::WriteBatch batch(/*reserved_bytes=*/chunks.size() *
                            (kChunkKeyBytes + kLocationBytes + 16));
  CKPT_RETURN_IF_ERROR(AppendChunks(chunks, &batch));
  CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/false,
                             absl::StrCat("recording ", chunks.size(), " chunks (", incoming,
                                          " bytes) of data id ", chunks.front().address.data_id)));
  NoteWritten(incoming);
  chunks_written_.fetch_add(static_cast<int64_t>(chunks.size()), std::memory_order_relaxed);
  chunk_bytes_written_.fetch_add(incoming, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status SegmentStore::AppendChunks(const std::vector<ChunkWrite>& chunks,
                                        rocksdb::WriteBatch* batch) {
  // One append per data id and stream (usually one in all).
  std::vector<std::pair<uint64_t, uint32_t>> lanes;
  for (const ChunkWrite& c : chunks) lanes.push_back({c.address.data_id, c.stream});
  std::sort(lanes.begin(), lanes.end());
  lanes.erase(std::unique(lanes.begin(), lanes.end()), lanes.end());
  std::vector<std::string_view> pieces;
  std::vector<int64_t> sizes;
  std::vector<ChunkWrite> of_lane;
  for (const auto& [id, stream] : lanes) {
    pieces.clear();
    sizes.clear();
    of_lane.clear();
    for (const ChunkWrite& c : chunks) {
      if (c.address.data_id != id || c.stream != stream) continue;
      pieces.push_back(c.bytes);
      sizes.push_back(static_cast<int64_t>(c.bytes.size()));
      of_lane.push_back(c);
    }
    const std::string doing = absl::StrCat("writing ", pieces.size(), " chunks of data id ", id);
    absl::StatusOr<std::vector<uint64_t>> offsets = writer_->Append(id, pieces, stream);
    if (!offsets.ok()) {
      return absl::Status(offsets.status().code(),
                          absl::StrCat(doing, ": ", offsets.status().message()));
    }
    CKPT_RETURN_IF_ERROR(BatchLocations(id, of_lane, *offsets, sizes, batch));
  }
  return absl::OkStatus();
}

template <typename Chunk>
absl::Status SegmentStore::BatchLocations(uint64_t data_id, const std::vector<Chunk>& chunks,
                                          const std::vector<uint64_t>& offsets,
                                          const std::vector<int64_t>& sizes,
                                          rocksdb::WriteBatch* batch) {
  std::string pack;  // the sole chunks' entries, when there are any
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    const ChunkLocation location{offsets[i], static_cast<uint64_t>(sizes[i])};
    if (c.sole_chunk) {
      if (pack.empty()) {
        pack.reserve(1 + chunks.size() * kPackEntryBytes);
        pack.push_back(segment_store_internal::kPackTag);
      }
      AppendPackEntry(&pack, {c.address.tensor, c.address.blob, c.address.chunk, location});
      continue;
    }
    // The chunk is named only when the put fails: no string is built per chunk.
    const std::array<char, kChunkKeyBytes> key = ChunkKeyArray(c.address);
    const std::array<char, kLocationBytes> value = EncodeLocationArray(location);
    const rocksdb::Status put = batch->Put(locations_, rocksdb::Slice(key.data(), key.size()),
                                           rocksdb::Slice(value.data(), value.size()));
    if (!put.ok()) return FromRocks(put, absl::StrCat("batching chunk ", c.address.ToString()));
  }
  if (pack.empty()) return absl::OkStatus();
  const auto key = segment_store_internal::PackKeyArray(
      data_id, next_pack_.fetch_add(1, std::memory_order_relaxed));
  return FromRocks(batch->Put(locations_, rocksdb::Slice(key.data(), key.size()), pack),
                   absl::StrCat("batching a pack of chunk locations of data id ", data_id));
}

// Chunks placed in the segment writer's blocks (SegmentWriter::Reserve): Commit ends the
// writer's reservation (writing the blocks it completed) and records the locations, as
// PutChunks does after its append.
class SegmentStore::Reservation final : public ChunkReservation {
 public:
  // `sizes`: the chunks' bytes, `incoming` their sum.
  Reservation(SegmentStore* store, std::vector<ChunkSpace> chunks, std::vector<int64_t> sizes,
              int64_t incoming, segment_internal::SegmentWriter::Reservation placed)
      : store_(store),
        chunks_(std::move(chunks)),
        sizes_(std::move(sizes)),
        incoming_(incoming),
        placed_(std::move(placed)) {
    places_ = std::move(placed_.places);
    first_ = std::move(placed_.first);
  }
  ~Reservation() override {
    // Abandoned: the blocks are written with whatever their reserved bytes hold, unreferenced.
    store_->writer_->Finish(&placed_).IgnoreError();
  }

  absl::Status Commit() override {
    const uint64_t id = placed_.data_id;
    const std::vector<uint64_t> ids = {id};
    // The data id must still be live, as for PutChunks: no chunk lands after its commit or
    // discard has begun.
    if (absl::Status live = store_->BeginWrite(ids); !live.ok()) {
      store_->writer_->Finish(&placed_).IgnoreError();
      return live;
    }
    absl::Cleanup unregister = [&] { store_->EndWrite(ids); };
    if (absl::Status s = store_->writer_->Finish(&placed_); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("writing ", chunks_.size(), " chunks of data id ",
                                                 id, ": ", s.message()));
    }
    rocksdb::WriteBatch batch(/*reserved_bytes=*/chunks_.size() *
                              (kChunkKeyBytes + kLocationBytes + 16));
    CKPT_RETURN_IF_ERROR(store_->BatchLocations(id, chunks_, placed_.offsets, sizes_, &batch));
    CKPT_RETURN_IF_ERROR(store_->Write(&batch, /*sync=*/false,
                                       absl::StrCat("recording ", chunks_.size(), " chunks (",
                                                    incoming_, " bytes) of data id ", id)));
    store_->NoteWritten(incoming_);
    store_->chunks_written_.fetch_add(static_cast<int64_t>(chunks_.size()),
                                      std::memory_order_relaxed);
    store_->chunk_bytes_written_.fetch_add(incoming_, std::memory_order_relaxed);
    return absl::OkStatus();
  }

 private:
  SegmentStore* const store_;
  const std::vector<ChunkSpace> chunks_;
  const std::vector<int64_t> sizes_;
  const int64_t incoming_;
  segment_internal::SegmentWriter::Reservation placed_;
};

absl::StatusOr<std::unique_ptr<ChunkReservation>> SegmentStore::ReserveChunks(
    const std::vector<ChunkSpace>& chunks) {
  const bool one_lane = std::all_of(chunks.begin(), chunks.end(), [&](const ChunkSpace& c) {
    return c.address.data_id == chunks.front().address.data_id &&
           c.stream == chunks.front().stream && c.bytes >= 0;
  });
  if (chunks.empty() || !one_lane) return CheckpointStore::ReserveChunks(chunks);
  const uint64_t id = chunks.front().address.data_id;
  int64_t incoming = 0;
  std::vector<int64_t> sizes;
  sizes.reserve(chunks.size());
  for (const ChunkSpace& c : chunks) {
    sizes.push_back(c.bytes);
    incoming += c.bytes;
  }
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    auto it = data_.find(id);
    if (it == data_.end() || it->second.state != DataState::kLive) return DataIdNotLive(id);
  }
  const std::string doing = absl::StrCat("writing ", chunks.size(), " chunks of data id ", id);
  CKPT_RETURN_IF_ERROR(CheckFreeDisk(incoming, doing));
  absl::StatusOr<segment_internal::SegmentWriter::Reservation> placed =
      writer_->Reserve(id, sizes, chunks.front().stream);
  if (!placed.ok()) {
    return absl::Status(placed.status().code(),
                        absl::StrCat(doing, ": ", placed.status().message()));
  }
  return std::make_unique<Reservation>(this, chunks, std::move(sizes), incoming,
                                       *std::move(placed));
}

bool SegmentStore::IsLive(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(data_mu_);
  return data_.contains(data_id);
}

std::optional<ChunkLocation> SegmentStore::ScanBlobLocations(const ChunkAddress& address) {
  ChunkAddress first = address;
  first.chunk = 0;
  const std::string from = ChunkKey(first);
  const rocksdb::Slice data_prefix(from.data(), 8);  // the data id (ChunkKey)
  // The scan goes on past the blob asked for, over the blobs after it in key order (the next
  // ones of the tensor, then the next tensors), until about kScanAheadLocations are read: fetches
  // read blobs in about that order, and an iterator step costs far less than the seek of a scan
  // of its own, which for checkpoints of many small tensors (a blob of one chunk each) would be
  // most of the cost of reading them the first time. Each blob scanned whole is kept.
  constexpr size_t kScanAheadLocations = 4096;
  uint32_t tensor = address.tensor, blob = address.blob;  // the blob being scanned
  bool asked = true;                                      // it is the blob of `address`
  LocationCache::Locations locations;
  std::optional<ChunkLocation> found;
  // The blob being scanned is complete: keep it (an empty one too: it has no chunk).
  auto keep = [&] {
    if (asked && address.chunk < locations.size() &&
        locations[address.chunk].offset != LocationCache::kNoChunk.offset) {
      found = locations[address.chunk];
    }
    location_cache_->Insert({address.data_id, tensor, blob, 0}, std::move(locations));
    locations.clear();
    asked = false;
  };
  size_t scanned = 0;
  bool complete = true;  // the scan ended at the end of a blob
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), locations_));
  for (it->Seek(from); it->Valid() && it->key().starts_with(data_prefix); it->Next()) {
    const char* key = it->key().data();
    if (it->key().size() != kChunkKeyBytes) {
      // The data id's packs follow its chunk keys: the end of them. Anything else is not a chunk
      // key: the blob being scanned is looked up alone.
      if (!IsPackKey(std::string_view(key, it->key().size()))) complete = false;
      break;
    }
    const auto key_tensor = static_cast<uint32_t>(DecodeBigEndian(key + 8, 4));
    const auto key_blob = static_cast<uint32_t>(DecodeBigEndian(key + 12, 4));
    if (key_tensor != tensor || key_blob != blob) {
      keep();
      if (scanned >= kScanAheadLocations) break;
      tensor = key_tensor;
      blob = key_blob;
    }
    // The key's last 4 bytes (ChunkKey).
    const uint64_t chunk = DecodeBigEndian(key + kChunkKeyBytes - 4, 4);
    if (chunk >= kMaxCachedLocations) {  // too large to keep
      complete = false;
      break;
    }
    // A damaged record stays out: its chunk is then looked up alone, which reports it.
    const std::optional<ChunkLocation> location =
        DecodeLocation(std::string_view(it->value().data(), it->value().size()));
    if (chunk >= locations.size()) locations.resize(size_t{chunk} + 1, LocationCache::kNoChunk);
    locations[chunk] = location.value_or(LocationCache::kNoChunk);
    ++scanned;
  }
  if (!it->status().ok()) return found;  // the blob being scanned is looked up alone
  // Out of keys of the data id, or stopped at the bound (the blob being scanned kept already).
  if (complete && (asked || !locations.empty())) keep();
  return found;
}

template <typename Fn>
absl::Status SegmentStore::ScanPacks(uint64_t data_id, Fn fn) {
  const std::string from = segment_store_internal::PackRangeStart(data_id);
  const rocksdb::Slice data_prefix(from.data(), 8);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), locations_));
  for (it->Seek(from); it->Valid() && it->key().starts_with(data_prefix); it->Next()) {
    const std::string_view key(it->key().data(), it->key().size());
    if (!IsPackKey(key)) continue;
    if (!segment_store_internal::ForEachPackEntry(
            std::string_view(it->value().data(), it->value().size()), fn)) {
      return absl::DataLossError(
          absl::StrCat("pack of chunk locations ", DecodeBigEndian(key.data() + 20, 8),
                       " of data id ", data_id, " is damaged (", it->value().size(), " bytes)"));
    }
  }
  return FromRocks(it->status(), absl::StrCat("reading the packs of data id ", data_id));
}

absl::StatusOr<std::optional<ChunkLocation>> SegmentStore::LoadPacks(const ChunkAddress& address) {
  LocationCache::Packs packs;
  CKPT_RETURN_IF_ERROR(ScanPacks(address.data_id, [&](const PackEntry& e) { packs.push_back(e); }));
  // Sorted by address; of entries naming one address (a sole chunk written again) the last, in
  // pack order, counts: a stable sort keeps them in that order, and the last of each run is kept.
  std::stable_sort(packs.begin(), packs.end(), [](const PackEntry& a, const PackEntry& b) {
    return std::tie(a.tensor, a.blob, a.chunk) < std::tie(b.tensor, b.blob, b.chunk);
  });
  size_t kept = 0;
  for (size_t i = 0; i < packs.size(); ++i) {
    const bool last = i + 1 == packs.size() || packs[i].tensor != packs[i + 1].tensor ||
                      packs[i].blob != packs[i + 1].blob || packs[i].chunk != packs[i + 1].chunk;
    if (last) packs[kept++] = packs[i];
  }
  packs.resize(kept);
  std::optional<ChunkLocation> found = LocationCache::FindPacked(packs, address);
  location_cache_->InsertPacks(address.data_id, std::move(packs));
  return found;
}

absl::StatusOr<std::optional<ChunkLocation>> SegmentStore::FindInPacks(
    const ChunkAddress& address) {
  std::optional<ChunkLocation> found;
  CKPT_RETURN_IF_ERROR(ScanPacks(address.data_id, [&](const PackEntry& e) {
    if (e.tensor == address.tensor && e.blob == address.blob && e.chunk == address.chunk) {
      found = e.location;  // a later pack overrides
    }
  }));
  return found;
}

absl::StatusOr<std::unique_ptr<ChunkData>> SegmentStore::ReadChunkUnverified(
    const ChunkAddress& address) {
  // The chunk is named only when something went wrong: no string is built per read.
  auto what = [&] { return absl::StrCat("reading chunk ", address.ToString()); };
  // Chunks of committed data: their data id's packs, read once for all of them, or their blob's
  // locations, read with one scan for the whole blob. Chunks of data being uploaded may still be
  // added: those are looked up one by one, and so is a chunk its cached blob lacks (which is then
  // not found).
  const LocationCache::Lookup cached = location_cache_->Find(address);
  std::optional<ChunkLocation> location = cached.location;
  const bool live = !cached.blob_cached && IsLive(address.data_id);
  if (!cached.blob_cached && !live) {
    if (!cached.packs_known) {
      absl::StatusOr<std::optional<ChunkLocation>> packed = LoadPacks(address);
      if (!packed.ok()) {
        return absl::Status(packed.status().code(),
                            absl::StrCat(what(), ": ", packed.status().message()));
      }
      location = *packed;
    }
    if (!location) location = ScanBlobLocations(address);
  }
  rocksdb::Status found = rocksdb::Status::OK();
  if (!location) {
    rocksdb::PinnableSlice value;
    found = db_->Get(rocksdb::ReadOptions(), locations_, ChunkKey(address), &value);
    if (found.ok()) {
      location = DecodeLocation(std::string_view(value.data(), value.size()));
      if (!location) {
        return absl::DataLossError(absl::StrCat(what(), ": location record of ", value.size(),
                                                " bytes, expected ", kLocationBytes));
      }
    }
  }
  if (!location && live && found.IsNotFound()) {
    absl::StatusOr<std::optional<ChunkLocation>> packed = FindInPacks(address);
    if (!packed.ok()) {
      return absl::Status(packed.status().code(),
                          absl::StrCat(what(), ": ", packed.status().message()));
    }
    location = *packed;
  }
  if (location) return ReadLocated(address, *location);
  if (!found.IsNotFound()) return FromRocks(found, what());
  return absl::NotFoundError(absl::StrCat("chunk ", address.ToString(), " not found"));
}

absl::StatusOr<std::unique_ptr<ChunkData>> SegmentStore::ReadLocated(
    const ChunkAddress& address, const ChunkLocation& location,
    segment_internal::ReadCursor* cursor) {
  auto what = [&] { return absl::StrCat("reading chunk ", address.ToString()); };
  absl::StatusOr<std::unique_ptr<ChunkData>> data =
      cursor != nullptr
          ? reader_->Read(address.data_id, location.offset, location.length, "", *cursor)
          : reader_->Read(address.data_id, location.offset, location.length, "");
  if (absl::IsDataLoss(data.status())) {
    // The checkpoint may have been deleted between the lookup and the read (its segment file
    // goes right after its records, all of which one batch deletes): that is NOT_FOUND, not
    // damage.
    const std::string prefix = BigEndian64(address.data_id);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), locations_));
    it->Seek(prefix);
    if (it->status().ok() && !(it->Valid() && it->key().starts_with(prefix))) {
      return absl::NotFoundError(
          absl::StrCat("chunk ", address.ToString(), " not found (deleted while being read)"));
    }
  }
  if (!data.ok()) {
    return absl::Status(data.status().code(), absl::StrCat(what(), ": ", data.status().message()));
  }
  chunks_read_.fetch_add(1, std::memory_order_relaxed);
  chunk_bytes_read_.fetch_add(static_cast<int64_t>(location.length), std::memory_order_relaxed);
  return *std::move(data);
}

void SegmentStore::ReadChunksUnverified(
    std::span<const ChunkAddress> addresses,
    std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>>* out) {
  out->clear();
  out->reserve(addresses.size());
  // The locations of every chunk whose blob is cached, under one lock; the others (blobs not
  // scanned yet, chunks of live data) as ReadChunkUnverified finds them.
  // Kept per thread from call to call: a fetch of many small tensors makes thousands of these
  // calls a second, and a new vector would be a large allocation each time.
  thread_local std::vector<LocationCache::Lookup> found;
  location_cache_->FindMany(addresses, &found);
  // Neighbouring chunks (small tensors stored side by side) share their file and window.
  segment_internal::ReadCursor cursor;
  for (size_t i = 0; i < addresses.size(); ++i) {
    if (found[i].blob_cached && found[i].location) {
      out->push_back(ReadLocated(addresses[i], *found[i].location, &cursor));
    } else {
      out->push_back(ReadChunkUnverified(addresses[i]));
    }
  }
}

absl::Status SegmentStore::ClaimLiveData(uint64_t data_id) {
  std::unique_lock<std::mutex> lock(data_mu_);
  auto it = data_.find(data_id);
  if (it == data_.end() || it->second.state != DataState::kLive) return DataIdNotLive(data_id);
  it->second.state = DataState::kClosing;
  // unordered_map references stay valid across other insertions and erasures.
  DataEntry& entry = it->second;
  data_cv_.wait(lock, [&] { return entry.writers == 0; });
  return absl::OkStatus();
}

void SegmentStore::ReleaseClaim(uint64_t data_id, bool forget) {
  std::lock_guard<std::mutex> lock(data_mu_);
  if (forget) {
    data_.erase(data_id);
  } else {
    data_[data_id].state = DataState::kLive;
  }
}

absl::Status SegmentStore::DiscardData(uint64_t data_id) {
  CKPT_RETURN_IF_ERROR(ClaimLiveData(data_id));
  // Forget first: if the delete below fails, the chunks are garbage and CollectGarbage retries.
  ReleaseClaim(data_id, /*forget=*/true);
  rocksdb::WriteBatch batch;
  const std::string doing = absl::StrCat("discarding chunks of data id ", data_id);
  CKPT_RETURN_IF_ERROR(BatchDeleteChunks(&batch, data_id, doing));
  // Unsynced: if lost in a crash, the chunks belong to an uncommitted id and are collected at open.
  CKPT_RETURN_IF_ERROR(Write(&batch, /*sync=*/false, doing));
  deleted_ranges_.fetch_add(1, std::memory_order_relaxed);
  RemoveSegment(data_id);
  return absl::OkStatus();
}

}  // namespace ckpt
