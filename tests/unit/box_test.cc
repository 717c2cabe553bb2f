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
