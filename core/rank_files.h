// MindSpore's layout of a distributed checkpoint on disk: one directory per
// rank, DIR/rank_<r>/<prefix><r>.ckpt (as transform_checkpoints writes it). One
// definition of the names and of the file name prefix rule, used by client-side
// export, server-side export jobs and upload discovery alike. Pure string
// functions; thread-safe.
#ifndef CKPT_CORE_RANK_FILES_H_
#define CKPT_CORE_RANK_FILES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

// MindSpore's file name prefix of exported rank files (transform_checkpoints'
// default).
inline constexpr char kDefaultRankFilePrefix[] = "checkpoint_";

// "rank_<r>".
std::string RankDirName(int64_t rank);

// "<prefix><r>.ckpt".
std::string RankFileName(std::string_view prefix, int64_t rank);

// "<dir>/rank_<r>/<prefix><r>.ckpt".
std::string RankFilePath(std::string_view dir, std::string_view prefix, int64_t rank);

// The rank of a directory named "rank_<r>" (decimal, no sign, no leading
// zeros), or nullopt for any other name ("rank_backup", "rank_01", "rank_").
// MindSpore writes no leading zeros, and accepting them would make rank_01 and
// rank_1 the same rank.
std::optional<int64_t> ParseRankDirName(std::string_view name);

// True when `name` looks like a rank directory ("rank_" followed by digits
// only), whether or not ParseRankDirName accepts it: how a directory listing
// tells rank directories from others.
bool LooksLikeRankDirName(std::string_view name);

// The one rule for a rank file name prefix: 1-200 characters of [A-Za-z0-9._-]
// (it becomes part of a file name). INVALID_ARGUMENT naming the prefix and the
// rule otherwise.
absl::Status ValidateRankFilePrefix(std::string_view prefix);

}  // namespace ckpt

#endif  // CKPT_CORE_RANK_FILES_H_
