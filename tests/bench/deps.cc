#include "tests/bench/deps.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "core/strategy.h"
#include "tests/bench/bench_common.h"

namespace ckpt::bench {
namespace {

// `params` parameters over `stages` pipeline stages of `dev_matrix` (3 axes): a mix of row,
// column, nested, 2-D, optimizer-sharded and replicated layouts and 1-D biases; `variant` shifts
// the mix so that a source and a destination differ.
absl::StatusOr<Strategy> DepsStrategy(int64_t params, std::vector<int64_t> dev_matrix,
                                      int32_t stages, int variant) {
  std::map<std::string, StrategyParam> out;
  for (int64_t i = 0; i < params; ++i) {
    Layout l;
    l.dev_matrix = dev_matrix;
    if (i % 7 == 6) {  // 1-D bias
      l.tensor_map = {((i / 7) + variant) % 2 == 0 ? std::vector<int32_t>{1}
                                                   : std::vector<int32_t>{}};
    } else {
      switch ((i + variant) % 6) {
        case 0:
          l.tensor_map = {{2}, {}};
          break;
        case 1:
          l.tensor_map = {{}, {0}};
          break;
        case 2:
          l.tensor_map = {{2, 1}, {}};
          l.nested_form = true;
          break;
        case 3:
          l.tensor_map = {{1}, {0}};
          break;
        case 4:
          l.tensor_map = {{0}, {}};
          // 8-way, or the whole replica group (the two outer axes) where it is smaller: the
          // small destinations of the growth case.
          l.opt_shard_size = std::min<int64_t>(8, dev_matrix[0] * dev_matrix[1]);
          l.opt_shard_step = 1;
          break;
        default:
          l.tensor_map = {{}, {}};
          break;
      }
    }
    if (i == 0 && stages > 1) {
      l.stages = {0, stages - 1};  // a shared embedding
    } else {
      l.stages = {static_cast<int32_t>(i * stages / params)};
    }
    out[absl::StrFormat("layers.%04d.param", i)].layout = std::move(l);
  }
  return Strategy::Create(std::move(out), stages);
}

}  // namespace

absl::StatusOr<DepsResult> MeasureDeps(int64_t params) {
  return MeasureDepsTo({16, 8, 8}, 4, params);
}

absl::StatusOr<DepsResult> MeasureDepsTo(std::vector<int64_t> dst_dev_matrix, int32_t dst_stages,
                                         int64_t params) {
  if (dst_dev_matrix.size() != 3) {
    return absl::InvalidArgumentError("the destination dev_matrix must have 3 axes");
  }
  DepsResult result;
  result.params = params;
  CKPT_ASSIGN_OR_RETURN(Strategy src, DepsStrategy(result.params, {8, 8, 8}, 2, 0));
  CKPT_ASSIGN_OR_RETURN(Strategy dst,
                        DepsStrategy(result.params, std::move(dst_dev_matrix), dst_stages, 3));
  result.src_world = src.world_size();
  result.dst_world = dst.world_size();
  auto s = std::make_shared<const Strategy>(std::move(src));
  auto d = std::make_shared<const Strategy>(std::move(dst));
  for (int run = 0; run < 3; ++run) {
    const auto start = Clock::now();
    CKPT_ASSIGN_OR_RETURN(Resharder planner, Resharder::CreateFromLayouts(s, d));
    CKPT_ASSIGN_OR_RETURN(auto all, planner.AllSourceRanks());
    result.runs_ms.push_back(Seconds(start) * 1000.0);
    if (static_cast<int64_t>(all.size()) != result.dst_world) {
      return absl::InternalError("AllSourceRanks returned the wrong number of ranks");
    }
    for (const auto& r : all) {
      result.max_sources = std::max<int64_t>(result.max_sources, static_cast<int64_t>(r.size()));
    }
  }
  return result;
}

}  // namespace ckpt::bench
