// ckpt_bench: measures ckptd against the limits of its machine. docs/performance.md
// (## Method) says what each figure means. Every figure is measured in this run; nothing is
// assumed. This file is the command line; the harness is tests/bench/harness.h.
//
// Modes (the last three are internal: the harness re-executes itself as a child process):
//   ckpt_bench [--size-gib G] [--out FILE] [--work-dir DIR] [--keep] [--cases LIST]
//   ckpt_bench --transport-server PORT_FILE
//   ckpt_bench --worker --server ADDR --fetch-strategy NAME --rank R --size-gib G
//   ckpt_bench --baseline --src DIR --baseline-out DIR --size-gib G
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <set>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "tests/bench/child_modes.h"
#include "tests/bench/harness.h"
#include "tests/bench/transport.h"

namespace {

// The --cases list as a set; nullopt (after a message) when it names an unknown case.
std::optional<std::set<std::string>> ParseCases(const std::string& cases) {
  std::set<std::string> selected;
  for (absl::string_view c : absl::StrSplit(cases, ',', absl::SkipEmpty())) {
    selected.insert(std::string(c));
  }
  static const std::set<std::string> kKnown = {"all",        "transport",  "storage",      "fetch",
                                               "8to3",       "row_to_col", "opt_to_plain", "merged",
                                               "concurrent", "transform",  "deps",         "upload",
                                               "python",     "tls",        "storm",
                                               "many_tensors", "growth"};
  for (const std::string& c : selected) {
    if (!kKnown.contains(c)) {
      std::fprintf(stderr, "ckpt_bench: unknown case '%s'\n", c.c_str());
      return std::nullopt;
    }
  }
  return selected;
}

}  // namespace

int main(int argc, char** argv) {
  // Every process of the bench (the harness, its workers, the transport server) runs gRPC as
  // ckptd and ckptctl do, without abseil's lock-order checks (docs/performance.md, "Client
  // programs"), so that the limits and the fetches they are compared with pay the same.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  CLI::App app{"ckpt_bench - ckptd against the limits of this machine"};
  double size_gib = 2.0;
  std::string out = "build/bench-results.json";
  std::string work_dir;
  bool keep = false;
  std::string cases = "all";
  app.add_option("--size-gib", size_gib, "Checkpoint size (GiB of tensors)")
      ->check(CLI::Range(0.001, 64.0))
      ->capture_default_str();
  app.add_option("--out", out, "Results JSON")->capture_default_str();
  app.add_option("--work-dir", work_dir,
                 "Where the checkpoint, the store and outputs go (default: a temporary directory "
                 "under the build directory)");
  app.add_flag("--keep", keep, "Keep the work directory");
  app.add_option("--cases", cases,
                 "Comma-separated: all, transport, storage, fetch (or 8to3, row_to_col, "
                 "opt_to_plain, merged), python, concurrent, storm, tls, transform, deps, "
                 "many_tensors, growth. Upload always runs.")
      ->capture_default_str();
  // Internal modes: the harness re-executes itself.
  std::string transport_port_file, server, fetch_strategy, src_dir, baseline_out;
  bool worker = false, baseline = false;
  int64_t rank = 0;
  app.add_option("--transport-server", transport_port_file)->group("");
  app.add_flag("--worker", worker)->group("");
  app.add_option("--server", server)->group("");
  app.add_option("--fetch-strategy", fetch_strategy)->group("");
  app.add_option("--rank", rank)->group("");
  app.add_flag("--baseline", baseline)->group("");
  app.add_option("--src", src_dir)->group("");
  app.add_option("--baseline-out", baseline_out)->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!transport_port_file.empty()) return ckpt::bench::RunTransportServer(transport_port_file);
  if (worker) return ckpt::bench::WorkerMain(server, fetch_strategy, rank, size_gib);
  if (baseline) return ckpt::bench::BaselineMain(src_dir, baseline_out, size_gib);

  std::optional<std::set<std::string>> selected = ParseCases(cases);
  if (!selected) return 2;
  signal(SIGPIPE, SIG_IGN);  // a dead worker must not kill the harness
  // The in-process store (storage limit) logs its open at info level; keep the table readable.
  spdlog::set_level(spdlog::level::warn);
  ckpt::bench::Harness harness(size_gib, out, work_dir, keep, *std::move(selected));
  return harness.Run();
}
