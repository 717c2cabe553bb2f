// Memory for direct-I/O writes (AtomicFileSink's buffer, the store's write blocks).
#ifndef CKPT_STORAGE_IO_BUFFER_H_
#define CKPT_STORAGE_IO_BUFFER_H_

#include <cstddef>

#include "absl/status/statusor.h"

namespace ckpt {

// Zeroed anonymous memory for O_DIRECT writes, laid out so that the disk gets few, large requests.
//
// A direct write hands the disk the buffer's physical pages, one request segment per physically
// contiguous run, and a device takes a limited number of segments per request (virtio-blk: 254,
// /sys/block/<dev>/queue/max_segments). With 4 KiB pages a 2 MiB write therefore goes out as
// three requests and a 4 MiB one as five, most of them ~1 MiB and some a few KiB. An IoBuffer of
// 2 MiB or more is aligned to 2 MiB and marked MADV_HUGEPAGE, so that where transparent huge
// pages are available (`enabled` is `always` or `madvise`) each 2 MiB is one page and one
// segment, and a write goes out in requests of the device's largest size (max_sectors_kb). Where
// huge pages are unavailable it is ordinary page-aligned memory. Where none is free at once the
// kernel may first compact memory (its `defrag` setting): a cost paid once per buffer, which
// AtomicFileSink keeps for the file and the store reuses.
//
// Move-only; unmapped on destruction. Not thread-safe (one owner at a time).
class IoBuffer {
 public:
  // Size of a transparent huge page on x86-64 and of the alignment of buffers at least this large.
  static constexpr size_t kHugePageBytes = size_t{2} << 20;

  // `bytes` (> 0) rounded up to whole 4 KiB pages. RESOURCE_EXHAUSTED when the memory cannot be
  // mapped, INVALID_ARGUMENT for 0.
  static absl::StatusOr<IoBuffer> Allocate(size_t bytes);

  IoBuffer() = default;
  ~IoBuffer();
  IoBuffer(IoBuffer&& other) noexcept;
  IoBuffer& operator=(IoBuffer&& other) noexcept;
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }  // the rounded-up size

 private:
  IoBuffer(char* data, size_t size) : data_(data), size_(size) {}

  char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_IO_BUFFER_H_
