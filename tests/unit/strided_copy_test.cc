#include "core/strided_copy.h"

#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Iota;
using ::ckpt::testing::SliceOf;

TEST(StridedCopyTest, CopiesA2dWindow) {
  // src 4x5, copy rows 1..3, cols 2..5 into dst 3x4 at (1,0).
  std::vector<int32_t> src(20);
  std::iota(src.begin(), src.end(), 0);
  std::vector<int32_t> dst(12, -1);
  ASSERT_TRUE(CopyRegion(reinterpret_cast<const char*>(src.data()), {4, 5}, {1, 2},
                         reinterpret_cast<char*>(dst.data()), {3, 4}, {1, 0}, {2, 3}, 4)
                  .ok());
  const std::vector<int32_t> want = {-1, -1, -1, -1, 7, 8, 9, -1, 12, 13, 14, -1};
  EXPECT_EQ(dst, want);
}

TEST(StridedCopyTest, ScalarAndEmpty) {
  const double x = 2.5;
  double y = 0;
  ASSERT_TRUE(CopyRegion(reinterpret_cast<const char*>(&x), {}, {},
                         reinterpret_cast<char*>(&y), {}, {}, {}, 8)
                  .ok());
  EXPECT_EQ(y, 2.5);
  EXPECT_TRUE(CopyRegion(nullptr, {4}, {0}, nullptr, {4}, {0}, {0}, 4).ok());
}

TEST(StridedCopyTest, RejectsOutOfBounds) {
  std::vector<char> a(16), b(16);
  auto s = CopyRegion(a.data(), {4, 4}, {2, 0}, b.data(), {4, 4}, {0, 0}, {3, 4}, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("source region dim 0"), std::string::npos);
  EXPECT_FALSE(CopyRegion(a.data(), {4, 4}, {0, 0}, b.data(), {4, 4}, {0, 1}, {4, 4}, 1).ok());
  EXPECT_FALSE(CopyRegion(a.data(), {4, 4}, {0}, b.data(), {4, 4}, {0, 0}, {4, 4}, 1).ok());
  EXPECT_FALSE(CopyRegion(a.data(), {4, 4}, {-1, 0}, b.data(), {4, 4}, {0, 0}, {1, 1}, 1).ok());
}

// Random boxes inside random arrays: the result equals an element-by-element copy.
TEST(StridedCopyTest, RandomRegionsMatchElementwiseCopy) {
  const uint64_t seed = testing::PropertySeed(1234);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  testing::Rng rng(seed);
  for (int iter = 0; iter < 1000; ++iter) {
    const size_t rank = 1 + rng() % 4;
    Shape shape(rank), box_lo(rank), box_hi(rank);
    for (size_t i = 0; i < rank; ++i) {
      shape[i] = 1 + rng() % 6;
      box_lo[i] = rng() % shape[i];
      box_hi[i] = box_lo[i] + 1 + rng() % (shape[i] - box_lo[i]);
    }
    const Box region{box_lo, box_hi};
    const std::vector<uint32_t> global = Iota(*NumElements(shape), iter);
    const Box whole = Box::Whole(shape);
    std::vector<uint32_t> out(*region.Volume());
    ASSERT_TRUE(CopyBoxRegion(DType::kUInt32, reinterpret_cast<const char*>(global.data()), whole,
                              reinterpret_cast<char*>(out.data()), region, region)
                    .ok());
    ASSERT_EQ(out, SliceOf(global, shape, region)) << "iteration " << iter;
  }
}

TEST(StridedCopyTest, Int4NeedsEvenBoundaries) {
  std::vector<char> src(8), dst(4);
  std::iota(src.begin(), src.end(), 1);
  // 2x8 Int4 = 2x4 bytes; copy columns 4..8 of both rows.
  ASSERT_TRUE(CopyBoxRegion(DType::kInt4, src.data(), Box{{0, 0}, {2, 8}}, dst.data(),
                            Box{{0, 4}, {2, 8}}, Box{{0, 4}, {2, 8}})
                  .ok());
  EXPECT_EQ(dst, (std::vector<char>{3, 4, 7, 8}));
  auto s = CopyBoxRegion(DType::kInt4, src.data(), Box{{0, 0}, {2, 8}}, dst.data(),
                         Box{{0, 3}, {2, 7}}, Box{{0, 3}, {2, 7}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("even"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
