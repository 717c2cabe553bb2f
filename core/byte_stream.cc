#include "core/byte_stream.h"

#include <algorithm>
#include <cstring>

namespace ckpt {

absl::StatusOr<size_t> MemoryByteSource::Read(char* buf, size_t n) {
  const size_t k = std::min(n, data_.size() - pos_);
  std::memcpy(buf, data_.data() + pos_, k);
  pos_ += k;
  return k;
}

}  // namespace ckpt
