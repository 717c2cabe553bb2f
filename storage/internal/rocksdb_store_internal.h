// On-disk layout of the RocksDB store. Private to storage/rocksdb_store.cc and its tests (which
// use it to damage stored bytes behind the store's back); nothing else may depend on it. No
// RocksDB header is included here.
//
// Column families:
//   meta    's' + strategy name           -> strategy record
//           'c' + checkpoint id           -> 8-byte big-endian data id + manifest
//           'd' + 8-byte big-endian id    -> "" (the data id is committed: GC must keep it)
//           'n'                           -> 8-byte big-endian next data id (never reused)
//   chunks  8-byte BE data id | 4-byte BE tensor | 4-byte BE blob | 4-byte BE chunk -> raw bytes
//   jobs    job id                        -> job record
// Big-endian integers make byte order equal numeric order, so one data id (and within it one
// tensor, one blob) is a contiguous key range that DeleteRange and Seek can address.
#ifndef CKPT_STORAGE_INTERNAL_ROCKSDB_STORE_INTERNAL_H_
#define CKPT_STORAGE_INTERNAL_ROCKSDB_STORE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "storage/checkpoint_store.h"

namespace ckpt::rocksdb_store_internal {

inline constexpr char kMetaFamily[] = "meta";
inline constexpr char kChunksFamily[] = "chunks";
inline constexpr char kJobsFamily[] = "jobs";

inline constexpr size_t kChunkKeyBytes = 20;

// The chunks-family key of `address`.
std::string ChunkKey(const ChunkAddress& address);

}  // namespace ckpt::rocksdb_store_internal

#endif  // CKPT_STORAGE_INTERNAL_ROCKSDB_STORE_INTERNAL_H_
