// ckptctl subcommands of the server's transform jobs: `transform` (submit, optionally wait) and
// `jobs ls | get | watch | cancel`. Each writes its normal output to `out` and returns an error
// status for the caller to print as one line; argument combinations are checked here too, so
// that every front end gets the same rules.
#ifndef CKPT_CLIENT_CKPTCTL_JOB_COMMANDS_H_
#define CKPT_CLIENT_CKPTCTL_JOB_COMMANDS_H_

#include <optional>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckpt.pb.h"
#include "client/client.h"

namespace ckpt {

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
  // No progress at all (--progress none); the outcome is still printed.
  bool quiet = false;
  // Every state the server sends, the final one included, as one JSON object per line on the
  // command's output (output.h's JobJson) instead of progress and the outcome line.
  bool json = false;
};

// "ID  STATE  CKPT -> TARGET  PCT%[  reason: ...]", the `jobs ls` line of `job`. Pure, for tests.
std::string FormatJobLine(const v1::Job& job);

struct TransformCommand {
  std::string checkpoint_id;
  // Destination strategy (--dst-strategy); not with merged_file.
  std::string destination_strategy;
  // Exactly one output: a new stored checkpoint (--as)...
  std::string new_checkpoint_id;
  // ...an export directory on the server's filesystem (relative to the server's export root)
  // with optional ranks LIST and file name prefix...
  std::string export_dir;
  std::optional<std::string> ranks;
  std::string prefix;
  // ...or one merged .ckpt on the server's filesystem (relative to its export root).
  std::string merged_file;
  // Client-chosen job id (--id): resubmitting the same request returns the same job.
  std::string job_id;
  // Wait for the end, showing progress; fail when the job fails or is cancelled.
  bool wait = false;
  JobWaitOptions wait_options;
  // Print {"job_id", "created", "job"} as one JSON line (and, with `wait`, the job's states as
  // JSON lines: wait_options.json).
  bool json = false;
};
// `ckptctl transform CKPT --dst-strategy NAME (--as NEW | --export-dir DIR [--ranks LIST]
// [--prefix P]) [--id J] [--wait]` and `transform CKPT --merged-file FILE [--id J] [--wait]`.
// Prints "submitted job J ..." (or that it already existed); with `wait`, progress, then
// "job J SUCCEEDED: ...", or returns ABORTED (failed) / CANCELLED with the job's reason.
absl::Status RunTransform(CkptClient& client, const TransformCommand& command, std::ostream& out);

// `ckptctl jobs ls [--json]`: one FormatJobLine per job, or a JSON array of jobs.
absl::Status RunJobsList(CkptClient& client, bool json, std::ostream& out);
// `ckptctl jobs get ID [--json]`: every field of the job, one per line, or one JSON object.
absl::Status RunJobGet(CkptClient& client, const std::string& job_id, bool json, std::ostream& out);
// `ckptctl jobs watch ID`: as `transform --wait` for an existing job.
absl::Status RunJobWatch(CkptClient& client, const std::string& job_id,
                         const JobWaitOptions& options, std::ostream& out);
// `ckptctl jobs cancel ID [--json]`: prints the state the server left the job in.
absl::Status RunJobCancel(CkptClient& client, const std::string& job_id, bool json,
                          std::ostream& out);
// `ckptctl jobs rm ID [--json]`: removes a finished job's record.
absl::Status RunJobRemove(CkptClient& client, const std::string& job_id, bool json,
                          std::ostream& out);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_JOB_COMMANDS_H_
