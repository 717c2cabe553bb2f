// The Python client phase: the Python client (ckptd.Client.fetch: one NumPy array per tensor,
// every message verified) against the C++ client library, both fetching every rank of the 8to3
// case from this run's ckptd. tests/bench/python_fetch_bench.py runs in a child process (Debian's
// interpreter, the package in build/python) and does one pass per "go" line on its stdin; this
// process alternates a pass of the C++ library (checked as the fetch cases check theirs) with a
// pass of the child: one warm-up pair, then kRepeats measured pairs. The two are so measured over
// the same seconds of a machine whose speed drifts, and their medians compared. The child keeps
// one rank's arrays at a time; its peak resident set (the kernel's ru_maxrss) is compared with
// the most tensor bytes it held at once, its largest rank. The rows name the fetch path the
// package took (python_fetch_bench.py reports it): "native" (ckptd._native) or "grpcio".
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {
namespace {

using nlohmann::json;

// Targets: Python fetch GiB/s >= 0.8 x the C++ library's, and peak RSS <=
// 1.1 x the bytes held + 64 MiB (the interpreter, gRPC and NumPy themselves).
constexpr double kMinRatio = 0.8;
constexpr double kRssFactor = 1.1;
constexpr double kRssAllowanceMiB = 64;

// The highest ratio the Python client's CPU cost allows when ckptd and the client share the
// machine's CPUs: Python's throughput cannot exceed CPUs / (server + Python client CPU seconds
// per GiB), nor (it is compared with) the C++ library's measured `cpp_gibps`. Nullopt without
// the figures.
std::optional<double> CpuBoundRatio(const std::optional<double>& server_cpu,
                                    const std::optional<double>& client_cpu, double cpp_gibps) {
  const unsigned cpus = std::thread::hardware_concurrency();
  if (!server_cpu || !client_cpu || cpus == 0 || cpp_gibps <= 0) return std::nullopt;
  const double python_cpu = *server_cpu + *client_cpu;
  if (python_cpu <= 0) return std::nullopt;
  return std::min(1.0, cpus / python_cpu / cpp_gibps);
}

// A JSON object line of the child, or an error naming what it printed instead.
absl::StatusOr<json> ParseLine(const std::optional<std::string>& line, const char* what) {
  if (!line) {
    return absl::InternalError(absl::StrCat(CKPT_BENCH_PYTHON_SCRIPT, " ended before ", what,
                                            " (its error is on stderr above)"));
  }
  json j = json::parse(*line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("bytes")) {
    return absl::InternalError(
        absl::StrCat(CKPT_BENCH_PYTHON_SCRIPT, " printed '", *line, "' instead of ", what));
  }
  return j;
}

}  // namespace

void Harness::MeasurePython() {
  const FetchCase c{"8to3", kThreeName, "", 1.1, "row split"};
  const absl::StatusOr<Strategy> destination = StrategyByName(spec_, kThreeName);
  if (!destination.ok()) return Error("python fetch", destination.status());
  const int64_t ranks = destination->world_size();
  const std::vector<std::string> argv = {
      CKPT_BENCH_PYTHON3, CKPT_BENCH_PYTHON_SCRIPT,
      "--server",         server_->address(),
      "--checkpoint",     kCheckpointId,
      "--dst-strategy",   kThreeName,
      "--ranks",          absl::StrCat("0-", ranks - 1),
      "--pythonpath",     absl::StrCat(CKPT_BENCH_BUILD_DIR, "/python"),
      "--stdin-passes"};
  auto child = Child::Spawn(argv, {.pipe_stdin = true, .pipe_stdout = true});
  if (!child.ok()) return Error("python fetch: start", child.status());
  Child& py = **child;
  if (std::optional<std::string> ready = py.ReadLine(); !ready || *ready != "ready") {
    return Error("python fetch", absl::InternalError(absl::StrCat(
                                     CKPT_BENCH_PYTHON_SCRIPT, " did not start: ",
                                     ready ? *ready : "no output (its error is on stderr above)")));
  }
  PythonResult r;
  int64_t verified = 0;
  CpuTally cpp_cpu, py_cpu;                       // over the measured passes
  for (int pass = 0; pass <= kRepeats; ++pass) {  // pass 0: the warm-up pair
    const auto start = Clock::now();
    const CpuMeter cpp_meter(server_->pid());
    const std::optional<int64_t> cpp_bytes = FetchAllRanks(c, &*destination, ranks, &verified);
    if (!cpp_bytes) return;
    const double cpp_gibps = *cpp_bytes / kGiB / Seconds(start);
    if (pass > 0) cpp_meter.AddTo(&cpp_cpu, *cpp_bytes);
    const CpuMeter py_meter(server_->pid());  // its client side is this idle process
    if (absl::Status s = py.WriteLine("go"); !s.ok()) return Error("python fetch", s);
    absl::StatusOr<json> line = ParseLine(py.ReadLine(), "a pass's figures");
    if (!line.ok()) return Error("python fetch", line.status());
    const int64_t py_bytes = (*line)["bytes"].get<int64_t>();
    if (pass > 0) py_meter.AddTo(&py_cpu, py_bytes);
    const double py_gibps = (*line)["gibps"].get<double>();
    if (py_bytes != *cpp_bytes) {
      return Error("python fetch", absl::InternalError(absl::StrCat(
                                       "the Python client fetched ", py_bytes,
                                       " bytes in a pass, the C++ library ", *cpp_bytes)));
    }
    Progress(absl::StrFormat("python fetch 8to3%s: C++ %.2f GiB/s, Python %.2f GiB/s",
                             pass == 0 ? " (warm-up)" : "", cpp_gibps, py_gibps));
    if (pass == 0) {
      r.cpp_warmup_gibps = cpp_gibps;
      r.warmup_gibps = py_gibps;
      r.bytes = py_bytes;
    } else {
      r.cpp_passes_gibps.push_back(cpp_gibps);
      r.passes_gibps.push_back(py_gibps);
    }
  }
  if (absl::Status s = py.WriteLine("quit"); !s.ok()) return Error("python fetch", s);
  absl::StatusOr<json> summary = ParseLine(py.ReadLine(), "its summary");
  const Child::Exit exit = py.Wait();
  if (!summary.ok()) return Error("python fetch", summary.status());
  if (exit.exit_code != 0) {
    return Error("python fetch", absl::InternalError(absl::StrCat(
                                     CKPT_BENCH_PYTHON_SCRIPT, " exited with status ",
                                     exit.exit_code, " (its error is on stderr above)")));
  }
  const json& j = *summary;
  r.max_rank_bytes = j["max_rank_bytes"].get<int64_t>();
  r.path = j.contains("path") && j["path"].is_string() ? j["path"].get<std::string>() : "unknown";
  r.baseline_rss_bytes = j["baseline_rss_bytes"].get<int64_t>();
  if (j["cpu_seconds_per_gib"].is_number())
    r.cpu_s_per_gib = j["cpu_seconds_per_gib"].get<double>();
  r.peak_rss_bytes = exit.max_rss_kib * 1024;
  if (const std::optional<CpuPerGib> cpu = py_cpu.PerGib()) r.server_cpu_s_per_gib = cpu->server;
  r.cpp_cpu = cpp_cpu.PerGib();
  r.gibps = Median(r.passes_gibps);
  r.cpp_gibps = Median(r.cpp_passes_gibps);
  Progress(absl::StrFormat(
      "python fetch 8to3 (%s path): %.3f GiB per pass, median %.2f GiB/s against C++ %.2f "
      "GiB/s, peak RSS %.0f MiB for %.0f MiB held",
      r.path, r.bytes / kGiB, r.gibps, r.cpp_gibps, r.peak_rss_bytes / kMiB,
      r.max_rank_bytes / kMiB));
  python_ = std::move(r);
}

json Harness::PythonJson() const {
  if (!python_) return nullptr;
  const PythonResult& p = *python_;
  return {{"case", "8to3"},
          {"path", p.path},
          {"gibps", p.gibps},
          {"cpp_gibps", p.cpp_gibps},
          {"ratio_to_cpp", p.cpp_gibps > 0 ? json(p.gibps / p.cpp_gibps) : json(nullptr)},
          {"passes_gibps", p.passes_gibps},
          {"cpp_passes_gibps", p.cpp_passes_gibps},
          {"warmup_gibps", Opt(p.warmup_gibps)},
          {"cpp_warmup_gibps", Opt(p.cpp_warmup_gibps)},
          {"bytes", p.bytes},
          {"max_rank_bytes", p.max_rank_bytes},
          {"peak_rss_bytes", p.peak_rss_bytes},
          {"baseline_rss_bytes", p.baseline_rss_bytes},
          {"peak_rss_limit_bytes", kRssFactor * p.max_rank_bytes + kRssAllowanceMiB * kMiB},
          {"client_cpu_s_per_gib", Opt(p.cpu_s_per_gib)},
          {"server_cpu_s_per_gib", Opt(p.server_cpu_s_per_gib)},
          {"cpp_server_cpu_s_per_gib", p.cpp_cpu ? json(p.cpp_cpu->server) : json(nullptr)},
          {"cpp_client_cpu_s_per_gib", p.cpp_cpu ? json(p.cpp_cpu->client) : json(nullptr)},
          {"cpus", std::thread::hardware_concurrency()},
          {"cpu_bound_ratio",
           Opt(CpuBoundRatio(p.server_cpu_s_per_gib, p.cpu_s_per_gib, p.cpp_gibps))}};
}

void Harness::PythonRows(std::vector<Row>* rows) const {
  std::optional<double> gibps, cpp, ratio;
  if (python_) {
    gibps = python_->gibps;
    cpp = python_->cpp_gibps;
    if (*cpp > 0) ratio = *gibps / *cpp;
  }
  rows->push_back(
      {python_ ? absl::StrCat("python fetch 8to3 (", python_->path, " path) vs C++ library, median")
               : std::string("python fetch 8to3 vs C++ library, median"),
       absl::StrCat(Fmt(gibps, ""), " / ", Fmt(cpp, " GiB/s"), " = ", Fmt(ratio, "")),
       absl::StrFormat("ratio >= %.1f", kMinRatio),
       Verdict(ratio ? std::optional<bool>(*ratio >= kMinRatio) : std::nullopt)});
  if (!python_) return;
  const PythonResult& p = *python_;
  if (!p.passes_gibps.empty()) {
    rows->push_back({"  Python passes (alternating with C++)",
                     PassesWithWarmup(p.passes_gibps, p.warmup_gibps), "", ""});
    rows->push_back(
        {"  C++ library passes", PassesWithWarmup(p.cpp_passes_gibps, p.cpp_warmup_gibps), "", ""});
  }
  rows->push_back({"  CPU per GiB (server + client): Python",
                   absl::StrCat(Fmt(p.server_cpu_s_per_gib, ""), " + ", Fmt(p.cpu_s_per_gib, " s")),
                   "", ""});
  rows->push_back({"  CPU per GiB (server + client): C++", CpuText(p.cpp_cpu), "", ""});
  if (const std::optional<double> bound =
          CpuBoundRatio(p.server_cpu_s_per_gib, p.cpu_s_per_gib, p.cpp_gibps)) {
    const double python_cpu = *p.server_cpu_s_per_gib + *p.cpu_s_per_gib;
    const unsigned cpus = std::thread::hardware_concurrency();
    rows->push_back(
        {absl::StrFormat("  CPU bound, %u CPUs: min(C++, %u / %.2f s)", cpus, cpus, python_cpu),
         absl::StrFormat("%.2f GiB/s  ratio %.2f", *bound * p.cpp_gibps, *bound), "", ""});
  }
  const double peak_mib = p.peak_rss_bytes / kMiB;
  const double held_mib = p.max_rank_bytes / kMiB;
  const double limit_mib = kRssFactor * held_mib + kRssAllowanceMiB;
  rows->push_back(
      {"  Python peak RSS / largest rank fetched",
       absl::StrFormat("%.0f / %.0f MiB (at start %.0f MiB)", peak_mib, held_mib,
                       p.baseline_rss_bytes / kMiB),
       absl::StrFormat("<= %.1fx + %.0f MiB = %.0f MiB", kRssFactor, kRssAllowanceMiB, limit_mib),
       Verdict(peak_mib <= limit_mib)});
}

}  // namespace ckpt::bench
