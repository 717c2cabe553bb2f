#include "client/malloc_tuning.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ckpt {

bool TuneMallocForStreaming() {
#if defined(__GLIBC__)
  // mallopt returns 1 on success. Both are attempted even if the first is refused.
  const bool mmap_ok =
      mallopt(M_MMAP_THRESHOLD, static_cast<int>(kStreamingMmapThresholdBytes)) == 1;
  const bool trim_ok =
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(kStreamingTrimThresholdBytes)) == 1;
  return mmap_ok && trim_ok;
#else
  return false;
#endif
}

}  // namespace ckpt
