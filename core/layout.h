// The layout of one parameter: how its global tensor is split over the devices of a pipeline
// stage, as MindSpore's strategy files describe it (docs/design.md, "Model"). Pure index
// maths, no I/O.
#ifndef CKPT_CORE_LAYOUT_H_
#define CKPT_CORE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/box.h"

namespace ckpt {

// Value type. A Layout is only meaningful after Validate() accepted it for a global shape;
// the query methods below assume a validated layout (they return errors, never crash, otherwise).
struct Layout {
  // Devices of one pipeline stage viewed as an n-D grid, outermost axis first.
  std::vector<int64_t> dev_matrix;
  // One entry per tensor dim: the device axes splitting that dim, counted from the RIGHT of
  // dev_matrix (axis m is dev_matrix[n-1-m]), most significant first. Empty = not split.
  // A plain MindSpore map [1,-1] is {{1},{}}; nested multi-axis maps have several axes.
  std::vector<std::vector<int32_t>> tensor_map;
  // True when the layout was written in the nested multi-axis form; kept so that export
  // reproduces it. Ignored by the maths.
  bool nested_form = false;
  // Optimizer (weight) shard: the first dim split further across the replicas of a slice
  // (MindSpore's opt_weight_shard_step/size): 0 = none; size -1 = the whole replica group.
  int64_t opt_shard_step = 0;
  int64_t opt_shard_size = 0;
  // Unsupported MindSpore features, kept so that Validate() can say so clearly.
  int32_t field = 0;
  std::vector<int64_t> param_split_shape;
  std::vector<int64_t> indices_offset;
  // Pipeline stages that hold this parameter, ascending (a shared embedding has several).
  std::vector<int32_t> stages = {0};

  // Checks the layout alone (no shape): dev_matrix entries >= 1 and their product fits, map axes
  // inside dev_matrix and used at most once, stages non-empty and ascending, and the unsupported
  // features (field != 0, param_split_shape, indices_offset) absent.
  absl::Status ValidateStructure() const;
  // ValidateStructure() plus the global shape: rank matches the map, dims >= 1, every dim divisible
  // by its split count, the optimizer shard divides the replica group and the local dim 0, and the
  // element/byte counts fit in int64.
  absl::Status Validate(const Shape& global_shape) const;

  // prod(dev_matrix): devices per pipeline stage.
  int64_t DeviceCount() const;
  // Split count p_i of every tensor dim (without the optimizer shard).
  std::vector<int64_t> SplitsPerDim() const;
  // Ranks sharing one model-parallel slice (devices / prod(p_i)).
  int64_t ReplicaGroupSize() const;
  // Resolved optimizer shard k (1 when there is none; -1 resolved to the replica group size).
  int64_t OptShardFactor() const;
  // The grid of distinct slices: p_i blocks on every dim, dim 0 further cut into k. Every rank's
  // slice is exactly one cell of this grid.
  std::vector<int64_t> Grid(size_t tensor_rank) const;
  // Number of ranks holding each distinct slice (devices / cells).
  int64_t CopiesPerSlice() const;

  // Grid cell (per-dim block index) held by local rank r. OUT_OF_RANGE when r >= DeviceCount().
  absl::StatusOr<std::vector<int64_t>> CellOf(int64_t local_rank, size_t tensor_rank) const;
  // CellOf into `cell` (one entry per tensor dim, so cell.size() is the tensor rank), without
  // allocating for layouts of up to 8 dev_matrix axes (hot loops). The same errors as CellOf;
  // `cell` is unspecified after one.
  absl::Status CellInto(int64_t local_rank, absl::Span<int64_t> cell) const;
  // The box of the global tensor that local rank r stores.
  absl::StatusOr<Box> SliceBox(const Shape& global_shape, int64_t local_rank) const;
  // Shape every rank stores.
  absl::StatusOr<Shape> LocalShape(const Shape& global_shape) const;
  // Global shape from a rank's local shape: local[i]*p_i, dim 0 also ×k (k: the optimizer shard).
  absl::StatusOr<Shape> GlobalShapeFromLocal(const Shape& local_shape) const;

  // MindSpore-style map for messages: "[1, -1]" or "[[1, 0], [-1]]".
  std::string TensorMapString() const;
  // "dev_matrix=[2, 4] tensor_map=[1, -1] opt_shard=(step 0, size 0) stages=[0]".
  std::string ToString() const;

  // Layout equality for planning: same dev matrix, map and optimizer shard (stages ignored).
  bool SameSplit(const Layout& other) const;

  friend bool operator==(const Layout&, const Layout&) = default;
};

// The box of grid cell `cell` for a tensor of `global_shape` cut into `grid` blocks per dim.
Box CellBox(const Shape& global_shape, const std::vector<int64_t>& grid,
            const std::vector<int64_t>& cell);

// A layout that replicates the whole tensor on `devices` devices (used for a parameter absent from
// a strategy, and for a single whole-tensor source).
Layout ReplicatedLayout(size_t tensor_rank, int64_t devices, std::vector<int32_t> stages);

}  // namespace ckpt

#endif  // CKPT_CORE_LAYOUT_H_
