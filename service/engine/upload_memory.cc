#include "service/engine/upload_memory.h"

#include <atomic>
#include <cstdlib>  // defines __GLIBC__ where the C library is glibc

#include "core/sanitizers.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ckpt {
namespace {

std::atomic<bool> marked_for_release{false};

}  // namespace

bool ReleaseFreeHeapMemory() {
#if defined(__GLIBC__) && !defined(CKPT_SANITIZED)
  return malloc_trim(0) == 1;
#else
  return false;
#endif
}

void MarkFreeHeapMemoryForRelease() { marked_for_release.store(true, std::memory_order_relaxed); }

bool ReleaseMarkedFreeHeapMemory() {
  if (!marked_for_release.exchange(false, std::memory_order_relaxed)) return false;
  return ReleaseFreeHeapMemory();
}

}  // namespace ckpt
