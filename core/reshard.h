// Re-shard planning (docs/design.md, "Re-sharding"): every destination slice is the union of its
// intersections with the distinct source slices; no global tensor is ever built. Also the
// dependency cover: which source ranks one destination rank reads (sufficient and irredundant,
// ties to the lowest rank).
#ifndef CKPT_CORE_RESHARD_H_
#define CKPT_CORE_RESHARD_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/layout.h"
#include "core/strategy.h"

namespace ckpt {

// One tensor of a source checkpoint, as the planner needs it.
struct TensorInfo {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape global_shape;
  // Source global ranks whose files hold this tensor when it has no layout in the source strategy
  // (verbatim values and whole tensors). Empty = every source rank. Ignored for laid-out tensors.
  std::vector<int64_t> holders;
};

// True for optimizer-state names (`adam_m.`, `adam_v.`, `moments.`, `accu_grads.`); sets `weight`
// to the name without the prefix.
bool IsOptimizerStateName(std::string_view name, std::string* weight);

// The layout `strategy` gives `name`: its own entry, or — when `inherit_optimizer_layouts` and the
// name is an optimizer state of a parameter the strategy has — that weight's (strategies
// saved with MindSpore's default only_trainable_params=True omit optimizer states, whose layouts
// equal the weight's). Null when neither exists.
const Layout* ResolveLayout(const Strategy& strategy, std::string_view name,
                            bool inherit_optimizer_layouts);

struct PlanOptions {
  // A parameter missing from a strategy whose name is an optimizer state of a weight in that
  // strategy takes the weight's layout, on both sides (MindSpore's transform copies such states
  // verbatim, with the wrong shape for sharded ones). Default on.
  bool inherit_optimizer_layouts = true;
  // Refuse (FAILED_PRECONDITION) a parameter laid out in the source strategy but absent from the
  // destination one, instead of delivering it whole with a warning. Default off.
  bool strict = false;
  // Which tensors to deliver (include/exclude globs are applied by the caller). Null = all.
  std::function<bool(std::string_view)> select;
};

enum class TensorKind {
  kResharded,  // laid out at the destination: the rank's slice
  kWhole,      // laid out at the source but not at the destination: delivered whole (warning)
  kVerbatim,   // in neither strategy: copied unchanged from one source rank
};

// Copy one region from one distinct source slice into the destination slice.
struct CopyOp {
  int64_t src_box_id = 0;  // row-major index of the source slice in its layout's grid
  int64_t src_rank = 0;    // global source rank chosen to supply it (a member of the cover)
  Box src_box;             // the source slice, global coordinates
  std::vector<int64_t> src_offset;  // region start inside the source slice
  std::vector<int64_t> dst_offset;  // region start inside the destination slice
  Shape extent;                     // region shape
};

// The copy ops of one tensor's destination slice: immutable, and shared by the tensors of a plan
// that have the same geometry (global shape, layouts and holders), so that a plan of many tensors
// of a few shapes neither computes nor copies them per tensor. Copies share; thread-safe to read.
class CopyOps {
 public:
  CopyOps() = default;
  explicit CopyOps(std::vector<CopyOp> ops)
      : ops_(std::make_shared<const std::vector<CopyOp>>(std::move(ops))) {}

  size_t size() const { return ops_ ? ops_->size() : 0; }
  bool empty() const { return size() == 0; }
  const CopyOp& operator[](size_t i) const { return (*ops_)[i]; }
  const CopyOp* begin() const { return ops_ ? ops_->data() : nullptr; }
  const CopyOp* end() const { return ops_ ? ops_->data() + ops_->size() : nullptr; }

 private:
  std::shared_ptr<const std::vector<CopyOp>> ops_;
};

struct TensorPlan {
  std::string name;
  DType dtype = DType::kFloat32;
  TensorKind kind = TensorKind::kResharded;
  Shape global_shape;
  Box dst_box;  // global coordinates of the destination slice
  CopyOps ops;  // disjoint, exactly tiling dst_box, ordered by destination position
  // Index of the tensor in the catalog the planner was created with (Resharder::Create's
  // `tensors`); -1 for a plan from layouts alone.
  int64_t catalog_index = -1;
};

struct RankPlan {
  int64_t dst_rank = 0;
  // Re-sharded and whole tensors in source catalog order, then the verbatim ones (MindSpore's
  // output order in transform_checkpoints).
  std::vector<TensorPlan> tensors;
  std::vector<int64_t> source_ranks;  // the dependency cover, ascending
  std::vector<std::string> warnings;  // e.g. tensors delivered whole
};

// Immutable after Create(); Plan/SourceRanks are const and thread-safe.
class Resharder {
 public:
  // Plans against a real checkpoint. `src` null: a single whole-tensor source (one rank, every
  // tensor whole). `dst` null: merged output (one rank receiving every tensor whole).
  // Validates every layout against its tensor's global shape (errors name the parameter).
  static absl::StatusOr<Resharder> Create(std::shared_ptr<const Strategy> src,
                                          std::shared_ptr<const Strategy> dst,
                                          std::vector<TensorInfo> tensors,
                                          PlanOptions options = {});
  // Plans from layouts alone (no checkpoint; for `deps`): the parameters in both strategies, each
  // on a scale-free virtual shape (the overlap structure of uniform splits does not depend on the
  // actual sizes). Verbatim parameters are not known and do not contribute.
  static absl::StatusOr<Resharder> CreateFromLayouts(std::shared_ptr<const Strategy> src,
                                                     std::shared_ptr<const Strategy> dst,
                                                     PlanOptions options = {});

  int64_t src_world() const;
  int64_t dst_world() const;

  // The plan for one destination global rank. OUT_OF_RANGE for a rank outside the destination
  // world; NOT_FOUND when a selected destination parameter of the rank's stage is missing from
  // the checkpoint.
  absl::StatusOr<RankPlan> Plan(int64_t dst_rank) const;
  // The dependency cover of one destination rank, ascending.
  absl::StatusOr<std::vector<int64_t>> SourceRanks(int64_t dst_rank) const;
  // The cover of every destination rank (index = rank).
  absl::StatusOr<std::vector<std::vector<int64_t>>> AllSourceRanks() const;

  ~Resharder();
  Resharder(Resharder&&) noexcept;
  Resharder& operator=(Resharder&&) noexcept;

 private:
  struct Impl;
  explicit Resharder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Picks a sufficient and irredundant set of ranks from `pieces` (each piece lists the ranks that
// hold it, any order; none empty): greedy by coverage with ties to the lowest rank, then every
// rank that became redundant dropped, highest first. Exposed for tests.
absl::StatusOr<std::vector<int64_t>> ChooseCover(const std::vector<std::vector<int64_t>>& pieces);

}  // namespace ckpt

#endif  // CKPT_CORE_RESHARD_H_
