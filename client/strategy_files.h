// Loading and saving strategy files from the local filesystem (client side): a binary or .json
// file, or a directory of per-stage files merged as merge_pipeline_strategys does.
#ifndef CKPT_CLIENT_STRATEGY_FILES_H_
#define CKPT_CLIENT_STRATEGY_FILES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/strategy.h"

namespace ckpt {

// Largest strategy file we read (MindSpore strategy files are kilobytes to a few megabytes).
inline constexpr int64_t kMaxStrategyFileBytes = int64_t{256} << 20;

// PATH is a binary strategy file, a `.json` one, or a directory whose regular files (sorted by
// name) are per-stage strategy files to merge.
absl::StatusOr<Strategy> LoadStrategyPath(const std::string& path);

// Reads every file of `paths` (directories expand to their regular files, sorted) for merging.
absl::StatusOr<std::vector<StrategyFile>> ReadStrategyFiles(const std::vector<std::string>& paths);

// Writes `strategy` atomically: MindSpore's JSON form when the path ends in ".json", its binary
// protobuf form otherwise.
absl::Status WriteStrategyFile(const Strategy& strategy, const std::string& path);

}  // namespace ckpt

#endif  // CKPT_CLIENT_STRATEGY_FILES_H_
