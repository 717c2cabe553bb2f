#include "core/checksum.h"

// For the hash states on the stack (their layout is stable within the 0.8 series we link).
#define XXH_STATIC_LINKING_ONLY
#include <xxh_x86dispatch.h>
#include <xxhash.h>

namespace ckpt {

std::optional<ChecksumAlgorithm> ChecksumAlgorithmFromNumber(int64_t number) {
  switch (number) {
    case static_cast<int>(ChecksumAlgorithm::kXxh64):
      return ChecksumAlgorithm::kXxh64;
    case static_cast<int>(ChecksumAlgorithm::kXxh3):
      return ChecksumAlgorithm::kXxh3;
    default:
      return std::nullopt;
  }
}

const char* ChecksumAlgorithmName(ChecksumAlgorithm algorithm) {
  return algorithm == ChecksumAlgorithm::kXxh3 ? "xxh3" : "xxh64";
}

uint64_t Checksum(ChecksumAlgorithm algorithm, std::string_view bytes) {
  if (algorithm == ChecksumAlgorithm::kXxh3) {
    // libxxhash's dispatcher picks the AVX-512, AVX2 or SSE2 code once, on first use.
    return XXH3_64bits_dispatch(bytes.data(), bytes.size());
  }
  return XXH64(bytes.data(), bytes.size(), /*seed=*/0);
}

uint64_t Checksum(ChecksumAlgorithm algorithm, const std::vector<std::string_view>& parts) {
  if (parts.size() == 1) return Checksum(algorithm, parts[0]);
  if (algorithm == ChecksumAlgorithm::kXxh3) {
    XXH3_state_t state;
    XXH3_INITSTATE(&state);
    XXH3_64bits_reset(&state);
    for (std::string_view part : parts) {
      XXH3_64bits_update_dispatch(&state, part.data(), part.size());
    }
    return XXH3_64bits_digest(&state);
  }
  XXH64_state_t state;
  XXH64_reset(&state, /*seed=*/0);
  for (std::string_view part : parts) XXH64_update(&state, part.data(), part.size());
  return XXH64_digest(&state);
}

}  // namespace ckpt
