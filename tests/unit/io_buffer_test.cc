#include "storage/io_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

// The /proc/self/smaps entry of the mapping that contains `p`: its bounds and VmFlags.
struct Mapping {
  uintptr_t start = 0, end = 0;
  std::vector<std::string> flags;
};

std::optional<Mapping> MappingOf(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  std::optional<Mapping> found;
  while (std::getline(smaps, line)) {
    unsigned long start = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &start, &end) == 2) {  // a mapping's first line
      if (found) return found;  // the next mapping begins: the one found had no VmFlags line
      if (address >= start && address < end) found = Mapping{start, end, {}};
      continue;
    }
    if (found && line.rfind("VmFlags:", 0) == 0) {
      std::istringstream words(line.substr(8));
      for (std::string w; words >> w;) found->flags.push_back(w);
      return found;
    }
  }
  return found;
}

bool Mapped(const void* p, size_t bytes) {
  std::vector<unsigned char> residency((bytes + 4095) / 4096);
  // mincore fails with ENOMEM where the range is not mapped.
  return ::mincore(const_cast<void*>(p), bytes, residency.data()) == 0;
}

TEST(IoBufferTest, SmallBuffersArePageAlignedZeroedAndWritable) {
  absl::StatusOr<IoBuffer> b = IoBuffer::Allocate(5000);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), 8192u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % 4096, 0u);
  for (size_t i = 0; i < b->size(); ++i) ASSERT_EQ(b->data()[i], 0) << "byte " << i;
  b->data()[0] = 1;
  b->data()[b->size() - 1] = 2;
  EXPECT_EQ(b->data()[b->size() - 1], 2);
}

TEST(IoBufferTest, LargeBuffersAreHugePageAlignedAndAdvisedExactly) {
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage")) {
    GTEST_SKIP() << "SKIPPED: this kernel has no transparent huge pages; buffers keep 4 KiB pages";
  }
  const size_t want = (size_t{4} << 20) + 1;
  absl::StatusOr<IoBuffer> b = IoBuffer::Allocate(want);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->size(), (size_t{4} << 20) + 4096);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data()) % IoBuffer::kHugePageBytes, 0u);
  const std::optional<Mapping> m = MappingOf(b->data());
  ASSERT_TRUE(m.has_value());
  // The extra huge page mapped for the alignment was given back on both sides.
  EXPECT_EQ(m->start, reinterpret_cast<uintptr_t>(b->data()));
  EXPECT_EQ(m->end, reinterpret_cast<uintptr_t>(b->data()) + b->size());
  EXPECT_THAT(m->flags, ::testing::Contains("hg")) << "MADV_HUGEPAGE not set";
  // The whole span is usable.
  b->data()[0] = 1;
  b->data()[b->size() - 1] = 1;
}

TEST(IoBufferTest, MovesOwnershipAndUnmapsOnce) {
  absl::StatusOr<IoBuffer> b = IoBuffer::Allocate(IoBuffer::kHugePageBytes);
  ASSERT_TRUE(b.ok()) << b.status();
  char* const data = b->data();
  const size_t size = b->size();
  IoBuffer moved = *std::move(b);
  EXPECT_EQ(moved.data(), data);
  EXPECT_EQ(moved.size(), size);
  IoBuffer assigned;
  EXPECT_EQ(assigned.data(), nullptr);
  assigned = std::move(moved);
  EXPECT_EQ(moved.data(), nullptr);  // NOLINT(bugprone-use-after-move): checks the moved-from
  EXPECT_EQ(moved.size(), 0u);
  ASSERT_EQ(assigned.data(), data);
  EXPECT_TRUE(Mapped(data, size));
  assigned = IoBuffer();  // the old buffer is unmapped by the assignment
  EXPECT_FALSE(Mapped(data, size));
}

TEST(IoBufferTest, ErrorsNameTheProblem) {
  absl::StatusOr<IoBuffer> empty = IoBuffer::Allocate(0);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  // More than the 128 TiB of a user address space on x86-64: mmap fails with ENOMEM.
  absl::StatusOr<IoBuffer> huge = IoBuffer::Allocate(size_t{1} << 48);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("I/O buffer of 281474976710656 bytes"));
}

}  // namespace
}  // namespace ckpt
