// RocksDB's CRC32C, computed with the CPU's CRC instructions.
//
// RocksDB checksums every blob record it writes (each stored chunk), every table block, and the
// WAL and MANIFEST records with CRC32C through one exported function, rocksdb::crc32c::Extend.
// Debian builds librocksdb portably (no SSE4.2), so that function falls back to a table-driven
// loop: about two thirds of a chunk flush's CPU in `perf`, and the largest single cost of an
// upload. rocksdb_crc32c.cc defines the same function with Intel ISA-L's crc32_iscsi, which picks
// the fastest CRC32C code for the CPU at run time (PCLMULQDQ folding, the SSE4.2 crc32
// instruction, or its own table). The executable's definition takes the place of the library's
// for the whole process (ELF symbol interposition: librocksdb calls Extend through its PLT), so
// RocksDB computes the same values faster. Nothing on disk changes: stores written before remain
// readable, and stores written now are readable by any RocksDB.
//
// Whether the replacement is in effect depends on how librocksdb was linked (a build with
// -Bsymbolic or hidden visibility would bypass it, silently). AcceleratedCrc32cBytes() lets the
// store check this after opening (and log it) and lets the tests fail if it stops being true.
//
// Thread-safe. Private to the storage layer and its tests; no RocksDB header is included.
#ifndef CKPT_STORAGE_INTERNAL_ROCKSDB_CRC32C_H_
#define CKPT_STORAGE_INTERNAL_ROCKSDB_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace ckpt::rocksdb_store_internal {

// CRC32C (Castagnoli) of `data` continuing from `crc`, the CRC of the bytes before it (0 for
// none): the contract of rocksdb::crc32c::Extend, which calls this.
uint32_t ExtendCrc32c(uint32_t crc, const char* data, size_t n);

// Bytes RocksDB has checksummed through the replacement since the process started (calls of
// ExtendCrc32c itself do not count). Opening a store writes or reads checksummed MANIFEST
// records, so a store that is open and still sees 0 here runs RocksDB's own code.
uint64_t AcceleratedCrc32cBytes();

}  // namespace ckpt::rocksdb_store_internal

#endif  // CKPT_STORAGE_INTERNAL_ROCKSDB_CRC32C_H_
