// ckptctl subcommands that talk to a ckptd server. Each writes its normal output to `out`
// (warnings and progress to `err`) and returns an error status for the caller to print as one
// line; argument combinations are checked here too, so that every front end gets the same rules.
#ifndef CKPT_CLIENT_CKPTCTL_SERVER_COMMANDS_H_
#define CKPT_CLIENT_CKPTCTL_SERVER_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt.pb.h"
#include "client/client.h"
#include "client/ckptctl/progress.h"

namespace ckpt {

// `ckptctl strategy put NAME PATH [--overwrite]`: PATH is a binary or .json strategy file, or a
// directory of per-stage files (merged first).
absl::Status RunStrategyPut(CkptClient& client, const std::string& name, const std::string& path,
                            bool overwrite, std::ostream& out);
// `ckptctl strategy get NAME [--json]`: the `strategy show` summary, or the JSON form.
absl::Status RunStrategyGet(CkptClient& client, const std::string& name, bool json,
                            std::ostream& out);
// `ckptctl strategy ls`: one line per strategy.
absl::Status RunStrategyList(CkptClient& client, std::ostream& out);
// `ckptctl strategy rm NAME`.
absl::Status RunStrategyRemove(CkptClient& client, const std::string& name, std::ostream& out);

struct UploadCommand {
  std::string checkpoint_id;
  // Either a rank directory with the strategy it was saved with (--strategy)...
  std::string source_strategy;
  std::string dir;
  int parallel = 4;
  // ...or one whole-tensor file.
  std::string file;
  // Progress display (default: on stderr when it is a terminal).
  ProgressOptions progress;
};
// `ckptctl upload CKPT --strategy NAME --dir DIR [--parallel N]` or `upload CKPT --file FILE`.
absl::Status RunUpload(CkptClient& client, const UploadCommand& command, std::ostream& out,
                       std::ostream& err);

struct FetchCommand {
  std::string checkpoint_id;
  // Either a destination strategy (--dst-strategy) and rank...
  std::string destination_strategy;
  std::optional<int64_t> rank;
  // ...or every tensor whole.
  bool merged = false;
  std::string out_path;
  std::vector<std::string> include;
  std::vector<std::string> exclude;
  bool strict = false;
  ProgressOptions progress;
};
// `ckptctl fetch CKPT (--dst-strategy NAME --rank R | --merged) --out FILE [--include GLOB]...
// [--exclude GLOB]... [--strict]`. Summary warnings go to `err` as "warning: ..." lines.
absl::Status RunFetch(CkptClient& client, const FetchCommand& command, std::ostream& out,
                      std::ostream& err);

// `ckptctl deps CKPT --dst-strategy NAME (--rank R | --all) [--json]`: PrintDeps format.
absl::Status RunRemoteDeps(CkptClient& client, const std::string& checkpoint_id,
                           const std::string& destination_strategy, std::optional<int64_t> rank,
                           bool all, bool json, std::ostream& out);

// `ckptctl ls`: one line per checkpoint.
absl::Status RunList(CkptClient& client, std::ostream& out);
// `ckptctl describe CKPT`: the checkpoint's summary, then one line per tensor.
absl::Status RunDescribe(CkptClient& client, const std::string& checkpoint_id, std::ostream& out);
// `ckptctl rm CKPT`.
absl::Status RunRemove(CkptClient& client, const std::string& checkpoint_id, std::ostream& out);

// ---------------------------------------------------------------- rank lists

// Largest rank a LIST may name (keeps "0-999999999999" from allocating the world).
inline constexpr int64_t kMaxListedRank = (int64_t{1} << 20) - 1;

// Parses a rank LIST: comma-separated ranks and inclusive ranges, "0,2,5-7" -> {0, 2, 5, 6, 7}.
// Spaces around items are ignored. INVALID_ARGUMENT naming the offending item for an empty list
// or item, anything but decimal digits (negative ranks included), a reversed range ("7-5"), a
// rank above kMaxListedRank, or a rank listed twice (also through overlapping ranges). The result
// is ascending.
absl::StatusOr<std::vector<int64_t>> ParseRankList(std::string_view list);
// The inverse for ascending distinct ranks: {0, 2, 5, 6, 7} -> "0,2,5-7"; "" for none.
std::string FormatRankList(const std::vector<int64_t>& ranks);

// ---------------------------------------------------------------- jobs

// How a waiting command shows a job's progress.
struct JobWaitOptions {
  // Where the live bar goes. Default std::cerr.
  std::ostream* terminal = nullptr;
  // Live bar (redrawn in place on `terminal`) or plain lines on the command's output. Default
  // (nullopt): the live bar when stderr (fd 2) is a terminal.
  std::optional<bool> live;
  // Plain mode: at most one progress line per interval (state changes are always shown).
  // Default 1 s.
  absl::Duration line_interval = absl::Seconds(1);
};

// "ID  STATE  CKPT -> TARGET  PCT%[  reason: ...]", the `jobs ls` line of `job`. Pure, for tests.
std::string FormatJobLine(const v1::Job& job);

struct TransformCommand {
  std::string checkpoint_id;
  // Destination strategy (--dst-strategy); not with merged_file.
  std::string destination_strategy;
  // Exactly one output: a new stored checkpoint (--as)...
  std::string new_checkpoint_id;
  // ...an export directory on the server's filesystem (absolute) with optional ranks LIST and
  // file name prefix...
  std::string export_dir;
  std::optional<std::string> ranks;
  std::string prefix;
  // ...or one merged .ckpt on the server's filesystem (absolute).
  std::string merged_file;
  // Client-chosen job id (--id): resubmitting the same request returns the same job.
  std::string job_id;
  // Wait for the end, showing progress; fail when the job fails or is cancelled.
  bool wait = false;
  JobWaitOptions wait_options;
};
// `ckptctl transform CKPT --dst-strategy NAME (--as NEW | --export-dir DIR [--ranks LIST]
// [--prefix P]) [--id J] [--wait]` and `transform CKPT --merged-file FILE [--id J] [--wait]`.
// Prints "submitted job J ..." (or that it already existed); with `wait`, progress, then
// "job J SUCCEEDED: ...", or returns ABORTED (failed) / CANCELLED with the job's reason.
absl::Status RunTransform(CkptClient& client, const TransformCommand& command, std::ostream& out);

// `ckptctl jobs ls`: one FormatJobLine per job.
absl::Status RunJobsList(CkptClient& client, std::ostream& out);
// `ckptctl jobs get ID`: every field of the job, one per line.
absl::Status RunJobGet(CkptClient& client, const std::string& job_id, std::ostream& out);
// `ckptctl jobs watch ID`: as `transform --wait` for an existing job.
absl::Status RunJobWatch(CkptClient& client, const std::string& job_id,
                         const JobWaitOptions& options, std::ostream& out);
// `ckptctl jobs cancel ID`: prints the state the server left the job in.
absl::Status RunJobCancel(CkptClient& client, const std::string& job_id, std::ostream& out);

// ---------------------------------------------------------------- client-side export

struct ExportCommand {
  std::string checkpoint_id;
  // Destination strategy (--dst-strategy).
  std::string destination_strategy;
  // Local directory to create (must not exist or be empty).
  std::string dir;
  std::optional<std::string> ranks;
  std::string prefix = kDefaultRankFilePrefix;
  int parallel = 4;
  ProgressOptions progress;
};
// `ckptctl export CKPT --dst-strategy NAME --dir DIR [--ranks LIST] [--prefix P] [--parallel N]`:
// CkptClient::ExportRanks, then one line per rank and a total.
absl::Status RunExport(CkptClient& client, const ExportCommand& command, std::ostream& out,
                       std::ostream& err);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_SERVER_COMMANDS_H_
