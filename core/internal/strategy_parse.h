// Pieces shared by the two halves of the strategy codecs: core/strategy.cc (Strategy itself, the
// binary form and the per-stage merge) and core/strategy_json.cc (the JSON form). Private to
// those two files; everything else uses core/strategy.h.
#ifndef CKPT_CORE_INTERNAL_STRATEGY_PARSE_H_
#define CKPT_CORE_INTERNAL_STRATEGY_PARSE_H_

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/strategy.h"

namespace ckpt::strategy_internal {

inline constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kInt32Min = std::numeric_limits<int32_t>::min();

// The error for a strategy without parameters, whatever its format.
absl::Status NoLayoutItems();

// Tensor maps as written in the files -> Layout::tensor_map; `param` names the parameter in
// errors.
// Plain form: one entry per tensor dim, -1 = not split, m >= 0 = device axis m.
absl::StatusOr<std::vector<std::vector<int32_t>>> FromPlainMap(const std::vector<int64_t>& map,
                                                               std::string_view param);
// Nested (multi-axis) form: one list per tensor dim, [-1] = not split. A 1-D tensor carries an
// extra empty list so that "several TensorMaps" always means nested form; it is not a tensor dim.
absl::StatusOr<std::vector<std::vector<int32_t>>> FromNestedMap(
    std::vector<std::vector<int64_t>> dims, std::string_view param);

// One parallel_layout_item as read from a file, before stage prefixes are interpreted.
struct LayoutItem {
  std::string key;  // param_name as written ("<stage>-<name>" in a merged file)
  StrategyParam param;
};

// Interprets the items of one file: "<stage>-<name>" keys on every item mean a merged pipeline
// strategy (merge_pipeline_strategys' output), anything else is a single stage.
absl::StatusOr<Strategy> BuildStrategy(std::vector<LayoutItem> items, std::vector<OpStrategy> ops);

// The JSON form (MindSpore's to_json/FromJson), in core/strategy_json.cc.
absl::StatusOr<Strategy> ParseJson(std::string_view bytes);
std::string SerializeJson(const Strategy& strategy);

}  // namespace ckpt::strategy_internal

#endif  // CKPT_CORE_INTERNAL_STRATEGY_PARSE_H_
