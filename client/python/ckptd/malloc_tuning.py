"""Allocator policy for processes that stream checkpoint bytes (the Python twin of the C++
client's client/malloc_tuning.h).

A fetch receives every byte into buffers that gRPC allocates and frees message after message,
and places tensors into freshly allocated arrays. glibc's default policy hands freed memory at
the top of a heap back to the kernel as soon as it exceeds a threshold that follows the largest
recently freed block, and serves large blocks from their own mappings that are unmapped when
freed; a streaming process then keeps faulting fresh, zero-filled pages back in, which on small
VMs costs more CPU than moving the bytes.

tune_malloc_for_streaming() makes the process keep up to 256 MiB of freed memory at the top of
each heap for reuse (M_TRIM_THRESHOLD) and serve blocks up to 32 MiB from the heap
(M_MMAP_THRESHOLD), so that arrays and messages freed by one fetch are reused by the next. It
changes a process-wide setting, so the client never calls it by itself: a program opts in once at
start-up. Resident memory then stays near its high-water mark instead of shrinking between
fetches.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# Freed memory kept at the top of a heap before any is returned to the kernel.
STREAMING_TRIM_THRESHOLD_BYTES = 256 << 20
# Largest block served from a heap (glibc's maximum for it on 64-bit systems).
STREAMING_MMAP_THRESHOLD_BYTES = 32 << 20

# <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc_for_streaming() -> bool:
    """Applies the policy above. False where the C library refused a setting or is not glibc
    (the process then runs with its allocator's defaults, which is correct, only slower)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; both are attempted even if the first is refused.
    mmap_ok = mallopt(_M_MMAP_THRESHOLD, STREAMING_MMAP_THRESHOLD_BYTES) == 1
    trim_ok = mallopt(_M_TRIM_THRESHOLD, STREAMING_TRIM_THRESHOLD_BYTES) == 1
    return mmap_ok and trim_ok
