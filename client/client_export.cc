// CkptClient::ExportRanks: every selected destination rank fetched in parallel into a hidden
// temporary sibling of the export directory, which is renamed into place only when every rank
// succeeded.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_internal.h"
#include "core/rank_files.h"
#include "core/status_macros.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

// Sums the progress of several rank fetches. The total is exact once every rank has reported its
// plan; before that it is extrapolated from the plans known so far (ranks of one strategy are
// usually of similar size), so that a rate and ETA can be shown from the start. Thread-safe.
class ExportProgress {
 public:
  ExportProgress(size_t rank_count, ProgressFn progress)
      : ranks_(rank_count), progress_(std::move(progress)) {}

  ProgressFn ForRank(size_t index) {
    if (!progress_) return nullptr;
    return [this, index](int64_t done, int64_t total) { Update(index, done, total); };
  }

 private:
  struct Rank {
    bool planned = false;
    int64_t done = 0;
    int64_t total = 0;
  };

  void Update(size_t index, int64_t done, int64_t total) {
    std::lock_guard<std::mutex> lock(mu_);
    Rank& rank = ranks_[index];
    done_ += done - rank.done;
    rank.done = done;
    if (!rank.planned) {
      rank.planned = true;
      ++planned_;
      known_total_ += total;
    }
    int64_t estimate = known_total_;
    if (planned_ < ranks_.size()) {
      estimate =
          static_cast<int64_t>(static_cast<double>(known_total_) *
                               static_cast<double>(ranks_.size()) / static_cast<double>(planned_));
    }
    // Called under mu_ so that the caller sees monotonic sums.
    progress_(done_, std::max(estimate, done_));
  }

  std::mutex mu_;
  std::vector<Rank> ranks_;  // guarded by mu_
  size_t planned_ = 0;       // guarded by mu_
  int64_t known_total_ = 0;  // guarded by mu_
  int64_t done_ = 0;         // guarded by mu_
  const ProgressFn progress_;
};

// Where an export goes: DIR without trailing separators, its last component and its parent.
struct ExportTarget {
  std::string path;
  std::string name;
  std::string parent;
};

// Checks that `dir` names a directory that does not exist or is empty. INVALID_ARGUMENT when it
// names no new directory ("", "/", "."), ALREADY_EXISTS when it is a file or not empty.
absl::StatusOr<ExportTarget> CheckExportTarget(const std::string& dir) {
  // "out/" names the directory "out": drop trailing separators before taking the name apart.
  std::string target_str = dir;
  while (target_str.size() > 1 && target_str.back() == '/') target_str.pop_back();
  const fs::path target(target_str);
  const std::string name = target.filename().string();
  if (target_str.empty() || name.empty() || name == "." || name == ".." || target_str == "/") {
    return absl::InvalidArgumentError(absl::StrCat(
        "export directory \"", dir, "\" does not name a new directory (e.g. ./export)"));
  }
  std::error_code ec;
  const fs::file_status target_status = fs::symlink_status(target, ec);
  if (fs::exists(target_status)) {
    if (!fs::is_directory(target_status)) {
      return absl::AlreadyExistsError(
          absl::StrCat(target_str, " exists and is not a directory; export writes a new one"));
    }
    if (!fs::is_empty(target, ec) || ec) {
      return absl::AlreadyExistsError(absl::StrCat(
          target_str, " exists and is not empty; export writes a new or empty directory"));
    }
  }
  // The temporary sibling lives in the same parent, on the same file system, so the final rename
  // is atomic.
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  return ExportTarget{target_str, name, parent.string()};
}

// `ranks` sorted, or every rank of a world of `world` when empty. INVALID_ARGUMENT for a rank
// listed twice, OUT_OF_RANGE for one outside the world of `strategy`.
absl::StatusOr<std::vector<int64_t>> SelectExportRanks(std::vector<int64_t> ranks, int64_t world,
                                                       const std::string& strategy) {
  if (ranks.empty()) {
    ranks.resize(static_cast<size_t>(world));
    for (int64_t r = 0; r < world; ++r) ranks[static_cast<size_t>(r)] = r;
  }
  std::sort(ranks.begin(), ranks.end());
  if (const auto twice = std::adjacent_find(ranks.begin(), ranks.end()); twice != ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", *twice, " is listed more than once"));
  }
  for (int64_t r : ranks) {
    if (r < 0 || r >= world) {
      return absl::OutOfRangeError(absl::StrCat("destination rank ", r,
                                                " is outside the world of strategy ", strategy,
                                                " (", world, " ranks)"));
    }
  }
  return ranks;
}

// Makes the export in `temp` durable and presents it as `target.path` at once. Every rank file
// is already synced (FetchToFile); their directory entries are synced here. rename(2) replaces
// an empty directory and fails on a non-empty one, so a directory filled by someone else
// meanwhile is never merged into. `temp` is released once renamed.
absl::Status PublishExport(TempDirectory& temp, const ExportTarget& target,
                           const std::vector<RankExportResult>& ranks) {
  for (const RankExportResult& r : ranks) {
    CKPT_RETURN_IF_ERROR(SyncDirectory(absl::StrCat(temp.path(), "/", RankDirName(r.rank))));
  }
  CKPT_RETURN_IF_ERROR(SyncDirectory(temp.path()));
  if (::rename(temp.path().c_str(), target.path.c_str()) != 0) {
    const int error = errno;
    if (error == ENOTEMPTY || error == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(target.path,
                       " was filled by someone else during the export; nothing "
                       "was written to it"));
    }
    return ErrnoToStatus(error, "rename", temp.path() + " to " + target.path);
  }
  temp.Release();
  return SyncDirectory(target.parent);
}

}  // namespace

absl::StatusOr<ExportSummary> CkptClient::ExportRanks(const std::string& checkpoint_id,
                                                      const std::string& destination_strategy,
                                                      const std::string& dir,
                                                      const std::vector<int64_t>& ranks,
                                                      const std::string& prefix, int parallelism,
                                                      ProgressFn progress) {
  if (parallelism < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("export parallelism must be at least 1, got ", parallelism));
  }
  if (destination_strategy.empty()) {
    return absl::InvalidArgumentError("export needs a destination strategy name");
  }
  CKPT_RETURN_IF_ERROR(ValidateRankFilePrefix(prefix));
  CKPT_ASSIGN_OR_RETURN(const ExportTarget target, CheckExportTarget(dir));
  CKPT_ASSIGN_OR_RETURN(const int64_t world, StrategyWorldSize(destination_strategy));
  CKPT_ASSIGN_OR_RETURN(const std::vector<int64_t> selected,
                        SelectExportRanks(ranks, world, destination_strategy));

  std::error_code ec;
  fs::create_directories(target.parent, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create directory", target.parent);
  // A failed export leaves nothing: `temp` removes the directory when it is not released.
  CKPT_ASSIGN_OR_RETURN(
      TempDirectory temp,
      TempDirectory::Create(target.parent, absl::StrCat(".", target.name, ".ckptctl-export-")));

  ExportSummary summary;
  summary.dir = target.path;
  summary.ranks.resize(selected.size());
  for (size_t i = 0; i < selected.size(); ++i) {
    const std::string rank_dir = absl::StrCat(temp.path(), "/", RankDirName(selected[i]));
    summary.ranks[i].rank = selected[i];
    summary.ranks[i].file = RankFilePath(target.path, prefix, selected[i]);
    fs::create_directory(rank_dir, ec);
    if (ec) return ErrnoToStatus(ec.value(), "create directory", rank_dir);
  }

  CancelGroup group;
  ExportProgress export_progress(selected.size(), std::move(progress));
  CKPT_RETURN_IF_ERROR(group.RunTasks(selected.size(), parallelism, [&](size_t i) {
    v1::FetchRequest request;
    request.set_checkpoint_id(checkpoint_id);
    request.set_destination_strategy(destination_strategy);
    request.set_rank(selected[i]);
    absl::StatusOr<v1::FetchPlanSummary> fetched =
        FetchToFileImpl(request, RankFilePath(temp.path(), prefix, selected[i]),
                        export_progress.ForRank(i), &group);
    if (!fetched.ok()) {
      return WithPrefix(fetched.status(), absl::StrCat("export of rank ", selected[i], ": "));
    }
    summary.ranks[i].summary = *std::move(fetched);
    return absl::OkStatus();
  }));
  CKPT_RETURN_IF_ERROR(PublishExport(temp, target, summary.ranks));

  for (const RankExportResult& r : summary.ranks) {
    summary.tensors += r.summary.tensor_count();
    summary.bytes += r.summary.total_bytes();
  }
  return summary;
}

}  // namespace ckpt
