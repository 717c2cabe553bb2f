// ckptctl on the real MindSpore fixtures (../shared/fixtures/mindspore, read in place): inspect,
// strategy show and deps, with the dependency lists checked by brute force (sufficient and
// irredundant). Every test skips with a visible message when the fixtures are absent.
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/layout.h"
#include "core/reshard.h"
#include "core/strategy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::RunSubprocess;
using ::ckpt::testing::SplitLines;
using ::ckpt::testing::SubprocessResult;
using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kStrategy8[] = "strategy_8_npus.ckpt";

// Skips the test when fixture `name` is absent; otherwise declares `std::string var` = its path.
#define REQUIRE_FIXTURE_PATH(var, name)                                                        \
  const std::optional<std::string> var##_opt = ::ckpt::testing::FixturePath(name);             \
  if (!var##_opt) {                                                                            \
    GTEST_SKIP() << "MindSpore fixture " << (name) << " not found under " << CKPT_FIXTURES_DIR \
                 << " (../shared is absent on a user's clone)";                                \
  }                                                                                            \
  const std::string var = *var##_opt

SubprocessResult RunCkptctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {CKPTCTL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  auto result = RunSubprocess(argv);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return {};
  EXPECT_FALSE(result->timed_out);
  return *std::move(result);
}

Json RunJson(const std::vector<std::string>& args) {
  SubprocessResult r = RunCkptctl(args);
  EXPECT_EQ(r.exit_code, 0) << "ckptctl " << absl::StrJoin(args, " ") << "\n" << r.stderr_text;
  EXPECT_EQ(r.stderr_text, "");
  Json j = Json::parse(r.stdout_text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON: " << r.stdout_text;
  return j;
}

std::shared_ptr<const Strategy> LoadStrategy(const std::string& path) {
  auto s = ParseStrategy(::ckpt::testing::ReadFileOrDie(path), StrategyFormatForPath(path));
  EXPECT_TRUE(s.ok()) << path << ": " << s.status();
  if (!s.ok()) return nullptr;
  return std::make_shared<const Strategy>(*std::move(s));
}

// ---- Brute-force dependency checks (independent of the planner's cover algorithm). ----

// Scale-free shape on which both layouts split evenly: per dim the product of their grids.
Shape VirtualShape(const Layout& a, const Layout& b, size_t rank) {
  const std::vector<int64_t> ga = a.Grid(rank), gb = b.Grid(rank);
  Shape shape(rank);
  for (size_t d = 0; d < rank; ++d) shape[d] = ga[d] * gb[d];
  return shape;
}

// True when every element of `target` lies in one of `boxes` (element by element; the virtual
// shapes are tiny).
bool Covered(const Box& target, const std::vector<Box>& boxes) {
  if (target.empty()) return true;
  std::vector<int64_t> idx = target.lo;
  const size_t rank = target.rank();
  while (true) {
    const bool inside = std::any_of(boxes.begin(), boxes.end(), [&](const Box& b) {
      for (size_t d = 0; d < rank; ++d) {
        if (idx[d] < b.lo[d] || idx[d] >= b.hi[d]) return false;
      }
      return true;
    });
    if (!inside) return false;
    // Next index in row-major order; done after the last one.
    bool done = true;
    for (size_t d = rank; d > 0; --d) {
      if (++idx[d - 1] < target.hi[d - 1]) {
        done = false;
        break;
      }
      idx[d - 1] = target.lo[d - 1];
    }
    if (done) return true;
  }
}

// Whether source ranks `ranks` hold every element destination global rank `dst_rank` needs of
// every parameter of its stage that both strategies lay out. `why` names the first gap.
bool Sufficient(const Strategy& src, const Strategy& dst, int64_t dst_rank,
                const std::vector<int64_t>& ranks, std::string* why) {
  const int32_t dst_stage = static_cast<int32_t>(dst_rank / dst.devices_per_stage());
  const int64_t dst_local = dst_rank % dst.devices_per_stage();
  for (const auto& [name, dparam] : dst.params()) {
    const Layout& dl = dparam.layout;
    if (std::find(dl.stages.begin(), dl.stages.end(), dst_stage) == dl.stages.end()) continue;
    const StrategyParam* sparam = src.Find(name);
    if (sparam == nullptr) continue;
    const Layout& sl = sparam->layout;
    const size_t rank = dl.tensor_map.size();
    const Shape shape = VirtualShape(sl, dl, rank);
    auto dst_box = dl.SliceBox(shape, dst_local);
    EXPECT_TRUE(dst_box.ok()) << name << ": " << dst_box.status();
    if (!dst_box.ok()) return false;
    std::vector<Box> held;
    for (int64_t g : ranks) {
      const int32_t stage = static_cast<int32_t>(g / src.devices_per_stage());
      if (std::find(sl.stages.begin(), sl.stages.end(), stage) == sl.stages.end()) continue;
      auto box = sl.SliceBox(shape, g % src.devices_per_stage());
      EXPECT_TRUE(box.ok()) << name << ": " << box.status();
      if (box.ok()) held.push_back(*box);
    }
    if (!Covered(*dst_box, held)) {
      *why = absl::StrCat(name, ": destination box ", dst_box->ToString(), " (virtual shape ",
                          ShapeToString(shape), ") is not covered");
      return false;
    }
  }
  return true;
}

// Sufficient, and no listed rank can be dropped.
void ExpectMinimalCover(const Strategy& src, const Strategy& dst, int64_t dst_rank,
                        const std::vector<int64_t>& ranks) {
  SCOPED_TRACE(absl::StrCat("destination rank ", dst_rank, ": [", absl::StrJoin(ranks, ", "), "]"));
  EXPECT_FALSE(ranks.empty());
  EXPECT_TRUE(std::is_sorted(ranks.begin(), ranks.end()));
  EXPECT_EQ(std::set<int64_t>(ranks.begin(), ranks.end()).size(), ranks.size()) << "duplicates";
  for (int64_t g : ranks) {
    EXPECT_GE(g, 0);
    EXPECT_LT(g, src.world_size());
  }
  std::string why;
  EXPECT_TRUE(Sufficient(src, dst, dst_rank, ranks, &why)) << why;
  for (size_t i = 0; i < ranks.size(); ++i) {
    std::vector<int64_t> fewer = ranks;
    fewer.erase(fewer.begin() + static_cast<std::ptrdiff_t>(i));
    EXPECT_FALSE(Sufficient(src, dst, dst_rank, fewer, &why))
        << "source rank " << ranks[i] << " is redundant";
  }
}

std::vector<std::vector<int64_t>> ParseDepsList(const Json& j, size_t expected_ranks) {
  std::vector<std::vector<int64_t>> out;
  EXPECT_TRUE(j.is_array()) << j.dump();
  if (!j.is_array()) return out;
  EXPECT_EQ(j.size(), expected_ranks);
  for (size_t r = 0; r < j.size(); ++r) {
    EXPECT_TRUE(j[r].is_object() && j[r].size() == 2) << j[r].dump();
    EXPECT_EQ(j[r].at("rank"), r);
    out.push_back(j[r].at("source_ranks").get<std::vector<int64_t>>());
  }
  return out;
}

// ---- Tests ----

TEST(FixtureCompatTest, InspectGoldenSequentialMlpLists12Float32Tensors) {
  REQUIRE_FIXTURE_PATH(path, "golden_sequential_mlp.ckpt");
  const Json j = RunJson({"inspect", path, "--json"});
  const Json& tensors = j.at("tensors");
  ASSERT_EQ(tensors.size(), 12u) << j.dump(1);
  std::set<std::string> names;
  for (const Json& t : tensors) {
    const std::string name = t.at("name");
    names.insert(name);
    EXPECT_EQ(t.at("dtype"), "Float32") << name;
    const Shape shape = t.at("shape").get<Shape>();
    EXPECT_TRUE(shape == Shape({16, 4}) || shape == Shape({4, 16})) << name;
    EXPECT_EQ(t.at("bytes"), 16 * 4 * 4) << name;
  }
  std::set<std::string> want;
  for (int block = 0; block < 4; ++block) {
    for (int w = 1; w <= 3; ++w) want.insert(absl::StrCat(block, ".w", w, ".weight"));
  }
  EXPECT_EQ(names, want);
  EXPECT_EQ(j.at("total_bytes"), 12 * 256);

  // The text form: header, 12 rows naming Float32, summary.
  SubprocessResult text = RunCkptctl({"inspect", path});
  EXPECT_EQ(text.exit_code, 0) << text.stderr_text;
  const std::vector<std::string> lines = SplitLines(text.stdout_text);
  ASSERT_EQ(lines.size(), 14u) << text.stdout_text;
  for (size_t i = 1; i <= 12; ++i) EXPECT_THAT(lines[i], HasSubstr("Float32"));
  EXPECT_THAT(lines.back(), ::testing::StartsWith("12 tensors, 3.0 KiB"));
}

TEST(FixtureCompatTest, InspectGoldenRouter) {
  REQUIRE_FIXTURE_PATH(path, "golden_router.ckpt");
  const Json j = RunJson({"inspect", path, "--json"});
  ASSERT_EQ(j.at("tensors").size(), 1u) << j.dump(1);
  EXPECT_EQ(j.at("tensors")[0].at("name"), "gating.weight");
  EXPECT_EQ(j.at("tensors")[0].at("dtype"), "Float32");
  EXPECT_EQ(j.at("tensors")[0].at("shape").get<Shape>(), Shape({4, 16}));
}

TEST(FixtureCompatTest, InspectRejectsTheUtf8MangledCheckpoint) {
  REQUIRE_FIXTURE_PATH(path, "golden_router_CORRUPT_utf8mangled.ckpt");
  SubprocessResult r = RunCkptctl({"inspect", path});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.term_signal, 0) << "crashed";
  EXPECT_EQ(r.stdout_text, "");
  const std::vector<std::string> lines = SplitLines(r.stderr_text);
  ASSERT_EQ(lines.size(), 1u) << r.stderr_text;
  EXPECT_THAT(lines[0], HasSubstr("golden_router_CORRUPT_utf8mangled.ckpt"));
}

TEST(FixtureCompatTest, StrategyShowJsonHas144ParametersIn2Stages) {
  REQUIRE_FIXTURE_PATH(path, kStrategy8);
  const Json j = RunJson({"strategy", "show", path, "--json"});
  ASSERT_TRUE(j.is_object());
  const Json& items = j.at("parallel_layout_item");
  // The merged file's 148 layout items, written back as "<stage>-<name>" keys.
  EXPECT_EQ(items.size(), 148u);
  std::map<std::string, std::set<int>> stages_of;
  for (const auto& [key, item] : items.items()) {
    const size_t dash = key.find('-');
    ASSERT_NE(dash, std::string::npos) << key;
    stages_of[key.substr(dash + 1)].insert(std::stoi(key.substr(0, dash)));
    EXPECT_EQ(item.at("dev_matrix"), Json::array({2, 2})) << key;
  }
  EXPECT_EQ(stages_of.size(), 144u);
  std::set<std::string> shared;
  std::set<int> all_stages;
  for (const auto& [name, stages] : stages_of) {
    all_stages.insert(stages.begin(), stages.end());
    if (stages.size() > 1) shared.insert(name);
  }
  EXPECT_EQ(all_stages, (std::set<int>{0, 1}));
  const std::string emb = "backbone.embedding.word_embedding.embedding_table";
  EXPECT_EQ(shared,
            (std::set<std::string>{emb, "adam_m." + emb, "adam_v." + emb, "accu_grads." + emb}));

  // The core parses the printed JSON to the same strategy as the binary file.
  auto reparsed = ParseStrategy(j.dump(), StrategyFormat::kJson);
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(reparsed->params().size(), 144u);
  EXPECT_EQ(reparsed->stage_count(), 2);
  EXPECT_EQ(reparsed->devices_per_stage(), 4);
  auto binary = LoadStrategy(path);
  ASSERT_NE(binary, nullptr);
  EXPECT_EQ(reparsed->params(), binary->params());

  SubprocessResult text = RunCkptctl({"strategy", "show", path});
  EXPECT_EQ(text.exit_code, 0) << text.stderr_text;
  EXPECT_THAT(text.stdout_text,
              HasSubstr("144 parameters, 4 devices per stage, 2 stage(s), 8 ranks"));
}

TEST(FixtureCompatTest, DepsOfTheFixtureOntoItselfStayInTheOwnStageAndAreMinimal) {
  REQUIRE_FIXTURE_PATH(path, kStrategy8);
  auto strategy = LoadStrategy(path);
  ASSERT_NE(strategy, nullptr);
  const Json j =
      RunJson({"deps", "--src-strategy", path, "--dst-strategy", path, "--all", "--json"});
  const auto deps = ParseDepsList(j, 8);
  ASSERT_EQ(deps.size(), 8u);
  for (int64_t r = 0; r < 8; ++r) {
    const std::vector<int64_t>& ranks = deps[r];
    ASSERT_FALSE(ranks.empty()) << "rank " << r;
    for (int64_t s : ranks) EXPECT_EQ(s / 4, r / 4) << "rank " << r << " reads rank " << s;
    ExpectMinimalCover(*strategy, *strategy, r, ranks);
  }
}

// A single-stage, 3-device destination for the fixture's parameters: row, column and no splits
// mixed so that destination boxes straddle source boxes (3 is not a multiple of 2).
Strategy ThreeDeviceDestination(const Strategy& src) {
  std::map<std::string, StrategyParam> params;
  size_t i = 0;
  for (const auto& [name, p] : src.params()) {
    Layout l;
    l.dev_matrix = {3};
    const size_t rank = p.layout.tensor_map.size();
    l.tensor_map.assign(rank, {});
    if (rank > 0) {
      const size_t choice = i++ % 3;
      if (choice < rank) l.tensor_map[choice] = {0};  // split dim 0, dim 1, or nothing
    }
    params[name].layout = l;
  }
  return *Strategy::Create(std::move(params), 1);
}

TEST(FixtureCompatTest, DepsFromTheFixtureToAThreeDeviceStrategyAreMinimalCovers) {
  REQUIRE_FIXTURE_PATH(path, kStrategy8);
  auto src = LoadStrategy(path);
  ASSERT_NE(src, nullptr);
  const Strategy dst_strategy = ThreeDeviceDestination(*src);

  // A temporary directory removed on every exit path.
  struct TempDir {
    std::string path = (fs::temp_directory_path() / "fixture_compat.XXXXXX").string();
    bool ok = ::mkdtemp(path.data()) != nullptr;
    ~TempDir() {
      std::error_code ec;
      if (ok) fs::remove_all(path, ec);
    }
  } tmp;
  ASSERT_TRUE(tmp.ok) << "mkdtemp " << tmp.path;
  const std::string dst_path = tmp.path + "/dst_3_devices.json";
  {
    std::ofstream out(dst_path);
    out << SerializeStrategy(dst_strategy, StrategyFormat::kJson);
    ASSERT_TRUE(out.good());
  }
  auto dst = LoadStrategy(dst_path);
  ASSERT_NE(dst, nullptr);
  EXPECT_EQ(dst->params(), dst_strategy.params());

  const Json j =
      RunJson({"deps", "--src-strategy", path, "--dst-strategy", dst_path, "--all", "--json"});
  SubprocessResult one = RunCkptctl(
      {"deps", "--src-strategy", path, "--dst-strategy", dst_path, "--rank", "1", "--json"});

  const auto deps = ParseDepsList(j, 3);
  ASSERT_EQ(deps.size(), 3u);
  for (int64_t r = 0; r < 3; ++r) ExpectMinimalCover(*src, *dst, r, deps[r]);

  // Same answer as the core API, and `--rank` agrees with `--all`.
  auto planner = Resharder::CreateFromLayouts(src, dst);
  ASSERT_TRUE(planner.ok()) << planner.status();
  auto all = planner->AllSourceRanks();
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(deps, *all);
  EXPECT_EQ(one.exit_code, 0) << one.stderr_text;
  EXPECT_EQ(Json::parse(one.stdout_text, nullptr, false),
            (Json{{"rank", 1}, {"source_ranks", deps[1]}}));
}

}  // namespace
}  // namespace ckpt
