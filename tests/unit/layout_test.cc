#include "core/layout.h"

#include <map>
#include <numeric>

#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

Layout Plain(std::vector<int64_t> dm, std::vector<int32_t> map) {
  Layout l;
  l.dev_matrix = std::move(dm);
  for (int32_t m : map)
    l.tensor_map.push_back(m < 0 ? std::vector<int32_t>{} : std::vector<int32_t>{m});
  return l;
}

// A worked example: dev [2,4], map [1,-1], shape [32,32]: ranks 0-3 rows 0-15, ranks 4-7 rows
// 16-31.
TEST(LayoutTest, WorkedExampleOuterAxis) {
  Layout l = Plain({2, 4}, {1, -1});
  ASSERT_TRUE(l.Validate({32, 32}).ok());
  for (int64_t r = 0; r < 8; ++r) {
    Box b = *l.SliceBox({32, 32}, r);
    EXPECT_EQ(b, (Box{{r < 4 ? 0 : 16, 0}, {r < 4 ? 16 : 32, 32}})) << "rank " << r;
  }
  EXPECT_EQ(*l.LocalShape({32, 32}), (Shape{16, 32}));
  EXPECT_EQ(l.CopiesPerSlice(), 4);
}

// The counter-example: map [0,-1] splits dim 0 over the inner axis (size 4).
TEST(LayoutTest, WorkedExampleInnerAxis) {
  Layout l = Plain({2, 4}, {0, -1});
  EXPECT_EQ(*l.SliceBox({32, 32}, 0), (Box{{0, 0}, {8, 32}}));
  EXPECT_EQ(*l.SliceBox({32, 32}, 4), (Box{{0, 0}, {8, 32}}));
  EXPECT_EQ(*l.SliceBox({32, 32}, 3), (Box{{24, 0}, {32, 32}}));
}

// An optimizer-shard example: D=[4,2], T=[0,-1], S=[16,8], k=4: rank 5 -> rows 12-13, shape [2,8].
TEST(LayoutTest, OptimizerShardWorkedExample) {
  Layout l = Plain({4, 2}, {0, -1});
  l.opt_shard_step = 2;
  l.opt_shard_size = 4;
  ASSERT_TRUE(l.Validate({16, 8}).ok());
  EXPECT_EQ(*l.SliceBox({16, 8}, 5), (Box{{12, 0}, {14, 8}}));
  EXPECT_EQ(*l.LocalShape({16, 8}), (Shape{2, 8}));
  EXPECT_EQ(*l.GlobalShapeFromLocal({2, 8}), (Shape{16, 8}));
  l.opt_shard_size = -1;  // whole replica group = 4
  EXPECT_EQ(l.OptShardFactor(), 4);
  EXPECT_EQ(*l.SliceBox({16, 8}, 5), (Box{{12, 0}, {14, 8}}));
}

TEST(LayoutTest, NestedMapIsMixedRadixWithFirstAxisMostSignificant) {
  // dev [2,3], dim 0 split by axes {1 (size 2), 0 (size 3)}: block = c[0]*3 + c[1].
  Layout l;
  l.dev_matrix = {2, 3};
  l.tensor_map = {{1, 0}, {}};
  l.nested_form = true;
  ASSERT_TRUE(l.Validate({12, 5}).ok());
  EXPECT_EQ(l.TensorMapString(), "[[1, 0], [-1]]");
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t block = (r / 3) * 3 + r % 3;
    EXPECT_EQ(*l.SliceBox({12, 5}, r), (Box{{2 * block, 0}, {2 * block + 2, 5}}));
  }
}

TEST(LayoutTest, ValidationErrorsNameTheProblem) {
  struct Case {
    Layout layout;
    Shape shape;
    absl::StatusCode code;
    std::string needle;
  };
  Layout axis_out = Plain({2, 2}, {2, -1});
  Layout twice = Plain({2, 2}, {0, 0});
  Layout indivisible = Plain({3}, {0});
  Layout opt_group = Plain({4, 2}, {0, -1});
  opt_group.opt_shard_step = 1;
  opt_group.opt_shard_size = 3;
  Layout opt_rows = Plain({2, 4}, {1, -1});
  opt_rows.opt_shard_step = 1;
  opt_rows.opt_shard_size = 4;
  Layout field = Plain({2}, {0});
  field.field = 2;
  Layout uneven = Plain({2}, {0});
  uneven.param_split_shape = {3, 5};
  Layout empty_dm;
  empty_dm.tensor_map = {{}};
  Layout zero_dev = Plain({0, 2}, {-1});
  Layout no_stage = Plain({2}, {0});
  no_stage.stages = {};
  const std::vector<Case> cases = {
      {axis_out, {4, 4}, absl::StatusCode::kInvalidArgument, "uses device axis 2"},
      {twice, {4, 4}, absl::StatusCode::kInvalidArgument, "twice"},
      {indivisible, {8}, absl::StatusCode::kInvalidArgument, "not divisible by its split count 3"},
      {opt_group, {16, 8}, absl::StatusCode::kInvalidArgument, "does not divide the replica group"},
      {opt_rows,
       {4, 8},
       absl::StatusCode::kInvalidArgument,
       "not divisible by opt_weight_shard_size"},
      {field, {4}, absl::StatusCode::kUnimplemented, "field"},
      {uneven, {8}, absl::StatusCode::kUnimplemented, "param_split_shape"},
      {empty_dm, {4}, absl::StatusCode::kInvalidArgument, "dev_matrix is empty"},
      {zero_dev, {4}, absl::StatusCode::kInvalidArgument, "non-positive"},
      {Plain({2}, {0}), {4, 4}, absl::StatusCode::kInvalidArgument, "has 1 entries"},
      {Plain({2}, {0}), {0}, absl::StatusCode::kInvalidArgument, "dims must be >= 1"},
      {Plain({2}, {0}), {-4}, absl::StatusCode::kInvalidArgument, "dims must be >= 1"},
      {Plain({1, 1}, {-1, -1}),
       {int64_t{1} << 32, int64_t{1} << 32},
       absl::StatusCode::kInvalidArgument,
       "overflows"},
      {Plain({1}, {-1}), {int64_t{1} << 61}, absl::StatusCode::kInvalidArgument, "overflows"},
      {no_stage, {4}, absl::StatusCode::kInvalidArgument, "no pipeline stage"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::Status s = cases[i].layout.Validate(cases[i].shape);
    EXPECT_EQ(s.code(), cases[i].code) << "case " << i << ": " << s;
    EXPECT_NE(s.message().find(cases[i].needle), std::string::npos)
        << "case " << i << ": " << s.message();
  }
}

TEST(LayoutTest, RankOutOfRange) {
  Layout l = Plain({2, 2}, {0});
  auto b = l.SliceBox({4}, 4);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_FALSE(l.SliceBox({4}, -1).ok());
}

TEST(LayoutTest, CellIntoWritesCellOfIntoCallerStorage) {
  // dev [2, 2, 2], map [2, -1, 0] with an optimizer shard of 2 over the unused axis: 8 cells.
  Layout l = Plain({2, 2, 2}, {2, -1, 0});
  l.opt_shard_step = 1;
  l.opt_shard_size = 2;
  ASSERT_TRUE(l.Validate({8, 3, 4}).ok());
  std::vector<int64_t> cell(3, -7);  // stale values: every entry is overwritten
  for (int64_t r = 0; r < 8; ++r) {
    ASSERT_TRUE(l.CellInto(r, absl::MakeSpan(cell)).ok()) << r;
    EXPECT_EQ(cell, *l.CellOf(r, 3)) << r;
  }
  // More dev_matrix axes than are kept inline (8): the same answer as the brute-force slicer.
  Layout wide = Plain({2, 1, 1, 1, 1, 1, 1, 1, 1, 2}, {9, 0});
  ASSERT_TRUE(wide.Validate({4, 6}).ok());
  std::vector<int64_t> two(2);
  for (int64_t r = 0; r < 4; ++r) {
    ASSERT_TRUE(wide.CellInto(r, absl::MakeSpan(two)).ok()) << r;
    const Box box = testing::BruteForceSliceBox(wide, {4, 6}, r);
    EXPECT_EQ(two, (std::vector<int64_t>{box.lo[0] / 2, box.lo[1] / 3})) << r;
  }
  // Errors as CellOf's: a rank outside the stage, a span of the wrong rank.
  EXPECT_EQ(l.CellInto(8, absl::MakeSpan(cell)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(l.CellInto(-1, absl::MakeSpan(cell)).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(l.CellInto(0, absl::MakeSpan(two)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(LayoutTest, ShapesWhoseByteCountOverflowsAreRefused) {
  const Layout l = Plain({2}, {-1});
  const absl::Status s = l.Validate({int64_t{1} << 60});  // 8-byte elements: 2^63 bytes
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("byte size of shape [1152921504606846976] overflows int64"),
            std::string::npos)
      << s;
  EXPECT_TRUE(l.Validate({(int64_t{1} << 60) - 1}).ok());
}

TEST(LayoutTest, GlobalShapeFromLocal) {
  Layout l = Plain({2, 4}, {1, 0});
  EXPECT_EQ(*l.GlobalShapeFromLocal({8, 4}), (Shape{16, 16}));
  EXPECT_FALSE(l.GlobalShapeFromLocal({8}).ok());
  EXPECT_FALSE(l.GlobalShapeFromLocal({0, 4}).ok());
  EXPECT_FALSE(l.GlobalShapeFromLocal({int64_t{1} << 62, 4}).ok());
}

TEST(LayoutTest, ScalarLayout) {
  Layout l = Plain({4}, {});
  ASSERT_TRUE(l.Validate({}).ok());
  EXPECT_EQ(*l.SliceBox({}, 3), Box::Whole({}));
  EXPECT_EQ(l.CopiesPerSlice(), 4);
}

// Property (a): the boxes of every local rank agree with the brute-force slicer, tile the tensor,
// and hold every element exactly CopiesPerSlice() times.
TEST(LayoutPropertyTest, BoxesTileTheTensorWithReplicaMultiplicity) {
  const uint64_t seed = testing::PropertySeed(20261122);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  std::cout << "LayoutPropertyTest seed " << seed << "\n";
  testing::Rng rng(seed);
  for (int iter = 0; iter < 1500; ++iter) {
    const int64_t devices = testing::RandomDeviceCount(rng, 64);
    const size_t rank = rng() % 4;
    Layout l = testing::RandomLayout(rng, devices, rank, /*allow_opt_shard=*/true);
    const Shape shape = testing::RandomShapeFor(rng, {&l}, rank);
    ASSERT_TRUE(l.Validate(shape).ok()) << l.ToString() << " " << ShapeToString(shape);
    const int64_t elements = *NumElements(shape);
    std::vector<uint32_t> index(elements);
    std::iota(index.begin(), index.end(), 0u);
    std::vector<int> count(elements, 0);
    std::map<Box, int> distinct;
    for (int64_t r = 0; r < devices; ++r) {
      const Box b = *l.SliceBox(shape, r);
      ASSERT_EQ(b, testing::BruteForceSliceBox(l, shape, r))
          << "iteration " << iter << " rank " << r << " " << l.ToString();
      ASSERT_EQ(b.shape(), *l.LocalShape(shape));
      ++distinct[b];
      for (uint32_t flat : testing::SliceOf(index, shape, b)) ++count[flat];
    }
    int64_t cells = 1;
    for (int64_t g : l.Grid(rank)) cells *= g;
    ASSERT_EQ(static_cast<int64_t>(distinct.size()), cells) << l.ToString();
    for (int64_t e = 0; e < elements; ++e) {
      ASSERT_EQ(count[e], l.CopiesPerSlice())
          << "element " << e << " of " << ShapeToString(shape) << " with " << l.ToString();
    }
    ASSERT_EQ(*l.GlobalShapeFromLocal(*l.LocalShape(shape)), shape);
  }
}

}  // namespace
}  // namespace ckpt
