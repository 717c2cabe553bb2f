// TuneMallocForStreaming (client/malloc_tuning.h): buffers freed between reads are reused
// without the kernel handing out fresh pages again. ctest runs every test in a process of its
// own, so the process-wide setting does not reach other tests.
#include "client/malloc_tuning.h"

#include <sys/resource.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "core/sanitizers.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

int64_t MinorFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Allocates `count` blocks of `bytes`, writes every byte, then frees them newest first (so the
// freed memory ends up at the top of the heap, where glibc trims it), as a stream of reads
// does; returns the page faults the round took.
int64_t FaultsOfOneRound(size_t bytes, int count) {
  const int64_t before = MinorFaults();
  std::vector<char*> blocks;
  for (int i = 0; i < count; ++i) {
    char* p = static_cast<char*>(std::malloc(bytes));
    if (p == nullptr) std::abort();
    std::memset(p, i, bytes);
    asm volatile("" : : "r"(p) : "memory");  // keeps the compiler from eliding the block
    blocks.push_back(p);
  }
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) std::free(*it);
  return MinorFaults() - before;
}

// Page faults of the third of three identical rounds (the first two warm the heap up).
int64_t FaultsOfAWarmRound(size_t bytes, int count) {
  FaultsOfOneRound(bytes, count);
  FaultsOfOneRound(bytes, count);
  return FaultsOfOneRound(bytes, count);
}

TEST(MallocTuningTest, FreedStreamingBuffersAreReusedWithoutFreshPages) {
#ifdef CKPT_SANITIZED
  // The sanitizer's allocator replaces glibc's malloc (mallopt has no effect and fails), so the
  // policy this test measures is not in use (make test-asan, make test-tsan).
  GTEST_SKIP() << "glibc's malloc is replaced by the sanitizer's allocator in this build";
#endif
  ASSERT_TRUE(TuneMallocForStreaming());
  constexpr size_t kRoundBytes = size_t{32} << 20;
  const int64_t pages = static_cast<int64_t>(kRoundBytes / 4096);
  // Sizes of gRPC's receive buffers, of fetched chunks and of the client's file buffers. With
  // glibc's default policy each warm round faults in about every page again.
  for (const size_t bytes : {size_t{64} << 10, size_t{1} << 20, size_t{4} << 20}) {
    const int count = static_cast<int>(kRoundBytes / bytes);
    EXPECT_LT(FaultsOfAWarmRound(bytes, count), pages / 8) << "main thread, blocks of " << bytes;
    // Another thread allocates from a heap (arena) of its own.
    int64_t faults = 0;
    std::thread([&] { faults = FaultsOfAWarmRound(bytes, count); }).join();
    EXPECT_LT(faults, pages / 8) << "second thread, blocks of " << bytes;
  }
}

}  // namespace
}  // namespace ckpt
