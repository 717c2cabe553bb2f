// On-disk layout of the RocksDB store. Private to storage/rocksdb_store.cc and its tests (which
// use it to damage stored bytes behind the store's back); nothing else may depend on it. No
// RocksDB header is included here.
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
//                                            (segment_files.h: <dir>/segments/<id hex>.seg)
//   jobs    job id                        -> job record
// Chunk key: 8-byte BE data id | 4-byte BE tensor | 4-byte BE blob | 4-byte BE chunk.
// Big-endian integers make byte order equal numeric order, so one data id (and within it one
// tensor, one blob) is a contiguous key range that DeleteRange and Seek can address.
#ifndef CKPT_STORAGE_INTERNAL_ROCKSDB_STORE_INTERNAL_H_
#define CKPT_STORAGE_INTERNAL_ROCKSDB_STORE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "storage/checkpoint_store.h"

namespace ckpt::rocksdb_store_internal {

inline constexpr char kMetaFamily[] = "meta";
inline constexpr char kLocationsFamily[] = "chunk_locations";
inline constexpr char kSegmentsDir[] = "segments";  // under the store's directory
inline constexpr char kJobsFamily[] = "jobs";

// The layout above (with the records of proto/ckpt_records.proto it holds) as one number, checked
// at open: a store recording another one is refused with FAILED_PRECONDITION. Any change to the
// layout or to the meaning of a record gives it a new number.
inline constexpr uint64_t kStoreFormatVersion = 1;

// A column family of this name holds chunk bytes in RocksDB itself, a layout this version does
// not read: a store that has one is refused at open (FAILED_PRECONDITION naming it).
inline constexpr char kChunkBytesFamily[] = "chunks";

inline constexpr size_t kChunkKeyBytes = 20;

// The chunk key of `address` (chunk_locations family).
std::string ChunkKey(const ChunkAddress& address);

// Where a chunk's bytes are in its data id's segment file.
struct ChunkLocation {
  uint64_t offset = 0;
  uint64_t length = 0;
};
inline constexpr size_t kLocationBytes = 16;
std::string EncodeLocation(const ChunkLocation& location);
// nullopt unless `value` has kLocationBytes bytes.
std::optional<ChunkLocation> DecodeLocation(std::string_view value);

}  // namespace ckpt::rocksdb_store_internal

#endif  // CKPT_STORAGE_INTERNAL_ROCKSDB_STORE_INTERNAL_H_
