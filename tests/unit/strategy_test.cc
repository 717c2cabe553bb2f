#include "core/strategy.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "mindspore_strategy.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"

namespace ckpt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kFixture[] = "strategy_8_npus.ckpt";
constexpr char kFixtureListing[] = "strategy_8_npus.layouts.txt";

// Asserts `status` has `code` and a message containing every one of `parts`.
void ExpectError(const absl::Status& status, absl::StatusCode code,
                 std::initializer_list<std::string> parts) {
  EXPECT_EQ(status.code(), code) << status;
  for (const std::string& part : parts) {
    EXPECT_THAT(std::string(status.message()), HasSubstr(part));
  }
}

// ---------------------------------------------------------------------------------------------
// A protobuf wire writer, independent of the generated classes, so that the tests check our
// codec against the wire format itself (and can write packed fields, which MindSpore does not).
class Wire {
 public:
  Wire& Varint(int field, int64_t value) {
    Tag(field, 0);
    PutVarint(static_cast<uint64_t>(value));  // negative int32/int64: 10-byte two's complement
    return *this;
  }
  Wire& Bytes(int field, std::string_view bytes) {
    Tag(field, 2);
    PutVarint(bytes.size());
    out_.append(bytes);
    return *this;
  }
  Wire& Message(int field, const Wire& message) { return Bytes(field, message.str()); }
  // A repeated varint field, one tag per value (MindSpore's form) or packed.
  Wire& Repeated(int field, const std::vector<int64_t>& values, bool packed) {
    if (!packed) {
      for (int64_t v : values) Varint(field, v);
      return *this;
    }
    Wire body;
    for (int64_t v : values) body.PutVarint(static_cast<uint64_t>(v));
    return Bytes(field, body.str());
  }
  const std::string& str() const { return out_; }

 private:
  void Tag(int field, int wire_type) { PutVarint((static_cast<uint64_t>(field) << 3) | wire_type); }
  void PutVarint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  std::string out_;
};

// One message holding `dim` (field 1): DevMatrix, TensorMap, ParallelStrategy...
Wire DimsMsg(const std::vector<int64_t>& dims, bool packed = false) {
  return Wire().Repeated(1, dims, packed);
}

// ParallelLayouts exactly as MindSpore writes it: one TensorMap per entry of
// `maps`, empty param_split_shape/indices_offset, fields 5-7 explicit.
Wire LayoutsMsg(const std::vector<int64_t>& dev, const std::vector<std::vector<int64_t>>& maps,
                bool packed = false, int64_t opt_step = 0, int64_t opt_size = 0) {
  Wire w;
  w.Message(1, DimsMsg(dev, packed));
  for (const auto& map : maps) w.Message(2, DimsMsg(map, packed));
  w.Message(3, Wire()).Message(4, Wire());
  w.Varint(5, 0).Varint(6, opt_step).Varint(7, opt_size);
  return w;
}

Wire LayoutItemMsg(std::string_view name, const Wire& layouts) {
  return Wire().Bytes(1, name).Message(2, layouts);
}

Wire OpItemMsg(std::string_view node, int64_t stage,
               const std::vector<std::vector<int64_t>>& inputs, bool packed = false) {
  Wire strategys;
  strategys.Varint(1, stage);
  for (const auto& input : inputs) strategys.Message(2, DimsMsg(input, packed));
  return Wire().Bytes(1, node).Message(2, strategys);
}

std::string StrategyMapBytes(int64_t current_stage, const std::vector<Wire>& ops,
                             const std::vector<Wire>& items) {
  Wire w;
  w.Varint(1, current_stage);
  for (const Wire& op : ops) w.Message(2, op);
  for (const Wire& item : items) w.Message(3, item);
  return w.str();
}

// A single-map (plain) layout item, MindSpore style.
Wire PlainItem(std::string_view name, const std::vector<int64_t>& dev,
               const std::vector<int64_t>& map) {
  return LayoutItemMsg(name, LayoutsMsg(dev, {map}));
}

std::string Bytes(std::initializer_list<uint8_t> bytes) {
  return std::string(bytes.begin(), bytes.end());
}

Layout MakeLayout(std::vector<int64_t> dev, std::vector<std::vector<int32_t>> map,
                  std::vector<int32_t> stages = {0}) {
  Layout layout;
  layout.dev_matrix = std::move(dev);
  layout.tensor_map = std::move(map);
  layout.stages = std::move(stages);
  return layout;
}

StrategyParam Param(Layout layout, std::optional<Shape> shape = std::nullopt) {
  return StrategyParam{std::move(layout), std::move(shape)};
}

// The parameter `name` of `s`; a test failure (not a crash) when absent.
const StrategyParam& ParamOf(const Strategy& s, std::string_view name) {
  static const StrategyParam kMissing;
  const StrategyParam* p = s.Find(name);
  if (p == nullptr) ADD_FAILURE() << "parameter " << name << " not in strategy";
  return p != nullptr ? *p : kMissing;
}

Strategy ParseOrDie(std::string_view bytes, StrategyFormat format) {
  absl::StatusOr<Strategy> s = ParseStrategy(bytes, format);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : Strategy();
}

// Serialise in `format`, parse back, and expect the identical Strategy.
void ExpectRoundTrip(const Strategy& strategy, StrategyFormat format) {
  const std::string bytes = SerializeStrategy(strategy, format);
  absl::StatusOr<Strategy> back = ParseStrategy(bytes, format);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << bytes;
  EXPECT_TRUE(*back == strategy) << (format == StrategyFormat::kJson ? bytes : "binary");
}

// ---------------------------------------------------------------------------------------------
// The real MindSpore fixture: a merged 2-stage GPT2 strategy.

// "[2, 2]" -> {2, 2}.
std::vector<int64_t> ParseIntList(std::string_view text) {
  std::vector<int64_t> out;
  std::string cleaned(text);
  for (char& c : cleaned) {
    if (c == '[' || c == ']' || c == ',') c = ' ';
  }
  std::istringstream in(cleaned);
  int64_t v;
  while (in >> v) out.push_back(v);
  return out;
}

// "[[0, -1], [1]]" -> {{0, -1}, {1}}.
std::vector<std::vector<int64_t>> ParseListOfIntLists(std::string_view text) {
  std::vector<std::vector<int64_t>> out;
  size_t pos = text.find('[');
  while ((pos = text.find('[', pos + 1)) != std::string_view::npos) {
    const size_t end = text.find(']', pos);
    out.push_back(ParseIntList(text.substr(pos, end - pos + 1)));
    pos = end;
  }
  return out;
}

struct ListedLayout {
  int32_t stage;
  std::string name;
  std::vector<int64_t> dev_matrix;
  std::vector<std::vector<int64_t>> tensor_maps;  // one per TensorMap entry
};

// strategy_8_npus.layouts.txt: "<stage>-<name> [dev, ...] [[map, ...], ...]" per layout item.
std::vector<ListedLayout> ParseListing(const std::string& text) {
  std::vector<ListedLayout> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const size_t space = line.find(' ');
    const size_t dash = line.find('-');
    const size_t dev_end = line.find(']', space);
    ListedLayout listed;
    listed.stage = std::stoi(line.substr(0, dash));
    listed.name = line.substr(dash + 1, space - dash - 1);
    listed.dev_matrix = ParseIntList(std::string_view(line).substr(space, dev_end - space + 1));
    listed.tensor_maps = ParseListOfIntLists(std::string_view(line).substr(dev_end + 1));
    out.push_back(std::move(listed));
  }
  return out;
}

TEST(StrategyFixtureTest, ReadsEveryLayoutItemOfTheMergedPipelineFile) {
  CKPT_REQUIRE_FIXTURE(bytes, kFixture);
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);

  // 148 items: 72 of stage 0, 76 of stage 1; 4 names are in both stages (the shared word
  // embedding and its three optimizer states) and collapse into one parameter each.
  size_t items = 0;
  std::map<int32_t, size_t> per_stage;
  for (const auto& [name, param] : s.params()) {
    items += param.layout.stages.size();
    for (int32_t stage : param.layout.stages) ++per_stage[stage];
  }
  EXPECT_EQ(items, 148u);
  EXPECT_EQ(s.params().size(), 144u);
  EXPECT_EQ(per_stage, (std::map<int32_t, size_t>{{0, 72}, {1, 76}}));
  EXPECT_EQ(s.stage_count(), 2);
  EXPECT_EQ(s.devices_per_stage(), 4);
  EXPECT_EQ(s.world_size(), 8);
  EXPECT_TRUE(s.stage_prefixed_names());

  for (const char* name : {"backbone.embedding.word_embedding.embedding_table",
                           "adam_m.backbone.embedding.word_embedding.embedding_table",
                           "adam_v.backbone.embedding.word_embedding.embedding_table",
                           "accu_grads.backbone.embedding.word_embedding.embedding_table"}) {
    const StrategyParam* p = s.Find(name);
    ASSERT_NE(p, nullptr) << name;
    EXPECT_THAT(p->layout.stages, ElementsAre(0, 1)) << name;
    EXPECT_FALSE(p->tensor_shape.has_value());  // binary files do not record it
  }
  const StrategyParam* position = s.Find("backbone.embedding.position_embedding.embedding_table");
  ASSERT_NE(position, nullptr);
  EXPECT_THAT(position->layout.stages, ElementsAre(0));
  EXPECT_EQ(s.Find("1-backbone.layernorm.gamma"), nullptr);  // prefixes are stripped
  ASSERT_NE(s.Find("backbone.layernorm.gamma"), nullptr);
  EXPECT_THAT(ParamOf(s, "backbone.layernorm.gamma").layout.stages, ElementsAre(1));

  // The 34 operator items are kept in file order: the stage-1 file was merged first.
  ASSERT_EQ(s.ops().size(), 34u);
  EXPECT_EQ(s.ops()[0].node_name, "Receive_backbone.blocks.1.attention.projection.weight");
  EXPECT_EQ(s.ops()[0].stage, 1);
  EXPECT_EQ(s.ops()[0].inputs, (std::vector<std::vector<uint32_t>>{{2, 1}, {2, 1}}));
  EXPECT_EQ(s.ops().back().stage, 0);
}

TEST(StrategyFixtureTest, EveryLayoutItemMatchesTheDecodedListing) {
  CKPT_REQUIRE_FIXTURE(bytes, kFixture);
  CKPT_REQUIRE_FIXTURE(listing_text, kFixtureListing);
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  const std::vector<ListedLayout> listing = ParseListing(listing_text);
  ASSERT_EQ(listing.size(), 148u);

  std::set<std::pair<int32_t, std::string>> listed_items;
  for (const ListedLayout& listed : listing) {
    SCOPED_TRACE(absl::StrCat(listed.stage, "-", listed.name));
    listed_items.insert({listed.stage, listed.name});
    const StrategyParam* p = s.Find(listed.name);
    ASSERT_NE(p, nullptr);
    const Layout& layout = p->layout;
    EXPECT_THAT(layout.stages, ::testing::Contains(listed.stage));
    EXPECT_EQ(layout.dev_matrix, listed.dev_matrix);
    ASSERT_EQ(listed.tensor_maps.size(), 1u);  // the fixture has no nested maps
    std::vector<std::vector<int32_t>> expected_map;
    for (int64_t m : listed.tensor_maps[0]) {
      expected_map.push_back(m == -1 ? std::vector<int32_t>{} : std::vector<int32_t>{int32_t(m)});
    }
    EXPECT_EQ(layout.tensor_map, expected_map);
    EXPECT_FALSE(layout.nested_form);
    EXPECT_EQ(layout.opt_shard_step, 0);
    EXPECT_EQ(layout.opt_shard_size, 0);
    EXPECT_EQ(layout.field, 0);
    EXPECT_TRUE(layout.param_split_shape.empty());
    EXPECT_TRUE(layout.indices_offset.empty());
  }
  // ...and nothing else: the parsed (stage, name) pairs are exactly the listed ones.
  std::set<std::pair<int32_t, std::string>> parsed_items;
  for (const auto& [name, param] : s.params()) {
    for (int32_t stage : param.layout.stages) parsed_items.insert({stage, name});
  }
  EXPECT_EQ(parsed_items, listed_items);
}

TEST(StrategyFixtureTest, ReserialisedFixtureParsesToTheSameStrategy) {
  CKPT_REQUIRE_FIXTURE(bytes, kFixture);
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  ExpectRoundTrip(s, StrategyFormat::kBinary);
  ExpectRoundTrip(s, StrategyFormat::kJson);
  // Same number of layout items (one per stage of each parameter) and the same size: only the
  // item order differs from MindSpore's output.
  const std::string again = SerializeStrategy(s, StrategyFormat::kBinary);
  EXPECT_EQ(again.size(), bytes.size());
}

TEST(StrategyFixtureTest, WritesLayoutItemsByteForByteAsMindSpore) {
  CKPT_REQUIRE_FIXTURE(bytes, kFixture);
  // One item of the fixture as MindSpore wrote it: unpacked fields, -1 as a 10-byte varint, empty
  // param_split_shape/indices_offset sub-messages, explicit zeros in fields 5-7.
  const std::string item =
      Bytes({0x1a, 0x4e, 0x0a, 0x2b}) + "0-backbone.blocks.0.attention.dense2.weight" +
      Bytes({0x12, 0x1f, 0x0a, 0x04, 0x08, 0x02, 0x08, 0x02, 0x12, 0x0d, 0x08,
             0x00, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
             0x01, 0x1a, 0x00, 0x22, 0x00, 0x28, 0x00, 0x30, 0x00, 0x38, 0x00});
  ASSERT_NE(bytes.find(item), std::string::npos) << "fixture does not hold the quoted item";
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  const std::string ours = SerializeStrategy(s, StrategyFormat::kBinary);
  EXPECT_NE(ours.find(item), std::string::npos);
  EXPECT_EQ(ours.substr(0, 2), Bytes({0x08, 0x01}));  // current_stage 1, as merged files have
}

// ---------------------------------------------------------------------------------------------
// Binary form, hand-built files.

TEST(StrategyBinaryTest, UnprefixedFileIsOneStage) {
  const std::string bytes =
      StrategyMapBytes(3, {OpItemMsg("MatMul_w", 3, {{2, 4}, {4, 1}})},
                       {PlainItem("w", {2, 4}, {1, -1}), PlainItem("b", {2, 4}, {-1}),
                        PlainItem("scalar", {2, 4}, {})});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  EXPECT_EQ(s.stage_count(), 1);
  EXPECT_EQ(s.devices_per_stage(), 8);
  EXPECT_FALSE(s.stage_prefixed_names());
  ASSERT_EQ(s.params().size(), 3u);
  EXPECT_EQ(ParamOf(s, "w").layout, MakeLayout({2, 4}, {{1}, {}}));
  EXPECT_EQ(ParamOf(s, "b").layout, MakeLayout({2, 4}, {{}}));
  EXPECT_EQ(ParamOf(s, "scalar").layout, MakeLayout({2, 4}, {}));
  // A per-rank file of a pipelined job: the op stage is kept, the layouts are stage 0 of this file.
  ASSERT_EQ(s.ops().size(), 1u);
  EXPECT_EQ(s.ops()[0], (OpStrategy{"MatMul_w", 3, {{2, 4}, {4, 1}}}));
  ExpectRoundTrip(s, StrategyFormat::kBinary);
  ExpectRoundTrip(s, StrategyFormat::kJson);
}

TEST(StrategyBinaryTest, AcceptsPackedRepeatedFields) {
  const auto build = [](bool packed) {
    return StrategyMapBytes(
        0, {OpItemMsg("MatMul_w", 0, {{2, 4}, {4, 1}}, packed)},
        // Parameters in name order, as our writer emits them, for the byte comparison below.
        {LayoutItemMsg("v", LayoutsMsg({2, 2, 2}, {{2, 1}, {-1}}, packed)),
         LayoutItemMsg("w", LayoutsMsg({2, 4}, {{1, -1}}, packed))});
  };
  const std::string unpacked = build(false);
  const std::string packed = build(true);
  ASSERT_NE(packed, unpacked);
  const Strategy from_unpacked = ParseOrDie(unpacked, StrategyFormat::kBinary);
  const Strategy from_packed = ParseOrDie(packed, StrategyFormat::kBinary);
  EXPECT_EQ(ParamOf(from_packed, "w").layout, MakeLayout({2, 4}, {{1}, {}}));
  EXPECT_EQ(ParamOf(from_packed, "v").layout.tensor_map,
            (std::vector<std::vector<int32_t>>{{2, 1}, {}}));
  EXPECT_TRUE(from_packed == from_unpacked);
  // Export always writes MindSpore's unpacked form.
  EXPECT_EQ(SerializeStrategy(from_packed, StrategyFormat::kBinary), unpacked);
}

TEST(StrategyBinaryTest, ReadsOptimizerShardAndDefaultsMissingFieldsToZero) {
  Wire bare;  // only fields 1 and 2, as older writers produce
  bare.Message(1, DimsMsg({4, 2})).Message(2, DimsMsg({0, -1}));
  const std::string bytes =
      StrategyMapBytes(0, {},
                       {LayoutItemMsg("bare", bare),
                        LayoutItemMsg("sharded", LayoutsMsg({4, 2}, {{0, -1}}, false, 2, -1))});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  const Layout& b = ParamOf(s, "bare").layout;
  EXPECT_EQ(b.opt_shard_step, 0);
  EXPECT_EQ(b.opt_shard_size, 0);
  EXPECT_EQ(b.field, 0);
  const Layout& sharded = ParamOf(s, "sharded").layout;
  EXPECT_EQ(sharded.opt_shard_step, 2);
  EXPECT_EQ(sharded.opt_shard_size, -1);
  ExpectRoundTrip(s, StrategyFormat::kBinary);
  ExpectRoundTrip(s, StrategyFormat::kJson);
}

TEST(StrategyBinaryTest, NestedTensorMapsOnePerDim) {
  // dim 0 split over axes 2 and 1 (dev_matrix[0] and [1]), dim 1 unsplit.
  const std::string bytes =
      StrategyMapBytes(0, {},
                       {// Nested form with one axis per dim is kept as written.
                        LayoutItemMsg("v", LayoutsMsg({2, 2, 2}, {{0}, {-1}})),
                        LayoutItemMsg("w", LayoutsMsg({2, 2, 2}, {{2, 1}, {-1}}))});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  const Layout& w = ParamOf(s, "w").layout;
  EXPECT_TRUE(w.nested_form);
  EXPECT_EQ(w.tensor_map, (std::vector<std::vector<int32_t>>{{2, 1}, {}}));
  const Layout& v = ParamOf(s, "v").layout;
  EXPECT_TRUE(v.nested_form);
  EXPECT_EQ(v.tensor_map, (std::vector<std::vector<int32_t>>{{0}, {}}));
  // Our writer reproduces MindSpore's bytes exactly.
  EXPECT_EQ(SerializeStrategy(s, StrategyFormat::kBinary), bytes);
  ExpectRoundTrip(s, StrategyFormat::kJson);
}

TEST(StrategyBinaryTest, NestedOneDimTensorDropsTheExtraEmptyMap) {
  const std::string bytes =
      StrategyMapBytes(0, {}, {LayoutItemMsg("bias", LayoutsMsg({2, 2}, {{1, 0}, {}}))});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  const Layout& bias = ParamOf(s, "bias").layout;
  EXPECT_TRUE(bias.nested_form);
  EXPECT_EQ(bias.tensor_map, (std::vector<std::vector<int32_t>>{{1, 0}}));
  // The marker is written back, so the item stays recognisably nested.
  EXPECT_EQ(SerializeStrategy(s, StrategyFormat::kBinary), bytes);
  ExpectRoundTrip(s, StrategyFormat::kJson);
}

TEST(StrategyBinaryTest, RejectsMalformedTensorMaps) {
  const auto parse_map = [](std::vector<std::vector<int64_t>> maps) {
    return ParseStrategy(StrategyMapBytes(0, {}, {LayoutItemMsg("w", LayoutsMsg({2, 2, 2}, maps))}),
                         StrategyFormat::kBinary)
        .status();
  };
  ExpectError(parse_map({{-2, 0}}), absl::StatusCode::kInvalidArgument,
              {"parameter w: tensor_map entry -2 is invalid"});
  ExpectError(parse_map({{0}, {}, {1}}), absl::StatusCode::kInvalidArgument,
              {"parameter w: nested tensor_map dim 1 is empty"});
  ExpectError(parse_map({{0, -1}, {1}}), absl::StatusCode::kInvalidArgument,
              {"parameter w: nested tensor_map dim 0", "is invalid"});
  ExpectError(parse_map({}), absl::StatusCode::kInvalidArgument,
              {"parameter w: has no tensor_map entry"});
  // Axis outside the dev_matrix: caught by Layout::ValidateStructure, named by Create.
  ExpectError(parse_map({{7, -1}}), absl::StatusCode::kInvalidArgument, {"parameter w: "});
}

TEST(StrategyBinaryTest, RequiresExactlyOneDevMatrix) {
  for (int count : {0, 2}) {
    Wire layouts;
    for (int i = 0; i < count; ++i) layouts.Message(1, DimsMsg({2, 2}));
    layouts.Message(2, DimsMsg({0, -1}));
    ExpectError(
        ParseStrategy(StrategyMapBytes(0, {}, {LayoutItemMsg("w", layouts)}),
                      StrategyFormat::kBinary)
            .status(),
        absl::StatusCode::kInvalidArgument,
        {absl::StrCat("parameter w: expected exactly one dev_matrix entry, found ", count)});
  }
}

TEST(StrategyBinaryTest, RejectsSeveralParamSplitShapeEntries) {
  Wire layouts;
  layouts.Message(1, DimsMsg({2, 2})).Message(2, DimsMsg({0, -1}));
  layouts.Message(3, Wire()).Message(3, Wire()).Message(4, Wire());
  ExpectError(
      ParseStrategy(StrategyMapBytes(0, {}, {LayoutItemMsg("w", layouts)}), StrategyFormat::kBinary)
          .status(),
      absl::StatusCode::kInvalidArgument,
      {"parameter w: expected at most one param_split_shape", "found 2 and 1"});
}

TEST(StrategyBinaryTest, UnsupportedFeaturesAreReportedWithTheParameter) {
  Wire layouts;
  layouts.Message(1, DimsMsg({2, 2})).Message(2, DimsMsg({0, -1}));
  layouts.Message(3, DimsMsg({4, 4})).Message(4, Wire()).Varint(5, 0);
  const absl::Status status =
      ParseStrategy(StrategyMapBytes(0, {}, {LayoutItemMsg("uneven", layouts)}),
                    StrategyFormat::kBinary)
          .status();
  EXPECT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("parameter uneven: "));
  EXPECT_THAT(std::string(status.message()), HasSubstr("param_split_shape"));
}

TEST(StrategyBinaryTest, RejectsEmptyAndGarbageInput) {
  ExpectError(ParseStrategy("", StrategyFormat::kBinary).status(),
              absl::StatusCode::kInvalidArgument, {"strategy has no parallel_layout_item"});
  // A valid message with operator items but no layouts is just as empty for us.
  ExpectError(ParseStrategy(StrategyMapBytes(1, {OpItemMsg("Add_x", 0, {{1}})}, {}),
                            StrategyFormat::kBinary)
                  .status(),
              absl::StatusCode::kInvalidArgument, {"strategy has no parallel_layout_item"});
  for (const std::string& garbage :
       {std::string("definitely not a strategy"), Bytes({0xff, 0xff, 0xff, 0xff}),
        // A valid file cut in the middle of a layout item.
        StrategyMapBytes(0, {}, {PlainItem("w", {2, 2}, {0, -1})}).substr(0, 12)}) {
    ExpectError(ParseStrategy(garbage, StrategyFormat::kBinary).status(),
                absl::StatusCode::kInvalidArgument, {"not a MindSpore ParallelStrategyMap"});
  }
  // Well-formed protobuf lacking required fields (no param_name, no current_stage).
  ExpectError(ParseStrategy(Wire().Message(3, Wire().Message(2, LayoutsMsg({2}, {{0}}))).str(),
                            StrategyFormat::kBinary)
                  .status(),
              absl::StatusCode::kInvalidArgument,
              {"not a MindSpore ParallelStrategyMap: required fields are missing"});
}

TEST(StrategyBinaryTest, DeviceCountMismatchBlamesTheOddLayoutOut) {
  // "b" sorts first but is the odd one: the majority decides which layout is wrong.
  const std::string bytes = StrategyMapBytes(
      0, {},
      {PlainItem("w", {2, 4}, {1, -1}), PlainItem("b", {2, 2}, {-1}), PlainItem("c", {8}, {0})});
  ExpectError(ParseStrategy(bytes, StrategyFormat::kBinary).status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter b: dev_matrix [2, 2] has 4 devices but the strategy's other layouts "
               "have 8"});
}

TEST(StrategyBinaryTest, RejectsOperatorStageBeyondInt32) {
  const std::string bytes =
      StrategyMapBytes(0, {OpItemMsg("Add_x", int64_t{1} << 31, {})}, {PlainItem("w", {2}, {0})});
  ExpectError(ParseStrategy(bytes, StrategyFormat::kBinary).status(),
              absl::StatusCode::kInvalidArgument,
              {"operator Add_x: pipeline stage 2147483648 is out of range"});
}

// ---------------------------------------------------------------------------------------------
// Merged pipeline files ("<stage>-<name>", as merge_pipeline_strategys writes them).

TEST(StrategyMergedFileTest, SplitsNamesOnTheFirstDashOnly) {
  const std::string bytes = StrategyMapBytes(
      1, {},
      {PlainItem("1-model.layer-norm.gamma", {2, 2}, {-1}), PlainItem("1-a-b-c", {2, 2}, {0, -1}),
       PlainItem("0-model.layer-norm.gamma", {2, 2}, {-1}), PlainItem("0-w", {2, 2}, {-1, 0})});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  EXPECT_EQ(s.stage_count(), 2);
  EXPECT_TRUE(s.stage_prefixed_names());
  ASSERT_EQ(s.params().size(), 3u);
  ASSERT_NE(s.Find("model.layer-norm.gamma"), nullptr);
  EXPECT_THAT(ParamOf(s, "model.layer-norm.gamma").layout.stages, ElementsAre(0, 1));
  ASSERT_NE(s.Find("a-b-c"), nullptr);
  EXPECT_THAT(ParamOf(s, "a-b-c").layout.stages, ElementsAre(1));
  EXPECT_THAT(ParamOf(s, "w").layout.stages, ElementsAre(0));
  ExpectRoundTrip(s, StrategyFormat::kBinary);
  ExpectRoundTrip(s, StrategyFormat::kJson);
}

TEST(StrategyMergedFileTest, OneUnprefixedNameMakesTheFileSingleStage) {
  const std::string bytes =
      StrategyMapBytes(0, {},
                       {PlainItem("2-x", {2}, {0}), PlainItem("layer-1.w", {2}, {-1}),
                        PlainItem("plain", {2}, {-1})});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  EXPECT_EQ(s.stage_count(), 1);
  EXPECT_FALSE(s.stage_prefixed_names());
  EXPECT_NE(s.Find("2-x"), nullptr);
  EXPECT_NE(s.Find("layer-1.w"), nullptr);
  EXPECT_EQ(s.Find("x"), nullptr);
}

TEST(StrategyMergedFileTest, SingleStageMergedFileKeepsItsPrefixes) {
  const std::string bytes = StrategyMapBytes(1, {}, {PlainItem("0-w", {2}, {0})});
  const Strategy s = ParseOrDie(bytes, StrategyFormat::kBinary);
  EXPECT_EQ(s.stage_count(), 1);
  EXPECT_TRUE(s.stage_prefixed_names());
  EXPECT_NE(s.Find("w"), nullptr);
  EXPECT_EQ(SerializeStrategy(s, StrategyFormat::kBinary), bytes);
}

TEST(StrategyMergedFileTest, RejectsDifferentLayoutsOfASharedParameter) {
  const std::string bytes = StrategyMapBytes(
      1, {}, {PlainItem("0-emb", {2, 2}, {0, -1}), PlainItem("1-emb", {2, 2}, {-1, 0})});
  ExpectError(ParseStrategy(bytes, StrategyFormat::kBinary).status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter emb: pipeline stage 0 has", "but stage 1 has", "[0, -1]", "[-1, 0]"});
}

TEST(StrategyMergedFileTest, RepeatedItemOfOneStage) {
  // Identical repeats are harmless; different ones are ambiguous.
  const Strategy s =
      ParseOrDie(StrategyMapBytes(1, {}, {PlainItem("0-w", {2}, {0}), PlainItem("0-w", {2}, {0})}),
                 StrategyFormat::kBinary);
  EXPECT_THAT(ParamOf(s, "w").layout.stages, ElementsAre(0));
  ExpectError(ParseStrategy(StrategyMapBytes(
                                1, {}, {PlainItem("0-w", {2}, {0}), PlainItem("0-w", {2}, {-1})}),
                            StrategyFormat::kBinary)
                  .status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter w appears twice in pipeline stage 0 with different layouts"});
}

TEST(StrategyMergedFileTest, RejectsAMissingStage) {
  const std::string bytes =
      StrategyMapBytes(1, {}, {PlainItem("0-a", {2}, {0}), PlainItem("2-b", {2}, {0})});
  ExpectError(ParseStrategy(bytes, StrategyFormat::kBinary).status(),
              absl::StatusCode::kInvalidArgument, {"strategy is missing pipeline stage 1"});
}

TEST(StrategyMergedFileTest, RejectsStagePrefixesOutOfRange) {
  for (const char* key : {"99999999999-a", "2147483647-a"}) {
    const std::string bytes = StrategyMapBytes(1, {}, {PlainItem(key, {2}, {0})});
    ExpectError(ParseStrategy(bytes, StrategyFormat::kBinary).status(),
                absl::StatusCode::kInvalidArgument,
                {absl::StrCat("parameter ", key, ": pipeline stage prefix"), "is out of range"});
  }
}

// ---------------------------------------------------------------------------------------------
// Strategy::Create.

TEST(StrategyCreateTest, BuildsAValidStrategy) {
  std::map<std::string, StrategyParam> params;
  params["w"] = Param(MakeLayout({2, 4}, {{1}, {}}, {0, 1}), Shape{32, 32});
  params["b"] = Param(MakeLayout({8}, {{0}}, {1}));
  absl::StatusOr<Strategy> s = Strategy::Create(params, 2, {{"MatMul_w", 1, {{2, 1}}}});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->devices_per_stage(), 8);
  EXPECT_EQ(s->stage_count(), 2);
  EXPECT_EQ(s->world_size(), 16);
  ASSERT_NE(s->Find("w"), nullptr);
  EXPECT_EQ(ParamOf(*s, "w"), params["w"]);
  EXPECT_EQ(s->Find("nope"), nullptr);
  EXPECT_EQ(s->ops().size(), 1u);
}

TEST(StrategyCreateTest, NormalisesRepresentationFlagsSoEveryStrategyRoundTrips) {
  std::map<std::string, StrategyParam> params;
  params["multi_axis"] = Param(MakeLayout({2, 2, 2}, {{2, 1}, {}}, {0, 1}), Shape{8, 4});
  Layout scalar = MakeLayout({2, 2, 2}, {}, {1});
  scalar.nested_form = true;  // a 0-D tensor has no dims to nest
  params["scalar"] = Param(scalar, Shape{});
  absl::StatusOr<Strategy> s = Strategy::Create(params, 2, {}, /*stage_prefixed_names=*/false);
  ASSERT_TRUE(s.ok()) << s.status();
  // Two stages can only be written with "<stage>-" names; several axes need the nested form.
  EXPECT_TRUE(s->stage_prefixed_names());
  EXPECT_TRUE(ParamOf(*s, "multi_axis").layout.nested_form);
  EXPECT_FALSE(ParamOf(*s, "scalar").layout.nested_form);
  // Both keep tensor_shape (the binary form in ckptd's own field), with and without shapes.
  ExpectRoundTrip(*s, StrategyFormat::kJson);
  ExpectRoundTrip(*s, StrategyFormat::kBinary);
  std::map<std::string, StrategyParam> no_shapes = s->params();
  for (auto& [name, param] : no_shapes) param.tensor_shape.reset();
  absl::StatusOr<Strategy> shapeless = Strategy::Create(no_shapes, 2);
  ASSERT_TRUE(shapeless.ok()) << shapeless.status();
  ExpectRoundTrip(*shapeless, StrategyFormat::kBinary);
  ExpectRoundTrip(*shapeless, StrategyFormat::kJson);
  // Without shapes the binary form is exactly MindSpore's: no field of ckptd's own.
  ms::ParallelStrategyMap written;
  ASSERT_TRUE(written.ParseFromString(SerializeStrategy(*shapeless, StrategyFormat::kBinary)));
  for (const ms::ParallelLayoutItem& item : written.parallel_layout_item()) {
    EXPECT_FALSE(item.parallel_layouts().has_ckptd_tensor_shape());
  }
  ASSERT_TRUE(written.ParseFromString(SerializeStrategy(*s, StrategyFormat::kBinary)));
  ASSERT_GT(written.parallel_layout_item_size(), 0);
  for (const ms::ParallelLayoutItem& item : written.parallel_layout_item()) {
    EXPECT_TRUE(item.parallel_layouts().has_ckptd_tensor_shape()) << item.param_name();
  }
}

TEST(StrategyCreateTest, RejectsInvalidStrategies) {
  const auto one = [](Layout layout, std::optional<Shape> shape = std::nullopt) {
    std::map<std::string, StrategyParam> params;
    params["w"] = Param(std::move(layout), std::move(shape));
    return params;
  };
  const Layout ok = MakeLayout({2, 2}, {{0}, {}});
  ExpectError(Strategy::Create({}, 1).status(), absl::StatusCode::kInvalidArgument,
              {"strategy has no parameters"});
  ExpectError(Strategy::Create(one(ok), 0).status(), absl::StatusCode::kInvalidArgument,
              {"stage_count must be >= 1, got 0"});
  ExpectError(Strategy::Create(one(MakeLayout({2, 2}, {{0}}, {0, 2})), 2).status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter w: pipeline stage 2 is outside [0, 2)"});
  ExpectError(Strategy::Create(one(MakeLayout({2, 2}, {{0}}, {1})), 2).status(),
              absl::StatusCode::kInvalidArgument, {"strategy is missing pipeline stage 0"});
  // Structural problems come from Layout::ValidateStructure, prefixed with the parameter.
  ExpectError(Strategy::Create(one(MakeLayout({2, 2}, {{5}})), 1).status(),
              absl::StatusCode::kInvalidArgument, {"parameter w: "});
  ExpectError(Strategy::Create(one(ok, Shape{3, 4}), 1).status(),
              absl::StatusCode::kInvalidArgument, {"parameter w: tensor_shape [3, 4]: "});
  Layout big_shard = ok;
  big_shard.opt_shard_step = int64_t{1} << 40;
  ExpectError(Strategy::Create(one(big_shard), 1).status(), absl::StatusCode::kInvalidArgument,
              {"parameter w: opt_shard", "exceeds MindSpore's int32 fields"});

  std::map<std::string, StrategyParam> unnamed;
  unnamed[""] = Param(ok);
  ExpectError(Strategy::Create(unnamed, 1).status(), absl::StatusCode::kInvalidArgument,
              {"a parameter name is empty"});
  std::map<std::string, StrategyParam> bad_utf8;
  bad_utf8["w\xc0\xaf"] = Param(ok);  // overlong '/'
  ExpectError(Strategy::Create(bad_utf8, 1).status(), absl::StatusCode::kInvalidArgument,
              {"is not valid UTF-8"});
  ExpectError(Strategy::Create(one(ok), 1, {{"Add_w", -1, {}}}).status(),
              absl::StatusCode::kInvalidArgument,
              {"operator Add_w: pipeline stage -1 is negative"});
  ExpectError(Strategy::Create(one(ok), 1, {{"Add_\xed\xa0\x80", 0, {}}}).status(),
              absl::StatusCode::kInvalidArgument, {"operator name", "is not valid UTF-8"});
}

TEST(StrategyCreateTest, RejectsControlCharactersWorldsTooLargeAndHugeJson) {
  for (const std::string& name :
       std::vector<std::string>{"w\nevent=forged", std::string("w\0x", 3), "w\x1b[31m", "w\xc2\x85",
                                std::string(5000, 'w')}) {
    std::map<std::string, StrategyParam> params;
    params[name] = Param(MakeLayout({2}, {{0}}));
    absl::Status s = Strategy::Create(params, 1).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), ::testing::Not(::testing::HasSubstr("\n")));
  }
  // 2^24 devices per stage are fine for a layout, but 2^24 x 2 stages is more ranks than ckptd
  // enumerates.
  std::map<std::string, StrategyParam> wide;
  wide["a"] = Param(MakeLayout({int64_t{1} << 24}, {{}}, {0}));
  wide["b"] = Param(MakeLayout({int64_t{1} << 24}, {{}}, {1}));
  ExpectError(Strategy::Create(wide, 2).status(), absl::StatusCode::kInvalidArgument,
              {"ranks ckptd supports"});
  // JSON texts that would cost far more memory parsed than their size.
  std::string deep(100, '[');
  deep += std::string(100, ']');
  ExpectError(
      ParseStrategy(absl::StrCat(R"({"parallel_layout_item": )", deep, "}"), StrategyFormat::kJson)
          .status(),
      absl::StatusCode::kInvalidArgument, {"nests deeper than"});
  std::string many = R"({"x": [)";
  for (int i = 0; i < (1 << 23) + 10; ++i) many += "0,";
  many += "0]}";
  ExpectError(ParseStrategy(many, StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument, {"values"});
  // Empty containers count as values too.
  std::string empties = R"({"x": [)";
  for (int i = 0; i < (1 << 23) + 10; ++i) empties += "{},";
  empties += "[]]}";
  ExpectError(ParseStrategy(empties, StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument, {"holds more than 8388608 values"});
}

TEST(StrategyCreateTest, BinaryNamesThatAreNotUtf8AreRejected) {
  // proto2 strings are bytes; JSON export would fail on these, so they never get in.
  const std::string bytes = StrategyMapBytes(0, {}, {PlainItem("w\xff", {2}, {0})});
  ExpectError(ParseStrategy(bytes, StrategyFormat::kBinary).status(),
              absl::StatusCode::kInvalidArgument, {"parameter name \"w\\xff\" is not valid UTF-8"});
}

// ---------------------------------------------------------------------------------------------
// JSON form.

TEST(StrategyJsonTest, ParsesTheDocumentedFormat) {
  const std::string json = R"({
    "current_stage": 0,
    "parallel_strategy_item": {
      "MatMul_w": {"stage": 1, "parallel_strategy": [[2, 1], [1, 1]]},
      "Add_b": {"stage": 0, "parallel_strategy": [[4]]}
    },
    "parallel_layout_item": {
      "w": {"dev_matrix": [2, 4], "tensor_map": [1, -1], "tensor_shape": [32, 32],
            "field": 0, "opt_weight_shard_step": 1, "opt_weight_shard_size": 2,
            "param_split_shape": [], "indices_offset": []},
      "b": {"dev_matrix": [2, 4], "tensor_map": [-1]}
    }})";
  const Strategy s = ParseOrDie(json, StrategyFormat::kJson);
  EXPECT_EQ(s.stage_count(), 1);
  EXPECT_EQ(s.devices_per_stage(), 8);
  Layout w = MakeLayout({2, 4}, {{1}, {}});
  w.opt_shard_step = 1;
  w.opt_shard_size = 2;
  EXPECT_EQ(ParamOf(s, "w"), Param(w, Shape{32, 32}));
  EXPECT_EQ(ParamOf(s, "b"), Param(MakeLayout({2, 4}, {{}})));  // optional keys default to 0
  // File order of operator items survives (the first decides a per-stage file's stage).
  ASSERT_EQ(s.ops().size(), 2u);
  EXPECT_EQ(s.ops()[0], (OpStrategy{"MatMul_w", 1, {{2, 1}, {1, 1}}}));
  EXPECT_EQ(s.ops()[1], (OpStrategy{"Add_b", 0, {{4}}}));
  ExpectRoundTrip(s, StrategyFormat::kJson);
}

TEST(StrategyJsonTest, NestedMapsAreListsPerDim) {
  const std::string json = R"({"parallel_layout_item": {
      "w": {"dev_matrix": [2, 2, 2], "tensor_map": [[2, 1], [-1]], "tensor_shape": [8, 3]},
      "bias": {"dev_matrix": [2, 2, 2], "tensor_map": [[1, 0]]},
      "marker": {"dev_matrix": [2, 2, 2], "tensor_map": [[1, 0], []]},
      "mixed": {"dev_matrix": [2, 2, 2], "tensor_map": [[1, 0], -1]}}})";
  const Strategy s = ParseOrDie(json, StrategyFormat::kJson);
  using Map = std::vector<std::vector<int32_t>>;
  EXPECT_TRUE(ParamOf(s, "w").layout.nested_form);
  EXPECT_EQ(ParamOf(s, "w").layout.tensor_map, (Map{{2, 1}, {}}));
  EXPECT_EQ(ParamOf(s, "bias").layout.tensor_map, (Map{{1, 0}}));
  EXPECT_EQ(ParamOf(s, "marker").layout.tensor_map, (Map{{1, 0}}));
  EXPECT_EQ(ParamOf(s, "mixed").layout.tensor_map, (Map{{1, 0}, {}}));
  ExpectRoundTrip(s, StrategyFormat::kJson);
  // Written back as lists per dim, [-1] for an unsplit dim.
  std::string compact = SerializeStrategy(s, StrategyFormat::kJson);
  std::erase_if(compact, [](char c) { return c == ' ' || c == '\n'; });
  EXPECT_THAT(compact, HasSubstr(R"("w":{"dev_matrix":[2,2,2],"tensor_map":[[2,1],[-1]],)"));
  EXPECT_THAT(compact, HasSubstr(R"("bias":{"dev_matrix":[2,2,2],"tensor_map":[[1,0]],)"));
}

TEST(StrategyJsonTest, MergedNamesAndSharedParameters) {
  const std::string json = R"({"current_stage": 1, "parallel_layout_item": {
      "0-emb-table": {"dev_matrix": [4], "tensor_map": [-1, -1]},
      "1-emb-table": {"dev_matrix": [4], "tensor_map": [-1, -1], "tensor_shape": [16, 8]},
      "0-w": {"dev_matrix": [4], "tensor_map": [0]}}})";
  const Strategy s = ParseOrDie(json, StrategyFormat::kJson);
  EXPECT_EQ(s.stage_count(), 2);
  ASSERT_NE(s.Find("emb-table"), nullptr);
  EXPECT_THAT(ParamOf(s, "emb-table").layout.stages, ElementsAre(0, 1));
  // Only the stage-1 item records the shape; it is kept although the stage-0 item came first.
  EXPECT_EQ(ParamOf(s, "emb-table").tensor_shape, (Shape{16, 8}));
  ExpectRoundTrip(s, StrategyFormat::kJson);

  const std::string conflicting = R"({"parallel_layout_item": {
      "0-e": {"dev_matrix": [4], "tensor_map": [-1], "tensor_shape": [16]},
      "1-e": {"dev_matrix": [4], "tensor_map": [-1], "tensor_shape": [32]}}})";
  ExpectError(ParseStrategy(conflicting, StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter e: pipeline stage 0 has", "tensor_shape [16]", "tensor_shape [32]"});
}

TEST(StrategyJsonTest, ItemsKeepTheirFileOrder) {
  // Operator items in file order, not name order: the first one decides a per-stage file's stage.
  const std::string json = R"({"parallel_strategy_item": {
      "z_op": {"stage": 1, "parallel_strategy": [[2]]},
      "a_op": {"stage": 0, "parallel_strategy": [[1]]}},
    "parallel_layout_item": {
      "1-w": {"dev_matrix": [4], "tensor_map": [0]},
      "0-w": {"dev_matrix": [4], "tensor_map": [0]}}})";
  const Strategy s = ParseOrDie(json, StrategyFormat::kJson);
  ASSERT_EQ(s.ops().size(), 2u);
  EXPECT_EQ(s.ops()[0].node_name, "z_op");
  EXPECT_EQ(s.ops()[1].node_name, "a_op");
  // Written back in the same order.
  const std::string written = SerializeStrategy(s, StrategyFormat::kJson);
  EXPECT_LT(written.find("z_op"), written.find("a_op")) << written;
  ExpectRoundTrip(s, StrategyFormat::kJson);

  // Layout items too: the item met first is the one a conflict names first.
  const std::string conflicting = R"({"parallel_layout_item": {
      "1-e": {"dev_matrix": [4], "tensor_map": [-1], "tensor_shape": [32]},
      "0-e": {"dev_matrix": [4], "tensor_map": [-1], "tensor_shape": [16]}}})";
  ExpectError(ParseStrategy(conflicting, StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter e: pipeline stage 1 has", "tensor_shape [32]", "but stage 0 has"});
}

TEST(StrategyJsonTest, RepeatedKeysKeepTheLastValue) {
  const std::string json = R"({"parallel_strategy_item": {
      "op": {"stage": 0}, "other": {"stage": 0}, "op": {"stage": 0, "parallel_strategy": [[4]]}},
    "parallel_layout_item": {
      "w": {"dev_matrix": [4], "tensor_map": [0]},
      "w": {"dev_matrix": [4], "tensor_map": [-1]}},
    "parallel_layout_item": {
      "v": {"dev_matrix": [2], "tensor_map": [0]},
      "u": {"dev_matrix": [2], "tensor_map": [-1]}}})";
  const Strategy s = ParseOrDie(json, StrategyFormat::kJson);
  // The repeated top-level key: only its last object counts.
  EXPECT_EQ(s.Find("w"), nullptr);
  ASSERT_NE(s.Find("v"), nullptr);
  ASSERT_NE(s.Find("u"), nullptr);
  EXPECT_EQ(s.devices_per_stage(), 2);
  // A repeated operator keeps its first position and its last value.
  ASSERT_EQ(s.ops().size(), 2u);
  EXPECT_EQ(s.ops()[0].node_name, "op");
  EXPECT_EQ(s.ops()[0].inputs, (std::vector<std::vector<uint32_t>>{{4}}));
  EXPECT_EQ(s.ops()[1].node_name, "other");

  const std::string repeated_param = R"({"parallel_layout_item": {
      "w": {"dev_matrix": [4], "tensor_map": [0]},
      "w": {"dev_matrix": [4], "tensor_map": [-1]}}})";
  const Strategy r = ParseOrDie(repeated_param, StrategyFormat::kJson);
  EXPECT_EQ(ParamOf(r, "w").layout.tensor_map, (std::vector<std::vector<int32_t>>{{}}));
}

TEST(StrategyJsonTest, FiftyThousandParametersRoundTrip) {
  // Large models' strategies: every parameter survives, in both directions.
  std::map<std::string, StrategyParam> params;
  for (int i = 0; i < 50000; ++i) {
    StrategyParam& p = params[absl::StrCat("model.layers.", i / 6, ".param_", i % 6)];
    p.layout.dev_matrix = {8, 8};
    p.layout.tensor_map = i % 2 == 0 ? std::vector<std::vector<int32_t>>{{0}, {}}
                                     : std::vector<std::vector<int32_t>>{{}, {1}};
    p.tensor_shape = Shape{64, 64};
  }
  absl::StatusOr<Strategy> s = Strategy::Create(std::move(params), 1);
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectRoundTrip(*s, StrategyFormat::kJson);
}

TEST(StrategyJsonTest, WrittenExactlyAsNlohmannDumpsIt) {
  // The JSON writer is our own; its text must be what nlohmann's dump(2) makes of the same
  // document (indents, separators, empty containers, escapes), so files written before and after
  // compare equal. Names with characters that need escaping, empty lists, both tensor_map forms.
  for (const bool merged : {false, true}) {
    std::map<std::string, StrategyParam> params;
    StrategyParam& a = params["w\"quoted\\back\xc3\xa9"];
    a.layout.dev_matrix = {2, 4};
    a.layout.tensor_map = {{1}, {}};
    a.tensor_shape = Shape{8, 12};
    StrategyParam& b = params["bias"];
    b.layout.dev_matrix = {2, 4};
    b.layout.tensor_map = {{1, 0}, {}};
    b.layout.nested_form = true;
    b.layout.opt_shard_step = 2;
    b.layout.opt_shard_size = 4;
    StrategyParam& c = params["scalar"];
    c.layout.dev_matrix = {8};
    c.tensor_shape = Shape{};
    if (merged) {
      a.layout.stages = {0, 1};
      b.layout.stages = {1};
      c.layout.stages = {0};
    }
    std::vector<OpStrategy> ops = {{"op\t\x01\"x", 0, {{2, 4}, {}}}, {"no_inputs", 1, {}}};
    absl::StatusOr<Strategy> s =
        Strategy::Create(std::move(params), merged ? 2 : 1, std::move(ops), merged);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::string written = SerializeStrategy(*s, StrategyFormat::kJson);
    EXPECT_EQ(written, nlohmann::ordered_json::parse(written).dump(2));
    EXPECT_THAT(written, HasSubstr(R"("op\t\u0001\"x": {)"));
    EXPECT_THAT(written, HasSubstr("\"parallel_strategy\": []"));
    ExpectRoundTrip(*s, StrategyFormat::kJson);
  }
}

TEST(StrategyJsonTest, TypeErrorsNameTheKey) {
  const auto layout_error = [](const std::string& item) {
    return ParseStrategy(absl::StrCat(R"({"parallel_layout_item": {"w": )", item, "}}"),
                         StrategyFormat::kJson)
        .status();
  };
  const std::string dev_msg =
      "parallel_layout_item.w.dev_matrix must be a list of positive integers";
  ExpectError(layout_error(R"({"dev_matrix": "2,2", "tensor_map": [0]})"),
              absl::StatusCode::kInvalidArgument, {dev_msg});
  ExpectError(layout_error(R"({"dev_matrix": [2, 0], "tensor_map": [0]})"),
              absl::StatusCode::kInvalidArgument, {dev_msg});
  ExpectError(layout_error(R"({"dev_matrix": [2.5], "tensor_map": [0]})"),
              absl::StatusCode::kInvalidArgument, {dev_msg});
  ExpectError(layout_error(R"({"tensor_map": [0]})"), absl::StatusCode::kInvalidArgument,
              {dev_msg});
  const std::string map_msg = "parallel_layout_item.w.tensor_map must be a list of integers";
  ExpectError(layout_error(R"({"dev_matrix": [2]})"), absl::StatusCode::kInvalidArgument,
              {map_msg});
  ExpectError(layout_error(R"({"dev_matrix": [2], "tensor_map": [1.5]})"),
              absl::StatusCode::kInvalidArgument, {map_msg});
  ExpectError(layout_error(R"({"dev_matrix": [2], "tensor_map": [[true]]})"),
              absl::StatusCode::kInvalidArgument, {map_msg});
  ExpectError(layout_error(R"({"dev_matrix": [2], "tensor_map": [-3]})"),
              absl::StatusCode::kInvalidArgument, {"parameter w: tensor_map entry -3 is invalid"});
  ExpectError(layout_error(R"({"dev_matrix": [2], "tensor_map": [0], "field": "0"})"),
              absl::StatusCode::kInvalidArgument,
              {"parallel_layout_item.w.field must be a 32-bit integer"});
  ExpectError(
      layout_error(
          R"({"dev_matrix": [2], "tensor_map": [0], "opt_weight_shard_step": 1099511627776})"),
      absl::StatusCode::kInvalidArgument,
      {"parallel_layout_item.w.opt_weight_shard_step must be a 32-bit integer"});
  ExpectError(layout_error(R"({"dev_matrix": [2], "tensor_map": [0], "tensor_shape": [-4]})"),
              absl::StatusCode::kInvalidArgument,
              {"parallel_layout_item.w.tensor_shape must be a list of non-negative integers"});
  ExpectError(layout_error(R"({"dev_matrix": [2], "tensor_map": [0], "param_split_shape": "x"})"),
              absl::StatusCode::kInvalidArgument,
              {"parallel_layout_item.w.param_split_shape must be a list of integers"});
  ExpectError(layout_error("[2, 2]"), absl::StatusCode::kInvalidArgument,
              {"parallel_layout_item.w must be an object"});

  const auto op_error = [](const std::string& op) {
    return ParseStrategy(absl::StrCat(R"({"parallel_strategy_item": {"Add_w": )", op,
                                      R"(}, "parallel_layout_item": {"w": {"dev_matrix": [2], )",
                                      R"("tensor_map": [0]}}})"),
                         StrategyFormat::kJson)
        .status();
  };
  ExpectError(op_error(R"({"stage": -1})"), absl::StatusCode::kInvalidArgument,
              {"parallel_strategy_item.Add_w.stage must be a non-negative 32-bit integer"});
  ExpectError(op_error(R"({"parallel_strategy": [[1]]})"), absl::StatusCode::kInvalidArgument,
              {"parallel_strategy_item.Add_w.stage must be"});
  ExpectError(op_error(R"({"stage": 0, "parallel_strategy": [[-1]]})"),
              absl::StatusCode::kInvalidArgument,
              {"parallel_strategy_item.Add_w.parallel_strategy must be a list of lists"});

  ExpectError(ParseStrategy("[]", StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument, {"a JSON strategy must be an object"});
  ExpectError(ParseStrategy(R"({"parallel_layout_item": []})", StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument, {"parallel_layout_item must be an object"});
  ExpectError(ParseStrategy(R"({"parallel_strategy_item": 3, "parallel_layout_item": {}})",
                            StrategyFormat::kJson)
                  .status(),
              absl::StatusCode::kInvalidArgument, {"parallel_strategy_item must be an object"});
}

TEST(StrategyJsonTest, RejectsEmptyAndMalformedDocuments) {
  for (const char* empty : {"", "  \n", "{}", R"({"parallel_layout_item": {}})"}) {
    ExpectError(ParseStrategy(empty, StrategyFormat::kJson).status(),
                absl::StatusCode::kInvalidArgument, {"strategy has no parallel_layout_item"});
  }
  for (const char* broken : {"{\"parallel_layout_item\": {", "not json", "{\"a\": 1,}"}) {
    ExpectError(ParseStrategy(broken, StrategyFormat::kJson).status(),
                absl::StatusCode::kInvalidArgument, {"not a JSON strategy: "});
  }
  // A syntax error names the byte where the parser stopped (counting from 1); the text it quotes
  // is escaped.
  ExpectError(ParseStrategy(R"({"parallel_layout_item": tru})", StrategyFormat::kJson).status(),
              absl::StatusCode::kInvalidArgument,
              {"not a JSON strategy: syntax error at byte 29: ", "tru"});
  const absl::Status bad_utf8 =
      ParseStrategy("{\"parallel_layout_item\": {\"w\xff\x01\": {}}}", StrategyFormat::kJson)
          .status();
  ExpectError(bad_utf8, absl::StatusCode::kInvalidArgument,
              {"not a JSON strategy: syntax error at byte "});
  EXPECT_EQ(std::string(bad_utf8.message()).find_first_of("\xff\x01"), std::string::npos)
      << bad_utf8;
}

TEST(StrategyJsonTest, ParsesStrictJson) {
  // What RFC 8259 allows: escapes (a surrogate pair too), a byte order mark, raw UTF-8, "-0".
  const std::string ok =
      "\xEF\xBB\xBF"
      R"( {"parallel_layout_item": {
      "w\u00e9\ud83d\ude00\"\\\/x": {"dev_matrix": [2], "tensor_map": [-0],
                                  "unknown": [1.5e3, true, false, null, {"a": "b"}]},
      "na)"
      "\xc3\xa9"
      R"(me": {"dev_matrix": [2], "tensor_map": [-1]}}} )";
  const Strategy s = ParseOrDie(ok, StrategyFormat::kJson);
  ASSERT_NE(s.Find("w\xc3\xa9\xf0\x9f\x98\x80\"\\/x"), nullptr);
  EXPECT_EQ(ParamOf(s, "w\xc3\xa9\xf0\x9f\x98\x80\"\\/x").layout.tensor_map,
            (std::vector<std::vector<int32_t>>{{0}}));
  ASSERT_NE(s.Find("na\xc3\xa9me"), nullptr);
  ExpectRoundTrip(s, StrategyFormat::kJson);

  // What it does not: each is a syntax error, not a crash or a quietly accepted document.
  const std::string item = R"({"dev_matrix": [2], "tensor_map": [0]})";
  for (const std::string& broken : {
           std::string(R"({"parallel_layout_item": {"w": )") + item + "}} x",
           std::string(R"({"parallel_layout_item": {"w": {"dev_matrix": [02]}}})"),
           std::string(R"({"parallel_layout_item": {"w": {"dev_matrix": [2.]}}})"),
           std::string(R"({"parallel_layout_item": {"w\ud800": )") + item + "}}",
           std::string(R"({"parallel_layout_item": {"w\udc00": )") + item + "}}",
           std::string(R"({"parallel_layout_item": {"w\q": )") + item + "}}",
           std::string("{\"parallel_layout_item\": {\"w\xff\": ") + item + "}}",
           std::string("{\"parallel_layout_item\": {\"w\xed\xa0\x80\": ") + item + "}}",
           std::string("{\"parallel_layout_item\": {\"w\xc0\xaf\": ") + item + "}}",
           std::string("{\"parallel_layout_item\": {\"w\x01\": ") + item + "}}",
           std::string(R"({"parallel_layout_item": {"w": )") + item + "}",
           std::string(R"({"parallel_layout_item": {"w" )") + item + "}}",
           std::string(R"({"parallel_layout_item": {"w": )") + item + ",}}",
           std::string(R"({"parallel_layout_item": {"w": tru}})"),
           std::string(R"({"parallel_layout_item": {"w": "unterminated)"),
       }) {
    ExpectError(ParseStrategy(broken, StrategyFormat::kJson).status(),
                absl::StatusCode::kInvalidArgument, {"not a JSON strategy: "});
  }
  // Numbers that are not 32-bit integers are type errors naming the key.
  for (const char* map :
       {"[1.0]", "[1e2]", "[18446744073709551616]", "[-9223372036854775809]", "[2147483648]"}) {
    ExpectError(ParseStrategy(absl::StrCat(R"({"parallel_layout_item": {"w": {"dev_matrix": [2], )",
                                           R"("tensor_map": )", map, "}}}"),
                              StrategyFormat::kJson)
                    .status(),
                absl::StatusCode::kInvalidArgument, {"parallel_layout_item.w.tensor_map must be"});
  }
}

TEST(StrategyJsonTest, ParamSplitShapeAcceptsBothSpellingsOfEmpty) {
  for (const char* value : {"[]", "[[]]"}) {
    const Strategy s = ParseOrDie(
        absl::StrCat(R"({"parallel_layout_item": {"w": {"dev_matrix": [2], "tensor_map": [0], )",
                     R"("param_split_shape": )", value, R"(, "indices_offset": )", value, "}}}"),
        StrategyFormat::kJson);
    EXPECT_TRUE(ParamOf(s, "w").layout.param_split_shape.empty()) << value;
    EXPECT_TRUE(ParamOf(s, "w").layout.indices_offset.empty()) << value;
  }
}

TEST(StrategyFormatTest, JsonSuffixSelectsJson) {
  EXPECT_EQ(StrategyFormatForPath("/a/b/strategy.json"), StrategyFormat::kJson);
  EXPECT_EQ(StrategyFormatForPath("strategy.ckpt"), StrategyFormat::kBinary);
  EXPECT_EQ(StrategyFormatForPath("strategy"), StrategyFormat::kBinary);
  EXPECT_EQ(StrategyFormatForPath("dir.json/strategy.ckpt"), StrategyFormat::kBinary);
  EXPECT_EQ(StrategyFormatForPath("strategy.JSON"), StrategyFormat::kBinary);  // as MindSpore
}

// ---------------------------------------------------------------------------------------------
// MergeStageStrategies (MindSpore's merge_pipeline_strategys).

TEST(StrategyMergeTest, MergesPerStageFilesLikeMindSpore) {
  const std::vector<Wire> stage1_ops = {OpItemMsg("Receive_emb", 1, {{2, 1}}),
                                        OpItemMsg("MatMul_head.w", 1, {{2, 1}, {2, 1}})};
  const std::vector<Wire> stage0_ops = {OpItemMsg("Gather_emb", 0, {{1, 1}, {2, 2}})};
  const std::vector<StrategyFile> files = {
      {"rank_4/strategy.ckpt", StrategyMapBytes(1, stage1_ops,
                                                {PlainItem("emb", {2, 2}, {-1, -1}),
                                                 PlainItem("head.w", {2, 2}, {0, -1})})},
      {"rank_0/strategy.ckpt", StrategyMapBytes(0, stage0_ops,
                                                {PlainItem("emb", {2, 2}, {-1, -1}),
                                                 PlainItem("blocks-0.w", {2, 2}, {-1, 0})})},
      // A second rank of stage 0: skipped, whatever it holds.
      {"rank_1/strategy.ckpt",
       StrategyMapBytes(0, {OpItemMsg("Add_bogus", 0, {})}, {PlainItem("bogus", {2, 2}, {0})})},
  };
  absl::StatusOr<Strategy> merged = MergeStageStrategies(files);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->stage_count(), 2);
  EXPECT_EQ(merged->devices_per_stage(), 4);
  EXPECT_TRUE(merged->stage_prefixed_names());
  ASSERT_EQ(merged->params().size(), 3u);
  EXPECT_THAT(ParamOf(*merged, "emb").layout.stages, ElementsAre(0, 1));
  EXPECT_THAT(ParamOf(*merged, "head.w").layout.stages, ElementsAre(1));
  EXPECT_THAT(ParamOf(*merged, "blocks-0.w").layout.stages, ElementsAre(0));
  EXPECT_EQ(merged->Find("bogus"), nullptr);
  ASSERT_EQ(merged->ops().size(), 3u);
  EXPECT_EQ(merged->ops()[0].node_name, "Receive_emb");
  EXPECT_EQ(merged->ops()[2].node_name, "Gather_emb");

  // Identical to reading the file MindSpore's merge_pipeline_strategys would have written.
  std::vector<Wire> all_ops = stage1_ops;
  all_ops.insert(all_ops.end(), stage0_ops.begin(), stage0_ops.end());
  const std::string mindspore_merged = StrategyMapBytes(
      1, all_ops,
      {PlainItem("1-emb", {2, 2}, {-1, -1}), PlainItem("1-head.w", {2, 2}, {0, -1}),
       PlainItem("0-emb", {2, 2}, {-1, -1}), PlainItem("0-blocks-0.w", {2, 2}, {-1, 0})});
  EXPECT_TRUE(ParseOrDie(mindspore_merged, StrategyFormat::kBinary) == *merged);
  ExpectRoundTrip(*merged, StrategyFormat::kBinary);
  ExpectRoundTrip(*merged, StrategyFormat::kJson);
}

TEST(StrategyMergeTest, MergesJsonFiles) {
  const std::vector<StrategyFile> files = {
      {"s0.json", R"({"parallel_strategy_item": {"Gather_e": {"stage": 0}},
                      "parallel_layout_item": {"e": {"dev_matrix": [2], "tensor_map": [-1],
                                                     "tensor_shape": [6]}}})"},
      {"s1.json", R"({"parallel_strategy_item": {"MatMul_e": {"stage": 1}, "Add_x": {"stage": 0}},
                      "parallel_layout_item": {"e": {"dev_matrix": [2], "tensor_map": [-1]},
                                               "x": {"dev_matrix": [2], "tensor_map": [0]}}})"},
  };
  absl::StatusOr<Strategy> merged = MergeStageStrategies(files);
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->stage_count(), 2);
  EXPECT_THAT(ParamOf(*merged, "e").layout.stages, ElementsAre(0, 1));
  EXPECT_EQ(ParamOf(*merged, "e").tensor_shape, (Shape{6}));
  EXPECT_THAT(ParamOf(*merged, "x").layout.stages, ElementsAre(1));  // first op item decides
  ExpectRoundTrip(*merged, StrategyFormat::kJson);
}

TEST(StrategyMergeTest, RejectsIncompleteOrInconsistentInput) {
  const auto file = [](std::string path, int64_t stage, std::vector<Wire> items) {
    return StrategyFile{std::move(path),
                        StrategyMapBytes(0, {OpItemMsg("Op", stage, {})}, std::move(items))};
  };
  const Wire w = PlainItem("w", {2}, {0});
  ExpectError(MergeStageStrategies({}).status(), absl::StatusCode::kInvalidArgument,
              {"no pipeline strategy files given"});
  ExpectError(MergeStageStrategies({file("a", 0, {w}), file("b", 2, {w})}).status(),
              absl::StatusCode::kInvalidArgument,
              {"pipeline strategy files cover stages {0, 2}; stage 1 is missing"});
  ExpectError(MergeStageStrategies({file("a", 1, {w})}).status(),
              absl::StatusCode::kInvalidArgument,
              {"pipeline strategy files cover stages {1}; stage 0 is missing"});
  ExpectError(
      MergeStageStrategies({file("s0.ckpt", 0, {w}), file("s1.json", 1, {w})}).status(),
      absl::StatusCode::kInvalidArgument,
      {"strategy files must be all binary or all .json", "s0.ckpt is binary", "s1.json is JSON"});
  ExpectError(
      MergeStageStrategies({file("s0.ckpt", 0, {w}), {"no_ops.ckpt", StrategyMapBytes(0, {}, {w})}})
          .status(),
      absl::StatusCode::kInvalidArgument,
      {"strategy file no_ops.ckpt has no parallel_strategy_item"});
  ExpectError(MergeStageStrategies({file("merged.ckpt", 0, {PlainItem("0-w", {2}, {0})})}).status(),
              absl::StatusCode::kInvalidArgument,
              {"strategy file merged.ckpt is already a merged pipeline strategy"});
  ExpectError(MergeStageStrategies({file("s0", 0, {w}), file("s1", 1, {PlainItem("w", {2}, {-1})})})
                  .status(),
              absl::StatusCode::kInvalidArgument,
              {"parameter w: pipeline stage 0 has", "but stage 1 has"});
  ExpectError(MergeStageStrategies({file("s0", 0, {w}), {"s1", "garbage!"}}).status(),
              absl::StatusCode::kInvalidArgument,
              {"strategy file s1: not a MindSpore ParallelStrategyMap"});
  // Stages must agree on the device count too.
  ExpectError(
      MergeStageStrategies({file("s0", 0, {w}), file("s1", 1, {PlainItem("v", {4}, {0})}),
                            file("s2", 2, {PlainItem("u", {2}, {0})})})
          .status(),
      absl::StatusCode::kInvalidArgument,
      {"parameter v: dev_matrix [4] has 4 devices but the strategy's other layouts have 2"});
}

}  // namespace
}  // namespace ckpt
