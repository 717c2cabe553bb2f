// Finding the checkpoint file of every rank in a local MindSpore checkpoint directory
// DIR/rank_<r>/*.ckpt (core/rank_files.h names the layout), as CkptClient::UploadDirectory does.
// Functions of the local file system only; thread-safe.
#ifndef CKPT_CLIENT_RANK_DIRECTORY_H_
#define CKPT_CLIENT_RANK_DIRECTORY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

// The epoch and step of a MindSpore checkpoint name "<prefix>-<epoch>_<step>.ckpt" (the prefix
// may itself contain '-'), or nullopt for any other name.
std::optional<std::pair<int64_t, int64_t>> ParseEpochStep(std::string_view file_name);

// The newest .ckpt among the regular files of `rank_dir` (other files are ignored). When every
// candidate is named "<prefix>-<epoch>_<step>.ckpt" the largest (epoch, step) wins, compared
// numerically (MindSpore's loaders take the lexicographically last name, so x-9_10.ckpt beats
// x-10_10.ckpt there); otherwise, and between equal numbers, the latest modification time, then
// the largest name. NOT_FOUND when the directory holds no .ckpt file.
absl::StatusOr<std::string> SelectRankCheckpointFile(const std::string& rank_dir);

// The checkpoint file of every rank of DIR: DIR must hold exactly rank_0 .. rank_{world_size-1}
// (other entries not named rank_<digits> are ignored). INVALID_ARGUMENT naming the missing
// ranks, or the rank directories beyond the world; errors of SelectRankCheckpointFile.
absl::StatusOr<std::vector<std::string>> ResolveRankFiles(const std::string& dir,
                                                          int64_t world_size);

}  // namespace ckpt

#endif  // CKPT_CLIENT_RANK_DIRECTORY_H_
