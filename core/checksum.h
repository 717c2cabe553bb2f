// The checksum of stored chunks and of fetched data: XXH3-64 (the 64-bit XXH3 hash of xxHash
// 0.8, seed 0), computed with the SIMD code the CPU supports, chosen at run time. A manifest
// records it as records::CHUNK_CHECKSUM_XXH3_64; the public API (proto/ckpt.proto) uses nothing
// else.
#ifndef CKPT_CORE_CHECKSUM_H_
#define CKPT_CORE_CHECKSUM_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace ckpt {

// The algorithm's name, for messages.
inline constexpr char kChecksumName[] = "XXH3-64";

// The checksum of `bytes`.
uint64_t Checksum(std::string_view bytes);
// The same checksum of the concatenation of `parts`, without joining them.
uint64_t Checksum(const std::vector<std::string_view>& parts);
uint64_t Checksum(std::span<const std::span<char>> parts);

}  // namespace ckpt

#endif  // CKPT_CORE_CHECKSUM_H_
