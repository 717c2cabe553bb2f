#include "service/engine/upload_memory.h"

#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#include "core/sanitizers.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ckpt {

bool ReleaseFreeHeapMemory() {
#if defined(__GLIBC__) && !defined(CKPT_SANITIZED)
  return malloc_trim(0) == 1;
#else
  return false;
#endif
}

}  // namespace ckpt
