// Drives the real ckptctl binary as a user would: `sample` into a temporary directory,
// then inspect / strategy show / strategy merge / deps, checking the output against what the core
// library computes, and every error path for "non-zero exit and exactly one line on stderr".
#include <stdlib.h>  // mkdtemp

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/progress.h"
#include "client/ckptctl/sample.h"
#include "core/ckpt_format.h"
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

constexpr char kRankFile[] = "sample-1_10.ckpt";  // SampleOptions{}.file_name

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

Layout MakeLayout(std::vector<int64_t> dev_matrix, std::vector<int32_t> map,
                  std::vector<int32_t> stages) {
  Layout l;
  l.dev_matrix = std::move(dev_matrix);
  for (int32_t m : map) {
    l.tensor_map.push_back(m < 0 ? std::vector<int32_t>{} : std::vector<int32_t>{m});
  }
  l.stages = std::move(stages);
  return l;
}

// One per-stage strategy file as one rank of a pipelined MindSpore job writes it: the stage's
// layouts (not prefixed) and operator items that carry the stage.
Strategy StageStrategy(int32_t stage) {
  std::map<std::string, StrategyParam> params;
  params["embedding.weight"].layout = MakeLayout({2, 2}, {0, -1}, {0});
  std::vector<OpStrategy> ops;
  if (stage == 0) {
    params["layers.0.dense.weight"].layout = MakeLayout({2, 2}, {1, 0}, {0});
    ops.push_back({"Gather_embedding.weight", 0, {{2, 1}, {1, 1}}});
    ops.push_back({"MatMul_layers.0.dense.weight", 0, {{2, 1}, {1, 2}}});
  } else {
    Layout sharded = MakeLayout({2, 2}, {-1, 0}, {0});
    sharded.opt_shard_step = 1;
    sharded.opt_shard_size = 2;
    params["layers.1.dense.weight"].layout = sharded;
    params["layers.1.norm.gamma"].layout = MakeLayout({2, 2}, {-1}, {0});
    ops.push_back({"MatMul_layers.1.dense.weight", 1, {{1, 2}, {2, 1}}});
  }
  return *Strategy::Create(std::move(params), 1, std::move(ops));
}

class CkptctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "ckptctl_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "mkdtemp " << pattern;
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  std::string SampleDir() const { return Path("sample"); }
  std::string RankFile(int64_t rank) const {
    return absl::StrCat(SampleDir(), "/checkpoint/rank_", rank, "/", kRankFile);
  }
  std::string SrcStrategy() const { return SampleDir() + "/src_strategy.ckpt"; }
  std::string DstStrategy() const { return SampleDir() + "/dst_strategy.json"; }

  static SubprocessResult Run(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {CKPTCTL_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    auto result = RunSubprocess(argv);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return {};
    EXPECT_FALSE(result->timed_out) << "ckptctl " << absl::StrJoin(args, " ") << " timed out";
    return *std::move(result);
  }

  // Runs a command that must succeed silently on stderr; returns its stdout.
  static std::string RunOk(const std::vector<std::string>& args) {
    SubprocessResult r = Run(args);
    EXPECT_EQ(r.exit_code, 0) << "ckptctl " << absl::StrJoin(args, " ")
                              << "\nstderr: " << r.stderr_text;
    EXPECT_EQ(r.stderr_text, "") << "ckptctl " << absl::StrJoin(args, " ");
    return r.stdout_text;
  }

  static Json RunJson(const std::vector<std::string>& args) {
    const std::string out = RunOk(args);
    Json j = Json::parse(out, nullptr, /*allow_exceptions=*/false);
    EXPECT_FALSE(j.is_discarded()) << "not JSON: " << out;
    return j;
  }

  // Runs a command that must fail: non-zero exit (not a crash), nothing on stdout and exactly one
  // line on stderr. Returns that line.
  static std::string RunFails(const std::vector<std::string>& args) {
    SubprocessResult r = Run(args);
    const std::string cmd = "ckptctl " + absl::StrJoin(args, " ");
    EXPECT_NE(r.exit_code, 0) << cmd;
    EXPECT_EQ(r.term_signal, 0) << cmd << " crashed";
    EXPECT_EQ(r.stdout_text, "") << cmd;
    const std::vector<std::string> lines = SplitLines(r.stderr_text);
    EXPECT_EQ(lines.size(), 1u) << cmd << " stderr:\n" << r.stderr_text;
    EXPECT_TRUE(r.stderr_text.ends_with("\n")) << cmd;
    if (lines.empty()) return "";
    EXPECT_FALSE(lines[0].empty()) << cmd;
    return lines[0];
  }

  void WriteSample() {
    const std::string out = RunOk({"sample", SampleDir()});
    EXPECT_THAT(out, HasSubstr(SampleDir()));
  }

  static std::shared_ptr<const Strategy> LoadStrategy(const std::string& path) {
    auto s = ParseStrategy(::ckpt::testing::ReadFileOrDie(path), StrategyFormatForPath(path));
    EXPECT_TRUE(s.ok()) << path << ": " << s.status();
    if (!s.ok()) return nullptr;
    return std::make_shared<const Strategy>(*std::move(s));
  }

  std::string dir_;
};

// What rank `rank` of the demo stores, as inspect should list it: (name, dtype, shape, bytes).
struct ExpectedRow {
  std::string name, dtype;
  Shape shape;
  int64_t bytes = 0;
};

std::vector<ExpectedRow> ExpectedRankRows(int64_t rank) {
  const Strategy src = DemoSourceStrategy();
  const int32_t stage = static_cast<int32_t>(rank / src.devices_per_stage());
  const int64_t local = rank % src.devices_per_stage();
  std::vector<ExpectedRow> rows;
  for (const SampleTensor& t : DemoTensors()) {
    const Layout* layout = ResolveLayout(src, t.name, /*inherit_optimizer_layouts=*/true);
    if (layout == nullptr) {
      ADD_FAILURE() << t.name << " has no layout in the demo strategy";
      continue;
    }
    if (std::find(layout->stages.begin(), layout->stages.end(), stage) == layout->stages.end()) {
      continue;
    }
    auto box = layout->SliceBox(t.global_shape, local);
    EXPECT_TRUE(box.ok()) << box.status();
    const Shape shape = box->shape();
    rows.push_back({t.name, std::string(DTypeName(t.dtype)), shape,
                    *ByteSizeOf(t.dtype, *NumElements(shape))});
  }
  rows.push_back({"global_step", "Int32", {}, 4});
  rows.push_back({"learning_rate", "Float32", {}, 4});
  return rows;
}

void ExpectInspectJson(const Json& j, const std::string& file,
                       const std::vector<ExpectedRow>& expected) {
  ASSERT_TRUE(j.is_object()) << j.dump();
  EXPECT_EQ(j.at("file"), file);
  const Json& tensors = j.at("tensors");
  ASSERT_TRUE(tensors.is_array());
  ASSERT_EQ(tensors.size(), expected.size()) << tensors.dump(1);
  int64_t total = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].name);
    EXPECT_EQ(tensors[i].at("name"), expected[i].name);
    EXPECT_EQ(tensors[i].at("dtype"), expected[i].dtype);
    EXPECT_EQ(tensors[i].at("shape").get<Shape>(), expected[i].shape);
    EXPECT_EQ(tensors[i].at("bytes"), expected[i].bytes);
    total += expected[i].bytes;
  }
  EXPECT_EQ(j.at("total_bytes"), total);
}

TEST_F(CkptctlTest, HelpExitsZeroAndListsSubcommands) {
  const std::string help = RunOk({"--help"});
  for (const char* sub : {"inspect", "strategy", "deps", "sample"}) {
    EXPECT_THAT(help, HasSubstr(sub));
  }
  EXPECT_THAT(RunOk({"deps", "--help"}), HasSubstr("--all"));
  EXPECT_THAT(RunOk({"strategy", "merge", "--help"}), HasSubstr("--out"));
}

TEST_F(CkptctlTest, SampleWritesStrategiesAndEveryRankFile) {
  WriteSample();
  EXPECT_TRUE(fs::is_regular_file(SrcStrategy()));
  EXPECT_TRUE(fs::is_regular_file(DstStrategy()));
  EXPECT_TRUE(fs::is_regular_file(SampleDir() + "/whole.ckpt"));
  for (int64_t r = 0; r < DemoSourceStrategy().world_size(); ++r) {
    EXPECT_TRUE(fs::is_regular_file(RankFile(r))) << RankFile(r);
  }
  EXPECT_FALSE(fs::exists(RankFile(DemoSourceStrategy().world_size())));
}

TEST_F(CkptctlTest, InspectListsEachRanksLocalSlices) {
  WriteSample();
  for (int64_t r = 0; r < DemoSourceStrategy().world_size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    ExpectInspectJson(RunJson({"inspect", RankFile(r), "--json"}), RankFile(r),
                      ExpectedRankRows(r));
  }
}

TEST_F(CkptctlTest, SampleRankFilesHoldTheirSlicesOfTheGlobalTensors) {
  WriteSample();
  const Strategy src = DemoSourceStrategy();
  std::map<std::string, SampleTensor> by_name;
  for (const SampleTensor& t : DemoTensors()) by_name[t.name] = t;
  for (int64_t rank : {0, 5}) {  // one rank of each stage; rank 5 holds the optimizer shard
    auto tensors = DecodeCkpt(::ckpt::testing::ReadFileOrDie(RankFile(rank)));
    ASSERT_TRUE(tensors.ok()) << tensors.status();
    for (const CkptTensor& t : *tensors) {
      auto it = by_name.find(t.name);
      if (it == by_name.end()) continue;  // verbatim scalars
      const Layout* layout = ResolveLayout(src, t.name, true);
      ASSERT_NE(layout, nullptr);
      auto box = layout->SliceBox(it->second.global_shape, rank % src.devices_per_stage());
      ASSERT_TRUE(box.ok());
      EXPECT_EQ(t.data, SampleSlice(t.name, t.dtype, it->second.global_shape, *box, 1))
          << t.name << " on rank " << rank;
    }
  }
}

TEST_F(CkptctlTest, InspectWholeCheckpointAsText) {
  WriteSample();
  const std::string out = RunOk({"inspect", SampleDir() + "/whole.ckpt"});
  const std::vector<std::string> lines = SplitLines(out);
  const std::vector<SampleTensor> tensors = DemoTensors();
  ASSERT_EQ(lines.size(), tensors.size() + 2 + 2) << out;  // header, tensors, 2 scalars, summary
  EXPECT_THAT(lines[0], ::testing::StartsWith("NAME"));
  int64_t total = 8;  // the two 4-byte scalars
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SampleTensor& t = tensors[i];
    const int64_t bytes = *ByteSizeOf(t.dtype, *NumElements(t.global_shape));
    total += bytes;
    EXPECT_THAT(lines[i + 1], ::testing::StartsWith(t.name + " "));
    EXPECT_THAT(lines[i + 1], HasSubstr(std::string(DTypeName(t.dtype))));
    EXPECT_THAT(lines[i + 1], HasSubstr(ShapeToString(t.global_shape)));
    EXPECT_THAT(lines[i + 1], ::testing::EndsWith(absl::StrCat(" ", FormatBytes(bytes))));
  }
  EXPECT_EQ(lines.back(), absl::StrCat(tensors.size() + 2, " tensors, ", FormatBytes(total)));
}

TEST_F(CkptctlTest, InspectReportsChunkedTensorsAndCrcTrailer) {
  // A tensor larger than the slice size is stored as consecutive Values (MindSpore chunks at
  // 512 MiB; a small slice size exercises the same format).
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  CkptWriterOptions options;
  options.slice_bytes = 400;
  options.crc_trailer = true;
  auto bytes = EncodeCkpt(
      {{"big", DType::kFloat32, {250}, data}, {"small", DType::kInt8, {3}, std::string("abc")}},
      options);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string file = Path("chunked.ckpt");
  WriteFile(file, *bytes);

  const Json j = RunJson({"inspect", file, "--json"});
  ExpectInspectJson(j, file, {{"big", "Float32", {250}, 1000}, {"small", "Int8", {3}, 3}});
  EXPECT_EQ(j.at("tensors")[0].at("chunks"), 3);
  EXPECT_EQ(j.at("tensors")[1].at("chunks"), 1);
  EXPECT_EQ(j.at("crc_trailer"), true);

  const std::string text = RunOk({"inspect", file});
  EXPECT_THAT(text, HasSubstr("(3 chunks)"));
  EXPECT_THAT(text, HasSubstr("crc_num trailer verified"));

  // A flipped content byte must fail the trailer check, as one line naming the file.
  std::string corrupt = *bytes;
  corrupt[corrupt.size() / 2] ^= 0x01;
  WriteFile(Path("flipped.ckpt"), corrupt);
  EXPECT_THAT(RunFails({"inspect", Path("flipped.ckpt")}), HasSubstr("flipped.ckpt"));
}

TEST_F(CkptctlTest, StrategyShowJsonOfBinaryFileIsMindSporeJson) {
  WriteSample();
  const Json j = RunJson({"strategy", "show", SrcStrategy(), "--json"});
  ASSERT_TRUE(j.is_object());
  EXPECT_TRUE(j.contains("current_stage"));
  ASSERT_TRUE(j.contains("parallel_layout_item"));
  // A 2-stage strategy is written in merged form: "<stage>-<name>" keys, the shared embedding once
  // per stage.
  const Json& items = j.at("parallel_layout_item");
  EXPECT_EQ(items.size(), DemoSourceStrategy().params().size() + 1);
  EXPECT_TRUE(items.contains("0-embedding.word_embedding.embedding_table"));
  EXPECT_TRUE(items.contains("1-embedding.word_embedding.embedding_table"));
  for (const auto& [key, item] : items.items()) {
    SCOPED_TRACE(key);
    EXPECT_EQ(item.at("dev_matrix"), Json::array({2, 2}));
    EXPECT_TRUE(item.at("tensor_map").is_array());
  }
  auto reparsed = ParseStrategy(j.dump(), StrategyFormat::kJson);
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(reparsed->params(), DemoSourceStrategy().params());
  EXPECT_EQ(reparsed->stage_count(), 2);
  EXPECT_EQ(reparsed->devices_per_stage(), 4);
}

TEST_F(CkptctlTest, StrategyShowTextListsEveryParameter) {
  WriteSample();
  const std::string out = RunOk({"strategy", "show", SrcStrategy()});
  const std::vector<std::string> lines = SplitLines(out);
  const Strategy src = DemoSourceStrategy();
  ASSERT_EQ(lines.size(), src.params().size() + 1) << out;
  EXPECT_THAT(lines[0], HasSubstr("8 parameters, 4 devices per stage, 2 stage(s), 8 ranks"));
  size_t i = 1;
  for (const auto& [name, param] : src.params()) {
    EXPECT_THAT(lines[i], HasSubstr(name));
    EXPECT_THAT(lines[i], HasSubstr(param.layout.ToString()));
    ++i;
  }

  const std::string dst = RunOk({"strategy", "show", DstStrategy()});
  EXPECT_THAT(dst, HasSubstr("8 parameters, 3 devices per stage, 1 stage(s), 3 ranks"));
}

TEST_F(CkptctlTest, DepsForOneRankIsTheSpecifiedJsonObject) {
  WriteSample();
  auto planner =
      Resharder::CreateFromLayouts(LoadStrategy(SrcStrategy()), LoadStrategy(DstStrategy()));
  ASSERT_TRUE(planner.ok()) << planner.status();
  for (int64_t r = 0; r < planner->dst_world(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    auto expected = planner->SourceRanks(r);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const Json j = RunJson({"deps", "--src-strategy", SrcStrategy(), "--dst-strategy",
                            DstStrategy(), "--rank", absl::StrCat(r), "--json"});
    ASSERT_TRUE(j.is_object()) << j.dump();
    EXPECT_EQ(j.size(), 2u) << j.dump();  // exactly "rank" and "source_ranks"
    EXPECT_EQ(j.at("rank"), r);
    ASSERT_TRUE(j.at("source_ranks").is_array());
    EXPECT_EQ(j.at("source_ranks").get<std::vector<int64_t>>(), *expected);
    EXPECT_FALSE(expected->empty());
  }
}

TEST_F(CkptctlTest, DepsAllIsAListOfRankObjects) {
  WriteSample();
  auto planner =
      Resharder::CreateFromLayouts(LoadStrategy(SrcStrategy()), LoadStrategy(DstStrategy()));
  ASSERT_TRUE(planner.ok()) << planner.status();
  auto expected = planner->AllSourceRanks();
  ASSERT_TRUE(expected.ok()) << expected.status();

  const Json j = RunJson({"deps", "--src-strategy", SrcStrategy(), "--dst-strategy", DstStrategy(),
                          "--all", "--json"});
  ASSERT_TRUE(j.is_array()) << j.dump();
  ASSERT_EQ(j.size(), expected->size());
  for (size_t r = 0; r < j.size(); ++r) {
    ASSERT_TRUE(j[r].is_object());
    EXPECT_EQ(j[r].size(), 2u) << j[r].dump();
    EXPECT_EQ(j[r].at("rank"), r);
    EXPECT_EQ(j[r].at("source_ranks").get<std::vector<int64_t>>(), (*expected)[r]);
  }

  // The text form says the same, one line per rank.
  const std::string text =
      RunOk({"deps", "--src-strategy", SrcStrategy(), "--dst-strategy", DstStrategy(), "--all"});
  std::vector<std::string> want;
  for (size_t r = 0; r < expected->size(); ++r) {
    want.push_back(absl::StrCat("rank ", r, ": ", absl::StrJoin((*expected)[r], " ")));
  }
  EXPECT_EQ(SplitLines(text), want);
}

TEST_F(CkptctlTest, DepsOfIdenticalStrategiesReadsOnlyTheOwnStage) {
  WriteSample();
  const Json j = RunJson({"deps", "--src-strategy", SrcStrategy(), "--dst-strategy", SrcStrategy(),
                          "--all", "--json"});
  ASSERT_TRUE(j.is_array());
  ASSERT_EQ(j.size(), 8u);
  for (size_t r = 0; r < j.size(); ++r) {
    const auto ranks = j[r].at("source_ranks").get<std::vector<int64_t>>();
    ASSERT_FALSE(ranks.empty()) << r;
    for (int64_t s : ranks) EXPECT_EQ(s / 4, static_cast<int64_t>(r / 4)) << "rank " << r;
  }
}

class CkptctlMergeTest : public CkptctlTest {
 protected:
  // Writes the two per-stage files into DIR/stages in `format`; returns their paths.
  std::vector<std::string> WriteStageFiles(StrategyFormat format) {
    const std::string stages = Path("stages");
    fs::create_directories(stages);
    const char* ext = format == StrategyFormat::kJson ? ".json" : ".ckpt";
    std::vector<std::string> paths;
    std::vector<StrategyFile> files;
    for (int32_t stage : {0, 1}) {
      // Rank 0 is stage 0, rank 4 stage 1, as MindSpore names them.
      const std::string path = absl::StrCat(stages, "/strategy_rank_", stage * 4, ext);
      const std::string bytes = SerializeStrategy(StageStrategy(stage), format);
      WriteFile(path, bytes);
      paths.push_back(path);
      files.push_back({path, bytes});
    }
    auto merged = MergeStageStrategies(files);
    EXPECT_TRUE(merged.ok()) << merged.status();
    expected_ = std::make_unique<Strategy>(*std::move(merged));
    return paths;
  }

  static void ExpectMergedParams(const Strategy& s) {
    EXPECT_EQ(s.stage_count(), 2);
    EXPECT_EQ(s.devices_per_stage(), 4);
    ASSERT_EQ(s.params().size(), 4u);
    EXPECT_EQ(s.Find("embedding.weight")->layout.stages, (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(s.Find("layers.0.dense.weight")->layout.stages, (std::vector<int32_t>{0}));
    EXPECT_EQ(s.Find("layers.1.dense.weight")->layout.stages, (std::vector<int32_t>{1}));
    EXPECT_EQ(s.Find("layers.1.dense.weight")->layout.opt_shard_size, 2);
    EXPECT_EQ(s.Find("layers.1.norm.gamma")->layout.stages, (std::vector<int32_t>{1}));
  }

  std::unique_ptr<Strategy> expected_;
};

TEST_F(CkptctlMergeTest, MergesBinaryPerStageFilesToJsonAndBinary) {
  const std::vector<std::string> files = WriteStageFiles(StrategyFormat::kBinary);
  ASSERT_NE(expected_, nullptr);

  // A directory of per-stage files, to JSON.
  const std::string json_out = Path("merged.json");
  EXPECT_EQ(RunOk({"strategy", "merge", Path("stages"), "--out", json_out}),
            absl::StrCat("merged 2 files into ", json_out, ": 4 parameters, 2 stages\n"));
  auto from_json = ParseStrategy(::ckpt::testing::ReadFileOrDie(json_out), StrategyFormat::kJson);
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  EXPECT_EQ(*from_json, *expected_);
  ExpectMergedParams(*from_json);

  // The files named one by one, to binary.
  const std::string bin_out = Path("merged.ckpt");
  RunOk({"strategy", "merge", files[0], files[1], "--out", bin_out});
  auto from_bin = ParseStrategy(::ckpt::testing::ReadFileOrDie(bin_out), StrategyFormat::kBinary);
  ASSERT_TRUE(from_bin.ok()) << from_bin.status();
  EXPECT_EQ(*from_bin, *expected_);

  // `strategy show` and `deps` accept the directory itself and agree with the merged file.
  EXPECT_EQ(RunJson({"strategy", "show", Path("stages"), "--json"}),
            RunJson({"strategy", "show", bin_out, "--json"}));
  EXPECT_EQ(RunOk({"deps", "--src-strategy", Path("stages"), "--dst-strategy", bin_out, "--all"}),
            RunOk({"deps", "--src-strategy", bin_out, "--dst-strategy", bin_out, "--all"}));
}

TEST_F(CkptctlMergeTest, MergesJsonPerStageFilesToBinary) {
  const std::vector<std::string> files = WriteStageFiles(StrategyFormat::kJson);
  ASSERT_NE(expected_, nullptr);
  const std::string out = Path("merged.ckpt");
  RunOk({"strategy", "merge", files[1], files[0], "--out", out});
  auto merged = ParseStrategy(::ckpt::testing::ReadFileOrDie(out), StrategyFormat::kBinary);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->params(), expected_->params());
  ExpectMergedParams(*merged);
}

TEST_F(CkptctlMergeTest, MergeRefusesAMissingStage) {
  const std::vector<std::string> files = WriteStageFiles(StrategyFormat::kBinary);
  const std::string line = RunFails({"strategy", "merge", files[1], "--out", Path("m.json")});
  EXPECT_THAT(line, HasSubstr("stage 0"));
  EXPECT_FALSE(fs::exists(Path("m.json")));
}

TEST_F(CkptctlMergeTest, MergeRefusesMixedFormats) {
  const std::vector<std::string> bin = WriteStageFiles(StrategyFormat::kBinary);
  const std::string json = Path("stage1.json");
  WriteFile(json, SerializeStrategy(StageStrategy(1), StrategyFormat::kJson));
  EXPECT_THAT(RunFails({"strategy", "merge", bin[0], json, "--out", Path("m.json")}),
              HasSubstr("JSON"));
}

// ---- Errors: non-zero exit and exactly one line on stderr naming the problem. ----

TEST_F(CkptctlTest, MissingFilesAreOneLineErrors) {
  const std::string missing = Path("no_such.ckpt");
  EXPECT_THAT(RunFails({"inspect", missing}), HasSubstr(missing));
  EXPECT_THAT(RunFails({"strategy", "show", missing}), HasSubstr(missing));
  EXPECT_THAT(RunFails({"strategy", "merge", missing, "--out", Path("m.json")}),
              HasSubstr(missing));
  WriteSample();
  EXPECT_THAT(
      RunFails({"deps", "--src-strategy", missing, "--dst-strategy", DstStrategy(), "--rank", "0"}),
      HasSubstr(missing));
  EXPECT_THAT(
      RunFails({"deps", "--src-strategy", SrcStrategy(), "--dst-strategy", missing, "--all"}),
      HasSubstr(missing));
}

TEST_F(CkptctlTest, CorruptCheckpointIsAOneLineError) {
  std::mt19937_64 rng(20240611);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(rng());
  const std::string random_file = Path("random.ckpt");
  WriteFile(random_file, noise);
  EXPECT_THAT(RunFails({"inspect", random_file}), HasSubstr(random_file));

  WriteFile(Path("empty.ckpt"), "");
  // An empty file holds no tensors; either a clean empty listing or one clear error is fine,
  // but never a crash or a multi-line error.
  SubprocessResult empty = Run({"inspect", Path("empty.ckpt")});
  if (empty.exit_code != 0) RunFails({"inspect", Path("empty.ckpt")});

  WriteSample();
  const std::string whole = ::ckpt::testing::ReadFileOrDie(SampleDir() + "/whole.ckpt");
  const std::string truncated = Path("truncated.ckpt");
  WriteFile(truncated, whole.substr(0, whole.size() / 2));
  const std::string line = RunFails({"inspect", truncated});
  EXPECT_THAT(line, HasSubstr(truncated));
  EXPECT_THAT(line, HasSubstr("truncated"));
}

TEST_F(CkptctlTest, GarbageStrategyIsAOneLineError) {
  WriteSample();
  const std::string bin = Path("garbage.ckpt");
  WriteFile(bin, "this is not a protobuf \xff\xff\xff\xff");
  const std::string json = Path("garbage.json");
  WriteFile(json, "{\"parallel_layout_item\": ");
  // A .ckpt checkpoint is not a strategy either.
  const std::string checkpoint = RankFile(0);
  for (const std::string& f : {bin, json, checkpoint}) {
    SCOPED_TRACE(f);
    EXPECT_THAT(RunFails({"strategy", "show", f}), HasSubstr(f));
    EXPECT_THAT(RunFails({"deps", "--src-strategy", f, "--dst-strategy", DstStrategy(), "--all"}),
                HasSubstr(f));
    EXPECT_THAT(RunFails({"deps", "--src-strategy", SrcStrategy(), "--dst-strategy", f, "--rank",
                          "0", "--json"}),
                HasSubstr(f));
  }
}

TEST_F(CkptctlTest, DepsRankOutOfRangeIsAOneLineError) {
  WriteSample();
  for (const char* rank : {"3", "-1", "1000000"}) {
    SCOPED_TRACE(rank);
    const std::string line = RunFails(
        {"deps", "--src-strategy", SrcStrategy(), "--dst-strategy", DstStrategy(), "--rank", rank});
    EXPECT_THAT(line, HasSubstr(absl::StrCat("rank ", rank)));
    EXPECT_THAT(line, HasSubstr("3 ranks"));
  }
}

TEST_F(CkptctlTest, DepsNeedsExactlyOneOfRankAndAll) {
  WriteSample();
  const std::vector<std::string> base = {"deps", "--src-strategy", SrcStrategy(), "--dst-strategy",
                                         DstStrategy()};
  std::string neither = RunFails(base);
  EXPECT_THAT(neither, HasSubstr("--rank"));
  EXPECT_THAT(neither, HasSubstr("--all"));

  std::vector<std::string> both = base;
  both.insert(both.end(), {"--rank", "0", "--all"});
  const std::string line = RunFails(both);
  EXPECT_THAT(line, HasSubstr("--rank"));
  EXPECT_THAT(line, HasSubstr("--all"));
}

TEST_F(CkptctlTest, UsageErrorsAreOneLine) {
  EXPECT_THAT(RunFails({}), ::testing::Not(::testing::IsEmpty()));
  RunFails({"no-such-command"});
  EXPECT_THAT(RunFails({"inspect"}), HasSubstr("FILE"));
  EXPECT_THAT(RunFails({"deps", "--dst-strategy", "x", "--all"}), HasSubstr("--src-strategy"));
  EXPECT_THAT(RunFails({"deps", "--src-strategy", "x", "--dst-strategy", "y", "--rank", "zero"}),
              HasSubstr("zero"));
}

// The strategy to re-shard to is --dst-strategy for every command that takes one, with no other
// spelling; upload's --strategy names the checkpoint's own (source) strategy. All checked before
// any server is contacted.
TEST_F(CkptctlTest, DestinationStrategyIsDstStrategyEverywhere) {
  // Complete commands but for one more option, --strategy: refused by name.
  const std::vector<std::vector<std::string>> with_strategy = {
      {"fetch", "c", "--dst-strategy", "d", "--rank", "0", "--out", "x.ckpt", "--strategy", "d"},
      {"deps", "c", "--dst-strategy", "d", "--all", "--strategy", "d"},
      {"export", "c", "--dst-strategy", "d", "--dir", "x", "--strategy", "d"},
      {"transform", "c", "--dst-strategy", "d", "--as", "c2", "--strategy", "d"}};
  for (const std::vector<std::string>& args : with_strategy) {
    SCOPED_TRACE(args[0]);
    EXPECT_THAT(RunFails(args), HasSubstr("--strategy"));
    const std::string help = absl::AsciiStrToLower(RunOk({args[0], "--help"}));
    EXPECT_THAT(help, HasSubstr("--dst-strategy"));
    EXPECT_THAT(help, HasSubstr("destination strategy"));
  }
  const std::string upload_help = RunOk({"upload", "--help"});
  EXPECT_THAT(upload_help, HasSubstr("--strategy"));
  EXPECT_THAT(upload_help, HasSubstr("source strategy"));
  EXPECT_THAT(upload_help, ::testing::Not(HasSubstr("--dst-strategy")));
  EXPECT_THAT(RunFails({"deps", "c", "--src-strategy", "x", "--dst-strategy", "y", "--all"}),
              HasSubstr("not both"));
  EXPECT_THAT(RunFails({"deps", "--all"}), HasSubstr("CKPT --dst-strategy NAME"));
}

}  // namespace
}  // namespace ckpt
