#include "core/strategy.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/absl_compat.h"
#include "core/internal/strategy_parse.h"
#include "core/names.h"
#include "core/status_macros.h"
#include "google/protobuf/arena.h"
#include "mindspore_strategy.pb.h"

namespace ckpt {
namespace {

using strategy_internal::kInt32Max;
using strategy_internal::kInt32Min;

std::string SplitString(const Layout& layout) {
  return absl::StrCat("dev_matrix ", ShapeToString(layout.dev_matrix), " tensor_map ",
                      layout.TensorMapString(), " opt_shard (step ", layout.opt_shard_step,
                      ", size ", layout.opt_shard_size, ")");
}

// Everything that decides where a parameter's bytes live. Stages are what is being merged and
// nested_form is only spelling, so neither takes part. The unsupported features do: keeping one
// stage's value silently would hide the other's from Layout::ValidateStructure.
bool SameLayoutIgnoringStages(const Layout& a, const Layout& b) {
  return a.dev_matrix == b.dev_matrix && a.tensor_map == b.tensor_map &&
         a.opt_shard_step == b.opt_shard_step && a.opt_shard_size == b.opt_shard_size &&
         a.field == b.field && a.param_split_shape == b.param_split_shape &&
         a.indices_offset == b.indices_offset;
}

// Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). nlohmann::json
// throws when dumping anything else, and MindSpore's names are Python strings, so a name that
// fails this came from a corrupt file.
bool IsValidUtf8(std::string_view s) {
  static constexpr uint32_t kMinCodePoint[] = {0, 0, 0x80, 0x800, 0x10000};
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((lead & 0xE0) == 0xC0) {
      len = 2;
      cp = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      len = 3;
      cp = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      len = 4;
      cp = lead & 0x07;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const auto cont = static_cast<unsigned char>(s[i + k]);
      if ((cont & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cont & 0x3F);
    }
    if (cp < kMinCodePoint[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// True when `key` looks like "<digits>-<something>" (a merged pipeline strategy key).
bool HasStagePrefix(std::string_view key) {
  size_t digits = 0;
  while (digits < key.size() && key[digits] >= '0' && key[digits] <= '9') ++digits;
  return digits > 0 && digits + 1 < key.size() && key[digits] == '-';
}

// Adds one item of pipeline stage `stage` to `params`. A name already present gets the stage
// added; the first item's layout is kept, as MindSpore does, but only after checking that the
// layouts agree: silently picking one of two different layouts would misplace data.
absl::Status AddStageItem(std::map<std::string, StrategyParam>& params, const std::string& name,
                          int32_t stage, StrategyParam param) {
  param.layout.stages = {stage};
  auto [it, inserted] = params.try_emplace(name, std::move(param));
  if (inserted) return absl::OkStatus();
  StrategyParam& kept = it->second;
  const int32_t kept_stage = kept.layout.stages.front();
  const bool same_shape =
      !kept.tensor_shape || !param.tensor_shape || *kept.tensor_shape == *param.tensor_shape;
  if (!SameLayoutIgnoringStages(kept.layout, param.layout) || !same_shape) {
    std::string kept_desc = SplitString(kept.layout);
    std::string new_desc = SplitString(param.layout);
    if (!same_shape) {
      absl::StrAppend(&kept_desc, " tensor_shape ", ShapeToString(*kept.tensor_shape));
      absl::StrAppend(&new_desc, " tensor_shape ", ShapeToString(*param.tensor_shape));
    }
    std::vector<int32_t>& stages = kept.layout.stages;
    if (std::find(stages.begin(), stages.end(), stage) != stages.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", name, " appears twice in pipeline stage ", stage,
                       " with different layouts: ", kept_desc, " vs ", new_desc));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", name, ": pipeline stage ", kept_stage, " has ", kept_desc, " but stage ",
        stage, " has ", new_desc, "; a parameter shared between stages needs one layout"));
  }
  if (!kept.tensor_shape) kept.tensor_shape = std::move(param.tensor_shape);
  std::vector<int32_t>& stages = kept.layout.stages;
  auto pos = std::lower_bound(stages.begin(), stages.end(), stage);
  if (pos == stages.end() || *pos != stage) stages.insert(pos, stage);
  return absl::OkStatus();
}

}  // namespace

namespace strategy_internal {

absl::Status NoLayoutItems() {
  // MindSpore: "The strategy file ... is empty".
  return absl::InvalidArgumentError(
      "strategy has no parallel_layout_item (the strategy file is empty)");
}

// ---------------------------------------------------------------------------------------------
// Tensor maps as written in the files -> Layout::tensor_map.

// Plain form: one entry per tensor dim, -1 = not split, m >= 0 = device axis m.
absl::StatusOr<std::vector<std::vector<int32_t>>> FromPlainMap(const std::vector<int64_t>& map,
                                                               std::string_view param) {
  std::vector<std::vector<int32_t>> out;
  out.reserve(map.size());
  for (int64_t m : map) {
    if (m == -1) {
      out.emplace_back();
    } else if (m >= 0 && m <= kInt32Max) {
      out.push_back({static_cast<int32_t>(m)});
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", Sv(param), ": tensor_map entry ", m,
                       " is invalid (expected -1 for an unsplit dim or a device axis >= 0)"));
    }
  }
  return out;
}

// Nested (multi-axis) form: one list per tensor dim, [-1] = not split. A 1-D tensor carries an
// extra empty list so that "several TensorMaps" always means nested form; it is not a tensor dim.
absl::StatusOr<std::vector<std::vector<int32_t>>> FromNestedMap(
    std::vector<std::vector<int64_t>> dims, std::string_view param) {
  if (dims.size() == 2 && dims[1].empty()) dims.pop_back();
  std::vector<std::vector<int32_t>> out;
  out.reserve(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    const std::vector<int64_t>& axes = dims[i];
    if (axes.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", Sv(param),
                                                     ": nested tensor_map dim ", i,
                                                     " is empty (an unsplit dim is written [-1])"));
    }
    if (axes.size() == 1 && axes[0] == -1) {
      out.emplace_back();
      continue;
    }
    std::vector<int32_t> dim_axes;
    dim_axes.reserve(axes.size());
    for (int64_t m : axes) {
      if (m < 0 || m > kInt32Max) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", Sv(param), ": nested tensor_map dim ", i, " ", ShapeToString(axes),
            " is invalid (expected [-1] or a list of device axes >= 0)"));
      }
      dim_axes.push_back(static_cast<int32_t>(m));
    }
    out.push_back(std::move(dim_axes));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Collecting layout items into parameters.

absl::StatusOr<Strategy> BuildStrategy(std::vector<LayoutItem> items, std::vector<OpStrategy> ops) {
  if (items.empty()) return NoLayoutItems();
  const bool merged = std::all_of(items.begin(), items.end(),
                                  [](const LayoutItem& item) { return HasStagePrefix(item.key); });
  std::map<std::string, StrategyParam> params;
  int32_t max_stage = 0;
  for (LayoutItem& item : items) {
    if (!merged) {
      CKPT_RETURN_IF_ERROR(AddStageItem(params, item.key, 0, std::move(item.param)));
      continue;
    }
    // Split on the FIRST '-' only: parameter names may contain '-' themselves.
    const size_t dash = item.key.find('-');
    const std::string_view prefix = std::string_view(item.key).substr(0, dash);
    int64_t stage = 0;
    // The stage count is stage + 1, so the largest int32 is out of range too.
    if (!absl::SimpleAtoi(Sv(prefix), &stage) || stage >= kInt32Max) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", item.key, ": pipeline stage prefix ", Sv(prefix), " is out of range"));
    }
    max_stage = std::max(max_stage, static_cast<int32_t>(stage));
    CKPT_RETURN_IF_ERROR(AddStageItem(params, item.key.substr(dash + 1),
                                      static_cast<int32_t>(stage), std::move(item.param)));
  }
  // A stage without parameters is reported by Create ("strategy is missing pipeline stage k").
  return Strategy::Create(std::move(params), max_stage + 1, std::move(ops), merged);
}

}  // namespace strategy_internal

namespace {

using strategy_internal::BuildStrategy;
using strategy_internal::FromNestedMap;
using strategy_internal::FromPlainMap;
using strategy_internal::LayoutItem;
using strategy_internal::NoLayoutItems;

// ---------------------------------------------------------------------------------------------
// Binary (protobuf) form.

absl::StatusOr<StrategyParam> ParamFromProto(const ms::ParallelLayouts& pl, std::string_view name) {
  StrategyParam param;
  Layout& layout = param.layout;
  if (pl.dev_matrix_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", Sv(name), ": expected exactly one dev_matrix entry, found ",
                     pl.dev_matrix_size()));
  }
  layout.dev_matrix.assign(pl.dev_matrix(0).dim().begin(), pl.dev_matrix(0).dim().end());

  if (pl.tensor_map_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", Sv(name), ": has no tensor_map entry"));
  }
  if (pl.tensor_map_size() == 1) {
    const auto& dims = pl.tensor_map(0).dim();
    CKPT_ASSIGN_OR_RETURN(layout.tensor_map,
                          FromPlainMap(std::vector<int64_t>(dims.begin(), dims.end()), name));
  } else {
    std::vector<std::vector<int64_t>> nested;
    nested.reserve(pl.tensor_map_size());
    for (const ms::TensorMap& map : pl.tensor_map()) {
      nested.emplace_back(map.dim().begin(), map.dim().end());
    }
    CKPT_ASSIGN_OR_RETURN(layout.tensor_map, FromNestedMap(std::move(nested), name));
    layout.nested_form = true;
  }

  // Both are written as one (usually empty) entry; several would be a format we do not know.
  if (pl.param_split_shape_size() > 1 || pl.indices_offset_size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", Sv(name),
                     ": expected at most one param_split_shape and one "
                     "indices_offset entry, found ",
                     pl.param_split_shape_size(), " and ", pl.indices_offset_size()));
  }
  if (pl.param_split_shape_size() == 1) {
    const auto& dims = pl.param_split_shape(0).dim();
    layout.param_split_shape.assign(dims.begin(), dims.end());
  }
  if (pl.indices_offset_size() == 1) {
    const auto& dims = pl.indices_offset(0).dim();
    layout.indices_offset.assign(dims.begin(), dims.end());
  }
  // Absent fields read as 0 (older MindSpore versions do not write fields 6 and 7).
  layout.field = pl.field();
  layout.opt_shard_step = pl.opt_weight_shard_step();
  layout.opt_shard_size = pl.opt_weight_shard_size();
  if (pl.has_ckptd_tensor_shape()) {
    const auto& dims = pl.ckptd_tensor_shape().dim();
    param.tensor_shape = Shape(dims.begin(), dims.end());
  }
  return param;
}

absl::StatusOr<Strategy> ParseBinary(std::string_view bytes) {
  if (bytes.empty()) return NoLayoutItems();
  if (bytes.size() > static_cast<size_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy file of ", bytes.size(), " bytes exceeds protobuf's 2 GiB limit"));
  }
  // The message and its parts live on an arena: a strategy of many parameters is tens of thousands
  // of small messages, allocated in a few blocks and freed at once.
  google::protobuf::Arena arena;
  ms::ParallelStrategyMap& msg =
      *google::protobuf::Arena::CreateMessage<ms::ParallelStrategyMap>(&arena);
  // ParsePartial: the strict variant logs on missing required fields, and core/ does not log.
  if (!msg.ParsePartialFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        "not a MindSpore ParallelStrategyMap: the bytes do not decode as its protobuf message");
  }
  if (!msg.IsInitialized()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a MindSpore ParallelStrategyMap: required fields are missing: ",
                     msg.InitializationErrorString()));
  }

  std::vector<OpStrategy> ops;
  ops.reserve(msg.parallel_strategy_item_size());
  for (const ms::ParallelStrategyItem& item : msg.parallel_strategy_item()) {
    const ms::ParallelStrategys& strategys = item.parallel_strategys();
    if (strategys.stage() > kInt32Max) {
      return absl::InvalidArgumentError(absl::StrCat("operator ", item.node_name(),
                                                     ": pipeline stage ", strategys.stage(),
                                                     " is out of range"));
    }
    OpStrategy op;
    op.node_name = item.node_name();
    op.stage = static_cast<int32_t>(strategys.stage());
    op.inputs.reserve(strategys.parallel_strategy_size());
    for (const ms::ParallelStrategy& input : strategys.parallel_strategy()) {
      op.inputs.emplace_back(input.dim().begin(), input.dim().end());
    }
    ops.push_back(std::move(op));
  }

  std::vector<LayoutItem> items;
  items.reserve(msg.parallel_layout_item_size());
  for (const ms::ParallelLayoutItem& item : msg.parallel_layout_item()) {
    CKPT_ASSIGN_OR_RETURN(StrategyParam param,
                          ParamFromProto(item.parallel_layouts(), item.param_name()));
    items.push_back({item.param_name(), std::move(param)});
  }
  return BuildStrategy(std::move(items), std::move(ops));
}

void LayoutToProto(const Layout& layout, ms::ParallelLayouts& pl) {
  // Strategy::Create guarantees every value fits the narrower wire types used here.
  ms::DevMatrix* dev = pl.add_dev_matrix();
  for (int64_t d : layout.dev_matrix) dev->add_dim(static_cast<uint32_t>(d));
  if (layout.nested_form) {
    for (const std::vector<int32_t>& axes : layout.tensor_map) {
      ms::TensorMap* map = pl.add_tensor_map();
      if (axes.empty()) map->add_dim(-1);
      for (int32_t m : axes) map->add_dim(m);
    }
    // The 1-D marker of the nested form: keeps "several TensorMap entries" meaning nested form.
    if (layout.tensor_map.size() == 1) pl.add_tensor_map();
  } else {
    ms::TensorMap* map = pl.add_tensor_map();
    for (const std::vector<int32_t>& axes : layout.tensor_map) {
      map->add_dim(axes.empty() ? -1 : axes.front());
    }
  }
  // MindSpore always writes these, empty sub-messages and zeros included.
  ms::ParamSplitShape* split = pl.add_param_split_shape();
  for (int64_t d : layout.param_split_shape) split->add_dim(d);
  ms::IndicesOffset* offset = pl.add_indices_offset();
  for (int64_t d : layout.indices_offset) offset->add_dim(d);
  pl.set_field(layout.field);
  pl.set_opt_weight_shard_step(static_cast<int32_t>(layout.opt_shard_step));
  pl.set_opt_weight_shard_size(static_cast<int32_t>(layout.opt_shard_size));
}

std::string SerializeBinary(const Strategy& strategy) {
  google::protobuf::Arena arena;  // as in ParseBinary
  ms::ParallelStrategyMap& msg =
      *google::protobuf::Arena::CreateMessage<ms::ParallelStrategyMap>(&arena);
  msg.set_current_stage(strategy.stage_prefixed_names() ? 1 : 0);
  for (const OpStrategy& op : strategy.ops()) {
    ms::ParallelStrategyItem* item = msg.add_parallel_strategy_item();
    item->set_node_name(op.node_name);
    ms::ParallelStrategys* strategys = item->mutable_parallel_strategys();
    strategys->set_stage(static_cast<uint32_t>(op.stage));
    for (const std::vector<uint32_t>& input : op.inputs) {
      ms::ParallelStrategy* ps = strategys->add_parallel_strategy();
      for (uint32_t d : input) ps->add_dim(d);
    }
  }
  for (const auto& [name, param] : strategy.params()) {
    for (int32_t stage : param.layout.stages) {
      ms::ParallelLayoutItem* item = msg.add_parallel_layout_item();
      item->set_param_name(strategy.stage_prefixed_names() ? absl::StrCat(stage, "-", name) : name);
      LayoutToProto(param.layout, *item->mutable_parallel_layouts());
      if (param.tensor_shape) {
        ms::TensorShape* shape = item->mutable_parallel_layouts()->mutable_ckptd_tensor_shape();
        for (int64_t d : *param.tensor_shape) shape->add_dim(d);
      }
    }
  }
  return msg.SerializeAsString();
}

// Strategy::Create's checks of one parameter (name, layout, stages, recorded shape), adding its
// stages to *used_stages; normalises its layout's nested_form to what the formats can express.
absl::Status CheckParam(const std::string& name, StrategyParam& param, int32_t stage_count,
                        std::set<int32_t>* used_stages) {
  Layout& layout = param.layout;
  if (name.empty()) return absl::InvalidArgumentError("a parameter name is empty");
  if (!IsValidUtf8(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter name \"", absl::CHexEscape(name), "\" is not valid UTF-8"));
  }
  // Control characters (which could forge log lines) and absurd lengths.
  CKPT_RETURN_IF_ERROR(ValidatePrintableName("parameter name", name));
  if (absl::Status s = layout.ValidateStructure(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("parameter ", name, ": ", s.message()));
  }
  // Every Strategy must be writable in MindSpore's formats, whose fields are narrower.
  // (dev_matrix needs no check: ValidateStructure caps a stage far below uint32.)
  for (int64_t v : {layout.opt_shard_step, layout.opt_shard_size}) {
    if (v < kInt32Min || v > kInt32Max) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", name, ": opt_shard (step ", layout.opt_shard_step, ", size ",
                       layout.opt_shard_size, ") exceeds MindSpore's int32 fields"));
    }
  }
  for (int32_t stage : layout.stages) {
    if (stage < 0 || stage >= stage_count) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": pipeline stage ", stage,
                                                     " is outside [0, ", stage_count, ")"));
    }
    used_stages->insert(stage);
  }
  // Normalise the spelling flag to what the formats can express so that every Strategy
  // round-trips: several axes on one dim need the nested form, and a 0-D tensor has no dims
  // to nest.
  if (std::any_of(layout.tensor_map.begin(), layout.tensor_map.end(),
                  [](const std::vector<int32_t>& axes) { return axes.size() > 1; })) {
    layout.nested_form = true;
  }
  if (layout.tensor_map.empty()) layout.nested_form = false;
  if (param.tensor_shape) {
    if (absl::Status s = layout.Validate(*param.tensor_shape); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("parameter ", name, ": tensor_shape ",
                                       ShapeToString(*param.tensor_shape), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

// The devices per stage every layout of `params` must have: the most common count, so that the
// message blames the odd layout out rather than whichever parameter sorts first.
absl::StatusOr<int64_t> DevicesPerStage(const std::map<std::string, StrategyParam>& params) {
  std::map<int64_t, size_t> device_count_votes;
  for (const auto& [name, param] : params) ++device_count_votes[param.layout.DeviceCount()];
  int64_t devices = 0;
  size_t votes = 0;
  for (const auto& [count, n] : device_count_votes) {
    if (n > votes) {
      devices = count;
      votes = n;
    }
  }
  if (device_count_votes.size() > 1) {
    for (const auto& [name, param] : params) {
      const int64_t count = param.layout.DeviceCount();
      if (count != devices) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter ", name, ": dev_matrix ", ShapeToString(param.layout.dev_matrix), " has ",
            count, " devices but the strategy's other layouts have ", devices));
      }
    }
  }
  return devices;
}

absl::Status CheckOps(const std::vector<OpStrategy>& ops) {
  for (const OpStrategy& op : ops) {
    if (!IsValidUtf8(op.node_name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "operator name \"", absl::CHexEscape(op.node_name), "\" is not valid UTF-8"));
    }
    if (op.stage < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("operator ", op.node_name, ": pipeline stage ", op.stage, " is negative"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------

absl::StatusOr<Strategy> Strategy::Create(std::map<std::string, StrategyParam> params,
                                          int32_t stage_count, std::vector<OpStrategy> ops,
                                          bool stage_prefixed_names) {
  if (params.empty()) return absl::InvalidArgumentError("strategy has no parameters");
  if (stage_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat("stage_count must be >= 1, got ", stage_count));
  }
  std::set<int32_t> used_stages;
  for (auto& [name, param] : params) {
    CKPT_RETURN_IF_ERROR(CheckParam(name, param, stage_count, &used_stages));
  }
  CKPT_ASSIGN_OR_RETURN(const int64_t devices, DevicesPerStage(params));
  // Ranks are enumerated (uploads, manifests, exports, dependency lists): a world claimed by a
  // strategy file must stay countable. devices <= 2^24 and stage_count < 2^31: no overflow.
  if (devices * stage_count > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy has a world of ", devices * stage_count, " ranks (", devices,
                     " devices per stage x ", stage_count, " stages), more than the ",
                     kMaxWorldSize, " ranks ckptd supports"));
  }
  // used_stages is a subset of [0, stage_count), so the first gap is found within
  // used_stages.size() + 1 steps even for a huge stage_count.
  for (int32_t stage = 0; stage < stage_count; ++stage) {
    if (!used_stages.contains(stage)) {
      return absl::InvalidArgumentError(absl::StrCat("strategy is missing pipeline stage ", stage,
                                                     ": no parameter is placed in it (",
                                                     stage_count, " stages)"));
    }
  }
  CKPT_RETURN_IF_ERROR(CheckOps(ops));

  Strategy strategy;
  strategy.params_ = std::move(params);
  strategy.devices_per_stage_ = devices;
  strategy.stage_count_ = stage_count;
  strategy.ops_ = std::move(ops);
  // A single MindSpore file can only hold several stages with "<stage>-" names.
  strategy.stage_prefixed_names_ = stage_prefixed_names || stage_count > 1;
  return strategy;
}

const StrategyParam* Strategy::Find(std::string_view name) const {
  auto it = params_.find(std::string(name));
  return it == params_.end() ? nullptr : &it->second;
}

absl::StatusOr<Strategy> ParseStrategy(std::string_view bytes, StrategyFormat format) {
  return format == StrategyFormat::kJson ? strategy_internal::ParseJson(bytes) : ParseBinary(bytes);
}

StrategyFormat StrategyFormatForPath(std::string_view path) {
  // MindSpore tests the file name's suffix, case-sensitively.
  return path.ends_with(".json") ? StrategyFormat::kJson : StrategyFormat::kBinary;
}

absl::StatusOr<Strategy> MergeStageStrategies(const std::vector<StrategyFile>& files) {
  if (files.empty()) return absl::InvalidArgumentError("no pipeline strategy files given");
  const StrategyFormat format = StrategyFormatForPath(files.front().path);
  for (const StrategyFile& file : files) {
    if (StrategyFormatForPath(file.path) != format) {
      const bool first_json = format == StrategyFormat::kJson;
      return absl::InvalidArgumentError(
          absl::StrCat("strategy files must be all binary or all .json: ", files.front().path,
                       " is ", first_json ? "JSON" : "binary", " but ", file.path, " is ",
                       first_json ? "binary" : "JSON"));
    }
  }

  std::map<std::string, StrategyParam> params;
  std::vector<OpStrategy> ops;
  std::set<int32_t> stages;
  for (const StrategyFile& file : files) {
    absl::StatusOr<Strategy> part = ParseStrategy(file.bytes, format);
    if (!part.ok()) {
      return absl::Status(part.status().code(),
                          absl::StrCat("strategy file ", file.path, ": ", part.status().message()));
    }
    if (part->stage_prefixed_names()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "strategy file ", file.path,
          " is already a merged pipeline strategy (\"<stage>-\" parameter names); pass the "
          "per-stage files instead"));
    }
    if (part->ops().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("strategy file ", file.path,
                       " has no parallel_strategy_item, so its pipeline stage is unknown"));
    }
    const int32_t stage = part->ops().front().stage;
    // One file per stage is enough: every rank of a stage holds the same layouts.
    if (!stages.insert(stage).second) continue;
    for (const auto& [name, param] : part->params()) {
      CKPT_RETURN_IF_ERROR(AddStageItem(params, name, stage, param));
    }
    ops.insert(ops.end(), part->ops().begin(), part->ops().end());
  }

  // int64: a stage of INT32_MAX must report a gap, not overflow.
  const int64_t stage_count = int64_t{*stages.rbegin()} + 1;
  if (static_cast<int64_t>(stages.size()) != stage_count) {
    int32_t missing = 0;
    while (stages.contains(missing)) ++missing;
    return absl::InvalidArgumentError(absl::StrCat("pipeline strategy files cover stages {",
                                                   absl::StrJoin(stages, ", "), "}; stage ",
                                                   missing, " is missing"));
  }
  return Strategy::Create(std::move(params), static_cast<int32_t>(stage_count), std::move(ops),
                          /*stage_prefixed_names=*/true);
}

std::string SerializeStrategy(const Strategy& strategy, StrategyFormat format) {
  return format == StrategyFormat::kJson ? strategy_internal::SerializeJson(strategy)
                                         : SerializeBinary(strategy);
}

}  // namespace ckpt
