// Giving the heap's free memory back to the kernel after an upload released a large amount of it.
//
// ckptd keeps freed memory in its heaps for reuse (ckptd_main's mallopt: a 256 MiB trim
// threshold, so that the ~1 MiB buffers of a stream are not unmapped and faulted in again
// message after message). The records of a checkpoint of many small tensors are different: a
// pending checkpoint holds about a KiB per slice in small blocks, all freed at once when it is
// committed or dropped, spread over the heap, where the trim threshold never returns them and
// the next upload's allocations need not land on them. ReleaseFreeHeapMemory returns the whole
// free pages of every heap, so that what ckptd holds after an upload is what it uses.
//
// Not at once: a pending checkpoint of many slices marks that it freed its records
// (MarkFreeHeapMemoryForRelease), and ckptd's maintenance hands the memory back once no upload is
// in progress (CheckpointManager::ReleaseFreedUploadMemory). Uploads one after another, or
// alongside, reuse the freed memory instead of faulting fresh pages in: returning it at every
// commit cost an upload of 20,000 tensors over 8 ranks about a tenth of ckptd's CPU, in the trim
// itself and in the page faults of the next upload's allocations.
#ifndef CKPT_SERVICE_ENGINE_UPLOAD_MEMORY_H_
#define CKPT_SERVICE_ENGINE_UPLOAD_MEMORY_H_

namespace ckpt {

// glibc's malloc_trim(0): every whole free page of every heap goes back to the kernel (memory in
// use is not touched). Costs a walk of the heaps' free blocks (milliseconds), so callers use it
// after releasing much memory, not per request. True when memory was returned; false when there
// was none, or where the allocator is not glibc's (sanitizer builds). Thread-safe.
bool ReleaseFreeHeapMemory();

// Records that a large amount of heap memory was freed, for ReleaseMarkedFreeHeapMemory.
// Lock-free; thread-safe.
void MarkFreeHeapMemoryForRelease();
// ReleaseFreeHeapMemory when memory was marked since the last call (clearing the mark);
// false, doing nothing, otherwise. Thread-safe.
bool ReleaseMarkedFreeHeapMemory();

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_UPLOAD_MEMORY_H_
