// ReleaseFreeHeapMemory (service/engine/upload_memory.h): freed blocks in the middle of a heap,
// which glibc's trim threshold never returns, go back to the kernel; and a marked release happens
// once, at the first ReleaseMarkedFreeHeapMemory after the mark.
#include "service/engine/upload_memory.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "core/sanitizers.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Resident bytes of this process (/proc/self/statm).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// Allocates `bytes` of small blocks, as a pending checkpoint's records are, then one more block
// that stays allocated above them, and frees the small ones: free memory inside the heap rather
// than at its top (where glibc's own trimming could return it). Returns the live block, which
// the caller frees; null (everything freed) when any allocation failed.
char* FreeBlocksBelowALiveOne(size_t bytes) {
  constexpr size_t kBlock = 1024;
  std::vector<char*> blocks;
  blocks.reserve(bytes / kBlock);
  bool failed = false;
  for (size_t i = 0; i < bytes / kBlock && !failed; ++i) {
    blocks.push_back(static_cast<char*>(std::malloc(kBlock)));
    failed = blocks.back() == nullptr;
    if (!failed) std::memset(blocks.back(), 1, kBlock);
  }
  char* pin = failed ? nullptr : static_cast<char*>(std::malloc(kBlock));
  if (pin != nullptr) std::memset(pin, 1, kBlock);
  for (char* p : blocks) std::free(p);
  return pin;
}

TEST(UploadMemoryTest, FreedSmallBlocksBelowALiveOneGoBackToTheKernel) {
#ifdef CKPT_SANITIZED
  GTEST_SKIP() << "glibc's malloc is replaced by the sanitizer's allocator in this build";
#endif
  constexpr size_t kBytes = size_t{64} << 20;
  char* pin = FreeBlocksBelowALiveOne(kBytes);
  ASSERT_NE(pin, nullptr);
  const int64_t before = ResidentBytes();
  EXPECT_TRUE(ReleaseFreeHeapMemory());
  const int64_t after = ResidentBytes();
  EXPECT_LT(after, before - static_cast<int64_t>(kBytes / 2))
      << "resident " << before << " -> " << after << " bytes";
  std::free(pin);
}

// Marked memory is released once, by the first ReleaseMarkedFreeHeapMemory after the mark.
TEST(UploadMemoryTest, MarkedMemoryIsReleasedOnceAfterTheMark) {
#ifdef CKPT_SANITIZED
  GTEST_SKIP() << "glibc's malloc is replaced by the sanitizer's allocator in this build";
#endif
  (void)ReleaseMarkedFreeHeapMemory();  // a mark left by anything before this test
  EXPECT_FALSE(ReleaseMarkedFreeHeapMemory()) << "released with nothing marked";
  constexpr size_t kBytes = size_t{16} << 20;
  char* pin = FreeBlocksBelowALiveOne(kBytes);
  ASSERT_NE(pin, nullptr);
  MarkFreeHeapMemoryForRelease();
  const int64_t before = ResidentBytes();
  EXPECT_TRUE(ReleaseMarkedFreeHeapMemory());
  EXPECT_LT(ResidentBytes(), before - static_cast<int64_t>(kBytes / 2));
  EXPECT_FALSE(ReleaseMarkedFreeHeapMemory()) << "the mark was not cleared";
  std::free(pin);
}

}  // namespace
}  // namespace ckpt
