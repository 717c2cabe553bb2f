#include "core/reshard.h"

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;

Layout L(std::vector<int64_t> dm, std::vector<int32_t> map, std::vector<int32_t> stages = {0}) {
  Layout l;
  l.dev_matrix = std::move(dm);
  for (int32_t m : map) l.tensor_map.push_back(m < 0 ? std::vector<int32_t>{} : std::vector<int32_t>{m});
  l.stages = std::move(stages);
  return l;
}

std::shared_ptr<const Strategy> S(std::map<std::string, Layout> layouts, int32_t stages = 1) {
  std::map<std::string, StrategyParam> params;
  for (auto& [name, l] : layouts) params[name].layout = l;
  auto s = Strategy::Create(std::move(params), stages);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::make_shared<const Strategy>(*std::move(s));
}

std::vector<std::string> Names(const RankPlan& plan) {
  std::vector<std::string> out;
  for (const auto& t : plan.tensors) out.push_back(t.name);
  return out;
}

TEST(ChooseCoverTest, TiesGoToTheLowestRank) {
  EXPECT_THAT(*ChooseCover({{0, 1}, {1, 0}}), ElementsAre(0));
  EXPECT_THAT(*ChooseCover({{5, 3}, {3, 1}}), ElementsAre(3));
  EXPECT_THAT(*ChooseCover({{0, 4}, {4, 5}}), ElementsAre(4));
  EXPECT_THAT(*ChooseCover({{2}, {1}, {1, 2}}), ElementsAre(1, 2));
  EXPECT_THAT(*ChooseCover({}), ElementsAre());
  EXPECT_FALSE(ChooseCover({{1}, {}}).ok());
}

TEST(ChooseCoverTest, DropsRanksMadeRedundantByLaterPicks) {
  // Greedy takes 0 first ({a,b} vs 2 for the others), then needs 1 and 2 for c and d; 0 stays
  // necessary only if it covers something alone.
  auto cover = *ChooseCover({{0, 1}, {0, 2}, {1}, {2}});
  EXPECT_THAT(cover, ElementsAre(1, 2));
}

// 8 -> 3 (non-multiple): rows of 3 at the source, 8 at the destination.
TEST(ResharderTest, EightToThreeRows) {
  auto src = S({{"w", L({8}, {0, -1})}});
  auto dst = S({{"w", L({3}, {0, -1})}});
  auto r = Resharder::Create(src, dst, {{"w", DType::kFloat32, {24, 4}, {}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(*r->SourceRanks(0), ElementsAre(0, 1, 2));
  EXPECT_THAT(*r->SourceRanks(1), ElementsAre(2, 3, 4, 5));
  EXPECT_THAT(*r->SourceRanks(2), ElementsAre(5, 6, 7));
  auto plan = *r->Plan(1);
  ASSERT_EQ(plan.tensors.size(), 1u);
  const TensorPlan& t = plan.tensors[0];
  EXPECT_EQ(t.dst_box, (Box{{8, 0}, {16, 4}}));
  ASSERT_EQ(t.ops.size(), 4u);
  EXPECT_EQ(t.ops[0].src_rank, 2);
  EXPECT_EQ(t.ops[0].src_offset, (std::vector<int64_t>{2, 0}));  // row 8 is row 2 of rows 6-9
  EXPECT_EQ(t.ops[0].dst_offset, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(t.ops[0].extent, (Shape{1, 4}));
  EXPECT_EQ(t.ops[3].src_rank, 5);
  EXPECT_EQ(t.ops[3].extent, (Shape{1, 4}));
  EXPECT_EQ(r->dst_world(), 3);
  EXPECT_EQ(r->src_world(), 8);
}

TEST(ResharderTest, ReplicatedSourceNeedsOneRank) {
  auto src = S({{"w", L({4}, {-1, -1})}});
  auto dst = S({{"w", L({2, 2}, {1, 0})}});
  auto r = *Resharder::Create(src, dst, {{"w", DType::kFloat16, {4, 4}, {}}});
  for (int64_t d = 0; d < 4; ++d) EXPECT_THAT(*r.SourceRanks(d), ElementsAre(0));
}

TEST(ResharderTest, DifferentStageCounts) {
  // Source: 2 stages x 2 devices; a lives in stage 0, b in stage 1. Destination: 1 x 1.
  auto src = S({{"a", L({2}, {0})}, {"b", L({2}, {-1}, {1})}}, 2);
  auto dst = S({{"a", L({1}, {-1})}, {"b", L({1}, {-1})}});
  auto r = *Resharder::Create(src, dst,
                              {{"a", DType::kInt32, {4}, {}}, {"b", DType::kInt32, {6}, {}}});
  EXPECT_THAT(*r.SourceRanks(0), ElementsAre(0, 1, 2));
  // And back: destination 2 stages, b only in stage 1 -> ranks 2,3 need only stage-1 sources.
  auto r2 = *Resharder::Create(dst, src,
                               {{"a", DType::kInt32, {4}, {}}, {"b", DType::kInt32, {6}, {}}});
  EXPECT_THAT(Names(*r2.Plan(0)), ElementsAre("a"));
  EXPECT_THAT(Names(*r2.Plan(3)), ElementsAre("b"));
  EXPECT_THAT(*r2.SourceRanks(3), ElementsAre(0));
}

TEST(ResharderTest, SharedParameterReadsFromEitherStage) {
  // The embedding lives in both source stages; ties go to the lowest rank.
  auto src = S({{"emb", L({2}, {0, -1}, {0, 1})}}, 2);
  auto dst = S({{"emb", L({1}, {-1, -1})}});
  auto r = *Resharder::Create(src, dst, {{"emb", DType::kFloat32, {4, 2}, {}}});
  EXPECT_THAT(*r.SourceRanks(0), ElementsAre(0, 1));
}

TEST(ResharderTest, RankOutOfRange) {
  auto s = S({{"w", L({2}, {0})}});
  auto r = *Resharder::Create(s, s, {{"w", DType::kFloat32, {4}, {}}});
  for (int64_t bad : {int64_t{-1}, int64_t{2}, int64_t{1000}}) {
    auto p = r.Plan(bad);
    ASSERT_FALSE(p.ok());
    EXPECT_EQ(p.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_NE(p.status().message().find("outside the destination world of 2"), std::string::npos);
    EXPECT_EQ(r.SourceRanks(bad).status().code(), absl::StatusCode::kOutOfRange);
  }
}

TEST(ResharderTest, MissingDestinationParameterIsNotFoundUnlessExcluded) {
  auto src = S({{"w", L({2}, {0})}});
  auto dst = S({{"w", L({2}, {0})}, {"extra", L({2}, {-1})}});
  auto r = *Resharder::Create(src, dst, {{"w", DType::kFloat32, {4}, {}}});
  auto p = r.Plan(0);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(p.status().message().find("extra"), std::string::npos);
  PlanOptions opts;
  opts.select = [](std::string_view n) { return n != "extra"; };
  auto r2 = *Resharder::Create(src, dst, {{"w", DType::kFloat32, {4}, {}}}, opts);
  EXPECT_TRUE(r2.Plan(0).ok());
}

TEST(ResharderTest, ParameterAbsentFromDestinationIsWholeOrRefusedWhenStrict) {
  auto src = S({{"w", L({2}, {0})}, {"head", L({2}, {0})}});
  auto dst = S({{"w", L({2}, {-1})}});
  std::vector<TensorInfo> cat = {{"w", DType::kFloat32, {4}, {}},
                                 {"head", DType::kFloat32, {6}, {}}};
  auto r = *Resharder::Create(src, dst, cat);
  auto plan = *r.Plan(1);
  ASSERT_EQ(plan.tensors.size(), 2u);
  EXPECT_EQ(plan.tensors[1].kind, TensorKind::kWhole);
  EXPECT_EQ(plan.tensors[1].dst_box, Box::Whole({6}));
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_NE(plan.warnings[0].find("head"), std::string::npos);
  PlanOptions strict;
  strict.strict = true;
  auto refused = Resharder::Create(src, dst, cat, strict);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("head"), std::string::npos);
}

TEST(ResharderTest, VerbatimParametersComeLastAndFromOneCoverRank) {
  auto src = S({{"w", L({4}, {0})}});
  auto dst = S({{"w", L({2}, {0})}});
  std::vector<TensorInfo> cat = {{"global_step", DType::kInt32, {}, {}},
                                 {"w", DType::kFloat32, {8}, {}},
                                 {"learning_rate", DType::kFloat32, {}, {}}};
  auto r = *Resharder::Create(src, dst, cat);
  auto plan = *r.Plan(1);
  EXPECT_THAT(Names(plan), ElementsAre("w", "global_step", "learning_rate"));
  EXPECT_THAT(plan.source_ranks, ElementsAre(2, 3));
  EXPECT_EQ(plan.tensors[1].kind, TensorKind::kVerbatim);
  ASSERT_EQ(plan.tensors[1].ops.size(), 1u);
  EXPECT_EQ(plan.tensors[1].ops[0].src_rank, 2);
}

TEST(ResharderTest, OptimizerStatesInheritTheirWeightsLayoutOnBothSides) {
  Layout sharded = L({4}, {0, -1});
  auto src = S({{"w", sharded}});  // saved with only_trainable_params=True: no adam_m.w item
  auto dst = S({{"w", L({2}, {-1, 0})}});
  std::vector<TensorInfo> cat = {{"w", DType::kFloat32, {8, 4}, {}},
                                 {"adam_m.w", DType::kFloat32, {8, 4}, {}}};
  auto r = *Resharder::Create(src, dst, cat);
  auto plan = *r.Plan(1);
  ASSERT_EQ(plan.tensors.size(), 2u);
  EXPECT_EQ(plan.tensors[1].name, "adam_m.w");
  EXPECT_EQ(plan.tensors[1].kind, TensorKind::kResharded);
  EXPECT_EQ(plan.tensors[1].dst_box, (Box{{0, 2}, {8, 4}}));
  EXPECT_EQ(plan.tensors[1].ops.size(), 4u);  // rows come from the 4 source shards
  PlanOptions off;
  off.inherit_optimizer_layouts = false;
  auto r2 = *Resharder::Create(src, dst, cat, off);
  EXPECT_EQ(r2.Plan(1)->tensors[1].kind, TensorKind::kVerbatim);
  std::string weight;
  EXPECT_TRUE(IsOptimizerStateName("accu_grads.a.b", &weight));
  EXPECT_EQ(weight, "a.b");
  EXPECT_FALSE(IsOptimizerStateName("adam_m.", &weight));
  EXPECT_FALSE(IsOptimizerStateName("weights.adam_m.x", &weight));
}

TEST(ResharderTest, MergedOutputAndSingleWholeSource) {
  auto src = S({{"w", L({2, 2}, {1, 0})}});
  std::vector<TensorInfo> cat = {{"w", DType::kFloat32, {4, 4}, {}},
                                 {"step", DType::kInt64, {}, {}}};
  auto merged = *Resharder::Create(src, nullptr, cat);
  EXPECT_EQ(merged.dst_world(), 1);
  auto plan = *merged.Plan(0);
  EXPECT_THAT(Names(plan), ElementsAre("w", "step"));
  EXPECT_EQ(plan.tensors[0].dst_box, Box::Whole({4, 4}));
  EXPECT_EQ(plan.tensors[0].ops.size(), 4u);
  EXPECT_THAT(plan.source_ranks, ElementsAre(0, 1, 2, 3));

  auto from_whole = *Resharder::Create(nullptr, src, cat);
  EXPECT_EQ(from_whole.src_world(), 1);
  for (int64_t r = 0; r < 4; ++r) {
    auto p = *from_whole.Plan(r);
    EXPECT_THAT(p.source_ranks, ElementsAre(0));
    EXPECT_EQ(p.tensors[0].ops.size(), 1u);
  }
  auto deps = *Resharder::CreateFromLayouts(nullptr, src);
  EXPECT_THAT(*deps.SourceRanks(3), ElementsAre(0));
}

TEST(ResharderTest, ErrorsNameTheParameter) {
  auto src = S({{"w", L({4}, {0})}});
  auto dst = S({{"w", L({3}, {0})}});
  auto bad_shape = Resharder::Create(src, dst, {{"w", DType::kFloat32, {8}, {}}});
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_NE(bad_shape.status().message().find("parameter w: destination layout"),
            std::string::npos)
      << bad_shape.status();
  auto dup = Resharder::Create(src, src, {{"w", DType::kFloat32, {8}, {}},
                                          {"w", DType::kFloat32, {8}, {}}});
  EXPECT_FALSE(dup.ok());
  auto holder = Resharder::Create(src, src, {{"v", DType::kFloat32, {8}, {9}}});
  ASSERT_FALSE(holder.ok());
  EXPECT_NE(holder.status().message().find("source rank 9"), std::string::npos);
  auto mismatch = Resharder::CreateFromLayouts(S({{"w", L({4}, {0, -1})}}), dst);
  ASSERT_FALSE(mismatch.ok());
  EXPECT_NE(mismatch.status().message().find("parameter w"), std::string::npos);
}

// Layout-only planning (no checkpoint, scale-free shapes) gives the same covers as planning on
// real shapes, for random strategy pairs.
TEST(ResharderPropertyTest, LayoutOnlyCoversMatchCatalogCovers) {
  const uint64_t seed = testing::PropertySeed(17);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  testing::Rng rng(seed);
  for (int iter = 0; iter < 1000; ++iter) {
    const int64_t ds = testing::RandomDeviceCount(rng, 32), dd = testing::RandomDeviceCount(rng, 32);
    std::map<std::string, Layout> sl, dl;
    std::vector<TensorInfo> cat;
    const int n = 1 + static_cast<int>(rng() % 5);
    for (int i = 0; i < n; ++i) {
      const size_t rank = rng() % 4;
      Layout a = testing::RandomLayout(rng, ds, rank, true);
      Layout b = testing::RandomLayout(rng, dd, rank, true);
      Shape shape = testing::RandomShapeFor(rng, {&a, &b}, rank);
      for (auto& d : shape) d *= 1 + static_cast<int64_t>(rng() % 3);
      const std::string name = absl::StrCat("p", i);
      sl[name] = a;
      dl[name] = b;
      cat.push_back({name, DType::kFloat32, shape, {}});
    }
    auto src = S(sl), dst = S(dl);
    auto by_layout = Resharder::CreateFromLayouts(src, dst);
    ASSERT_TRUE(by_layout.ok()) << by_layout.status();
    auto by_catalog = Resharder::Create(src, dst, cat);
    ASSERT_TRUE(by_catalog.ok()) << by_catalog.status();
    ASSERT_EQ(*by_layout->AllSourceRanks(), *by_catalog->AllSourceRanks()) << "iteration " << iter;
  }
}

}  // namespace
}  // namespace ckpt
