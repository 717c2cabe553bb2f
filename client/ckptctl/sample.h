// Deterministic sample checkpoints: every byte of every global tensor is a pure function of
// (tensor name, flat element index, byte within element), so tests and demos can check any
// slice independently without storing the global tensor.
#ifndef CKPT_CLIENT_CKPTCTL_SAMPLE_H_
#define CKPT_CLIENT_CKPTCTL_SAMPLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/strategy.h"

namespace ckpt {

// Byte `byte` of element `flat` of the sample tensor `name` (salted by `seed`).
uint8_t SampleByte(const std::string& name, int64_t flat, int byte, uint64_t seed);
// The row-major bytes of `box` of the sample tensor `name` with global shape `global`.
std::string SampleSlice(const std::string& name, DType dtype, const Shape& global,
                        const Box& box, uint64_t seed);

struct SampleTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape global_shape;
};

struct SampleOptions {
  uint64_t seed = 1;
  // File name inside each rank_<r>/ directory (MindSpore's <prefix>-<epoch>_<step>.ckpt).
  std::string file_name = "sample-1_10.ckpt";
  // Scalars appended to every rank's file, copied verbatim by transforms.
  bool verbatim_scalars = true;
};

// Writes DIR/rank_<r>/<file_name> for every global rank of `strategy`: each rank holds the
// slices of the parameters of its pipeline stage (local shapes), in `tensors` order, then the
// verbatim scalars `global_step` (Int32) and `learning_rate` (Float32).
absl::Status WriteShardedSample(const Strategy& strategy, const std::vector<SampleTensor>& tensors,
                                const std::string& dir, const SampleOptions& options);
// Writes one whole-tensor checkpoint FILE (integrated save): every tensor whole.
absl::Status WriteWholeSample(const std::vector<SampleTensor>& tensors, const std::string& file,
                              const SampleOptions& options);

// A small demo pair: a 2-stage × 4-device source strategy (dev_matrix [2,2], row/column splits,
// a replicated norm, an optimizer-sharded weight, an embedding shared by both stages) and its
// tensors; shapes divisible for destinations of 1, 2, 3, 4, 6 or 8 devices.
Strategy DemoSourceStrategy();
std::vector<SampleTensor> DemoTensors();
// A 3-device, single-stage destination for the demo (a non-multiple of the source's 8 ranks).
Strategy DemoDestinationStrategy();

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_SAMPLE_H_
