// Submission checks of transform jobs and the rules for their output paths.
#include <dirent.h>
#include <sys/stat.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/rank_files.h"
#include "core/status_macros.h"
#include "service/engine/job_internal.h"
#include "service/engine/job_runner.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace job_internal {

absl::StatusOr<std::string> CleanOutputPath(const std::string& what, const std::string& path) {
  if (path.empty() || path[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " must be an absolute path on the server, got \"", path, "\""));
  }
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(what, " contains a NUL character"));
  }
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  if (p == "/") return absl::InvalidArgumentError(absl::StrCat(what, " cannot be /"));
  if (std::filesystem::path(p).lexically_normal().string() != p) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", path, "\" must be normalised (no '.', '..' or repeated '/')"));
  }
  return p;
}

std::string ParentOf(const std::string& path) {
  return std::filesystem::path(path).parent_path().string();
}

std::string OutputPath(const v1::TransformTarget& t) {
  const std::string& raw =
      t.output_case() == v1::TransformTarget::kExportDir ? t.export_dir() : t.merged_file();
  auto clean = CleanOutputPath("output", raw);
  return clean.ok() ? *clean : raw;
}

bool Exists(const std::string& path, struct stat* st) {
  struct stat local;
  return ::lstat(path.c_str(), st ? st : &local) == 0;
}

absl::StatusOr<bool> IsEmptyDir(const std::string& path) {
  DIR* d = ::opendir(path.c_str());
  if (d == nullptr) return ErrnoToStatus(errno, "opendir", path);
  bool empty = true;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string_view name = ent->d_name;
    if (name != "." && name != "..") {
      empty = false;
      break;
    }
  }
  ::closedir(d);
  return empty;
}

v1::FetchRequest FetchFor(const v1::SubmitTransformRequest& r, int64_t rank, bool merged) {
  v1::FetchRequest f;
  f.set_checkpoint_id(r.checkpoint_id());
  if (merged) {
    f.set_merged(true);
  } else {
    f.set_destination_strategy(r.destination_strategy());
    f.set_rank(rank);
  }
  return f;
}

}  // namespace job_internal

namespace {

// An export target: its directory, absent or empty, its file name prefix (empty: the default)
// and its ranks, each in destination strategy `strategy` (named `strategy_name`) and listed at
// most once. Returns the cleaned directory.
absl::StatusOr<std::string> ValidateExportTarget(const v1::TransformTarget& target,
                                                 const std::string& strategy_name,
                                                 const Strategy& strategy) {
  CKPT_ASSIGN_OR_RETURN(std::string dir,
                        job_internal::CleanOutputPath("export_dir", target.export_dir()));
  if (!target.prefix().empty()) CKPT_RETURN_IF_ERROR(ValidateRankFilePrefix(target.prefix()));
  std::set<int64_t> seen;
  for (int64_t r : target.ranks()) {
    if (r < 0 || r >= strategy.world_size()) {
      return absl::OutOfRangeError(absl::StrCat("rank ", r, " is outside strategy ", strategy_name,
                                                "'s world of ", strategy.world_size(), " ranks"));
    }
    if (!seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", r, " is listed twice"));
    }
  }
  struct stat st;
  if (job_internal::Exists(dir, &st)) {
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("export directory ", dir, " exists and is not a directory"));
    }
    CKPT_ASSIGN_OR_RETURN(bool empty, job_internal::IsEmptyDir(dir));
    if (!empty) {
      return absl::FailedPreconditionError(
          absl::StrCat("export directory ", dir, " exists and is not empty"));
    }
  }
  return dir;
}

// A merged-file target: its path, which must not exist. Returns the cleaned path.
absl::StatusOr<std::string> ValidateMergedTarget(const v1::TransformTarget& target) {
  CKPT_ASSIGN_OR_RETURN(std::string path,
                        job_internal::CleanOutputPath("merged_file", target.merged_file()));
  if (job_internal::Exists(path)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " already exists"));
  }
  return path;
}

// FAILED_PRECONDITION unless the directory that is to hold file output `output` exists.
absl::Status CheckParentExists(const std::string& output) {
  struct stat st;
  const std::string parent = job_internal::ParentOf(output);
  if (::stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("parent directory ", parent, " of ", output, " does not exist"));
  }
  return absl::OkStatus();
}

}  // namespace

// ------------------------------------------------------------------------------- JobRunner

absl::Status JobRunner::ValidateRequest(const v1::SubmitTransformRequest& request) {
  CKPT_RETURN_IF_ERROR(ValidateName("job id", request.job_id()));
  CKPT_RETURN_IF_ERROR(ValidateName("checkpoint id", request.checkpoint_id()));
  const v1::TransformTarget& target = request.target();
  const auto kind = target.output_case();
  if (kind == v1::TransformTarget::OUTPUT_NOT_SET) {
    return absl::InvalidArgumentError(
        "the target needs one of new_checkpoint_id, export_dir or merged_file");
  }
  if (kind != v1::TransformTarget::kExportDir &&
      (target.ranks_size() > 0 || !target.prefix().empty())) {
    return absl::InvalidArgumentError("target ranks and prefix apply to export_dir only");
  }
  // The source must exist now; a later deletion fails the job when it runs.
  CKPT_RETURN_IF_ERROR(store_->GetManifest(request.checkpoint_id()).status());
  std::shared_ptr<const Strategy> strategy;
  if (kind != v1::TransformTarget::kMergedFile) {
    if (request.destination_strategy().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(job_internal::TargetText(target), " needs a destination strategy"));
    }
    CKPT_ASSIGN_OR_RETURN(strategy, manager_->GetStrategy(request.destination_strategy()));
  }
  CKPT_ASSIGN_OR_RETURN(const std::string output, ValidateOutput(request, strategy.get()));
  if (kind != v1::TransformTarget::kNewCheckpointId) {
    CKPT_RETURN_IF_ERROR(CheckParentExists(output));
  }
  // Plan errors (e.g. strategies that cannot be converted) surface now, not as a failed job.
  const bool merged = kind == v1::TransformTarget::kMergedFile;
  const int64_t first_rank =
      kind == v1::TransformTarget::kExportDir && target.ranks_size() > 0 ? target.ranks(0) : 0;
  CKPT_RETURN_IF_ERROR(
      manager_->OpenFetch(job_internal::FetchFor(request, first_rank, merged)).status());
  return CheckOutputFree(kind, output);
}

absl::StatusOr<std::string> JobRunner::ValidateOutput(const v1::SubmitTransformRequest& request,
                                                      const Strategy* strategy) {
  const v1::TransformTarget& target = request.target();
  switch (target.output_case()) {
    case v1::TransformTarget::kNewCheckpointId: {
      const std::string& id = target.new_checkpoint_id();
      CKPT_RETURN_IF_ERROR(ValidateName("new checkpoint id", id));
      auto existing = store_->GetManifest(id);
      if (existing.ok()) {
        return absl::AlreadyExistsError(absl::StrCat("checkpoint ", id, " already exists"));
      }
      if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
      return id;
    }
    case v1::TransformTarget::kExportDir:
      return ValidateExportTarget(target, request.destination_strategy(), *strategy);
    case v1::TransformTarget::kMergedFile:
      return ValidateMergedTarget(target);
    case v1::TransformTarget::OUTPUT_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "the target needs one of new_checkpoint_id, export_dir or merged_file");
}

absl::Status JobRunner::CheckOutputFree(v1::TransformTarget::OutputCase kind,
                                        const std::string& output) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : jobs_) {
    if (IsTerminal(e->job.state())) continue;
    const v1::TransformTarget& other = e->job.request().target();
    if (other.output_case() != kind) continue;
    const std::string other_output = kind == v1::TransformTarget::kNewCheckpointId
                                         ? other.new_checkpoint_id()
                                         : job_internal::OutputPath(other);
    if (other_output == output) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " (", job_internal::StateName(e->job.state()), ") already writes ", output));
    }
  }
  return absl::OkStatus();
}

}  // namespace ckpt
