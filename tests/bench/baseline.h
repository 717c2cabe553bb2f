// The naive transform the benchmark compares ckptd's export job against: MindSpore's
// transform_checkpoints algorithm (load every source rank file fully, merge each parameter's
// slices into the whole tensor, cut every destination rank's slice out of it, write one .ckpt per
// destination rank). Run in its own process so that its peak RSS is its own.
#ifndef CKPT_TESTS_BENCH_BASELINE_H_
#define CKPT_TESTS_BENCH_BASELINE_H_

#include <string>

#include "absl/status/status.h"
#include "core/strategy.h"
#include "tests/bench/bench_data.h"

namespace ckpt::bench {

// Reads SRC_DIR/rank_<r>/bench-1_1.ckpt for every rank of `source` and writes
// OUT_DIR/rank_<d>/checkpoint_<d>.ckpt for every rank of `destination` (single-stage strategies).
//
// Deliberately kinder to the baseline than MindSpore: compiled C++ instead of Python/numpy, and
// each whole tensor is merged once and cut for every destination rank (MindSpore merges again
// for every destination rank); the sources are still all held in memory, as MindSpore does.
absl::Status NaiveTransform(const BenchSpec& spec, const Strategy& source,
                            const Strategy& destination, const std::string& src_dir,
                            const std::string& out_dir);

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_BASELINE_H_
