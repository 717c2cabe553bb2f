#include "storage/io_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "storage/file_stream.h"

namespace ckpt {
namespace {
constexpr size_t kPageBytes = 4096;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }
}  // namespace

absl::StatusOr<IoBuffer> IoBuffer::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("an I/O buffer of 0 bytes");
  if (bytes > SIZE_MAX / 2) {
    return absl::ResourceExhaustedError(absl::StrCat("an I/O buffer of ", bytes, " bytes"));
  }
  const size_t size = RoundUp(bytes, kPageBytes);
  const bool huge = size >= kHugePageBytes;
  // To align a huge buffer, map one huge page more and give back what lies outside the aligned
  // span.
  const size_t reserved = huge ? size + kHugePageBytes : size;
  void* mapped =
      ::mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    // ENOMEM → RESOURCE_EXHAUSTED.
    return ErrnoToStatus(errno, "mmap", absl::StrCat("an I/O buffer of ", size, " bytes"));
  }
  char* base = static_cast<char*>(mapped);
  char* data = base;
  if (huge) {
    const auto address = reinterpret_cast<uintptr_t>(base);
    data = base + (RoundUp(address, kHugePageBytes) - address);
    const size_t head = static_cast<size_t>(data - base);
    const size_t tail = reserved - head - size;
    if (head > 0) ::munmap(base, head);
    if (tail > 0) ::munmap(data + size, tail);
    // Only advice: without transparent huge pages the buffer keeps 4 KiB pages and still works.
    (void)::madvise(data, size, MADV_HUGEPAGE);
  }
  return IoBuffer(data, size);
}

IoBuffer::~IoBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

IoBuffer::IoBuffer(IoBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

IoBuffer& IoBuffer::operator=(IoBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

}  // namespace ckpt
