// See rocksdb_crc32c.h for why this file defines a function of RocksDB's namespace.
#include "storage/internal/rocksdb_crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>
#include <atomic>
#include <climits>

namespace ckpt::rocksdb_store_internal {
namespace {

std::atomic<uint64_t> rocksdb_bytes{0};

}  // namespace

uint32_t ExtendCrc32c(uint32_t crc, const char* data, size_t n) {
  // ISA-L keeps the CRC register un-inverted between calls and takes an int length.
  uint32_t state = ~crc;
  constexpr size_t kMaxPiece = size_t{1} << 30;
  while (n > 0) {
    const size_t piece = std::min(n, kMaxPiece);
    state = crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(data)),
                        static_cast<int>(piece), state);
    data += piece;
    n -= piece;
  }
  return ~state;
}

uint64_t AcceleratedCrc32cBytes() { return rocksdb_bytes.load(std::memory_order_relaxed); }

}  // namespace ckpt::rocksdb_store_internal

// The declaration RocksDB's util/crc32c.h makes (that header is not installed): same name,
// signature and meaning, so this definition is the one the dynamic linker binds librocksdb's
// calls to.
namespace rocksdb::crc32c {

uint32_t Extend(uint32_t init_crc, const char* data, size_t n);

uint32_t Extend(uint32_t init_crc, const char* data, size_t n) {
  ckpt::rocksdb_store_internal::rocksdb_bytes.fetch_add(n, std::memory_order_relaxed);
  return ckpt::rocksdb_store_internal::ExtendCrc32c(init_crc, data, n);
}

}  // namespace rocksdb::crc32c
