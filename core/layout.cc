#include "core/layout.h"

#include <limits>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

// Largest device count per stage we accept: far above any real cluster, low enough that rank
// arithmetic (stage × devices + local) never overflows.
constexpr int64_t kMaxDevices = int64_t{1} << 24;

std::string AxesString(const std::vector<int32_t>& axes, bool nested) {
  if (axes.empty()) return nested ? "[-1]" : "-1";
  if (!nested && axes.size() == 1) return absl::StrCat(axes[0]);
  return absl::StrCat("[", absl::StrJoin(axes, ", "), "]");
}

}  // namespace

absl::Status Layout::ValidateStructure() const {
  if (dev_matrix.empty()) return absl::InvalidArgumentError("dev_matrix is empty");
  int64_t devices = 1;
  for (size_t a = 0; a < dev_matrix.size(); ++a) {
    if (dev_matrix[a] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("dev_matrix ", ShapeToString(dev_matrix),
                                                     " has a non-positive entry at axis ", a));
    }
    if (dev_matrix[a] > kMaxDevices || devices > kMaxDevices / dev_matrix[a]) {
      return absl::InvalidArgumentError(absl::StrCat("dev_matrix ", ShapeToString(dev_matrix),
                                                     " has more than ", kMaxDevices, " devices"));
    }
    devices *= dev_matrix[a];
  }
  const int32_t n = static_cast<int32_t>(dev_matrix.size());
  std::vector<int> used_by(n, -1);
  for (size_t i = 0; i < tensor_map.size(); ++i) {
    for (int32_t m : tensor_map[i]) {
      if (m < 0 || m >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor_map ", TensorMapString(), " uses device axis ", m, " for dim ", i,
                         ", but dev_matrix ", ShapeToString(dev_matrix), " has only ", n, " axes"));
      }
      if (used_by[m] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("tensor_map ", TensorMapString(),
                                                       " uses device axis ", m, " twice (dims ",
                                                       used_by[m], " and ", i, ")"));
      }
      used_by[m] = static_cast<int>(i);
    }
  }
  if (field != 0) {
    return absl::UnimplementedError(absl::StrCat("field-split layouts (field=", field,
                                                 ") are not supported; only uniform splits are"));
  }
  if (!param_split_shape.empty()) {
    return absl::UnimplementedError(absl::StrCat("uneven split (param_split_shape ",
                                                 ShapeToString(param_split_shape),
                                                 ") is not supported; only uniform splits are"));
  }
  if (!indices_offset.empty()) {
    return absl::UnimplementedError(absl::StrCat("uneven split (indices_offset ",
                                                 ShapeToString(indices_offset),
                                                 ") is not supported; only uniform splits are"));
  }
  if (opt_shard_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("opt_weight_shard_step ", opt_shard_step, " is negative"));
  }
  if (opt_shard_size < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("opt_weight_shard_size ", opt_shard_size, " is below -1"));
  }
  if (stages.empty()) return absl::InvalidArgumentError("layout belongs to no pipeline stage");
  for (size_t s = 0; s < stages.size(); ++s) {
    if (stages[s] < 0 || (s > 0 && stages[s] <= stages[s - 1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "pipeline stages [", absl::StrJoin(stages, ", "), "] must be >= 0 and ascending"));
    }
  }
  return absl::OkStatus();
}

absl::Status Layout::Validate(const Shape& global_shape) const {
  CKPT_RETURN_IF_ERROR(ValidateStructure());
  if (tensor_map.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_map ", TensorMapString(), " has ", tensor_map.size(), " entries but the tensor ",
        ShapeToString(global_shape), " has ", global_shape.size(), " dims"));
  }
  for (size_t i = 0; i < global_shape.size(); ++i) {
    if (global_shape[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("dim ", i, " of shape ",
                                                     ShapeToString(global_shape), " is ",
                                                     global_shape[i], "; dims must be >= 1"));
    }
  }
  CKPT_ASSIGN_OR_RETURN(int64_t elements, NumElements(global_shape));
  // 8 bytes is the widest element: every dtype's byte count must fit as well (the error's text is
  // built only for a shape whose byte count overflows).
  if (elements > std::numeric_limits<int64_t>::max() / 8) {
    CKPT_RETURN_IF_ERROR(
        CheckedMul(elements, 8, absl::StrCat("byte size of shape ", ShapeToString(global_shape)))
            .status());
  }
  const std::vector<int64_t> splits = SplitsPerDim();
  for (size_t i = 0; i < global_shape.size(); ++i) {
    if (global_shape[i] % splits[i] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dim ", i, " (size ", global_shape[i], ") of shape ", ShapeToString(global_shape),
          " is not divisible by its split count ", splits[i], " (dev_matrix ",
          ShapeToString(dev_matrix), ", tensor_map ", TensorMapString(), ")"));
    }
  }
  const int64_t k = OptShardFactor();
  if (k > 1) {
    const int64_t group = ReplicaGroupSize();
    if (global_shape.empty()) {
      return absl::InvalidArgumentError("optimizer shard on a scalar: there is no dim 0 to split");
    }
    if (group % k != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("opt_weight_shard_size ", k, " does not divide the replica group of ", group,
                       " ranks (dev_matrix ", ShapeToString(dev_matrix), ", tensor_map ",
                       TensorMapString(), ")"));
    }
    const int64_t rows = global_shape[0] / splits[0];
    if (rows % k != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dim 0 of each model-parallel slice (", rows, " rows of shape ",
          ShapeToString(global_shape), ") is not divisible by opt_weight_shard_size ", k));
    }
  }
  return absl::OkStatus();
}

int64_t Layout::DeviceCount() const {
  int64_t devices = 1;
  for (int64_t d : dev_matrix) devices *= d;
  return devices;
}

std::vector<int64_t> Layout::SplitsPerDim() const {
  const size_t n = dev_matrix.size();
  std::vector<int64_t> splits(tensor_map.size(), 1);
  for (size_t i = 0; i < tensor_map.size(); ++i) {
    for (int32_t m : tensor_map[i]) splits[i] *= dev_matrix[n - 1 - m];
  }
  return splits;
}

int64_t Layout::ReplicaGroupSize() const {
  int64_t model_parallel = 1;
  for (int64_t p : SplitsPerDim()) model_parallel *= p;
  return DeviceCount() / model_parallel;
}

int64_t Layout::OptShardFactor() const {
  if (opt_shard_step == 0 || opt_shard_size == 0 || tensor_map.empty()) return 1;
  if (opt_shard_size == -1) return ReplicaGroupSize();
  return opt_shard_size;
}

std::vector<int64_t> Layout::Grid(size_t tensor_rank) const {
  std::vector<int64_t> grid = SplitsPerDim();
  grid.resize(tensor_rank, 1);
  if (!grid.empty()) grid[0] *= OptShardFactor();
  return grid;
}

int64_t Layout::CopiesPerSlice() const { return ReplicaGroupSize() / OptShardFactor(); }

absl::StatusOr<std::vector<int64_t>> Layout::CellOf(int64_t local_rank, size_t tensor_rank) const {
  std::vector<int64_t> cell(tensor_rank, 0);
  CKPT_RETURN_IF_ERROR(CellInto(local_rank, absl::MakeSpan(cell)));
  return cell;
}

absl::Status Layout::CellInto(int64_t local_rank, absl::Span<int64_t> cell) const {
  const size_t tensor_rank = cell.size();
  const int64_t devices = DeviceCount();
  if (local_rank < 0 || local_rank >= devices) {
    return absl::OutOfRangeError(absl::StrCat("local rank ", local_rank, " is outside the stage's ",
                                              devices, " devices (dev_matrix ",
                                              ShapeToString(dev_matrix), ")"));
  }
  if (tensor_map.size() != tensor_rank) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_map ", TensorMapString(), " has ",
                                                   tensor_map.size(), " entries, tensor has ",
                                                   tensor_rank, " dims"));
  }
  // The rank's dev_matrix coordinates, row-major (last axis fastest, as MindSpore numbers a
  // stage's devices), and which axes split the tensor.
  const size_t n = dev_matrix.size();
  absl::InlinedVector<int64_t, 8> coord(n);
  absl::InlinedVector<bool, 8> used(n, false);
  int64_t rest = local_rank;
  for (size_t a = n; a-- > 0;) {
    coord[a] = rest % dev_matrix[a];
    rest /= dev_matrix[a];
  }
  for (size_t i = 0; i < tensor_rank; ++i) {
    cell[i] = 0;
    for (int32_t m : tensor_map[i]) {
      const size_t a = n - 1 - m;
      cell[i] = cell[i] * dev_matrix[a] + coord[a];
      used[a] = true;
    }
  }
  const int64_t k = OptShardFactor();
  if (k > 1) {
    // Position of the rank inside its replica group sorted ascending: the group varies over the
    // unused axes, and row-major rank order sorts it by those coordinates, outer axis first.
    int64_t index = 0;
    for (size_t a = 0; a < n; ++a) {
      if (!used[a]) index = index * dev_matrix[a] + coord[a];
    }
    cell[0] = cell[0] * k + index % k;
  }
  return absl::OkStatus();
}

Box CellBox(const Shape& global_shape, const std::vector<int64_t>& grid,
            const std::vector<int64_t>& cell) {
  Box box;
  box.lo.resize(global_shape.size());
  box.hi.resize(global_shape.size());
  for (size_t i = 0; i < global_shape.size(); ++i) {
    const int64_t block = global_shape[i] / grid[i];
    box.lo[i] = cell[i] * block;
    box.hi[i] = box.lo[i] + block;
  }
  return box;
}

absl::StatusOr<Box> Layout::SliceBox(const Shape& global_shape, int64_t local_rank) const {
  CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> cell, CellOf(local_rank, global_shape.size()));
  return CellBox(global_shape, Grid(global_shape.size()), cell);
}

absl::StatusOr<Shape> Layout::LocalShape(const Shape& global_shape) const {
  if (tensor_map.size() != global_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor_map ", TensorMapString(), " has ", tensor_map.size(), " entries, tensor ",
        ShapeToString(global_shape), " has ", global_shape.size(), " dims"));
  }
  const std::vector<int64_t> grid = Grid(global_shape.size());
  Shape local(global_shape.size());
  for (size_t i = 0; i < global_shape.size(); ++i) {
    if (global_shape[i] % grid[i] != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("dim ", i, " of shape ", ShapeToString(global_shape),
                       " is not divisible into ", grid[i], " slices"));
    }
    local[i] = global_shape[i] / grid[i];
  }
  return local;
}

absl::StatusOr<Shape> Layout::GlobalShapeFromLocal(const Shape& local_shape) const {
  if (tensor_map.size() != local_shape.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor_map ", TensorMapString(), " has ", tensor_map.size(),
                     " entries but the stored slice ", ShapeToString(local_shape), " has ",
                     local_shape.size(), " dims"));
  }
  const std::vector<int64_t> grid = Grid(local_shape.size());
  Shape global(local_shape.size());
  for (size_t i = 0; i < local_shape.size(); ++i) {
    if (local_shape[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("dim ", i, " of the stored slice ",
                                                     ShapeToString(local_shape), " is ",
                                                     local_shape[i], "; dims must be >= 1"));
    }
    CKPT_ASSIGN_OR_RETURN(global[i],
                          CheckedMul(local_shape[i], grid[i], absl::StrCat("global dim ", i)));
  }
  return global;
}

std::string Layout::TensorMapString() const {
  std::vector<std::string> parts;
  for (const auto& axes : tensor_map) parts.push_back(AxesString(axes, nested_form));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

std::string Layout::ToString() const {
  std::string out =
      absl::StrCat("dev_matrix=", ShapeToString(dev_matrix), " tensor_map=", TensorMapString());
  if (opt_shard_step != 0 || opt_shard_size != 0) {
    absl::StrAppend(&out, " opt_shard=(step ", opt_shard_step, ", size ", opt_shard_size, ")");
  }
  absl::StrAppend(&out, " stages=[", absl::StrJoin(stages, ", "), "]");
  return out;
}

bool Layout::SameSplit(const Layout& other) const {
  return dev_matrix == other.dev_matrix && tensor_map == other.tensor_map &&
         OptShardFactor() == other.OptShardFactor();
}

Layout ReplicatedLayout(size_t tensor_rank, int64_t devices, std::vector<int32_t> stages) {
  Layout layout;
  layout.dev_matrix = {devices};
  layout.tensor_map.assign(tensor_rank, {});
  layout.stages = std::move(stages);
  return layout;
}

}  // namespace ckpt
