"""Allocator policy for processes that fetch checkpoints into NumPy arrays (the Python
counterpart of the C++ client's client/malloc_tuning.h).

A fetch places every tensor into a freshly allocated array, and a program that fetches repeatedly
frees one fetch's arrays before (or while) it allocates the next one's. glibc's default policy
hands freed memory at the top of a heap back to the kernel as soon as it exceeds a threshold
that follows the largest recently freed block, and serves large blocks from their own mappings
that are unmapped when freed; the next fetch then writes into fresh pages, and the kernel zeroes
every one of them on its first touch, which costs more CPU than placing the bytes (NumPy asks
for transparent huge pages for large arrays, so the kernel zeroes 2 MiB at a time).
docs/performance.md ("Python client") has the measurements.

tune_malloc_for_streaming() makes the process never return freed heap memory to the kernel
(M_TRIM_THRESHOLD -1, as mallopt(3) documents) and serve blocks up to 32 MiB from the heap
(M_MMAP_THRESHOLD), so that the arrays one fetch frees are the memory the next one fills. The
C++ client keeps 256 MiB (enough for gRPC's message buffers); here the freed arrays are as large
as a whole rank's tensors, so any fixed bound below a rank would hand them back between fetches.
Resident memory then stays at the process's high-water mark instead of shrinking between fetches;
arrays above 32 MiB still get mappings of their own (glibc's limit for heap blocks), which are
unmapped when freed. It changes a process-wide setting, so the client never calls it by itself:
a program opts in once at start-up.
"""

from __future__ import annotations

import ctypes
import ctypes.util

# M_TRIM_THRESHOLD: -1 never trims (freed memory at the top of the heap is kept for reuse).
STREAMING_TRIM_THRESHOLD = -1
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
    trim_ok = mallopt(_M_TRIM_THRESHOLD, STREAMING_TRIM_THRESHOLD) == 1
    return mmap_ok and trim_ok
