// The checksum of stored chunks and fetched data: xxh64 with seed 0. Part of the on-disk format
// (manifests record these values) and of the wire format (FetchData.xxh64 / part_xxh64): never
// change it.
#ifndef CKPT_CORE_CHECKSUM_H_
#define CKPT_CORE_CHECKSUM_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace ckpt {

// xxh64 (seed 0) of `bytes`.
uint64_t ChunkChecksum(std::string_view bytes);
// The same checksum of the concatenation of `parts`, without joining them.
uint64_t ChunkChecksum(const std::vector<std::string_view>& parts);

}  // namespace ckpt

#endif  // CKPT_CORE_CHECKSUM_H_
