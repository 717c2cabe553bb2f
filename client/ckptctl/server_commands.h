// ckptctl subcommands that talk to a ckptd server about strategies and checkpoints: upload,
// fetch, dependency queries, listing and the client-side export (transform jobs are in
// job_commands.h). Each writes its normal output to `out` (warnings and progress to `err`) and
// returns an error status for the caller to print as one line; argument combinations are checked
// here too, so that every front end gets the same rules.
#ifndef CKPT_CLIENT_CKPTCTL_SERVER_COMMANDS_H_
#define CKPT_CLIENT_CKPTCTL_SERVER_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "client/ckptctl/progress.h"
#include "client/client.h"
#include "core/rank_files.h"

namespace ckpt {

// `ckptctl strategy put NAME PATH [--overwrite]`: PATH is a binary or .json strategy file, or a
// directory of per-stage files (merged first).
absl::Status RunStrategyPut(CkptClient& client, const std::string& name, const std::string& path,
                            bool overwrite, bool json, std::ostream& out);
// `ckptctl strategy get NAME [--json]`: the `strategy show` summary, or MindSpore's JSON form
// of the strategy (the document itself, as `strategy show --json`).
absl::Status RunStrategyGet(CkptClient& client, const std::string& name, bool json,
                            std::ostream& out);
// `ckptctl strategy ls [--json]`: one line per strategy, or a JSON array.
absl::Status RunStrategyList(CkptClient& client, bool json, std::ostream& out);
// `ckptctl strategy rm NAME [--json]`.
absl::Status RunStrategyRemove(CkptClient& client, const std::string& name, bool json,
                               std::ostream& out);

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
  // Print the summary as one JSON object (client/ckptctl/output.h).
  bool json = false;
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
  bool json = false;
};
// `ckptctl fetch CKPT (--dst-strategy NAME --rank R | --merged) --out FILE [--include GLOB]...
// [--exclude GLOB]... [--strict]`. Summary warnings go to `err` as "warning: ..." lines. When
// FILE is standard output ("-", /dev/stdout: see OutputDescriptor in client/client.h) the file's
// bytes are all that goes there: the summary goes to `err` too.
absl::Status RunFetch(CkptClient& client, const FetchCommand& command, std::ostream& out,
                      std::ostream& err);

// `ckptctl deps CKPT --dst-strategy NAME (--rank R | --all) [--json]`: PrintDeps format.
absl::Status RunRemoteDeps(CkptClient& client, const std::string& checkpoint_id,
                           const std::string& destination_strategy, std::optional<int64_t> rank,
                           bool all, bool json, std::ostream& out);

// `ckptctl ls [--json]`: one line per checkpoint, or a JSON array.
absl::Status RunList(CkptClient& client, bool json, std::ostream& out);
// `ckptctl describe CKPT [--json]`: the checkpoint's summary, then one line per tensor.
absl::Status RunDescribe(CkptClient& client, const std::string& checkpoint_id, bool json,
                         std::ostream& out);
// `ckptctl rm CKPT [--json]`.
absl::Status RunRemove(CkptClient& client, const std::string& checkpoint_id, bool json,
                       std::ostream& out);

// `ckptctl health [--service NAME] [--json]`: OK when the server reports SERVING; UNAVAILABLE
// naming the status otherwise.
absl::Status RunHealth(CkptClient& client, const std::string& service, bool json,
                       std::ostream& out);

// `ckptctl stats [--json]`: the server's counters and gauges (GetStats), sizes human-readable;
// with --json one object with every field, sizes in exact bytes.
absl::Status RunStats(CkptClient& client, bool json, std::ostream& out);

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
  bool json = false;
};
// `ckptctl export CKPT --dst-strategy NAME --dir DIR [--ranks LIST] [--prefix P] [--parallel N]`:
// CkptClient::ExportRanks, then one line per rank and a total.
absl::Status RunExport(CkptClient& client, const ExportCommand& command, std::ostream& out,
                       std::ostream& err);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_SERVER_COMMANDS_H_
