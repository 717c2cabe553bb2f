// ckptctl: command-line client of ckptd. Offline subcommands work on local files; the others talk
// to the server given by --server (or $CKPT_SERVER).
//
// The subcommands are declared group by group (Add*Commands), each group keeping the values its
// options are parsed into; after parsing, RunOffline runs a subcommand that needs no server and
// RunWithServer the others, through RunWithRetries (client/ckptctl/retry.h). Exit status: 0 on
// success, 2 for a usage error, otherwise the class of the failure (client/ckptctl/exit_codes.h).
#include <sys/stat.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/ckptctl/backup_command.h"
#include "client/ckptctl/exit_codes.h"
#include "client/ckptctl/job_commands.h"
#include "client/ckptctl/offline_commands.h"
#include "client/ckptctl/progress.h"
#include "client/ckptctl/retry.h"
#include "client/ckptctl/server_commands.h"
#include "client/client.h"
#include "client/malloc_tuning.h"
#include "core/duration_flag.h"
#include "core/duration_text.h"

namespace ckpt {
namespace {

// Prints the one-line error and returns the exit status of its class.
int Fail(const absl::Status& status) {
  std::cerr << "ckptctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return ExitStatusFor(status);
}

// The values of every subcommand's options. CLI11 writes into these members through pointers
// taken when the options are declared, so a CommandLine must not move after that.
struct CommandLine {
  std::string server = "127.0.0.1:50051";
  // TLS and the bearer token (ClientOptions); a token is only ever read from a file.
  ClientOptions connection;
  // Output and waiting, for every command.
  bool json = false;
  std::string wait_for_server = "0s";
  std::string progress = "auto";

  // inspect
  CLI::App* inspect = nullptr;
  std::string inspect_path;

  // strategy show | merge | put | get | ls | rm
  CLI::App* strategy_show = nullptr;
  CLI::App* strategy_merge = nullptr;
  CLI::App* strategy_put = nullptr;
  CLI::App* strategy_get = nullptr;
  CLI::App* strategy_ls = nullptr;
  CLI::App* strategy_rm = nullptr;
  std::string strategy_path;
  std::string strategy_name;
  bool overwrite = false;
  std::vector<std::string> merge_inputs;
  std::string merge_out;

  // upload, fetch
  CLI::App* upload = nullptr;
  UploadCommand upload_cmd;
  CLI::App* fetch = nullptr;
  FetchCommand fetch_cmd;

  // deps
  CLI::App* deps = nullptr;
  std::string deps_ckpt;
  std::string deps_src_strategy;
  std::string deps_dst_strategy;
  std::optional<int64_t> deps_rank;
  bool deps_all = false;

  // ls, describe, rm
  CLI::App* ls = nullptr;
  CLI::App* describe = nullptr;
  CLI::App* rm = nullptr;
  std::string checkpoint_id;

  // transform, jobs ls | get | watch | cancel
  CLI::App* transform = nullptr;
  CLI::Option* transform_ranks = nullptr;
  std::string transform_ranks_list;
  TransformCommand transform_cmd;
  CLI::App* jobs_ls = nullptr;
  CLI::App* jobs_get = nullptr;
  CLI::App* jobs_watch = nullptr;
  CLI::App* jobs_cancel = nullptr;
  CLI::App* jobs_rm = nullptr;
  std::string job_id;

  // health
  CLI::App* health = nullptr;
  std::string health_service;

  // export
  CLI::App* export_sub = nullptr;
  CLI::Option* export_ranks = nullptr;
  std::string export_ranks_list;
  ExportCommand export_cmd;

  // stats
  CLI::App* stats = nullptr;

  // sample
  CLI::App* sample = nullptr;
  std::string sample_dir;

  // backup
  BackupCommand backup;
};

void AddGlobalOptions(CLI::App& app, CommandLine& c) {
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  // CKPT_VERSION is the CMake project version (client/CMakeLists.txt).
  app.set_version_flag("--version", "ckptctl " CKPT_VERSION, "Print the version and exit");
  // Lets global options such as --server also follow the subcommand; subcommands created below
  // inherit this setting.
  app.fallthrough();
  app.add_option("--server", c.server, "ckptd address HOST:PORT")
      ->envname("CKPT_SERVER")
      ->capture_default_str();
  app.add_option("--tls-ca", c.connection.tls_ca,
                 "PEM CA of the server's certificate: connect with TLS")
      ->envname("CKPT_TLS_CA");
  app.add_option("--tls-cert", c.connection.tls_cert,
                 "PEM client certificate for mutual TLS (with --tls-key)")
      ->envname("CKPT_TLS_CERT");
  app.add_option("--tls-key", c.connection.tls_key, "PEM key of --tls-cert")
      ->envname("CKPT_TLS_KEY");
  app.add_option("--token-file", c.connection.token_file,
                 "File holding the bearer token to authenticate with")
      ->envname("CKPT_TOKEN_FILE");
  app.add_flag("--json", c.json,
               "Print the result as JSON (one object or array per line; sizes in bytes)");
  app.add_option("--wait-for-server", c.wait_for_server,
                 "Keep trying this long (e.g. 30s, 5m) while ckptd is unavailable")
      ->envname("CKPT_WAIT_FOR_SERVER")
      ->check(DurationValidator())
      ->capture_default_str();
  app.add_option("--progress", c.progress,
                 "Transfer and job progress: auto (a bar on a terminal, else a line every few "
                 "seconds), bar, plain or none")
      ->check(CLI::IsMember({"auto", "bar", "plain", "none"}))
      ->capture_default_str();
}

void AddInspectCommand(CLI::App& app, CommandLine& c) {
  c.inspect = app.add_subcommand("inspect", "List the tensors of a MindSpore .ckpt file");
  c.inspect->add_option("FILE", c.inspect_path, "MindSpore .ckpt file")->required();
}

void AddStrategyCommands(CLI::App& app, CommandLine& c) {
  auto* strategy = app.add_subcommand("strategy", "Strategy files and registered strategies");
  strategy->require_subcommand(1);
  c.strategy_show = strategy->add_subcommand("show", "Print the layouts of a local strategy file");
  c.strategy_show
      ->add_option("PATH", c.strategy_path,
                   "Binary or .json strategy file, or a directory of per-stage files")
      ->required();
  c.strategy_merge = strategy->add_subcommand(
      "merge", "Merge per-stage strategy files as merge_pipeline_strategys does");
  c.strategy_merge
      ->add_option("FILES_OR_DIR", c.merge_inputs, "Per-stage strategy files or directories")
      ->required();
  c.strategy_merge->add_option("--out", c.merge_out, "Output file (.json for JSON, else binary)")
      ->required();

  c.strategy_put = strategy->add_subcommand("put", "Register a strategy on the server");
  c.strategy_put->add_option("NAME", c.strategy_name, "Name to register it under")->required();
  c.strategy_put
      ->add_option("PATH", c.strategy_path,
                   "Binary or .json strategy file, or a directory of per-stage files")
      ->required();
  c.strategy_put->add_flag("--overwrite", c.overwrite, "Replace an existing strategy of that name");
  c.strategy_get = strategy->add_subcommand("get", "Print a registered strategy");
  c.strategy_get->add_option("NAME", c.strategy_name, "Registered name")->required();
  c.strategy_ls = strategy->add_subcommand("ls", "List registered strategies");
  c.strategy_rm = strategy->add_subcommand("rm", "Delete a registered strategy");
  c.strategy_rm->add_option("NAME", c.strategy_name, "Registered name")->required();
}

void AddUploadCommand(CLI::App& app, CommandLine& c) {
  UploadCommand& cmd = c.upload_cmd;
  c.upload = app.add_subcommand(
      "upload", "Upload a checkpoint: a directory of rank_<r>/ files, or one whole-tensor file");
  c.upload->add_option("CKPT", cmd.checkpoint_id, "Checkpoint id to create")->required();
  auto* strategy = c.upload->add_option(
      "--strategy", cmd.source_strategy,
      "Registered strategy the checkpoint was saved with (its source strategy)");
  auto* dir = c.upload->add_option("--dir", cmd.dir,
                                   "Directory holding rank_0 .. rank_<N-1> with one .ckpt each");
  c.upload->add_option("--parallel", cmd.parallel, "Ranks uploaded at once")->capture_default_str();
  auto* file = c.upload->add_option("--file", cmd.file, "One whole-tensor .ckpt (no strategy)");
  file->excludes(dir)->excludes(strategy);
}

void AddFetchCommand(CLI::App& app, CommandLine& c) {
  FetchCommand& cmd = c.fetch_cmd;
  c.fetch = app.add_subcommand(
      "fetch", "Write one destination rank's tensors (or every tensor whole) as a .ckpt");
  c.fetch->add_option("CKPT", cmd.checkpoint_id, "Checkpoint id")->required();
  auto* strategy = c.fetch->add_option("--dst-strategy", cmd.destination_strategy,
                                       "Registered destination strategy to re-shard to");
  auto* rank = c.fetch->add_option("--rank", cmd.rank, "Destination global rank");
  auto* merged = c.fetch->add_flag("--merged", cmd.merged, "Every tensor whole (single device)");
  merged->excludes(strategy)->excludes(rank);
  c.fetch
      ->add_option("--out", cmd.out_path,
                   "Output .ckpt file (missing directories are created), or - for standard "
                   "output")
      ->required();
  c.fetch->add_option("--include", cmd.include, "Only tensors matching this glob")
      ->allow_extra_args(false);
  c.fetch->add_option("--exclude", cmd.exclude, "Skip tensors matching this glob")
      ->allow_extra_args(false);
  c.fetch->add_flag("--strict", cmd.strict,
                    "Refuse parameters laid out at the source but absent from the destination");
}

void AddDepsCommand(CLI::App& app, CommandLine& c) {
  c.deps = app.add_subcommand("deps",
                              "Source ranks a destination rank reads: of a stored checkpoint "
                              "(CKPT --dst-strategy NAME) or offline from two strategy files "
                              "(--src-strategy FILE --dst-strategy FILE)");
  c.deps->add_option("CKPT", c.deps_ckpt, "Stored checkpoint id (server form)");
  c.deps->add_option("--src-strategy", c.deps_src_strategy,
                     "Offline form: source strategy file or directory of per-stage files");
  c.deps->add_option("--dst-strategy", c.deps_dst_strategy,
                     "Destination strategy: with CKPT a registered name; offline a strategy file "
                     "or directory of per-stage files");
  auto* rank = c.deps->add_option("--rank", c.deps_rank, "Destination global rank");
  auto* all = c.deps->add_flag("--all", c.deps_all, "Every destination rank");
  rank->excludes(all);
}

void AddCheckpointCommands(CLI::App& app, CommandLine& c) {
  c.ls = app.add_subcommand("ls", "List stored checkpoints");
  c.describe = app.add_subcommand("describe", "Print a stored checkpoint and its tensors");
  c.describe->add_option("CKPT", c.checkpoint_id, "Checkpoint id")->required();
  c.rm = app.add_subcommand("rm", "Delete a stored checkpoint");
  c.rm->add_option("CKPT", c.checkpoint_id, "Checkpoint id")->required();
}

void AddTransformCommand(CLI::App& app, CommandLine& c) {
  TransformCommand& cmd = c.transform_cmd;
  c.transform =
      app.add_subcommand("transform",
                         "Submit a server-side transform job: a new stored checkpoint (--as), an "
                         "export directory (--export-dir) or a merged file (--merged-file)");
  c.transform->add_option("CKPT", cmd.checkpoint_id, "Source checkpoint id")->required();
  c.transform->add_option(
      "--dst-strategy", cmd.destination_strategy,
      "Registered destination strategy to re-shard to (not with --merged-file)");
  auto* as = c.transform->add_option("--as", cmd.new_checkpoint_id,
                                     "Store the result as this new checkpoint id");
  auto* dir = c.transform->add_option(
      "--export-dir", cmd.export_dir,
      "Write DIR/rank_<r>/<prefix><r>.ckpt on the server, DIR relative to the server's "
      "export root (ckptd --export-root); DIR must not exist");
  auto* file = c.transform->add_option(
      "--merged-file", cmd.merged_file,
      "Write one .ckpt of whole tensors on the server, FILE relative to the server's export "
      "root (ckptd --export-root); FILE must not exist");
  as->excludes(dir)->excludes(file);
  dir->excludes(file);
  c.transform_ranks = c.transform->add_option(
      "--ranks", c.transform_ranks_list,
      "--export-dir: destination ranks to write, e.g. 0,2,5-7 (default all)");
  c.transform->add_option("--prefix", cmd.prefix,
                          "--export-dir: file name prefix (default checkpoint_)");
  c.transform->add_option("--id", cmd.job_id,
                          "Job id to use; resubmitting the same request returns the same job");
  c.transform->add_flag("--wait", cmd.wait,
                        "Wait for the job, showing progress; fail if it fails or is cancelled");
}

void AddJobsCommands(CLI::App& app, CommandLine& c) {
  auto* jobs = app.add_subcommand("jobs", "Transform jobs on the server");
  jobs->require_subcommand(1);
  c.jobs_ls = jobs->add_subcommand("ls", "List jobs: id, state, source -> target, progress");
  c.jobs_get = jobs->add_subcommand("get", "Print one job");
  c.jobs_get->add_option("ID", c.job_id, "Job id")->required();
  c.jobs_watch = jobs->add_subcommand(
      "watch", "Show a job's progress until it ends; fail if it fails or is cancelled");
  c.jobs_watch->add_option("ID", c.job_id, "Job id")->required();
  c.jobs_cancel = jobs->add_subcommand("cancel", "Cancel a queued or running job");
  c.jobs_cancel->add_option("ID", c.job_id, "Job id")->required();
  c.jobs_rm = jobs->add_subcommand("rm", "Remove a finished job's record (its output stays)");
  c.jobs_rm->add_option("ID", c.job_id, "Job id")->required();
}

void AddHealthCommand(CLI::App& app, CommandLine& c) {
  c.health =
      app.add_subcommand("health", "gRPC health check of the server: exit 0 when it is SERVING");
  c.health->add_option("--service", c.health_service,
                       "Service to check, e.g. ckpt.v1.CheckpointService (default: the server)");
}

void AddExportCommand(CLI::App& app, CommandLine& c) {
  ExportCommand& cmd = c.export_cmd;
  c.export_sub = app.add_subcommand(
      "export",
      "Fetch every destination rank and write DIR/rank_<r>/<prefix><r>.ckpt locally "
      "(DIR appears only when every rank succeeded)");
  c.export_sub->add_option("CKPT", cmd.checkpoint_id, "Checkpoint id")->required();
  c.export_sub
      ->add_option("--dst-strategy", cmd.destination_strategy,
                   "Registered destination strategy to re-shard to")
      ->required();
  c.export_sub->add_option("--dir", cmd.dir, "Local directory to create (absent or empty)")
      ->required();
  c.export_ranks = c.export_sub->add_option(
      "--ranks", c.export_ranks_list, "Destination ranks to write, e.g. 0,2,5-7 (default all)");
  c.export_sub->add_option("--prefix", cmd.prefix, "File name prefix")->capture_default_str();
  c.export_sub->add_option("--parallel", cmd.parallel, "Ranks fetched at once")
      ->capture_default_str();
}

void AddSampleCommand(CLI::App& app, CommandLine& c) {
  c.sample = app.add_subcommand(
      "sample", "Write a small generated demo: strategies and a sharded checkpoint");
  c.sample->add_option("DIR", c.sample_dir, "Output directory")->required();
}

// Parses the command line into `c`. An exit status when ckptctl is done: after --help,
// --help-all or --version (0), or a usage error (2, reported in the common one-line format).
std::optional<int> Parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line in the common format; exit 2 marks a usage error, as most tools do.
    Fail(absl::InvalidArgumentError(absl::StrCat(e.what(), " (see ckptctl --help)")));
    return static_cast<int>(ExitCode::kUsage);
  }
  return std::nullopt;
}

// `deps` without a checkpoint: the offline form, from two strategy files.
absl::Status RunOfflineDeps(const CommandLine& c) {
  if (c.deps_src_strategy.empty() && c.deps_dst_strategy.empty()) {
    return absl::InvalidArgumentError(
        "deps needs CKPT --dst-strategy NAME (server) or --src-strategy FILE --dst-strategy "
        "FILE (offline)");
  }
  if (c.deps_src_strategy.empty() || c.deps_dst_strategy.empty()) {
    return absl::InvalidArgumentError("offline deps needs --src-strategy and --dst-strategy");
  }
  if (!c.deps_rank && !c.deps_all) {
    return absl::InvalidArgumentError("deps needs --rank R or --all");
  }
  return RunLocalDeps(c.deps_src_strategy, c.deps_dst_strategy, c.deps_rank, c.json, std::cout);
}

// Runs the parsed subcommand when it never contacts the server; nullopt when it needs one.
std::optional<absl::Status> RunOffline(const CommandLine& c) {
  if (*c.inspect) return RunInspect(c.inspect_path, c.json, std::cout);
  if (*c.strategy_show) return RunStrategyShow(c.strategy_path, c.json, std::cout);
  if (*c.strategy_merge) return RunStrategyMerge(c.merge_inputs, c.merge_out, c.json, std::cout);
  if (*c.sample) return RunSample(c.sample_dir, c.json, std::cout);
  if (*c.deps && !c.deps_ckpt.empty() && !c.deps_src_strategy.empty()) {
    return absl::InvalidArgumentError(
        "deps takes either CKPT --dst-strategy NAME (server) or --src-strategy FILE "
        "--dst-strategy FILE (offline), not both");
  }
  // deps is offline unless it names a checkpoint.
  if (*c.deps && c.deps_ckpt.empty()) return RunOfflineDeps(c);
  return std::nullopt;
}

// Runs the parsed subcommand that talks to the server through `client`, its result on `out`.
absl::Status RunWithServer(const CommandLine& c, CkptClient& client, std::ostream& out) {
  const ProgressMode progress = *ParseProgressMode(c.progress);  // checked by the parser
  if (*c.strategy_put) {
    return RunStrategyPut(client, c.strategy_name, c.strategy_path, c.overwrite, c.json, out);
  }
  if (*c.strategy_get) return RunStrategyGet(client, c.strategy_name, c.json, out);
  if (*c.strategy_ls) return RunStrategyList(client, c.json, out);
  if (*c.strategy_rm) return RunStrategyRemove(client, c.strategy_name, c.json, out);
  if (*c.upload) {
    UploadCommand command = c.upload_cmd;
    command.progress.mode = progress;
    command.json = c.json;
    return RunUpload(client, command, out, std::cerr);
  }
  if (*c.fetch) {
    FetchCommand command = c.fetch_cmd;
    command.progress.mode = progress;
    command.json = c.json;
    return RunFetch(client, command, out, std::cerr);
  }
  if (*c.deps) {
    return RunRemoteDeps(client, c.deps_ckpt, c.deps_dst_strategy, c.deps_rank, c.deps_all, c.json,
                         out);
  }
  if (*c.ls) return RunList(client, c.json, out);
  if (*c.describe) return RunDescribe(client, c.checkpoint_id, c.json, out);
  if (*c.rm) return RunRemove(client, c.checkpoint_id, c.json, out);
  // Job progress: the bar on stderr, or plain lines on the command's output.
  JobWaitOptions wait;
  wait.json = c.json;
  wait.quiet = progress == ProgressMode::kNone;
  if (progress == ProgressMode::kBar) wait.live = true;
  if (progress == ProgressMode::kPlain) wait.live = false;
  wait.line_interval = absl::Seconds(5);
  if (*c.transform) {
    TransformCommand command = c.transform_cmd;
    if (c.transform_ranks->count() > 0) command.ranks = c.transform_ranks_list;
    command.json = c.json;
    command.wait_options = wait;
    return RunTransform(client, command, out);
  }
  if (*c.jobs_ls) return RunJobsList(client, c.json, out);
  if (*c.jobs_get) return RunJobGet(client, c.job_id, c.json, out);
  if (*c.jobs_watch) return RunJobWatch(client, c.job_id, wait, out);
  if (*c.jobs_cancel) return RunJobCancel(client, c.job_id, c.json, out);
  if (*c.jobs_rm) return RunJobRemove(client, c.job_id, c.json, out);
  if (*c.health) return RunHealth(client, c.health_service, c.json, out);
  if (*c.stats) return RunStats(client, c.json, out);
  if (*c.export_sub) {
    ExportCommand command = c.export_cmd;
    if (c.export_ranks->count() > 0) command.ranks = c.export_ranks_list;
    command.progress.mode = progress;
    command.json = c.json;
    return RunExport(client, command, out, std::cerr);
  }
  if (*c.backup.sub) return RunBackup(client, c.backup, c.json, out);
  return absl::OkStatus();
}

void AddStatsCommand(CLI::App& app, CommandLine& c) {
  c.stats = app.add_subcommand("stats", "Print the server's counters: store, streams, jobs");
}

// Whether a fetch writes `path` in place (an open descriptor, a pipe, a device) rather than as a
// file published at the end: a failed attempt may then have written part of the bytes already.
bool FetchWritesInPlace(const std::string& path) {
  if (OutputDescriptor(path) >= 0) return true;
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
}

// Whether running the parsed subcommand again after an UNAVAILABLE failure is harmless: it only
// reads, or (fetch to a file, export) publishes its output atomically at the end.
bool IsIdempotent(const CommandLine& c) {
  if (*c.fetch) return !FetchWritesInPlace(c.fetch_cmd.out_path);
  return *c.strategy_get || *c.strategy_ls || *c.ls || *c.describe || *c.deps || *c.export_sub ||
         *c.jobs_ls || *c.jobs_get || *c.jobs_watch || *c.health || *c.stats;
}

// The options of each connection: TLS and the token from the command line or environment.
ClientOptions ClientOptionsFor(const CommandLine& c, absl::Duration connect_timeout) {
  ClientOptions options = c.connection;
  options.connect_timeout = connect_timeout;
  return options;
}

// Runs a server subcommand with the retries of RetryOptions. Its output is held back until the
// last attempt (a failed attempt's partial output is dropped), except for commands that report
// as they go (jobs watch, transform --wait), which write straight to standard output.
absl::Status RunServerCommand(const CommandLine& c) {
  RetryOptions retry;
  retry.wait_for_server = *ParseDurationText(c.wait_for_server);  // checked by the parser
  const bool streams = *c.jobs_watch || (*c.transform && c.transform_cmd.wait);
  std::ostringstream buffer;
  std::ostream& out = streams ? std::cout : buffer;
  const absl::Status status = RunWithRetries(
      retry, IsIdempotent(c),
      [&c](absl::Duration connect_timeout) {
        return CkptClient::Connect(c.server, ClientOptionsFor(c, connect_timeout));
      },
      [&](CkptClient& client) { return RunWithServer(c, client, out); },
      [&buffer]() { buffer.str(""); }, std::cerr);
  if (!streams) std::cout << buffer.str();
  return status;
}

int Main(int argc, char** argv) {
  // Fetches and uploads stream gigabytes through short-lived buffers (client/malloc_tuning.h).
  TuneMallocForStreaming();
  // Debian's abseil (built without NDEBUG) checks every absl::Mutex lock of gRPC's for lock-order
  // cycles under a process-wide spin lock, and aborts on one: a debugging aid, off here as in
  // ckptd.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"ckptctl - client of ckptd, the sharded-checkpoint service"};
  CommandLine c;
  // In this order in --help.
  AddGlobalOptions(app, c);
  AddInspectCommand(app, c);
  AddStrategyCommands(app, c);
  AddUploadCommand(app, c);
  AddFetchCommand(app, c);
  AddDepsCommand(app, c);
  AddCheckpointCommands(app, c);
  AddTransformCommand(app, c);
  AddJobsCommands(app, c);
  AddExportCommand(app, c);
  AddHealthCommand(app, c);
  AddSampleCommand(app, c);
  AddStatsCommand(app, c);
  AddBackupCommand(app, c.backup);
  if (std::optional<int> exit_code = Parse(app, argc, argv)) return *exit_code;

  std::optional<absl::Status> status = RunOffline(c);
  if (!status.has_value()) status = RunServerCommand(c);
  // Flush before deciding the exit code: a closed stdout pipe is a failure to report too.
  std::cout.flush();
  if (status->ok() && !std::cout) *status = absl::InternalError("cannot write to standard output");
  return status->ok() ? EXIT_SUCCESS : Fail(*status);
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
