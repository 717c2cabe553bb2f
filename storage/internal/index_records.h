// On-disk layout of the segment store's index, the RocksDB database beside the segment files.
// Private to the segment store (storage/segment_store*.cc) and its tests (which use it to damage
// stored bytes behind the store's back); nothing else may depend on it. No RocksDB header.
//
// Column families:
//   meta    's' + strategy name           -> strategy record
//           'c' + checkpoint id           -> 8-byte big-endian data id + manifest
//           'd' + 8-byte big-endian id    -> "" (the data id is committed: GC must keep it)
//           'n'                           -> 8-byte big-endian next data id (never reused)
//           'v'                           -> 8-byte big-endian store format version
//                                            (kStoreFormatVersion)
//   chunk_locations
//           chunk key (below)             -> 8-byte BE offset | 8-byte BE length of the chunk's
//                                            bytes in its data id's segment file
//                                            (segment_directory.h: <dir>/segments/<id hex>.seg)
//           pack key (below)              -> kPackTag | entries of kPackEntryBytes: 4-byte BE
//                                            tensor | blob | chunk, 8-byte BE offset | length
//                                            (format 2: the locations of one PutChunks call's
//                                            sole chunks, ChunkWrite::sole_chunk)
//   jobs    job id                        -> job record
// Chunk key: 8-byte BE data id | 4-byte BE tensor | 4-byte BE blob | 4-byte BE chunk.
// Pack key: 8-byte BE data id | 12 bytes 0xff | 8-byte BE pack sequence (kPackKeyBytes).
// Big-endian integers make byte order equal numeric order, so one data id (and within it one
// tensor, one blob) is a contiguous key range that DeleteRange and Seek can address. A data id's
// pack keys follow all of its chunk keys (the 0xff run is past any chunk key's tensor, blob and
// chunk bytes, a chunk key of all 0xff being a prefix of them), so its chunk keys and its packs
// are two contiguous ranges. A chunk is recorded in one form only: a sole chunk (the only chunk of
// its blob) in a pack, every other chunk under its chunk key. A sole chunk written again (a slice
// whose first write never completed) is in a later pack, with a larger sequence: the last pack
// naming an address holds its location. Stores of format 1 have no packs.
#ifndef CKPT_STORAGE_INTERNAL_INDEX_RECORDS_H_
#define CKPT_STORAGE_INTERNAL_INDEX_RECORDS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "storage/checkpoint_store.h"

namespace ckpt::segment_store_internal {

inline constexpr char kMetaFamily[] = "meta";
inline constexpr char kLocationsFamily[] = "chunk_locations";
inline constexpr char kSegmentsDir[] = "segments";  // under the store's directory
inline constexpr char kJobsFamily[] = "jobs";

// The layout above (with the records of proto/ckpt_records.proto it holds) as one number, checked
// at open: a store recording another one is refused with FAILED_PRECONDITION. Any change to the
// layout or to the meaning of a record gives it a new number.
inline constexpr uint64_t kStoreFormatVersion = 2;
// The oldest format this version reads: format 1 is format 2 without pack records, and a store
// of format 1 is marked format 2 when it is opened (it may get packs from then on).
inline constexpr uint64_t kOldestReadableFormatVersion = 1;

// A column family of this name holds chunk bytes in RocksDB itself, a layout this version does
// not read: a store that has one is refused at open (FAILED_PRECONDITION naming it).
inline constexpr char kChunkBytesFamily[] = "chunks";

// Meta record-type prefixes and single keys (the meta family above).
inline constexpr char kStrategyPrefix = 's';
inline constexpr char kCheckpointPrefix = 'c';
inline constexpr char kCommittedPrefix = 'd';
inline constexpr char kCounterKey[] = "n";
inline constexpr char kFormatKey[] = "v";

inline constexpr size_t kChunkKeyBytes = 20;

// Appends the low `bytes` bytes of `value`, most significant first.
inline void AppendBigEndian(std::string* out, uint64_t value, int bytes) {
  for (int shift = 8 * (bytes - 1); shift >= 0; shift -= 8) {
    out->push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

// Writes the low `bytes` bytes of `value` at `out`, most significant first.
inline void StoreBigEndian(char* out, uint64_t value, int bytes) {
  for (int i = bytes - 1; i >= 0; --i, value >>= 8) out[i] = static_cast<char>(value & 0xff);
}

// The `bytes`-byte big-endian integer at `p` (AppendBigEndian's inverse).
inline uint64_t DecodeBigEndian(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value = (value << 8) | static_cast<unsigned char>(p[i]);
  return value;
}

inline std::string BigEndian64(uint64_t value) {
  std::string out;
  out.reserve(8);
  AppendBigEndian(&out, value, 8);
  return out;
}

// The meta key of record type `prefix` named `name`.
inline std::string MetaKey(char prefix, std::string_view name) {
  std::string key(1, prefix);
  key.append(name);
  return key;
}

// The meta key of `data_id`'s committed marker.
inline std::string CommittedKey(uint64_t data_id) {
  return MetaKey(kCommittedPrefix, BigEndian64(data_id));
}

// The chunk key of `address` (chunk_locations family).
inline std::string ChunkKey(const ChunkAddress& address) {
  std::string key;
  key.reserve(kChunkKeyBytes);
  AppendBigEndian(&key, address.data_id, 8);
  AppendBigEndian(&key, address.tensor, 4);
  AppendBigEndian(&key, address.blob, 4);
  AppendBigEndian(&key, address.chunk, 4);
  return key;
}

// ChunkKey's bytes in a fixed array: the write path builds one per chunk without allocating.
inline std::array<char, kChunkKeyBytes> ChunkKeyArray(const ChunkAddress& address) {
  std::array<char, kChunkKeyBytes> key;
  StoreBigEndian(key.data(), address.data_id, 8);
  StoreBigEndian(key.data() + 8, address.tensor, 4);
  StoreBigEndian(key.data() + 12, address.blob, 4);
  StoreBigEndian(key.data() + 16, address.chunk, 4);
  return key;
}

// [begin, end) of every chunk key of `data_id`. Data ids come from a counter starting at 1, so
// data_id + 1 never overflows in practice; the maximum id maps to an end past every key.
inline std::pair<std::string, std::string> DataIdRange(uint64_t data_id) {
  std::string end = data_id == std::numeric_limits<uint64_t>::max()
                        ? std::string(kChunkKeyBytes + 1, '\xff')
                        : BigEndian64(data_id + 1);
  return {BigEndian64(data_id), std::move(end)};
}

// Where a chunk's bytes are in its data id's segment file.
struct ChunkLocation {
  uint64_t offset = 0;
  uint64_t length = 0;
};
inline constexpr size_t kLocationBytes = 16;

inline std::string EncodeLocation(const ChunkLocation& location) {
  std::string value;
  value.reserve(kLocationBytes);
  AppendBigEndian(&value, location.offset, 8);
  AppendBigEndian(&value, location.length, 8);
  return value;
}

// EncodeLocation's bytes in a fixed array (no allocation).
inline std::array<char, kLocationBytes> EncodeLocationArray(const ChunkLocation& location) {
  std::array<char, kLocationBytes> value;
  StoreBigEndian(value.data(), location.offset, 8);
  StoreBigEndian(value.data() + 8, location.length, 8);
  return value;
}

// nullopt unless `value` has kLocationBytes bytes.
inline std::optional<ChunkLocation> DecodeLocation(std::string_view value) {
  if (value.size() != kLocationBytes) return std::nullopt;
  return ChunkLocation{DecodeBigEndian(value.data(), 8), DecodeBigEndian(value.data() + 8, 8)};
}

// --- Packs of sole-chunk locations -------------------------------------------------------------

inline constexpr size_t kPackKeyBytes = 28;
inline constexpr char kPackTag = '\x01';  // the first byte of a pack's value
inline constexpr size_t kPackEntryBytes = 28;

// The pack key of `data_id`'s pack number `sequence`.
inline std::array<char, kPackKeyBytes> PackKeyArray(uint64_t data_id, uint64_t sequence) {
  std::array<char, kPackKeyBytes> key;
  StoreBigEndian(key.data(), data_id, 8);
  for (size_t i = 8; i < 20; ++i) key[i] = '\xff';
  StoreBigEndian(key.data() + 20, sequence, 8);
  return key;
}

// The first pack key of `data_id` (every pack key of it is at or after this one).
inline std::string PackRangeStart(uint64_t data_id) {
  std::string key = BigEndian64(data_id);
  key.append(12, '\xff');
  return key;
}

// True when `key` is a pack key (of any data id).
inline bool IsPackKey(std::string_view key) {
  if (key.size() != kPackKeyBytes) return false;
  for (size_t i = 8; i < 20; ++i) {
    if (key[i] != '\xff') return false;
  }
  return true;
}

// One location of a pack.
struct PackEntry {
  uint32_t tensor = 0;
  uint32_t blob = 0;
  uint32_t chunk = 0;
  ChunkLocation location;
};

// Appends `entry` to a pack's value (which starts with kPackTag).
inline void AppendPackEntry(std::string* value, const PackEntry& entry) {
  char bytes[kPackEntryBytes];
  StoreBigEndian(bytes, entry.tensor, 4);
  StoreBigEndian(bytes + 4, entry.blob, 4);
  StoreBigEndian(bytes + 8, entry.chunk, 4);
  StoreBigEndian(bytes + 12, entry.location.offset, 8);
  StoreBigEndian(bytes + 20, entry.location.length, 8);
  value->append(bytes, kPackEntryBytes);
}

// Calls fn(const PackEntry&) for each entry of a pack's value, in order; false (having called fn
// for none) unless `value` is kPackTag followed by whole entries.
template <typename Fn>
bool ForEachPackEntry(std::string_view value, Fn&& fn) {
  if (value.empty() || value[0] != kPackTag || (value.size() - 1) % kPackEntryBytes != 0) {
    return false;
  }
  for (size_t at = 1; at < value.size(); at += kPackEntryBytes) {
    const char* p = value.data() + at;
    fn(PackEntry{static_cast<uint32_t>(DecodeBigEndian(p, 4)),
                 static_cast<uint32_t>(DecodeBigEndian(p + 4, 4)),
                 static_cast<uint32_t>(DecodeBigEndian(p + 8, 4)),
                 ChunkLocation{DecodeBigEndian(p + 12, 8), DecodeBigEndian(p + 20, 8)}});
  }
  return true;
}

// The location of a chunk_locations record (key, value): a chunk key's, or the first of a pack's;
// nullopt when the value is damaged or the pack empty.
inline std::optional<ChunkLocation> FirstLocationOfRecord(std::string_view key,
                                                          std::string_view value) {
  if (!IsPackKey(key)) return DecodeLocation(value);
  std::optional<ChunkLocation> first;
  ForEachPackEntry(value, [&first](const PackEntry& e) {
    if (!first) first = e.location;
  });
  return first;
}

}  // namespace ckpt::segment_store_internal

#endif  // CKPT_STORAGE_INTERNAL_INDEX_RECORDS_H_
