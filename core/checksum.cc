#include "core/checksum.h"

// For the hash state on the stack (its layout is stable within the 0.8 series we link).
#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

namespace ckpt {

uint64_t Checksum(std::string_view bytes) {
  // libxxhash's dispatcher picks the AVX-512, AVX2 or SSE2 code once, on first use.
  return XXH3_64bits_dispatch(bytes.data(), bytes.size());
}

namespace {

template <typename Parts>
uint64_t ChecksumOfParts(const Parts& parts) {
  if (parts.size() == 1) return Checksum(std::string_view(parts[0].data(), parts[0].size()));
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_64bits_reset(&state);
  for (const auto& part : parts) {
    XXH3_64bits_update_dispatch(&state, part.data(), part.size());
  }
  return XXH3_64bits_digest(&state);
}

}  // namespace

uint64_t Checksum(const std::vector<std::string_view>& parts) { return ChecksumOfParts(parts); }

uint64_t Checksum(std::span<const std::span<char>> parts) { return ChecksumOfParts(parts); }

}  // namespace ckpt
