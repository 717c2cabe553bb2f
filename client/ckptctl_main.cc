// ckptctl: command-line client of ckptd. Offline subcommands work on local files; the server
// subcommands arrive with the service.
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "client/offline_commands.h"

namespace {

int Fail(const absl::Status& status) {
  std::cerr << "ckptctl: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
            << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckptctl - client of ckptd, the sharded-checkpoint service"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");

  std::string path;
  bool json = false;
  auto* inspect = app.add_subcommand("inspect", "List the tensors of a MindSpore .ckpt file");
  inspect->add_option("FILE", path, "MindSpore .ckpt file")->required();
  inspect->add_flag("--json", json, "Print JSON");

  auto* strategy = app.add_subcommand("strategy", "Strategy files");
  strategy->require_subcommand(1);
  auto* show = strategy->add_subcommand("show", "Print the layouts of a strategy");
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

  std::string src_strategy, dst_strategy;
  std::optional<int64_t> rank;
  bool all = false;
  auto* deps = app.add_subcommand("deps", "Source ranks a destination rank reads");
  deps->add_option("--src-strategy", src_strategy, "Source strategy (file or directory)")
      ->required();
  deps->add_option("--dst-strategy", dst_strategy, "Destination strategy (file or directory)")
      ->required();
  auto* rank_opt = deps->add_option("--rank", rank, "Destination global rank");
  auto* all_opt = deps->add_flag("--all", all, "Every destination rank");
  rank_opt->excludes(all_opt);
  deps->add_flag("--json", json, "Print JSON");

  std::string dir;
  auto* sample = app.add_subcommand(
      "sample", "Write a small generated demo: strategies and a sharded checkpoint");
  sample->add_option("DIR", dir, "Output directory")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  absl::Status status;
  if (*inspect) {
    status = ckpt::RunInspect(path, json, std::cout);
  } else if (*show) {
    status = ckpt::RunStrategyShow(path, json, std::cout);
  } else if (*merge) {
    status = ckpt::RunStrategyMerge(inputs, out_path, std::cout);
  } else if (*deps) {
    if (!rank && !all) return Fail(absl::InvalidArgumentError("deps needs --rank R or --all"));
    status = ckpt::RunLocalDeps(src_strategy, dst_strategy, rank, json, std::cout);
  } else if (*sample) {
    status = ckpt::RunSample(dir, std::cout);
  }
  return status.ok() ? 0 : Fail(status);
}
