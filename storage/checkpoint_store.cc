#include "storage/checkpoint_store.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"

namespace ckpt {

std::string ChunkAddress::ToString() const {
  return absl::StrCat("data ", data_id, " tensor ", tensor, " blob ", blob, " chunk ", chunk);
}

uint64_t ChunkChecksum(std::string_view bytes) {
  // Seed 0 is part of the on-disk and wire format (manifests record these values): never change.
  return XXH64(bytes.data(), bytes.size(), /*seed=*/0);
}

}  // namespace ckpt
