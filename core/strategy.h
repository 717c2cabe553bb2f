// A parallel strategy: the layouts of every parameter of a (possibly pipelined) job, and its
// MindSpore file formats: binary ParallelStrategyMap, JSON, and per-stage merge.
#ifndef CKPT_CORE_STRATEGY_H_
#define CKPT_CORE_STRATEGY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/layout.h"

namespace ckpt {

// Most ranks (devices per stage x stages) a strategy may have.
inline constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

// One operator strategy item (`parallel_strategy_item`): only its stage matters to us, the rest
// is kept so that export round-trips.
struct OpStrategy {
  std::string node_name;
  int32_t stage = 0;
  std::vector<std::vector<uint32_t>> inputs;  // one split list per operator input
  friend bool operator==(const OpStrategy&, const OpStrategy&) = default;
};

// One parameter's entry.
struct StrategyParam {
  Layout layout;
  // Global shape, when the source file records it: MindSpore's JSON `tensor_shape` (MindSpore's
  // binary files do not; ckptd's own binary output does, see SerializeStrategy).
  std::optional<Shape> tensor_shape;
  friend bool operator==(const StrategyParam&, const StrategyParam&) = default;
};

// Immutable after Create(); safe to share between threads.
class Strategy {
 public:
  // Validates and builds: at least one parameter; every layout structurally valid (names the
  // parameter otherwise); all layouts have the same device count; stage_count >= 1 and every
  // layout's stages inside [0, stage_count); every stage holds at least one parameter; a recorded
  // tensor_shape passes Layout::Validate; every parameter name is printable
  // (ValidatePrintableName); the world has at most kMaxWorldSize ranks.
  // `stage_prefixed_names`: the file used "<stage>-<name>" keys (a merged pipeline strategy); kept
  // so that export writes the same form.
  static absl::StatusOr<Strategy> Create(std::map<std::string, StrategyParam> params,
                                         int32_t stage_count, std::vector<OpStrategy> ops = {},
                                         bool stage_prefixed_names = false);

  const std::map<std::string, StrategyParam>& params() const { return params_; }
  const StrategyParam* Find(std::string_view name) const;
  int64_t devices_per_stage() const { return devices_per_stage_; }
  int32_t stage_count() const { return stage_count_; }
  int64_t world_size() const { return devices_per_stage_ * stage_count_; }
  const std::vector<OpStrategy>& ops() const { return ops_; }
  bool stage_prefixed_names() const { return stage_prefixed_names_; }

  friend bool operator==(const Strategy&, const Strategy&) = default;

 private:
  std::map<std::string, StrategyParam> params_;
  int64_t devices_per_stage_ = 0;
  int32_t stage_count_ = 0;
  std::vector<OpStrategy> ops_;
  bool stage_prefixed_names_ = false;
};

enum class StrategyFormat { kBinary, kJson };

// Parses one MindSpore strategy file (binary ParallelStrategyMap, packed or unpacked repeated
// fields; or its JSON form). Keys "<stage>-<name>" on every layout mark a merged pipeline file:
// the name is split on the first '-' and a parameter present in several stages gets all of them
// (first item's layout wins, as MindSpore does). Otherwise the file is one stage (stage 0 of a
// single-stage strategy). Errors name the field and the parameter.
absl::StatusOr<Strategy> ParseStrategy(std::string_view bytes, StrategyFormat format);
// Chooses the format as MindSpore does: `.json` extension → JSON, anything else → binary.
StrategyFormat StrategyFormatForPath(std::string_view path);

// One per-stage (or per-rank) strategy file given to MergeStageStrategies.
struct StrategyFile {
  std::string path;   // for messages and format detection
  std::string bytes;  // whole file contents
};
// As MindSpore's merge_pipeline_strategys: the stage of each file is its first operator item's
// stage; files of an already-seen stage are skipped; the stage set must be exactly {0..S-1}; all
// files must have the same format. The result is a stage-prefixed multi-stage strategy.
absl::StatusOr<Strategy> MergeStageStrategies(const std::vector<StrategyFile>& files);

// Export. Binary writes MindSpore's wire form (unpacked repeated fields, fields 5-7 always
// written, stage prefixes when stage_prefixed_names()), plus each known global shape in a field of
// ckptd's own (ParallelLayouts.ckptd_tensor_shape, which MindSpore ignores), so that both forms
// keep everything a Strategy holds; JSON writes MindSpore's JSON form.
std::string SerializeStrategy(const Strategy& strategy, StrategyFormat format);

}  // namespace ckpt

#endif  // CKPT_CORE_STRATEGY_H_
