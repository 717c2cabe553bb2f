// Allocator policy for processes that stream checkpoint bytes through the client library.
//
// A fetch receives every byte into buffers that gRPC allocates, hands to the visitor and frees,
// read after read. glibc's default policy gives freed memory at the top of a heap back to the
// kernel as soon as it exceeds a threshold that follows the largest recently freed block (a few
// hundred KiB here), so a streaming process keeps unmapping its buffers and faulting fresh,
// zero-filled pages back in, and a fresh page can cost more than moving its bytes
// (docs/performance.md, "Client programs", has the measurements).
//
// TuneMallocForStreaming() makes the process keep up to 256 MiB of freed memory at the top of
// each heap for reuse (M_TRIM_THRESHOLD), and serves blocks up to 32 MiB from the heap instead
// of separate mappings that are unmapped on free (M_MMAP_THRESHOLD; setting the trim threshold
// turns off glibc's own adjustment of it). The process's resident memory then stays near its
// high-water mark instead of shrinking between reads. It changes a process-wide setting, so the
// library never calls it by itself: programs opt in once at start-up, before their threads start
// (ckptctl does). ckptd does not call it.
//
// Thread-safe in the sense of mallopt; call it from main().
#ifndef CKPT_CLIENT_MALLOC_TUNING_H_
#define CKPT_CLIENT_MALLOC_TUNING_H_

#include <cstdint>

namespace ckpt {

// Freed memory kept at the top of a heap before any is returned to the kernel.
inline constexpr int64_t kStreamingTrimThresholdBytes = int64_t{256} << 20;
// Largest block served from a heap (glibc's maximum for it on 64-bit systems).
inline constexpr int64_t kStreamingMmapThresholdBytes = int64_t{32} << 20;

// Applies the policy above. False where the C library refused a setting or is not glibc (the
// process then runs with its allocator's defaults, which is correct, only slower).
bool TuneMallocForStreaming();

}  // namespace ckpt

#endif  // CKPT_CLIENT_MALLOC_TUNING_H_
