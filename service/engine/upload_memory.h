// Giving the heap's free memory back to the kernel after an upload released a large amount of it.
//
// ckptd keeps freed memory in its heaps for reuse (ckptd_main's mallopt: a 256 MiB trim
// threshold, so that the ~1 MiB buffers of a stream are not unmapped and faulted in again
// message after message). The records of a checkpoint of many small tensors are different: a
// pending checkpoint holds about a KiB per slice in small blocks, all freed at once when it is
// committed or dropped, spread over the heap, where the trim threshold never returns them and
// the next upload's allocations need not land on them. ReleaseFreeHeapMemory returns the whole
// free pages of every heap, so that what ckptd holds after an upload is what it uses.
#ifndef CKPT_SERVICE_ENGINE_UPLOAD_MEMORY_H_
#define CKPT_SERVICE_ENGINE_UPLOAD_MEMORY_H_

namespace ckpt {

// glibc's malloc_trim(0): every whole free page of every heap goes back to the kernel (memory in
// use is not touched). Costs a walk of the heaps' free blocks (milliseconds), so callers use it
// after releasing much memory, not per request. True when memory was returned; false when there
// was none, or where the allocator is not glibc's (sanitizer builds). Thread-safe.
bool ReleaseFreeHeapMemory();

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_UPLOAD_MEMORY_H_
