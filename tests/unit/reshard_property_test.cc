// Property tests of the planner against brute force (properties b and c).
#include <algorithm>
#include <iostream>
#include <map>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "core/reshard.h"
#include "core/strided_copy.h"
#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt {
namespace {

using testing::Rng;

struct RandomParam {
  std::string name;
  Shape shape;
  std::optional<Layout> src;  // absent: whole in the holders' files
  std::optional<Layout> dst;
  std::vector<int64_t> holders;  // source global ranks holding it when src is absent
  std::vector<uint32_t> data;    // global tensor
};

struct RandomCase {
  std::shared_ptr<const Strategy> src;
  std::shared_ptr<const Strategy> dst;
  int64_t src_devices = 1, dst_devices = 1;
  int32_t src_stages = 1, dst_stages = 1;
  std::vector<RandomParam> params;
  std::string description;
};

std::vector<int32_t> RandomStages(Rng& rng, int32_t stages) {
  std::vector<int32_t> out;
  for (int32_t s = 0; s < stages; ++s) {
    if (rng() % 2) out.push_back(s);
  }
  if (out.empty()) out.push_back(static_cast<int32_t>(rng() % stages));
  return out;
}

// Every stage must hold a parameter for Strategy::Create; give uncovered stages to param 0.
void CoverStages(std::vector<RandomParam>& params, bool src_side, int32_t stages) {
  std::set<int32_t> seen;
  for (auto& p : params) {
    auto& l = src_side ? p.src : p.dst;
    if (l) seen.insert(l->stages.begin(), l->stages.end());
  }
  for (int32_t s = 0; s < stages; ++s) {
    if (seen.contains(s)) continue;
    for (auto& p : params) {
      auto& l = src_side ? p.src : p.dst;
      if (l) {
        l->stages.push_back(s);
        std::sort(l->stages.begin(), l->stages.end());
        break;
      }
    }
  }
}

std::shared_ptr<const Strategy> BuildStrategy(const std::vector<RandomParam>& params, bool src_side,
                                              int32_t stages) {
  std::map<std::string, StrategyParam> map;
  for (const auto& p : params) {
    const auto& l = src_side ? p.src : p.dst;
    if (l) map[p.name].layout = *l;
  }
  auto s = Strategy::Create(std::move(map), stages);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::make_shared<const Strategy>(*std::move(s));
}

RandomCase MakeCase(Rng& rng, int64_t max_elements) {
  RandomCase c;
  c.src_devices = testing::RandomDeviceCount(rng, 16);
  c.dst_devices = testing::RandomDeviceCount(rng, 16);
  c.src_stages = 1 + static_cast<int32_t>(rng() % 3);
  c.dst_stages = 1 + static_cast<int32_t>(rng() % 3);
  const int nparams = 1 + static_cast<int>(rng() % 4);
  for (int i = 0; i < nparams; ++i) {
    RandomParam p;
    p.name = absl::StrCat("p", i);
    const size_t rank = rng() % 4;
    const uint64_t kind = rng() % 8;  // mostly laid out on both sides
    if (kind != 6 && kind != 7) {
      p.src = testing::RandomLayout(rng, c.src_devices, rank, true);
      p.src->stages = RandomStages(rng, c.src_stages);
    }
    if (kind != 5 && kind != 7) {
      p.dst = testing::RandomLayout(rng, c.dst_devices, rank, true);
      p.dst->stages = RandomStages(rng, c.dst_stages);
    }
    std::vector<const Layout*> ls;
    if (p.src) ls.push_back(&*p.src);
    if (p.dst) ls.push_back(&*p.dst);
    p.shape = testing::RandomShapeFor(rng, ls, rank);
    if (*NumElements(p.shape) > max_elements) {
      --i;
      continue;
    }
    if (!p.src) {
      for (int64_t g = 0; g < c.src_devices * c.src_stages; ++g) {
        if (rng() % 2) p.holders.push_back(g);
      }
    }
    p.data = testing::Iota(*NumElements(p.shape), static_cast<uint32_t>(i * 7919));
    c.params.push_back(std::move(p));
  }
  const bool any_src =
      std::any_of(c.params.begin(), c.params.end(), [](auto& p) { return p.src.has_value(); });
  const bool any_dst =
      std::any_of(c.params.begin(), c.params.end(), [](auto& p) { return p.dst.has_value(); });
  if (!any_src) {
    c.params[0].src = Layout{};
    c.params[0].src->dev_matrix = {c.src_devices};
    c.params[0].src->tensor_map.assign(c.params[0].shape.size(), {});
  }
  if (!any_dst) {
    c.params[0].dst = Layout{};
    c.params[0].dst->dev_matrix = {c.dst_devices};
    c.params[0].dst->tensor_map.assign(c.params[0].shape.size(), {});
  }
  CoverStages(c.params, true, c.src_stages);
  CoverStages(c.params, false, c.dst_stages);
  c.src = BuildStrategy(c.params, true, c.src_stages);
  c.dst = BuildStrategy(c.params, false, c.dst_stages);
  c.description = "src " + std::to_string(c.src_devices) + "x" + std::to_string(c.src_stages) +
                  " dst " + std::to_string(c.dst_devices) + "x" + std::to_string(c.dst_stages);
  for (const auto& p : c.params) {
    c.description += "\n  " + p.name + " " + ShapeToString(p.shape) + " src " +
                     (p.src ? p.src->ToString() : "none") + " dst " +
                     (p.dst ? p.dst->ToString() : "none");
  }
  return c;
}

// The box source global rank g holds of p, if it holds p (brute force).
std::optional<Box> SourceBoxOf(const RandomCase& c, const RandomParam& p, int64_t g) {
  if (!p.src) {
    if (p.holders.empty() || std::count(p.holders.begin(), p.holders.end(), g)) {
      return Box::Whole(p.shape);
    }
    return std::nullopt;
  }
  const int32_t stage = static_cast<int32_t>(g / c.src_devices);
  if (!std::count(p.src->stages.begin(), p.src->stages.end(), stage)) return std::nullopt;
  return testing::BruteForceSliceBox(*p.src, p.shape, g % c.src_devices);
}

std::vector<TensorInfo> Catalog(const RandomCase& c) {
  std::vector<TensorInfo> out;
  for (const auto& p : c.params) {
    out.push_back({p.name, DType::kUInt32, p.shape, p.holders});
  }
  return out;
}

// Property (b): executing the plan of every destination rank on random data equals slicing the
// global tensor directly; every op reads a rank that really holds that box and is in the cover.
TEST(ReshardPropertyTest, ExecutedPlanEqualsDirectSlicing) {
  const uint64_t seed = testing::PropertySeed(7);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  std::cout << "ReshardPropertyTest.ExecutedPlanEqualsDirectSlicing seed " << seed << "\n";
  Rng rng(seed);
  for (int iter = 0; iter < 1000; ++iter) {
    const RandomCase c = MakeCase(rng, 4096);
    SCOPED_TRACE(::testing::Message() << "iteration " << iter << ": " << c.description);
    auto resharder = Resharder::Create(c.src, c.dst, Catalog(c));
    ASSERT_TRUE(resharder.ok()) << resharder.status();
    ASSERT_EQ(resharder->dst_world(), c.dst_devices * c.dst_stages);
    for (int64_t r = 0; r < resharder->dst_world(); ++r) {
      auto plan = resharder->Plan(r);
      ASSERT_TRUE(plan.ok()) << plan.status();
      const int32_t stage = static_cast<int32_t>(r / c.dst_devices);
      // Expected tensors: laid out at the destination in this stage, or delivered everywhere.
      std::set<std::string> expected;
      for (const auto& p : c.params) {
        if (!p.dst || std::count(p.dst->stages.begin(), p.dst->stages.end(), stage)) {
          expected.insert(p.name);
        }
      }
      std::set<std::string> got;
      for (const TensorPlan& t : plan->tensors) got.insert(t.name);
      ASSERT_EQ(got, expected) << "rank " << r;
      for (const TensorPlan& t : plan->tensors) {
        const RandomParam& p = *std::find_if(c.params.begin(), c.params.end(),
                                             [&](const auto& q) { return q.name == t.name; });
        const Box want_box = p.dst ? testing::BruteForceSliceBox(*p.dst, p.shape, r % c.dst_devices)
                                   : Box::Whole(p.shape);
        ASSERT_EQ(t.dst_box, want_box) << t.name << " rank " << r;
        ASSERT_EQ(t.kind, p.dst ? TensorKind::kResharded
                                : (p.src ? TensorKind::kWhole : TensorKind::kVerbatim));
        std::vector<uint32_t> out(*want_box.Volume(), 0xDEADBEEF);
        int64_t copied = 0;
        for (const CopyOp& op : t.ops) {
          ASSERT_TRUE(std::count(plan->source_ranks.begin(), plan->source_ranks.end(), op.src_rank))
              << "op reads rank " << op.src_rank << " outside the cover";
          const std::optional<Box> held = SourceBoxOf(c, p, op.src_rank);
          ASSERT_TRUE(held.has_value()) << "rank " << op.src_rank << " does not hold " << t.name;
          ASSERT_EQ(*held, op.src_box) << t.name;
          const std::vector<uint32_t> src_data = testing::SliceOf(p.data, p.shape, *held);
          Box region;
          for (size_t i = 0; i < op.extent.size(); ++i) {
            region.lo.push_back(op.src_box.lo[i] + op.src_offset[i]);
            region.hi.push_back(region.lo.back() + op.extent[i]);
            ASSERT_EQ(region.lo[i], t.dst_box.lo[i] + op.dst_offset[i]);
          }
          ASSERT_TRUE(CopyBoxRegion(DType::kUInt32, reinterpret_cast<const char*>(src_data.data()),
                                    op.src_box, reinterpret_cast<char*>(out.data()), t.dst_box,
                                    region)
                          .ok());
          copied += *region.Volume();
        }
        ASSERT_EQ(copied, *want_box.Volume()) << "ops must tile the destination exactly";
        ASSERT_EQ(out, testing::SliceOf(p.data, p.shape, want_box)) << t.name << " rank " << r;
      }
    }
  }
}

// Property (c): the cover is sufficient (every element of every delivered slice is held by a
// listed rank) and irredundant (dropping any listed rank leaves some element unheld), checked
// element by element.
TEST(ReshardPropertyTest, CoverIsSufficientAndIrredundant) {
  const uint64_t seed = testing::PropertySeed(11);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  std::cout << "ReshardPropertyTest.CoverIsSufficientAndIrredundant seed " << seed << "\n";
  Rng rng(seed);
  for (int iter = 0; iter < 1000; ++iter) {
    const RandomCase c = MakeCase(rng, 512);
    SCOPED_TRACE(::testing::Message() << "iteration " << iter << ": " << c.description);
    auto resharder = Resharder::Create(c.src, c.dst, Catalog(c));
    ASSERT_TRUE(resharder.ok()) << resharder.status();
    auto all = resharder->AllSourceRanks();
    ASSERT_TRUE(all.ok()) << all.status();
    const int64_t src_world = c.src_devices * c.src_stages;
    for (int64_t r = 0; r < resharder->dst_world(); ++r) {
      const std::vector<int64_t>& cover = (*all)[r];
      ASSERT_EQ(cover, *resharder->SourceRanks(r));
      ASSERT_TRUE(std::is_sorted(cover.begin(), cover.end()));
      // Holder sets of every needed element.
      std::vector<std::vector<int64_t>> needs;
      const int32_t stage = static_cast<int32_t>(r / c.dst_devices);
      for (const auto& p : c.params) {
        if (p.dst && !std::count(p.dst->stages.begin(), p.dst->stages.end(), stage)) continue;
        const Box want = p.dst ? testing::BruteForceSliceBox(*p.dst, p.shape, r % c.dst_devices)
                               : Box::Whole(p.shape);
        // Holders of each element of the destination slice: every source rank marks the
        // elements of its own slice that fall inside it.
        const int64_t volume = *want.Volume();
        std::vector<std::vector<int64_t>> holders(volume);
        for (int64_t g = 0; g < src_world; ++g) {
          const std::optional<Box> held = SourceBoxOf(c, p, g);
          if (!held) continue;
          const std::optional<Box> common = Intersect(*held, want);
          if (!common) continue;
          const Shape wshape = want.shape();
          std::vector<int64_t> idx = common->lo;
          while (true) {
            int64_t flat = 0;
            for (size_t i = 0; i < idx.size(); ++i) flat = flat * wshape[i] + (idx[i] - want.lo[i]);
            holders[flat].push_back(g);
            size_t d = idx.size();
            bool done = true;
            while (d > 0) {
              --d;
              if (++idx[d] < common->hi[d]) {
                done = false;
                break;
              }
              idx[d] = common->lo[d];
            }
            if (done) break;
          }
        }
        for (auto& h : holders) needs.push_back(std::move(h));
      }
      // Elements with the same holders are interchangeable for the check.
      std::sort(needs.begin(), needs.end());
      needs.erase(std::unique(needs.begin(), needs.end()), needs.end());
      auto covered_without = [&](int64_t skip) {
        for (const auto& h : needs) {
          bool ok = false;
          for (int64_t g : h) {
            if (g != skip && std::binary_search(cover.begin(), cover.end(), g)) ok = true;
          }
          if (!ok) return false;
        }
        return true;
      };
      ASSERT_TRUE(covered_without(-1)) << "cover of rank " << r << " is not sufficient";
      for (int64_t x : cover) {
        ASSERT_FALSE(covered_without(x))
            << "cover of rank " << r << " is redundant: rank " << x << " can be dropped";
      }
    }
  }
}

// Random set-cover instances: sufficient and irredundant, by brute force.
TEST(ReshardPropertyTest, ChooseCoverOnRandomInstances) {
  const uint64_t seed = testing::PropertySeed(13);
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with CKPT_SEED=" << seed << ")");
  Rng rng(seed);
  for (int iter = 0; iter < 2000; ++iter) {
    std::vector<std::vector<int64_t>> pieces(1 + rng() % 12);
    for (auto& p : pieces) {
      const int n = 1 + static_cast<int>(rng() % 4);
      for (int i = 0; i < n; ++i) p.push_back(static_cast<int64_t>(rng() % 10));
    }
    auto cover = ChooseCover(pieces);
    ASSERT_TRUE(cover.ok());
    auto ok_without = [&](int64_t skip) {
      for (const auto& p : pieces) {
        bool ok = false;
        for (int64_t g : p) {
          if (g != skip && std::count(cover->begin(), cover->end(), g)) ok = true;
        }
        if (!ok) return false;
      }
      return true;
    };
    ASSERT_TRUE(ok_without(-1));
    for (int64_t x : *cover) ASSERT_FALSE(ok_without(x));
  }
}

}  // namespace
}  // namespace ckpt
