#include "storage/checkpoint_store.h"

#include "absl/strings/str_cat.h"

namespace ckpt {

std::string ChunkAddress::ToString() const {
  return absl::StrCat("data ", data_id, " tensor ", tensor, " blob ", blob, " chunk ", chunk);
}

}  // namespace ckpt
