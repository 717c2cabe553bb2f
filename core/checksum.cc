#include "core/checksum.h"

// For XXH64_state_t on the stack (its layout is stable within the 0.8 series we link).
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace ckpt {

uint64_t ChunkChecksum(std::string_view bytes) {
  return XXH64(bytes.data(), bytes.size(), /*seed=*/0);
}

uint64_t ChunkChecksum(const std::vector<std::string_view>& parts) {
  if (parts.size() == 1) return ChunkChecksum(parts[0]);
  XXH64_state_t state;
  XXH64_reset(&state, /*seed=*/0);
  for (std::string_view part : parts) XXH64_update(&state, part.data(), part.size());
  return XXH64_digest(&state);
}

}  // namespace ckpt
