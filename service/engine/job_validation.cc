// Submission checks of transform jobs and the rules for their output paths.
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
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
#include "storage/confined_dir.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace job_internal {

const char* OutputField(const v1::TransformTarget& t) {
  return t.output_case() == v1::TransformTarget::kExportDir ? "export_dir" : "merged_file";
}

const std::string& OutputSpelling(const v1::TransformTarget& t) {
  return t.output_case() == v1::TransformTarget::kExportDir ? t.export_dir() : t.merged_file();
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

// An export target's prefix and ranks, each in destination strategy `strategy` (named
// `strategy_name`) and listed at most once.
absl::Status ValidateExportRanks(const v1::TransformTarget& target,
                                 const std::string& strategy_name, const Strategy& strategy) {
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
  if (kind != v1::TransformTarget::kNewCheckpointId) {
    CKPT_RETURN_IF_ERROR(FileOutput(target).status());  // first: no export root, or an escape
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
      CKPT_RETURN_IF_ERROR(ValidateExportRanks(target, request.destination_strategy(), *strategy));
      [[fallthrough]];
    case v1::TransformTarget::kMergedFile: {
      CKPT_ASSIGN_OR_RETURN(std::string output, FileOutput(target));
      CKPT_ASSIGN_OR_RETURN(ConfinedRoot::Location loc, OpenFileOutput(target));
      struct stat st;
      if (::fstatat(loc.parent.get(), loc.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) {
        const bool dir = S_ISDIR(st.st_mode);
        return absl::AlreadyExistsError(absl::StrCat(
            job_internal::OutputField(target), " \"", job_internal::OutputSpelling(target),
            "\" already exists", dir ? " as a directory" : "", "; transform writes a new ",
            target.output_case() == v1::TransformTarget::kExportDir ? "directory" : "file",
            " and never replaces or merges into an existing one"));
      }
      if (errno != ENOENT) {
        return ErrnoToStatus(errno, "stat",
                             absl::StrCat(job_internal::OutputField(target), " \"",
                                          job_internal::OutputSpelling(target), "\""));
      }
      return output;
    }
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
    std::string other_output;
    if (kind == v1::TransformTarget::kNewCheckpointId) {
      other_output = other.new_checkpoint_id();
    } else {
      // A record the current export root refuses cannot run, so writes nothing.
      auto normalised = FileOutput(other);
      if (!normalised.ok()) continue;
      other_output = *std::move(normalised);
    }
    if (other_output == output) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " (", job_internal::StateName(e->job.state()), ") already writes ",
          kind == v1::TransformTarget::kNewCheckpointId ? output
                                                        : absl::StrCat("\"", output, "\"")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> JobRunner::FileOutput(const v1::TransformTarget& target) const {
  const char* what = job_internal::OutputField(target);
  if (export_root_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        " output is disabled on this server: ckptd writes server-side files only beneath "
        "the directory given by its --export-root flag (CKPTD_EXPORT_ROOT), which is not "
        "set; use --as NEW to store the result, or export on the client side"));
  }
  const std::string& spelling = job_internal::OutputSpelling(target);
  if (target.output_case() == v1::TransformTarget::kMergedFile && !spelling.empty() &&
      (spelling.back() == '/' || spelling.ends_with("/.") || spelling == ".")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "merged_file \"", spelling, "\" names a directory; give the path of a new file"));
  }
  return export_root_->Normalize(what, spelling);
}

absl::StatusOr<ConfinedRoot::Location> JobRunner::OpenFileOutput(
    const v1::TransformTarget& target) const {
  CKPT_ASSIGN_OR_RETURN(const std::string relative, FileOutput(target));
  return export_root_->OpenParent(relative, job_internal::OutputField(target),
                                  job_internal::OutputSpelling(target));
}

}  // namespace ckpt
