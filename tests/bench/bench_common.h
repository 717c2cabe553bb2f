// What the harness and its child modes share: sizes, the names under which the harness registers
// its checkpoint and strategies, and small helpers for timing and medians.
#ifndef CKPT_TESTS_BENCH_BENCH_COMMON_H_
#define CKPT_TESTS_BENCH_BENCH_COMMON_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/strategy.h"
#include "tests/bench/bench_data.h"

namespace ckpt::bench {

using Clock = std::chrono::steady_clock;

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr int64_t kMessageBytes = int64_t{1} << 20;  // ckptd's data message size
// Throughput figures (transport, each fetch case, upload) are the median of this many runs, so
// that one hiccup of a shared machine does not decide a ratio.
inline constexpr int kRepeats = 3;
// The id of the uploaded checkpoint, and the number of worker processes of the concurrent phase.
inline constexpr char kCheckpointId[] = "bench";
inline constexpr int kWorkers = 8;

// Names under which the harness registers its strategies.
inline constexpr char kSourceName[] = "src8";
inline constexpr char kThreeName[] = "d3";
inline constexpr char kColumnName[] = "dcol";
inline constexpr char kPlainName[] = "dplain";
// The storm phase's destination: kStormTp tensor-parallel groups x kStormDp data-parallel
// replicas, one worker process per rank.
inline constexpr char kStormName[] = "dstorm";
inline constexpr int kStormTp = 8;
inline constexpr int kStormDp = 8;

// The median of `v` (not empty).
double Median(std::vector<double> v);

// Wall seconds since `since`. Inline: it ends timed regions.
inline double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The tensor bytes of a checkpoint of `size_gib` GiB (the --size-gib option).
int64_t SizeBytes(double size_gib);

// The strategy the harness registers under `name` (one of the names above); INVALID_ARGUMENT for
// any other name.
absl::StatusOr<Strategy> StrategyByName(const BenchSpec& spec, const std::string& name);

// `n` bytes of a fixed pseudo-random-looking pattern (one per `seed`), cheap to make.
std::string PatternBytes(size_t n, uint32_t seed);

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_BENCH_COMMON_H_
