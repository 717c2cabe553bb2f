#include "client/rank_directory.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <map>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/rank_files.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// A decimal without sign or spaces that fits int64 comfortably (names are not numbers to trust).
std::optional<int64_t> ParseDecimal(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t value = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

// "rank_2, rank_5" with at most `max_listed` names, then "and N more".
std::string RankList(const std::vector<int64_t>& ranks, size_t max_listed = 10) {
  std::vector<std::string> names;
  for (size_t i = 0; i < ranks.size() && i < max_listed; ++i) {
    names.push_back(RankDirName(ranks[i]));
  }
  std::string out = absl::StrJoin(names, ", ");
  if (ranks.size() > max_listed) absl::StrAppend(&out, " and ", ranks.size() - max_listed, " more");
  return out;
}

// The rank directories of a checkpoint directory: those of the world by rank, and the ranks of
// those beyond it.
struct RankDirs {
  std::map<int64_t, std::string> found;
  std::vector<int64_t> beyond;
};

// Lists the subdirectories of `dir` named rank_<digits> (MindSpore's rank_[0-9]*; rank_backup and
// other entries are ignored). INVALID_ARGUMENT for a rank directory with leading zeros: rank_01
// next to rank_1 would be ambiguous, and MindSpore writes none.
absl::StatusOr<RankDirs> ListRankDirs(const std::string& dir, int64_t world_size) {
  RankDirs dirs;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!LooksLikeRankDirName(name)) continue;
    std::error_code entry_ec;
    if (!it->is_directory(entry_ec)) continue;
    const std::optional<int64_t> rank = ParseRankDirName(name);
    if (!rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          it->path().string(), ": rank directories are named rank_<r> without leading zeros"));
    }
    if (*rank >= world_size) {
      dirs.beyond.push_back(*rank);
    } else {
      dirs.found[*rank] = it->path().string();
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  std::sort(dirs.beyond.begin(), dirs.beyond.end());
  return dirs;
}

// INVALID_ARGUMENT naming the missing ranks and those beyond the world, unless `dirs` holds
// exactly rank_0 .. rank_{world_size-1}.
absl::Status CheckRankDirsMatchWorld(const std::string& dir, const RankDirs& dirs,
                                     int64_t world_size) {
  std::vector<int64_t> missing;
  for (int64_t r = 0; r < world_size; ++r) {
    if (!dirs.found.contains(r)) missing.push_back(r);
  }
  if (missing.empty() && dirs.beyond.empty()) return absl::OkStatus();
  std::string problems;
  if (!missing.empty()) absl::StrAppend(&problems, "missing ", RankList(missing));
  if (!dirs.beyond.empty()) {
    absl::StrAppend(&problems, problems.empty() ? "" : "; ", "unexpected ", RankList(dirs.beyond),
                    " beyond the world");
  }
  return absl::InvalidArgumentError(absl::StrCat(dir, " does not match the strategy's ", world_size,
                                                 " ranks (rank_0..rank_", world_size - 1,
                                                 "): ", problems));
}

}  // namespace

std::optional<std::pair<int64_t, int64_t>> ParseEpochStep(std::string_view file_name) {
  constexpr std::string_view kSuffix = ".ckpt";
  if (!file_name.ends_with(kSuffix)) return std::nullopt;
  const std::string_view stem = file_name.substr(0, file_name.size() - kSuffix.size());
  const size_t dash = stem.rfind('-');
  if (dash == std::string_view::npos) return std::nullopt;
  const std::string_view numbers = stem.substr(dash + 1);
  const size_t underscore = numbers.find('_');
  if (underscore == std::string_view::npos) return std::nullopt;
  const std::optional<int64_t> epoch = ParseDecimal(numbers.substr(0, underscore));
  const std::optional<int64_t> step = ParseDecimal(numbers.substr(underscore + 1));
  if (!epoch || !step) return std::nullopt;
  return std::make_pair(*epoch, *step);
}

absl::StatusOr<std::string> SelectRankCheckpointFile(const std::string& rank_dir) {
  struct Candidate {
    std::string name;
    fs::path path;
    std::optional<std::pair<int64_t, int64_t>> epoch_step;
    fs::file_time_type mtime;
  };
  std::vector<Candidate> candidates;
  std::error_code ec;
  fs::directory_iterator it(rank_dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (name.size() <= 5 || !name.ends_with(".ckpt")) continue;
    std::error_code entry_ec;
    if (!it->is_regular_file(entry_ec)) continue;
    const fs::file_time_type mtime = it->last_write_time(entry_ec);
    if (entry_ec) {
      return absl::NotFoundError(
          absl::StrCat("cannot stat ", it->path().string(), ": ", entry_ec.message()));
    }
    std::optional<std::pair<int64_t, int64_t>> epoch_step = ParseEpochStep(name);
    candidates.push_back({std::move(name), it->path(), epoch_step, mtime});
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", rank_dir, ": ", ec.message()));
  if (candidates.empty()) {
    return absl::NotFoundError(absl::StrCat(rank_dir, " holds no .ckpt file"));
  }
  // Epoch/step numbers are only comparable when every name has them; a stray "final.ckpt" makes
  // the modification time the only meaningful order.
  const bool numbered = std::all_of(candidates.begin(), candidates.end(),
                                    [](const Candidate& c) { return c.epoch_step.has_value(); });
  auto older = [numbered](const Candidate& a, const Candidate& b) {
    if (numbered && a.epoch_step != b.epoch_step) return a.epoch_step < b.epoch_step;
    if (a.mtime != b.mtime) return a.mtime < b.mtime;
    return a.name < b.name;
  };
  return std::max_element(candidates.begin(), candidates.end(), older)->path.string();
}

absl::StatusOr<std::vector<std::string>> ResolveRankFiles(const std::string& dir,
                                                          int64_t world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be positive, got ", world_size));
  }
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  }
  CKPT_ASSIGN_OR_RETURN(const RankDirs dirs, ListRankDirs(dir, world_size));
  CKPT_RETURN_IF_ERROR(CheckRankDirsMatchWorld(dir, dirs, world_size));
  std::vector<std::string> files;
  files.reserve(static_cast<size_t>(world_size));
  for (const auto& [rank, rank_dir] : dirs.found) {
    CKPT_ASSIGN_OR_RETURN(std::string file, SelectRankCheckpointFile(rank_dir));
    files.push_back(std::move(file));
  }
  return files;
}

}  // namespace ckpt
