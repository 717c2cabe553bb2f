// The planning figure: how long `deps --all` (every destination rank's source ranks) takes for a
// large synthetic re-split, measured in this process without a server.
#ifndef CKPT_TESTS_BENCH_DEPS_H_
#define CKPT_TESTS_BENCH_DEPS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

struct DepsResult {
  std::vector<double> runs_ms;  // each run: planning plus AllSourceRanks, milliseconds
  int64_t src_world = 0;
  int64_t dst_world = 0;
  int64_t params = 0;
  int64_t max_sources = 0;  // the most source ranks any destination rank needs
};

// Three runs of planning `params` parameters from 1024 ranks (2 pipeline stages) to 4096 ranks (4
// stages), a mix of row, column, nested, 2-D, optimizer-sharded and replicated layouts, and of
// listing every destination rank's source ranks.
absl::StatusOr<DepsResult> MeasureDeps(int64_t params = 1000);
// The same source, to a destination of `dst_dev_matrix` (3 axes) per stage over `dst_stages`
// pipeline stages (the growth case's destination-rank series).
absl::StatusOr<DepsResult> MeasureDepsTo(std::vector<int64_t> dst_dev_matrix, int32_t dst_stages,
                                         int64_t params = 1000);

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_DEPS_H_
