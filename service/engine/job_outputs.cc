// The three outputs of transform jobs: a new stored checkpoint, an export directory in
// MindSpore's layout, and one merged .ckpt file.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt_records.pb.h"
#include "core/ckpt_format.h"
#include "core/dtype.h"
#include "core/rank_files.h"
#include "core/status_macros.h"
#include "service/engine/job_internal.h"
#include "service/engine/job_runner.h"
#include "service/engine/upload_session.h"
#include "spdlog/spdlog.h"
#include "storage/confined_dir.h"
#include "storage/file_stream.h"
#include "storage/posix_io.h"

namespace ckpt {

using job_internal::CheckStop;
using job_internal::FetchFor;
using job_internal::Logger;
using job_internal::RemoveTreeQuietly;

namespace {

// The file name prefix of an export's rank files (validated at submission).
std::string PrefixOf(const v1::TransformTarget& t) {
  return t.prefix().empty() ? std::string(kDefaultRankFilePrefix) : t.prefix();
}

// Creates directory `name` in `dir_fd` (mode 0777 minus the umask) and opens it without
// following a symlink. Errors name `shown`.
absl::StatusOr<UniqueFd> MakeDirAt(int dir_fd, const std::string& name, const std::string& shown) {
  if (::mkdirat(dir_fd, name.c_str(), 0777) != 0) return ErrnoToStatus(errno, "mkdir", shown);
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", shown);
  return UniqueFd(fd);
}

// Whether entry `name` of `dir_fd` exists (a symlink counts, and is not followed).
bool EntryExists(int dir_fd, const std::string& name) {
  struct stat st;
  return ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
}

// Whether directory `name` of `dir_fd` holds every rank file of an export (regular files in real
// rank directories; no symlink followed).
bool ExportComplete(int dir_fd, const std::string& name, const std::string& prefix,
                    const std::vector<int64_t>& ranks) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  const UniqueFd dir(fd);
  return std::all_of(ranks.begin(), ranks.end(), [&](int64_t r) {
    const int rank_fd = ::openat(dir.get(), RankDirName(r).c_str(),
                                 O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (rank_fd < 0) return false;
    const UniqueFd rank_dir(rank_fd);
    struct stat st;
    return ::fstatat(rank_dir.get(), RankFileName(prefix, r).c_str(), &st, AT_SYMLINK_NOFOLLOW) ==
               0 &&
           S_ISREG(st.st_mode);
  });
}

// Calls fn(i, stop) for every i in [0, count) on up to `parallelism` threads: the caller's and
// up to parallelism - 1 started here (which inherit the caller's niceness), each taking the next
// index when it has finished one. After the first failure no further index starts and `stop` is
// set so that calls in progress can end early; returns that first failure. A thread that cannot
// be started only means less parallelism.
absl::Status ForEachInParallel(
    size_t count, int parallelism,
    const std::function<absl::Status(size_t, const std::atomic<bool>& stop)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  absl::Status first;  // guarded by mu; set before `stop`, so it is never a call stopped by it
  auto work = [&] {
    while (!stop.load()) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      absl::Status s = fn(i, stop);
      if (!s.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (first.ok()) first = std::move(s);
        }
        stop = true;
      }
    }
  };
  std::vector<std::thread> helpers;
  const size_t threads = std::min<size_t>(count, static_cast<size_t>(std::max(1, parallelism)));
  for (size_t t = 1; t < threads; ++t) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error& err) {
      Logger()->warn("event=job_thread_failed error=\"{}\"", err.what());
      break;
    }
  }
  work();
  for (std::thread& t : helpers) t.join();
  std::lock_guard<std::mutex> lock(mu);
  return first;
}

// A .ckpt file as MindSpore writes it (no CRC trailer), one fetched tensor at a time.
class CkptFileSink final : public JobTensorSink {
 public:
  explicit CkptFileSink(ByteSink* out) : writer_(out) {}

  absl::Status BeginTensor(const v1::FetchTensorHeader& h) override {
    CKPT_ASSIGN_OR_RETURN(DType dtype, ParseDType(h.dtype()));
    // MindSpore writes scalars with empty dims but str values with dims [0].
    std::vector<int64_t> dims(h.local_shape().begin(), h.local_shape().end());
    if (dtype == DType::kStr) dims = {0};
    return writer_.BeginTensor(h.name(), dtype, dims, h.total_bytes());
  }
  absl::Status Append(std::string_view bytes) override { return writer_.Append(bytes); }
  absl::Status Finish() { return writer_.Finish(); }

 private:
  CkptWriter writer_;
};

// One destination rank fed into the upload path, which validates, chunks, deduplicates
// replicas and commits exactly as for a client upload.
class UploadSink final : public JobTensorSink {
 public:
  explicit UploadSink(RankUpload* upload) : upload_(upload) {}

  absl::Status BeginTensor(const v1::FetchTensorHeader& h) override {
    v1::UploadTensorHeader th;
    th.set_name(h.name());
    th.set_dtype(h.dtype());
    *th.mutable_dims() = h.local_shape();
    th.set_total_bytes(h.total_bytes());
    return upload_->StartTensor(th);
  }
  absl::Status Append(std::string_view bytes) override { return upload_->Append(bytes); }

 private:
  RankUpload* upload_;
};

}  // namespace

// ------------------------------------------------------------------------------- outputs

absl::Status JobRunner::RunNewCheckpoint(Entry* e, const v1::SubmitTransformRequest& request) {
  const std::string& new_id = request.target().new_checkpoint_id();
  const std::string& dst = request.destination_strategy();
  // Recorded as every rank's source file: proves, after a crash between the commit and the
  // SUCCEEDED record, that an existing checkpoint of this id is this job's output.
  const std::string marker = absl::StrCat("ckptd job ", request.job_id());
  auto existing = store_->GetManifest(new_id);
  if (existing.ok()) {
    records::CheckpointManifest m;
    if (m.ParseFromString(*existing) && m.strategy_name() == dst &&
        std::count(m.source_files().begin(), m.source_files().end(), marker) > 0) {
      Logger()->info("event=job_output_present job={} checkpoint={}", request.job_id(), new_id);
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", new_id, " already exists"));
  }
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();

  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const Strategy> strategy, manager_->GetStrategy(dst));
  std::vector<v1::FetchRequest> fetches;
  for (int64_t r = 0; r < strategy->world_size(); ++r) {
    fetches.push_back(FetchFor(request, r, false));
  }
  CKPT_RETURN_IF_ERROR(ComputeTotals(e, fetches));

  // The upload runs in a manager of its own (same store, same chunking): its pending checkpoint
  // is private to this run, so a cancelled or failed run can discard it at once (the shared
  // manager would keep it, with its received ranks, until the idle timeout, and a retry would
  // find those ranks "already received"). A zero idle timeout makes ExpireIdleUploads discard
  // it as soon as no rank stream is open.
  ManagerOptions upload_options;
  upload_options.upload = options_.upload;
  upload_options.upload_idle_timeout = absl::ZeroDuration();
  CheckpointManager uploads(store_, upload_options);
  std::atomic<bool> begun{false};
  std::atomic<bool> committed{false};
  absl::Status status = ForEachInParallel(
      static_cast<size_t>(strategy->world_size()), options_.rank_workers,
      [&](size_t r, const std::atomic<bool>& stop) -> absl::Status {
        // A rank whose slices all replicate other ranks' is still fetched and sent in full:
        // RankUpload verifies replicas against the stored copy, which costs a read but no
        // write. Skipping such ranks would need an upload API that accepts "same as rank k".
        v1::UploadHeader header;
        header.set_checkpoint_id(new_id);
        header.set_source_strategy(dst);
        header.set_rank(static_cast<int64_t>(r));
        header.set_source_file(marker);
        CKPT_ASSIGN_OR_RETURN(std::unique_ptr<RankUpload> upload, uploads.BeginUpload(header));
        begun = true;
        UploadSink sink(upload.get());
        CKPT_RETURN_IF_ERROR(Pump(e, fetches[r], &sink, &stop));
        // The Finish of whichever rank completes last commits, making the output visible.
        CKPT_RETURN_IF_ERROR(Check(e));
        CKPT_RETURN_IF_ERROR(CheckStop(&stop));
        CKPT_ASSIGN_OR_RETURN(v1::UploadResponse response, upload->Finish());
        if (response.committed()) committed = true;
        Update(e, Change::kProgress, [](v1::Job* j) {
          j->mutable_progress()->set_ranks_done(j->progress().ranks_done() + 1);
        });
        return absl::OkStatus();
      });
  if (status.ok() && !committed) {
    status = absl::InternalError(
        absl::StrCat("checkpoint ", new_id, " was not committed after its last rank"));
  }
  if (!status.ok() && begun) {
    // Drops the pending checkpoint and its chunks. Retried briefly because the idle check is
    // strict (last activity < now) and a clock read may coincide with the last activity.
    for (int i = 0; i < 100 && uploads.ExpireIdleUploads() == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return status;
}

absl::Status JobRunner::RunExport(Entry* e, const v1::SubmitTransformRequest& request,
                                  int32_t attempt) {
  const v1::TransformTarget& target = request.target();
  const std::string& shown = target.export_dir();  // errors name the output only this way
  // The parent is resolved beneath the export root once, here; everything below is relative to
  // its descriptor, so a symlink swapped into the path while the job runs is never followed.
  CKPT_ASSIGN_OR_RETURN(ConfinedRoot::Location out, OpenFileOutput(target));
  const int parent = out.parent.get();
  const std::string partial = PartialPath(out.name, request.job_id());
  const std::string partial_shown = PartialPath(shown, request.job_id());
  const std::string prefix = PrefixOf(target);
  // A clean point, whatever an earlier attempt left.
  RemoveTreeQuietly(parent, partial, partial_shown);

  std::vector<int64_t> ranks(target.ranks().begin(), target.ranks().end());
  if (ranks.empty()) {
    CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const Strategy> s,
                          manager_->GetStrategy(request.destination_strategy()));
    for (int64_t r = 0; r < s->world_size(); ++r) ranks.push_back(r);
  }
  std::sort(ranks.begin(), ranks.end());

  if (EntryExists(parent, out.name)) {
    // DIR was absent at submission, and only the final rename creates it: if an earlier attempt
    // got that far (and the process died before recording SUCCEEDED), it is complete.
    if (attempt > 1 && ExportComplete(parent, out.name, prefix, ranks)) {
      Logger()->info("event=job_output_present job={} dir={}", request.job_id(), shown);
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(absl::StrCat(
        "export_dir \"", shown, "\" already exists; transform never replaces or merges into it"));
  }

  std::vector<v1::FetchRequest> fetches;
  for (int64_t r : ranks) fetches.push_back(FetchFor(request, r, false));
  CKPT_RETURN_IF_ERROR(ComputeTotals(e, fetches));

  const absl::Status status = [&]() -> absl::Status {
    CKPT_ASSIGN_OR_RETURN(UniqueFd staging, MakeDirAt(parent, partial, partial_shown));
    CKPT_RETURN_IF_ERROR(ForEachInParallel(
        ranks.size(), options_.rank_workers,
        [&](size_t i, const std::atomic<bool>& stop) -> absl::Status {
          const int64_t r = ranks[i];
          const std::string rank_dir = RankDirName(r);
          const std::string file = RankFileName(prefix, r);
          const std::string rank_shown = absl::StrCat(shown, "/", rank_dir);
          CKPT_ASSIGN_OR_RETURN(UniqueFd dir, MakeDirAt(staging.get(), rank_dir, rank_shown));
          CKPT_ASSIGN_OR_RETURN(
              std::unique_ptr<AtomicFileSink> sink_file,
              AtomicFileSink::CreateAt(dir.get(), file, absl::StrCat(rank_shown, "/", file)));
          CkptFileSink sink(sink_file.get());
          CKPT_RETURN_IF_ERROR(Pump(e, fetches[i], &sink, &stop));
          CKPT_RETURN_IF_ERROR(sink.Finish());
          CKPT_RETURN_IF_ERROR(sink_file->Commit());
          Update(e, Change::kProgress, [](v1::Job* j) {
            j->mutable_progress()->set_ranks_done(j->progress().ranks_done() + 1);
          });
          return absl::OkStatus();
        }));
    CKPT_RETURN_IF_ERROR(SyncDirectoryFd(staging.get(), partial_shown));  // the rank_<r> entries
    CKPT_RETURN_IF_ERROR(Check(e));
    CKPT_RETURN_IF_ERROR(RenameNoReplaceAt(parent, partial, parent, out.name,
                                           absl::StrCat("export_dir \"", shown, "\"")));
    return SyncDirectoryFd(parent, absl::StrCat("the parent directory of ", shown));
  }();
  if (!status.ok()) RemoveTreeQuietly(parent, partial, partial_shown);
  return status;
}

absl::Status JobRunner::RunMerged(Entry* e, const v1::SubmitTransformRequest& request,
                                  int32_t attempt) {
  const std::string& shown = request.target().merged_file();
  CKPT_ASSIGN_OR_RETURN(ConfinedRoot::Location out, OpenFileOutput(request.target()));
  const int parent = out.parent.get();
  const std::string partial = PartialPath(out.name, request.job_id());
  const std::string partial_shown = PartialPath(shown, request.job_id());
  RemoveTreeQuietly(parent, partial, partial_shown);
  if (EntryExists(parent, out.name)) {
    // Absent at submission and written only by the final rename (see RunExport).
    struct stat st;
    if (attempt > 1 && ::fstatat(parent, out.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(st.st_mode)) {
      Logger()->info("event=job_output_present job={} file={}", request.job_id(), shown);
      return absl::OkStatus();
    }
    return absl::AlreadyExistsError(
        absl::StrCat("merged_file \"", shown, "\" already exists; transform never replaces it"));
  }
  const std::vector<v1::FetchRequest> fetches = {FetchFor(request, 0, true)};
  CKPT_RETURN_IF_ERROR(ComputeTotals(e, fetches));
  const absl::Status status = [&]() -> absl::Status {
    // The file is assembled inside a job-specific directory, so that whatever a crash leaves
    // behind (AtomicFileSink's randomly named temporary included) is found and removed by name.
    CKPT_ASSIGN_OR_RETURN(UniqueFd staging, MakeDirAt(parent, partial, partial_shown));
    CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> file,
                          AtomicFileSink::CreateAt(staging.get(), out.name,
                                                   absl::StrCat(partial_shown, "/", out.name)));
    CkptFileSink sink(file.get());
    CKPT_RETURN_IF_ERROR(Pump(e, fetches[0], &sink));
    CKPT_RETURN_IF_ERROR(sink.Finish());
    CKPT_RETURN_IF_ERROR(file->Commit());
    Update(e, Change::kProgress, [](v1::Job* j) { j->mutable_progress()->set_ranks_done(1); });
    CKPT_RETURN_IF_ERROR(Check(e));
    CKPT_RETURN_IF_ERROR(RenameNoReplaceAt(staging.get(), out.name, parent, out.name,
                                           absl::StrCat("merged_file \"", shown, "\"")));
    return SyncDirectoryFd(parent, absl::StrCat("the parent directory of ", shown));
  }();
  RemoveTreeQuietly(parent, partial, partial_shown);  // empty after success
  return status;
}

}  // namespace ckpt
