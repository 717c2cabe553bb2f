// ckptctl: command-line client of ckptd. Offline subcommands work on local files; the others talk
// to the server given by --server (or $CKPT_SERVER).
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/malloc_tuning.h"
#include "client/ckptctl/offline_commands.h"
#include "client/ckptctl/server_commands.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "ckptctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Fetches and uploads stream gigabytes through short-lived buffers (client/malloc_tuning.h).
  ckpt::TuneMallocForStreaming();
  CLI::App app{"ckptctl - client of ckptd, the sharded-checkpoint service"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  // CKPT_VERSION is the CMake project version (client/CMakeLists.txt).
  app.set_version_flag("--version", "ckptctl " CKPT_VERSION, "Print the version and exit");
  // Lets global options such as --server also follow the subcommand; subcommands created below
  // inherit this setting.
  app.fallthrough();

  std::string server = "127.0.0.1:50051";
  app.add_option("--server", server, "ckptd address HOST:PORT")
      ->envname("CKPT_SERVER")
      ->capture_default_str();

  std::string path;
  bool json = false;
  auto* inspect = app.add_subcommand("inspect", "List the tensors of a MindSpore .ckpt file");
  inspect->add_option("FILE", path, "MindSpore .ckpt file")->required();
  inspect->add_flag("--json", json, "Print JSON");

  // ------------------------------------------------------------------ strategy
  auto* strategy = app.add_subcommand("strategy", "Strategy files and registered strategies");
  strategy->require_subcommand(1);
  auto* show = strategy->add_subcommand("show", "Print the layouts of a local strategy file");
  show->add_option("PATH", path, "Binary or .json strategy file, or a directory of per-stage files")
      ->required();
  show->add_flag("--json", json, "Print the JSON form (MindSpore §2.5)");
  std::vector<std::string> inputs;
  std::string out_path;
  auto* merge = strategy->add_subcommand(
      "merge", "Merge per-stage strategy files as merge_pipeline_strategys does");
  merge->add_option("FILES_OR_DIR", inputs, "Per-stage strategy files or directories")
      ->required();
  merge->add_option("--out", out_path, "Output file (.json for JSON, else binary)")->required();

  std::string name;
  bool overwrite = false;
  auto* put = strategy->add_subcommand("put", "Register a strategy on the server");
  put->add_option("NAME", name, "Name to register it under")->required();
  put->add_option("PATH", path, "Binary or .json strategy file, or a directory of per-stage files")
      ->required();
  put->add_flag("--overwrite", overwrite, "Replace an existing strategy of that name");
  auto* get = strategy->add_subcommand("get", "Print a registered strategy");
  get->add_option("NAME", name, "Registered name")->required();
  get->add_flag("--json", json, "Print the JSON form");
  auto* strategy_ls = strategy->add_subcommand("ls", "List registered strategies");
  auto* strategy_rm = strategy->add_subcommand("rm", "Delete a registered strategy");
  strategy_rm->add_option("NAME", name, "Registered name")->required();

  // ------------------------------------------------------------------ upload
  ckpt::UploadCommand upload_cmd;
  auto* upload = app.add_subcommand(
      "upload", "Upload a checkpoint: a directory of rank_<r>/ files, or one whole-tensor file");
  upload->add_option("CKPT", upload_cmd.checkpoint_id, "Checkpoint id to create")->required();
  auto* upload_strategy = upload->add_option(
      "--strategy", upload_cmd.source_strategy,
      "Registered strategy the checkpoint was saved with (its source strategy)");
  auto* upload_dir = upload->add_option(
      "--dir", upload_cmd.dir, "Directory holding rank_0 .. rank_<N-1> with one .ckpt each");
  upload->add_option("--parallel", upload_cmd.parallel, "Ranks uploaded at once")
      ->capture_default_str();
  auto* upload_file =
      upload->add_option("--file", upload_cmd.file, "One whole-tensor .ckpt (no strategy)");
  upload_file->excludes(upload_dir)->excludes(upload_strategy);

  // ------------------------------------------------------------------ fetch
  ckpt::FetchCommand fetch_cmd;
  auto* fetch = app.add_subcommand(
      "fetch", "Write one destination rank's tensors (or every tensor whole) as a .ckpt");
  fetch->add_option("CKPT", fetch_cmd.checkpoint_id, "Checkpoint id")->required();
  auto* fetch_strategy = fetch->add_option("--dst-strategy", fetch_cmd.destination_strategy,
                                           "Registered destination strategy to re-shard to");
  auto* fetch_rank = fetch->add_option("--rank", fetch_cmd.rank, "Destination global rank");
  auto* fetch_merged =
      fetch->add_flag("--merged", fetch_cmd.merged, "Every tensor whole (single device)");
  fetch_merged->excludes(fetch_strategy)->excludes(fetch_rank);
  fetch->add_option("--out", fetch_cmd.out_path, "Output .ckpt file")->required();
  fetch->add_option("--include", fetch_cmd.include, "Only tensors matching this glob")
      ->allow_extra_args(false);
  fetch->add_option("--exclude", fetch_cmd.exclude, "Skip tensors matching this glob")
      ->allow_extra_args(false);
  fetch->add_flag("--strict", fetch_cmd.strict,
                  "Refuse parameters laid out at the source but absent from the destination");

  // ------------------------------------------------------------------ deps
  std::string deps_ckpt, src_strategy, dst_strategy;
  std::optional<int64_t> rank;
  bool all = false;
  auto* deps = app.add_subcommand(
      "deps", "Source ranks a destination rank reads: of a stored checkpoint "
              "(CKPT --dst-strategy NAME) or offline from two strategy files "
              "(--src-strategy FILE --dst-strategy FILE)");
  deps->add_option("CKPT", deps_ckpt, "Stored checkpoint id (server form)");
  deps->add_option("--src-strategy", src_strategy,
                   "Offline form: source strategy file or directory of per-stage files");
  deps->add_option("--dst-strategy", dst_strategy,
                   "Destination strategy: with CKPT a registered name; offline a strategy file or "
                   "directory of per-stage files");
  auto* rank_opt = deps->add_option("--rank", rank, "Destination global rank");
  auto* all_opt = deps->add_flag("--all", all, "Every destination rank");
  rank_opt->excludes(all_opt);
  deps->add_flag("--json", json, "Print JSON");

  // ------------------------------------------------------------------ checkpoints
  std::string checkpoint_id;
  auto* ls = app.add_subcommand("ls", "List stored checkpoints");
  auto* describe = app.add_subcommand("describe", "Print a stored checkpoint and its tensors");
  describe->add_option("CKPT", checkpoint_id, "Checkpoint id")->required();
  auto* rm = app.add_subcommand("rm", "Delete a stored checkpoint");
  rm->add_option("CKPT", checkpoint_id, "Checkpoint id")->required();

  // ------------------------------------------------------------------ transform jobs
  ckpt::TransformCommand transform_cmd;
  std::string ranks_list;
  auto* transform = app.add_subcommand(
      "transform", "Submit a server-side transform job: a new stored checkpoint (--as), an "
                   "export directory (--export-dir) or a merged file (--merged-file)");
  transform->add_option("CKPT", transform_cmd.checkpoint_id, "Source checkpoint id")->required();
  transform->add_option("--dst-strategy", transform_cmd.destination_strategy,
                        "Registered destination strategy to re-shard to (not with --merged-file)");
  auto* transform_as = transform->add_option(
      "--as", transform_cmd.new_checkpoint_id, "Store the result as this new checkpoint id");
  auto* transform_dir = transform->add_option(
      "--export-dir", transform_cmd.export_dir,
      "Write DIR/rank_<r>/<prefix><r>.ckpt on the server's filesystem (absolute path)");
  auto* transform_file = transform->add_option(
      "--merged-file", transform_cmd.merged_file,
      "Write one .ckpt of whole tensors on the server's filesystem (absolute path)");
  transform_as->excludes(transform_dir)->excludes(transform_file);
  transform_dir->excludes(transform_file);
  auto* transform_ranks = transform->add_option(
      "--ranks", ranks_list, "--export-dir: destination ranks to write, e.g. 0,2,5-7 (default all)");
  transform->add_option("--prefix", transform_cmd.prefix,
                        "--export-dir: file name prefix (default checkpoint_)");
  transform->add_option("--id", transform_cmd.job_id,
                        "Job id to use; resubmitting the same request returns the same job");
  transform->add_flag("--wait", transform_cmd.wait,
                      "Wait for the job, showing progress; fail if it fails or is cancelled");

  std::string job_id;
  auto* jobs = app.add_subcommand("jobs", "Transform jobs on the server");
  jobs->require_subcommand(1);
  auto* jobs_ls = jobs->add_subcommand("ls", "List jobs: id, state, source -> target, progress");
  auto* jobs_get = jobs->add_subcommand("get", "Print one job");
  jobs_get->add_option("ID", job_id, "Job id")->required();
  auto* jobs_watch = jobs->add_subcommand(
      "watch", "Show a job's progress until it ends; fail if it fails or is cancelled");
  jobs_watch->add_option("ID", job_id, "Job id")->required();
  auto* jobs_cancel = jobs->add_subcommand("cancel", "Cancel a queued or running job");
  jobs_cancel->add_option("ID", job_id, "Job id")->required();

  // ------------------------------------------------------------------ client-side export
  ckpt::ExportCommand export_cmd;
  auto* export_sub = app.add_subcommand(
      "export", "Fetch every destination rank and write DIR/rank_<r>/<prefix><r>.ckpt locally "
                "(DIR appears only when every rank succeeded)");
  export_sub->add_option("CKPT", export_cmd.checkpoint_id, "Checkpoint id")->required();
  export_sub->add_option("--dst-strategy", export_cmd.destination_strategy,
                         "Registered destination strategy to re-shard to")
      ->required();
  export_sub->add_option("--dir", export_cmd.dir, "Local directory to create (absent or empty)")
      ->required();
  auto* export_ranks = export_sub->add_option(
      "--ranks", ranks_list, "Destination ranks to write, e.g. 0,2,5-7 (default all)");
  export_sub->add_option("--prefix", export_cmd.prefix, "File name prefix")
      ->capture_default_str();
  export_sub->add_option("--parallel", export_cmd.parallel, "Ranks fetched at once")
      ->capture_default_str();

  std::string dir;
  auto* sample = app.add_subcommand(
      "sample", "Write a small generated demo: strategies and a sharded checkpoint");
  sample->add_option("DIR", dir, "Output directory")->required();

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
    return 2;
  }

  // Offline subcommands never contact the server. deps is offline unless it names a checkpoint.
  const bool offline_deps = deps_ckpt.empty();
  absl::Status status;
  if (*inspect) {
    status = ckpt::RunInspect(path, json, std::cout);
  } else if (*show) {
    status = ckpt::RunStrategyShow(path, json, std::cout);
  } else if (*merge) {
    status = ckpt::RunStrategyMerge(inputs, out_path, std::cout);
  } else if (*sample) {
    status = ckpt::RunSample(dir, std::cout);
  } else if (*deps && !deps_ckpt.empty() && !src_strategy.empty()) {
    status = absl::InvalidArgumentError(
        "deps takes either CKPT --dst-strategy NAME (server) or --src-strategy FILE "
        "--dst-strategy FILE (offline), not both");
  } else if (*deps && offline_deps) {
    if (src_strategy.empty() && dst_strategy.empty()) {
      status = absl::InvalidArgumentError(
          "deps needs CKPT --dst-strategy NAME (server) or --src-strategy FILE --dst-strategy "
          "FILE (offline)");
    } else if (src_strategy.empty() || dst_strategy.empty()) {
      status = absl::InvalidArgumentError("offline deps needs --src-strategy and --dst-strategy");
    } else if (!rank && !all) {
      status = absl::InvalidArgumentError("deps needs --rank R or --all");
    } else {
      status = ckpt::RunLocalDeps(src_strategy, dst_strategy, rank, json, std::cout);
    }
  } else {
    absl::StatusOr<std::unique_ptr<ckpt::CkptClient>> client = ckpt::CkptClient::Connect(server);
    if (!client.ok()) return Fail(client.status());
    ckpt::CkptClient& c = **client;
    if (*put) {
      status = ckpt::RunStrategyPut(c, name, path, overwrite, std::cout);
    } else if (*get) {
      status = ckpt::RunStrategyGet(c, name, json, std::cout);
    } else if (*strategy_ls) {
      status = ckpt::RunStrategyList(c, std::cout);
    } else if (*strategy_rm) {
      status = ckpt::RunStrategyRemove(c, name, std::cout);
    } else if (*upload) {
      status = ckpt::RunUpload(c, upload_cmd, std::cout, std::cerr);
    } else if (*fetch) {
      status = ckpt::RunFetch(c, fetch_cmd, std::cout, std::cerr);
    } else if (*deps) {
      status = ckpt::RunRemoteDeps(c, deps_ckpt, dst_strategy, rank, all, json, std::cout);
    } else if (*ls) {
      status = ckpt::RunList(c, std::cout);
    } else if (*describe) {
      status = ckpt::RunDescribe(c, checkpoint_id, std::cout);
    } else if (*rm) {
      status = ckpt::RunRemove(c, checkpoint_id, std::cout);
    } else if (*transform) {
      if (transform_ranks->count() > 0) transform_cmd.ranks = ranks_list;
      status = ckpt::RunTransform(c, transform_cmd, std::cout);
    } else if (*jobs_ls) {
      status = ckpt::RunJobsList(c, std::cout);
    } else if (*jobs_get) {
      status = ckpt::RunJobGet(c, job_id, std::cout);
    } else if (*jobs_watch) {
      status = ckpt::RunJobWatch(c, job_id, {}, std::cout);
    } else if (*jobs_cancel) {
      status = ckpt::RunJobCancel(c, job_id, std::cout);
    } else if (*export_sub) {
      if (export_ranks->count() > 0) export_cmd.ranks = ranks_list;
      status = ckpt::RunExport(c, export_cmd, std::cout, std::cerr);
    }
  }
  // Flush before deciding the exit code: a closed stdout pipe is a failure to report too.
  std::cout.flush();
  if (status.ok() && !std::cout) status = absl::InternalError("cannot write to standard output");
  return status.ok() ? EXIT_SUCCESS : Fail(status);
}
