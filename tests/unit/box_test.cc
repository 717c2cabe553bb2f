#include "core/box.h"

#include <limits>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(BoxTest, IntersectionAndVolume) {
  Box a{{0, 0}, {4, 8}};
  Box b{{2, 6}, {6, 10}};
  auto c = Intersect(a, b);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(*c, (Box{{2, 6}, {4, 8}}));
  EXPECT_EQ(*c->Volume(), 4);
  EXPECT_EQ(c->ToString(), "[2:4, 6:8]");
  EXPECT_TRUE(a.Contains(*c));
  EXPECT_TRUE(b.Contains(*c));
  EXPECT_FALSE(a.Contains(b));
}

TEST(BoxTest, TouchingBoxesDoNotIntersect) {
  EXPECT_FALSE(Intersect(Box{{0}, {4}}, Box{{4}, {8}}).has_value());
  EXPECT_FALSE(Intersect(Box{{0, 0}, {4, 4}}, Box{{0, 4}, {4, 8}}).has_value());
  EXPECT_FALSE(Intersect(Box{{0}, {4}}, Box{{0, 0}, {4, 4}}).has_value());  // rank mismatch
}

TEST(BoxTest, IntersectIntoReusesItsOutputAndAgreesWithIntersect) {
  Box out{{9, 9, 9}, {10, 10, 10}};  // another rank: resized
  ASSERT_TRUE(IntersectInto(Box{{0, 0}, {4, 8}}, Box{{2, 6}, {6, 10}}, &out));
  EXPECT_EQ(out, (Box{{2, 6}, {4, 8}}));
  EXPECT_FALSE(IntersectInto(Box{{0}, {4}}, Box{{4}, {8}}, &out));
  EXPECT_FALSE(IntersectInto(Box{{0}, {4}}, Box{{0, 0}, {4, 4}}, &out));  // rank mismatch
  // Every pair of small random boxes: the same answer as Intersect.
  uint64_t state = 12345;
  auto next = [&] { return static_cast<int64_t>((state = state * 6364136223846793005u + 1) >> 60); };
  for (int i = 0; i < 2000; ++i) {
    Box a, b;
    for (int d = 0; d < 2; ++d) {
      const int64_t alo = next(), blo = next();
      a.lo.push_back(alo), a.hi.push_back(alo + 1 + next() % 5);
      b.lo.push_back(blo), b.hi.push_back(blo + 1 + next() % 5);
    }
    const std::optional<Box> want = Intersect(a, b);
    ASSERT_EQ(IntersectInto(a, b, &out), want.has_value());
    if (want) {
      ASSERT_EQ(out, *want);
    }
  }
}

TEST(BoxTest, ScalarBox) {
  Box s = Box::Whole({});
  EXPECT_EQ(s.rank(), 0u);
  EXPECT_FALSE(s.empty());
  EXPECT_EQ(*s.Volume(), 1);
  ASSERT_TRUE(Intersect(s, s).has_value());
}

TEST(BoxTest, VolumeOverflowIsAnError) {
  const int64_t big = int64_t{1} << 40;
  Box b{{0, 0}, {big, big}};
  auto v = b.Volume();
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("overflows"), std::string::npos);
  // Both name the shape and the multiplication that overflowed.
  EXPECT_EQ(v.status().message(),
            "element count of shape [1099511627776, 1099511627776] overflows int64 "
            "(1099511627776 * 1099511627776)");
  EXPECT_EQ(NumElements({3, big, big}).status().message(),
            "element count of shape [3, 1099511627776, 1099511627776] overflows int64 "
            "(3298534883328 * 1099511627776)");
  EXPECT_FALSE(NumElements({big, big}).ok());
  EXPECT_FALSE(NumElements({2, -1}).ok());
  EXPECT_EQ(*NumElements({}), 1);
  EXPECT_FALSE(CheckedAdd(std::numeric_limits<int64_t>::max(), 1, "x").ok());
}

TEST(BoxTest, EmptyBoxHasZeroVolume) {
  Box e{{3, 0}, {3, 5}};
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(*e.Volume(), 0);
}

TEST(BoxTest, NextIndexWalksRowMajor) {
  std::vector<int64_t> lo = {1, 5}, hi = {3, 7}, idx = lo;
  std::vector<std::vector<int64_t>> seen;
  do {
    seen.push_back(idx);
  } while (NextIndex(idx, lo, hi));
  EXPECT_EQ(seen, (std::vector<std::vector<int64_t>>{{1, 5}, {1, 6}, {2, 5}, {2, 6}}));
  EXPECT_EQ(idx, lo);
  std::vector<int64_t> scalar;
  EXPECT_FALSE(NextIndex(scalar, {}, {}));
}

}  // namespace
}  // namespace ckpt
