// ckpt_bench: measures ckptd against the limits of its machine (issue 5). The Performance section
// of the top-level README.md says what each figure means. Every figure is measured in this run;
// nothing is assumed.
//
// Modes (the last three are internal: the harness re-executes itself as a child process):
//   ckpt_bench [--size-gib G] [--out FILE] [--work-dir DIR] [--keep] [--cases LIST]
//   ckpt_bench --transport-server PORT_FILE
//   ckpt_bench --worker --server ADDR --fetch-strategy NAME --rank R --size-gib G
//   ckpt_bench --baseline --src DIR --baseline-out DIR --size-gib G
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "ckpt.grpc.pb.h"
#include "ckpt_records.pb.h"
#include "client/client.h"
#include "client/malloc_tuning.h"
#include "core/absl_compat.h"
#include "core/ckpt_format.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"
#include "storage/checkpoint_store.h"
#include "storage/file_stream.h"
#include "tests/bench/baseline.h"
#include "tests/bench/bench_data.h"
#include "tests/bench/child.h"
#include "tests/bench/transport.h"
#include "tests/testing/server_process.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kMessageBytes = int64_t{1} << 20;  // ckptd's data message size
// Throughput figures (transport, each fetch case, upload) are the median of this many runs, so
// that one hiccup of a shared machine does not decide a ratio.
constexpr int kRepeats = 3;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
constexpr char kCheckpointId[] = "bench";
constexpr int kWorkers = 8;

// /proc/loadavg's first three fields: other work on the machine skews every figure.
std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

// /proc/stat's aggregate CPU line: steal (time the hypervisor gave this VM's CPUs to others) and
// the total, in ticks. A shared VM's figures move with its steal.
struct CpuTicks {
  uint64_t steal = 0;
  uint64_t total = 0;
};
CpuTicks ReadCpuTicks() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  in >> cpu;
  CpuTicks t;
  // user nice system idle iowait irq softirq steal (guest times are inside user and nice)
  for (int i = 0; i < 8 && in; ++i) {
    uint64_t v = 0;
    in >> v;
    t.total += v;
    if (i == 7) t.steal = v;
  }
  return t;
}
// Share of CPU time stolen since `start`, if /proc/stat could be read.
std::optional<double> StealSince(const CpuTicks& start) {
  const CpuTicks now = ReadCpuTicks();
  if (now.total <= start.total) return std::nullopt;
  return static_cast<double>(now.steal - start.steal) / static_cast<double>(now.total - start.total);
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// CPU seconds per GiB moved, of the serving process and of this (receiving) process: what a
// transfer costs each side, steadier than wall time on a shared VM and telling where a
// throughput gap comes from.
struct CpuPerGib {
  double server = 0;
  double client = 0;
};

// `n` bytes of a fixed pseudo-random-looking pattern (one per `seed`), cheap to make.
std::string PatternBytes(size_t n, uint32_t seed) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i + seed) * 2654435761u >> 13);
  return bytes;
}

// CPU seconds of a server process and of this one, and the bytes moved, summed over several
// spans (passes that other work runs between).
struct CpuTally {
  double server = 0;
  double client = 0;
  int64_t bytes = 0;
  bool complete = true;  // false once a span's server CPU time could not be read

  std::optional<CpuPerGib> PerGib() const {
    if (!complete || bytes <= 0) return std::nullopt;
    const double gib = static_cast<double>(bytes) / kGiB;
    return CpuPerGib{server / gib, client / gib};
  }
};

// Measures CpuPerGib over a span: construct at its start, Finish(bytes) (or AddTo) at its end.
class CpuMeter {
 public:
  explicit CpuMeter(pid_t server) : server_pid_(server), client_start_(SelfCpuSeconds()) {
    if (auto s = ProcessCpuSeconds(server); s.ok()) server_start_ = *s;
  }
  // nullopt when the server's CPU time cannot be read (or nothing moved).
  std::optional<CpuPerGib> Finish(int64_t bytes) const {
    CpuTally tally;
    AddTo(&tally, bytes);
    return tally.PerGib();
  }
  // Adds the span's CPU time and `bytes` to `tally`.
  void AddTo(CpuTally* tally, int64_t bytes) const {
    tally->client += SelfCpuSeconds() - client_start_;
    tally->bytes += bytes;
    auto server = ProcessCpuSeconds(server_pid_);
    if (!server.ok() || !server_start_) {
      tally->complete = false;
      return;
    }
    tally->server += *server - *server_start_;
  }

 private:
  pid_t server_pid_;
  double client_start_;
  std::optional<double> server_start_;
};

// "server + client" CPU seconds per GiB.
std::string CpuText(const std::optional<CpuPerGib>& cpu) {
  if (!cpu) return "null";
  return absl::StrFormat("%.2f + %.2f s", cpu->server, cpu->client);
}

// Names under which the harness registers its strategies.
constexpr char kSourceName[] = "src8";
constexpr char kThreeName[] = "d3";
constexpr char kColumnName[] = "dcol";
constexpr char kPlainName[] = "dplain";

absl::StatusOr<Strategy> StrategyByName(const BenchSpec& spec, const std::string& name) {
  if (name == kSourceName) return SourceStrategy(spec);
  if (name == kThreeName) return ThreeRankStrategy(spec);
  if (name == kColumnName) return ColumnStrategy(spec);
  if (name == kPlainName) return PlainStrategy(spec);
  return absl::InvalidArgumentError(absl::StrCat("unknown bench strategy ", name));
}

int64_t SizeBytes(double size_gib) { return static_cast<int64_t>(size_gib * kGiB); }

// ------------------------------------------------------------------ fetch verification

// Receives one destination rank's Fetch, counts its bytes and checks sampled bytes of every
// tensor against the generator; the delivered boxes must be the ones the destination layout
// gives the rank. Not thread-safe.
class CheckingVisitor final : public TensorVisitor {
 public:
  // `destination` null: merged (every tensor whole). `include_prefix`: only tensors whose names
  // start with it are expected (empty: all).
  CheckingVisitor(const BenchSpec* spec, const Strategy* destination, int64_t rank,
                  std::string include_prefix)
      : spec_(spec),
        destination_(destination),
        rank_(rank),
        include_prefix_(std::move(include_prefix)) {}

  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }

  absl::Status OnTensor(const v1::FetchTensorHeader& header) override {
    checker_.reset();
    const BenchTensor* t = spec_->Find(header.name());
    if (t == nullptr) {
      if (!header.verbatim()) {
        return absl::InternalError(absl::StrCat("unexpected tensor ", header.name()));
      }
      return absl::OkStatus();
    }
    Box want = Box::Whole(t->shape());
    if (destination_ != nullptr) {
      const StrategyParam* p = destination_->Find(t->name);
      if (p == nullptr) return absl::InternalError(absl::StrCat("no layout for ", t->name));
      CKPT_ASSIGN_OR_RETURN(want,
                            p->layout.SliceBox(t->shape(), rank_ % destination_->devices_per_stage()));
    }
    Box got;
    got.lo.assign(header.box_lo().begin(), header.box_lo().end());
    got.hi.assign(header.box_hi().begin(), header.box_hi().end());
    if (got != want) {
      return absl::InternalError(absl::StrCat(t->name, " to rank ", rank_, ": delivered box ",
                                              got.ToString(), ", expected ", want.ToString()));
    }
    if (header.dtype() != std::string(DTypeName(t->dtype))) {
      return absl::InternalError(absl::StrCat(t->name, ": dtype ", header.dtype()));
    }
    if (!seen_.insert(t->name).second) {
      return absl::InternalError(absl::StrCat(t->name, " delivered twice"));
    }
    checker_.emplace(t, want);
    return absl::OkStatus();
  }

  absl::Status OnData(std::string_view data) override {
    bytes_ += static_cast<int64_t>(data.size());
    if (checker_) return checker_->Feed(data);
    return absl::OkStatus();
  }

  absl::Status OnTensorEnd() override {
    if (checker_) checked_ += checker_->bytes_checked();
    checker_.reset();
    return absl::OkStatus();
  }

  // After the fetch: every expected tensor arrived.
  absl::Status Complete() const {
    for (const BenchTensor& t : spec_->tensors) {
      if (!t.name.starts_with(include_prefix_)) continue;
      if (!seen_.contains(t.name)) {
        return absl::InternalError(absl::StrCat(t.name, " was not delivered to rank ", rank_));
      }
    }
    return absl::OkStatus();
  }

  int64_t bytes() const { return bytes_; }
  int64_t checked() const { return checked_; }

 private:
  const BenchSpec* spec_;
  const Strategy* destination_;
  int64_t rank_;
  std::string include_prefix_;
  std::optional<SliceChecker> checker_;
  std::set<std::string> seen_;
  int64_t bytes_ = 0;
  int64_t checked_ = 0;
};

// Checks a written .ckpt of destination rank `rank` (sampled bytes, every tensor present).
absl::StatusOr<int64_t> VerifyRankFile(const BenchSpec& spec, const Strategy& destination,
                                       int64_t rank, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(auto source, FileByteSource::Open(path));
  CkptReader reader(source.get());
  CheckingVisitor visitor(&spec, &destination, rank, "");
  while (true) {
    CKPT_ASSIGN_OR_RETURN(std::optional<CkptTensor> t, reader.NextTensor());
    if (!t) break;
    v1::FetchTensorHeader header;
    header.set_name(t->name);
    header.set_dtype(std::string(DTypeName(t->dtype)));
    header.set_verbatim(spec.Find(t->name) == nullptr);
    // A file records only the local shape: the box is the one the layout gives, if the shape
    // agrees.
    if (const BenchTensor* bt = spec.Find(t->name)) {
      CKPT_ASSIGN_OR_RETURN(Box box, destination.Find(bt->name)->layout.SliceBox(
                                         bt->shape(), rank % destination.devices_per_stage()));
      if (t->shape() != box.shape()) {
        return absl::InternalError(absl::StrCat(path, ": ", t->name, " has shape ",
                                                ShapeToString(t->shape()), ", expected ",
                                                ShapeToString(box.shape())));
      }
      for (size_t i = 0; i < box.rank(); ++i) {
        header.add_box_lo(box.lo[i]);
        header.add_box_hi(box.hi[i]);
      }
    }
    CKPT_RETURN_IF_ERROR(visitor.OnTensor(header));
    for (size_t off = 0; off < t->data.size(); off += kMessageBytes) {
      CKPT_RETURN_IF_ERROR(visitor.OnData(std::string_view(t->data).substr(off, kMessageBytes)));
    }
    CKPT_RETURN_IF_ERROR(visitor.OnTensorEnd());
  }
  CKPT_RETURN_IF_ERROR(visitor.Complete());
  return visitor.checked();
}

// ------------------------------------------------------------------ child modes

int WorkerMain(const std::string& server, const std::string& strategy_name, int64_t rank,
               double size_gib) {
  // A worker stands for a user's program fetching its rank through the client library, which
  // opts in to the allocator policy the library documents for streaming (as ckptctl does).
  TuneMallocForStreaming();
  const BenchSpec spec = MakeSpec(SizeBytes(size_gib));
  auto destination = StrategyByName(spec, strategy_name);
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  auto client = CkptClient::Connect(server, options);
  if (!destination.ok() || !client.ok()) {
    std::printf("error %s\n", (!destination.ok() ? destination.status() : client.status())
                                  .ToString()
                                  .c_str());
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  // One fetch of the rank per "go" line, until "quit".
  for (std::string line; std::getline(std::cin, line);) {
    if (line == "quit") return 0;
    if (line != "go") {
      std::printf("error unknown command %s\n", line.c_str());
      return 1;
    }
    v1::FetchRequest request;
    request.set_checkpoint_id(kCheckpointId);
    request.set_destination_strategy(strategy_name);
    request.set_rank(rank);
    CheckingVisitor visitor(&spec, &*destination, rank, "");
    const auto start = Clock::now();
    const double cpu_start = SelfCpuSeconds();
    absl::Status status = (*client)->Fetch(request, visitor);
    const double seconds = Seconds(start);
    const double cpu = SelfCpuSeconds() - cpu_start;
    if (status.ok()) status = visitor.Complete();
    if (!status.ok()) {
      std::printf("error %s\n", status.ToString().c_str());
      return 1;
    }
    std::printf("ok %lld %.6f %lld %.6f\n", static_cast<long long>(visitor.bytes()), seconds,
                static_cast<long long>(visitor.checked()), cpu);
    std::fflush(stdout);
  }
  return 1;  // the harness went away without "quit"
}

int BaselineMain(const std::string& src_dir, const std::string& out_dir, double size_gib) {
  const BenchSpec spec = MakeSpec(SizeBytes(size_gib));
  const absl::Status status = NaiveTransform(spec, SourceStrategy(spec), ThreeRankStrategy(spec),
                                             src_dir, out_dir);
  if (!status.ok()) {
    std::fprintf(stderr, "baseline: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}

// ------------------------------------------------------------------ dependency planning

// `params` parameters over `stages` pipeline stages of `dev_matrix` (3 axes): a mix of row,
// column, nested, 2-D, optimizer-sharded and replicated layouts and 1-D biases; `variant` shifts
// the mix so that a source and a destination differ.
absl::StatusOr<Strategy> DepsStrategy(int64_t params, std::vector<int64_t> dev_matrix,
                                      int32_t stages, int variant) {
  std::map<std::string, StrategyParam> out;
  for (int64_t i = 0; i < params; ++i) {
    Layout l;
    l.dev_matrix = dev_matrix;
    if (i % 7 == 6) {  // 1-D bias
      l.tensor_map = {((i / 7) + variant) % 2 == 0 ? std::vector<int32_t>{1}
                                                   : std::vector<int32_t>{}};
    } else {
      switch ((i + variant) % 6) {
        case 0: l.tensor_map = {{2}, {}}; break;
        case 1: l.tensor_map = {{}, {0}}; break;
        case 2:
          l.tensor_map = {{2, 1}, {}};
          l.nested_form = true;
          break;
        case 3: l.tensor_map = {{1}, {0}}; break;
        case 4:
          l.tensor_map = {{0}, {}};
          l.opt_shard_size = 8;
          l.opt_shard_step = 1;
          break;
        default: l.tensor_map = {{}, {}}; break;
      }
    }
    if (i == 0 && stages > 1) {
      l.stages = {0, stages - 1};  // a shared embedding
    } else {
      l.stages = {static_cast<int32_t>(i * stages / params)};
    }
    out[absl::StrFormat("layers.%04d.param", i)].layout = std::move(l);
  }
  return Strategy::Create(std::move(out), stages);
}

struct DepsResult {
  std::vector<double> runs_ms;
  int64_t src_world = 0;
  int64_t dst_world = 0;
  int64_t params = 0;
  int64_t max_sources = 0;
};

absl::StatusOr<DepsResult> MeasureDeps() {
  DepsResult result;
  result.params = 1000;
  CKPT_ASSIGN_OR_RETURN(Strategy src, DepsStrategy(result.params, {8, 8, 8}, 2, 0));
  CKPT_ASSIGN_OR_RETURN(Strategy dst, DepsStrategy(result.params, {16, 8, 8}, 4, 3));
  result.src_world = src.world_size();
  result.dst_world = dst.world_size();
  auto s = std::make_shared<const Strategy>(std::move(src));
  auto d = std::make_shared<const Strategy>(std::move(dst));
  for (int run = 0; run < 3; ++run) {
    const auto start = Clock::now();
    CKPT_ASSIGN_OR_RETURN(Resharder planner, Resharder::CreateFromLayouts(s, d));
    CKPT_ASSIGN_OR_RETURN(auto all, planner.AllSourceRanks());
    result.runs_ms.push_back(Seconds(start) * 1000.0);
    if (static_cast<int64_t>(all.size()) != result.dst_world) {
      return absl::InternalError("AllSourceRanks returned the wrong number of ranks");
    }
    for (const auto& r : all) {
      result.max_sources = std::max<int64_t>(result.max_sources, static_cast<int64_t>(r.size()));
    }
  }
  return result;
}

// ------------------------------------------------------------------ the harness

struct FetchCase {
  std::string name;
  std::string strategy;        // empty: merged
  std::string include_prefix;  // empty: every tensor
  double max_amplification = 1.1;
  std::string split_kind;      // for the table
};

struct Row {
  std::string metric;
  std::string measured;
  std::string target;
  std::string result;  // PASS / MISS / "" (no target) / "n/a"
};

class Harness {
 public:
  Harness(double size_gib, std::string out, std::string work_dir, bool keep,
          std::set<std::string> cases)
      : size_gib_(size_gib),
        out_(std::move(out)),
        work_dir_arg_(std::move(work_dir)),
        keep_(keep),
        cases_(std::move(cases)),
        spec_(MakeSpec(SizeBytes(size_gib))) {}

  ~Harness() { Cleanup(); }

  int Run();

 private:
  bool Selected(const std::string& name) const {
    return cases_.contains("all") || cases_.contains(name);
  }
  void Note(const std::string& note) {
    notes_.push_back(note);
    std::fprintf(stderr, "note: %s\n", note.c_str());
  }
  void Error(const std::string& what, const absl::Status& status) {
    const std::string e = absl::StrCat(what, ": ", status.ToString());
    errors_.push_back(e);
    std::fprintf(stderr, "ERROR %s\n", e.c_str());
    if (server_) {
      const std::string log = server_->Log();
      std::fprintf(stderr, "--- ckptd log (tail) ---\n%s\n",
                   log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
    }
  }
  void Progress(const std::string& what) {
    std::fprintf(stderr, "[%7.1fs] %s\n", Seconds(start_), what.c_str());
  }

  absl::Status PrepareWorkDir();
  void Cleanup();
  absl::Status StartServer();
  void StopServer();
  absl::StatusOr<v1::ServerStats> Stats();

  absl::Status Generate();
  void MeasureUpload();
  // One raw sequential write of the checkpoint's size to the work directory (direct I/O or
  // through the page cache), GiB/s.
  absl::StatusOr<double> DiskWritePass(bool direct);
  void MeasureStoreWrite();
  void MeasureFirstFetch();
  void MeasureTransportLimit();
  // One plain pass of the transport stream, added to the transport limit (no-op without the
  // transport server). False if it failed (the server is then stopped).
  bool TransportPass();
  void StopTransportServer();
  void MeasureStorageLimit();
  void MeasureFetch(const FetchCase& c);
  void MeasureConcurrent();
  // One pass of each (false: it failed, the error recorded); TransformMedians sums them up.
  bool MeasureTransform(int pass);
  bool MeasureBaseline();
  void TransformMedians();
  void MeasureDependencies();

  json Results() const;
  // The verified-read ceiling as a fraction of the transport limit.
  std::optional<double> CeilingRatio() const {
    if (!ceiling_gibps_ || !transport_gibps_) return std::nullopt;
    return *ceiling_gibps_ / *transport_gibps_;
  }
  // Seconds to write the exported bytes at the raw disk-write speed measured in this run.
  std::optional<double> TransformDiskFloor() const {
    if (!transform_output_bytes_ || !disk_gibps_ || *disk_gibps_ <= 0) return std::nullopt;
    return static_cast<double>(*transform_output_bytes_) / kGiB / *disk_gibps_;
  }
  std::vector<Row> Table() const;
  void Print() const;

  // Config.
  const double size_gib_;
  const std::string out_;
  const std::string work_dir_arg_;
  const bool keep_;
  const std::set<std::string> cases_;
  const BenchSpec spec_;
  const Clock::time_point start_ = Clock::now();
  const std::string load_at_start_ = LoadAverage();
  const CpuTicks ticks_at_start_ = ReadCpuTicks();

  // State.
  std::string work_;
  bool created_work_ = false;
  std::unique_ptr<testing::ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
  std::unique_ptr<v1::CheckpointService::Stub> stats_stub_;
  bool stats_unimplemented_ = false;
  int64_t source_file_bytes_ = 0;
  bool uploaded_ = false;

  // Results (nullopt: not measured).
  // The transport limit is the median of all plain transport passes: kRepeats of its own, then
  // one before every fetch pass and every pass of the concurrent phase, with the transport
  // server kept up until then. The VM's speed drifts by about 10% over a run; limit and fetches
  // are so measured over the same spell instead of the limit over the seconds before them.
  std::unique_ptr<Child> transport_server_;
  std::string transport_address_;
  std::vector<double> transport_passes_;  // GiB/s, in the order run
  CpuTally transport_tally_;
  std::optional<double> transport_gibps_;
  std::optional<CpuPerGib> transport_cpu_;
  // The transport stream again, with every message read from the rank files (page cache) and
  // checksummed by the server, and verified by the client: what a fetch that does nothing but the
  // reads and checks the design requires could reach.
  std::optional<double> ceiling_gibps_;
  std::optional<CpuPerGib> ceiling_cpu_;
  std::optional<double> storage_gibps_;
  std::vector<double> storage_runs_;  // its passes; storage_gibps_ is their median
  std::optional<int64_t> storage_bytes_;
  struct FetchResult {
    FetchCase c;
    int64_t ranks = 0;
    int64_t bytes = 0;
    double seconds = 0;
    double gibps = 0;
    std::optional<double> amplification;
    int64_t verified_bytes = 0;
    std::optional<CpuPerGib> cpu;  // over the measured passes
    std::vector<double> passes_gibps;     // each measured pass, in the order run
    std::optional<double> warmup_gibps;   // the unmeasured pass before them
  };
  std::vector<FetchResult> fetch_;
  std::optional<double> concurrent_gibps_;
  std::optional<double> concurrent_rss_mib_;
  std::optional<CpuPerGib> concurrent_cpu_;  // server + all workers
  std::optional<double> concurrent_stats_rss_mib_;
  // Share of the phase's store reads that went as copies (the map budget was spent).
  std::optional<double> concurrent_copied_fraction_;
  int64_t concurrent_bytes_ = 0;     // of one pass
  std::vector<double> concurrent_runs_;  // GiB/s of each measured pass
  std::optional<double> concurrent_warmup_gibps_;  // the unmeasured pass before them
  // The transform job and the baseline run kRepeats alternating passes; seconds and CPU are the
  // medians, peak RSS the largest of the passes.
  std::vector<double> transform_runs_, transform_cpu_runs_, baseline_runs_, baseline_cpu_runs_;
  std::optional<double> transform_seconds_;
  std::optional<double> transform_rss_mib_;
  std::optional<int64_t> transform_output_bytes_;  // bytes of the exported files
  std::optional<double> transform_cpu_seconds_;  // ckptd's, during the job
  std::optional<double> baseline_seconds_;
  std::optional<double> baseline_rss_mib_;
  std::optional<double> baseline_cpu_seconds_;
  std::optional<DepsResult> deps_;
  std::optional<double> upload_gibps_;
  std::optional<CpuPerGib> upload_cpu_;  // of the median pass
  std::optional<double> upload_first_gibps_;  // the first pass, into a fresh ckptd and store
  std::optional<CpuPerGib> upload_first_cpu_;
  // One merged fetch right after the upload: ckptd writes whole blocks past the page cache, so
  // this first read comes from the disk (and warms the page cache for the cases after it).
  std::optional<double> first_fetch_gibps_;
  // 1 MiB chunks put into a fresh RocksDB store and committed, in this process: what RocksDB
  // alone costs to ingest the bytes (the floor of the upload's server side).
  std::optional<double> store_write_gibps_;
  std::optional<double> store_write_cpu_;  // s per GiB, this process (RocksDB's threads included)
  std::optional<double> disk_gibps_;           // direct I/O where the file system allows it
  std::vector<double> disk_runs_;              // its passes; disk_gibps_ is their median
  std::optional<double> disk_buffered_gibps_;  // through the page cache
  std::vector<std::string> notes_;
  std::vector<std::string> errors_;
};

absl::Status Harness::PrepareWorkDir() {
  if (!work_dir_arg_.empty()) {
    work_ = fs::absolute(work_dir_arg_).string();
    std::error_code ec;
    if (!fs::exists(work_)) {
      fs::create_directories(work_, ec);
      created_work_ = true;
    }
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", work_, ": ", ec.message()));
    return absl::OkStatus();
  }
  std::string tmpl = std::string(CKPT_BENCH_BUILD_DIR) + "/bench-work-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, " failed"));
  }
  work_ = tmpl;
  created_work_ = true;
  return absl::OkStatus();
}

void Harness::Cleanup() {
  client_.reset();
  stats_stub_.reset();
  StopServer();
  StopTransportServer();
  if (work_.empty() || keep_) return;
  std::error_code ec;
  if (created_work_) {
    fs::remove_all(work_, ec);
  } else {
    for (const char* sub : {"src", "data", "data.log", "data.port", "export", "baseline",
                            "disk-write.tmp", "store-write", "transport.port"}) {
      fs::remove_all(fs::path(work_) / sub, ec);
    }
  }
  work_.clear();
}

absl::Status Harness::StartServer() {
  CKPT_ASSIGN_OR_RETURN(server_, testing::ServerProcess::Start(CKPTD_PATH, work_ + "/data"));
  ClientOptions options;
  options.connect_timeout = absl::Seconds(20);
  CKPT_ASSIGN_OR_RETURN(client_, CkptClient::Connect(server_->address(), options));
  stats_stub_ = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  return absl::OkStatus();
}

void Harness::StopServer() {
  client_.reset();
  stats_stub_.reset();
  if (server_) {
    const int code = server_->Stop();
    if (code != 0) Note(absl::StrCat("ckptd exited with code ", code));
    server_.reset();
  }
}

absl::StatusOr<v1::ServerStats> Harness::Stats() {
  if (stats_unimplemented_) return absl::UnimplementedError("GetStats");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerStats stats;
  const grpc::Status s = stats_stub_->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (s.ok()) return stats;
  const absl::Status status = FromGrpcStatus(s);
  if (status.code() == absl::StatusCode::kUnimplemented) {
    stats_unimplemented_ = true;
    Note("ckptd does not implement GetStats yet (UNIMPLEMENTED): read_amplification is null");
  }
  return status;
}

absl::Status Harness::Generate() {
  Progress(absl::StrCat("generating ", spec_.Describe(), " over 8 source ranks"));
  const auto start = Clock::now();
  CKPT_ASSIGN_OR_RETURN(source_file_bytes_,
                        WriteSourceCheckpoint(spec_, SourceStrategy(spec_), work_ + "/src", 2));
  Progress(absl::StrFormat("generated %.3f GiB of rank files in %.1f s",
                           source_file_bytes_ / kGiB, Seconds(start)));
  return absl::OkStatus();
}

absl::StatusOr<double> Harness::DiskWritePass(bool direct) {
  const std::string path = work_ + "/disk-write.tmp";
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> sink,
                        AtomicFileSink::Create(path, direct));  // write + fsync + rename
  const std::string buffer = PatternBytes(static_cast<size_t>(kMessageBytes), 0);
  const auto start = Clock::now();
  absl::Status s;
  for (int64_t done = 0; done < source_file_bytes_ && s.ok(); done += kMessageBytes) {
    s = sink->Write(std::string_view(buffer).substr(
        0, static_cast<size_t>(std::min(kMessageBytes, source_file_bytes_ - done))));
  }
  if (s.ok()) s = sink->Commit();
  const double seconds = Seconds(start);
  std::error_code ec;
  fs::remove(path, ec);
  CKPT_RETURN_IF_ERROR(s);
  const double gibps = source_file_bytes_ / kGiB / seconds;
  if (direct) {
    Progress(absl::StrFormat("raw disk write (%s) + fsync: %.2f GiB/s",
                             sink->direct_io() ? "direct I/O" : "direct I/O refused, buffered",
                             gibps));
  } else {
    Progress(absl::StrFormat("buffered disk write + fsync: %.2f GiB/s", gibps));
  }
  return gibps;
}

void Harness::MeasureUpload() {
  // Raw sequential write of the same bytes to the data directory's file system: with direct I/O
  // (the disk's own speed: the limit the upload target and the transform floor use; the median
  // of kRepeats passes, as the disk's speed drifts) and through the page cache + fsync (what
  // buffered writers such as RocksDB pay; one pass).
  for (int pass = 0; pass < kRepeats; ++pass) {
    absl::StatusOr<double> gibps = DiskWritePass(/*direct=*/true);
    if (!gibps.ok()) return Error("disk write", gibps.status());
    disk_runs_.push_back(*gibps);
  }
  disk_gibps_ = Median(disk_runs_);
  absl::StatusOr<double> buffered = DiskWritePass(/*direct=*/false);
  if (!buffered.ok()) return Error("disk write", buffered.status());
  disk_buffered_gibps_ = *buffered;
  MeasureStoreWrite();
  for (const char* name : {kSourceName, kThreeName, kColumnName, kPlainName}) {
    auto put = client_->PutStrategy(name, *StrategyByName(spec_, name), true);
    if (!put.ok()) return Error(absl::StrCat("PutStrategy ", name), put.status());
  }
  // kRepeats passes into the same ckptd, the checkpoint deleted between them; the last one stays
  // for the fetch cases. The first pass also pays for the fresh process growing its heap
  // (memtables, gRPC buffers) and for the fresh store's first page-cache pages, so it is shown on
  // its own; the target is judged on the median pass, like every other throughput here.
  std::vector<double> pass_seconds;
  std::vector<std::optional<CpuPerGib>> pass_cpu;
  int64_t file_bytes = 0;
  for (int pass = 0; pass < kRepeats; ++pass) {
    if (pass > 0) {
      if (auto s = client_->DeleteCheckpoint(kCheckpointId); !s.ok()) {
        return Error("delete the uploaded checkpoint before the next upload pass", s);
      }
      uploaded_ = false;  // until the next pass commits it again
    }
    const CpuMeter cpu(server_->pid());
    const auto start = Clock::now();
    auto up = client_->UploadDirectory(kCheckpointId, kSourceName, work_ + "/src");
    const double seconds = Seconds(start);
    if (!up.ok()) return Error("upload", up.status());
    if (!up->committed) return Error("upload", absl::InternalError("checkpoint not committed"));
    uploaded_ = true;
    file_bytes = up->file_bytes;
    pass_seconds.push_back(seconds);
    pass_cpu.push_back(cpu.Finish(up->file_bytes));
    Progress(absl::StrFormat("upload pass %d: %.3f GiB in %.2f s = %.2f GiB/s (%lld bytes stored)",
                             pass + 1, up->file_bytes / kGiB, seconds,
                             up->file_bytes / kGiB / seconds,
                             static_cast<long long>(up->bytes_stored)));
  }
  const auto median = std::find(pass_seconds.begin(), pass_seconds.end(), Median(pass_seconds));
  upload_gibps_ = file_bytes / kGiB / *median;
  upload_cpu_ = pass_cpu[median - pass_seconds.begin()];
  upload_first_gibps_ = file_bytes / kGiB / pass_seconds.front();
  upload_first_cpu_ = pass_cpu.front();
}

void Harness::MeasureFirstFetch() {
  v1::FetchRequest request;
  request.set_checkpoint_id(kCheckpointId);
  request.set_merged(true);
  CheckingVisitor visitor(&spec_, nullptr, 0, "");
  const auto start = Clock::now();
  absl::Status s = client_->Fetch(request, visitor);
  if (s.ok()) s = visitor.Complete();
  if (!s.ok()) return Error("first fetch after the upload", s);
  const double seconds = Seconds(start);
  first_fetch_gibps_ = visitor.bytes() / kGiB / seconds;
  Progress(absl::StrFormat("first fetch after the upload (merged): %.3f GiB in %.2f s = %.2f GiB/s",
                           visitor.bytes() / kGiB, seconds, *first_fetch_gibps_));
}

void Harness::MeasureStoreWrite() {
  // The same bytes as the upload, as 1 MiB chunks in writes of 4, into a fresh store opened as
  // ckptd opens its own (chunk bytes appended to a segment file, their locations through
  // RocksDB's WAL), then committed (which syncs the segment file and the batch). One thread puts;
  // RocksDB's background threads run beside it, as in ckptd.
  const std::string dir = work_ + "/store-write";
  {
    StoreOptions options;
    options.min_free_disk_bytes = int64_t{64} << 20;
    auto store = OpenSegmentStore(dir, options);
    if (!store.ok()) return Error("store write: open", store.status());
    std::vector<std::string> payloads;
    for (uint32_t k = 0; k < 4; ++k) {
      payloads.push_back(PatternBytes(static_cast<size_t>(kMessageBytes), k + 1));
    }
    const double cpu_start = SelfCpuSeconds();
    const auto start = Clock::now();
    auto data_id = (*store)->BeginData();
    if (!data_id.ok()) return Error("store write: begin", data_id.status());
    int64_t written = 0;
    for (uint32_t chunk = 0; written < source_file_bytes_;) {
      std::vector<ChunkWrite> writes;
      for (const std::string& p : payloads) {
        if (written >= source_file_bytes_) break;
        const auto n = static_cast<size_t>(std::min(kMessageBytes, source_file_bytes_ - written));
        writes.push_back(
            {{*data_id, chunk / 1024, 0, chunk % 1024}, std::string_view(p).substr(0, n)});
        ++chunk;
        written += static_cast<int64_t>(n);
      }
      if (auto s = (*store)->PutChunks(writes); !s.ok()) return Error("store write: put", s);
    }
    if (auto s = (*store)->CommitCheckpoint("store-write", "", *data_id); !s.ok()) {
      return Error("store write: commit", s);
    }
    const double seconds = Seconds(start);
    const double gib = static_cast<double>(written) / kGiB;
    store_write_gibps_ = gib / seconds;
    store_write_cpu_ = (SelfCpuSeconds() - cpu_start) / gib;
    Progress(absl::StrFormat("store write limit: %.3f GiB in %.2f s = %.2f GiB/s, %.2f CPU s/GiB",
                             gib, seconds, *store_write_gibps_, *store_write_cpu_));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

void Harness::MeasureTransportLimit() {
  const std::string port_file = work_ + "/transport.port";
  auto child = Child::Spawn({SelfExe(), "--transport-server", port_file}, {});
  if (!child.ok()) return Error("transport server", child.status());
  int port = 0;
  for (int i = 0; i < 1500 && port == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (port == 0) return Error("transport server", absl::DeadlineExceededError("no port"));
  transport_server_ = *std::move(child);
  transport_address_ = absl::StrCat("127.0.0.1:", port);
  for (int run = 0; run < kRepeats; ++run) {
    if (!TransportPass()) return;
  }
  // Verified passes reading the rank files: the verified-read ceiling, with its own CPU meter.
  std::vector<std::string> files;
  for (int64_t r = 0; r < SourceStrategy(spec_).world_size(); ++r) {
    files.push_back(absl::StrCat(work_, "/src/rank_", r, "/", kRankFileName));
  }
  const int64_t messages = (spec_.total_bytes + kMessageBytes - 1) / kMessageBytes;
  std::vector<double> runs;
  CpuTally tally;
  for (int run = 0; run < kRepeats; ++run) {
    const CpuMeter cpu(transport_server_->pid());
    auto r = MeasureTransport(transport_address_, messages, kMessageBytes, files);
    if (!r.ok()) return Error("verified-read ceiling", r.status());
    // MeasureTransport's warm-up stream moved up to 32 messages more.
    cpu.AddTo(&tally, r->bytes + std::min<int64_t>(messages, 32) * kMessageBytes);
    runs.push_back(r->bytes / kGiB / r->seconds);
    Progress(absl::StrFormat("verified-read ceiling: %.3f GiB in %.2f s = %.2f GiB/s",
                             r->bytes / kGiB, r->seconds, runs.back()));
  }
  ceiling_gibps_ = Median(runs);
  ceiling_cpu_ = tally.PerGib();
}

bool Harness::TransportPass() {
  if (!transport_server_) return false;
  const int64_t messages = (spec_.total_bytes + kMessageBytes - 1) / kMessageBytes;
  const CpuMeter cpu(transport_server_->pid());
  auto r = MeasureTransport(transport_address_, messages, kMessageBytes);
  if (!r.ok()) {
    Error("transport", r.status());
    StopTransportServer();
    return false;
  }
  // MeasureTransport's warm-up stream moved up to 32 messages more.
  cpu.AddTo(&transport_tally_, r->bytes + std::min<int64_t>(messages, 32) * kMessageBytes);
  transport_passes_.push_back(r->bytes / kGiB / r->seconds);
  transport_gibps_ = Median(transport_passes_);
  transport_cpu_ = transport_tally_.PerGib();
  Progress(absl::StrFormat("transport: %.3f GiB in %.2f s = %.2f GiB/s", r->bytes / kGiB,
                           r->seconds, transport_passes_.back()));
  return true;
}

void Harness::StopTransportServer() {
  if (!transport_server_) return;
  transport_server_->Signal(SIGTERM);
  transport_server_->Wait();
  transport_server_.reset();
}

void Harness::MeasureStorageLimit() {
  StopServer();  // the store takes RocksDB's lock
  {
    StoreOptions options;
    options.min_free_disk_bytes = int64_t{64} << 20;
    auto store = OpenSegmentStore(work_ + "/data", options);
    if (!store.ok()) return Error("open store", store.status());
    auto manifest_bytes = (*store)->GetManifest(kCheckpointId);
    if (!manifest_bytes.ok()) return Error("manifest", manifest_bytes.status());
    records::CheckpointManifest manifest;
    if (!manifest.ParseFromString(*manifest_bytes)) {
      return Error("manifest", absl::DataLossError("cannot parse the manifest"));
    }
    if (manifest.chunk_checksum() != records::CHUNK_CHECKSUM_XXH3_64) {
      return Error("manifest", absl::DataLossError("unknown chunk checksum algorithm"));
    }
    // One thread, in key order, every chunk checksum-verified: what one Fetch stream's producer
    // could read at best. The median of kRepeats passes, like the other limits.
    for (int pass = 0; pass < kRepeats; ++pass) {
      int64_t bytes = 0;
      const auto start = Clock::now();
      for (const records::TensorRecord& t : manifest.tensors()) {
        for (const records::BlobRecord& b : t.blobs()) {
          for (int c = 0; c < b.chunk_checksums_size(); ++c) {
            const ChunkAddress address{manifest.data_id(), t.tensor_index(), b.blob_index(),
                                       static_cast<uint32_t>(c)};
            auto chunk = (*store)->ReadChunk(address, b.chunk_checksums(c));
            if (!chunk.ok()) return Error("read chunk", chunk.status());
            bytes += static_cast<int64_t>((*chunk)->bytes().size());
          }
        }
      }
      const double seconds = Seconds(start);
      storage_bytes_ = bytes;
      storage_runs_.push_back(bytes / kGiB / seconds);
      Progress(absl::StrFormat("storage: %.3f GiB of chunks in %.2f s = %.2f GiB/s",
                               bytes / kGiB, seconds, storage_runs_.back()));
    }
    storage_gibps_ = Median(storage_runs_);
  }
  if (auto s = StartServer(); !s.ok()) Error("restart ckptd", s);
}

void Harness::MeasureFetch(const FetchCase& c) {
  std::optional<Strategy> destination;
  int64_t ranks = 1;
  if (!c.strategy.empty()) {
    destination = *StrategyByName(spec_, c.strategy);
    ranks = destination->world_size();
  }
  FetchResult result;
  result.c = c;
  result.ranks = ranks;
  // Every rank of the case once: the bytes delivered, or nullopt after Error().
  auto fetch_all = [&]() -> std::optional<int64_t> {
    int64_t bytes = 0;
    for (int64_t r = 0; r < ranks; ++r) {
      v1::FetchRequest request;
      request.set_checkpoint_id(kCheckpointId);
      if (c.strategy.empty()) {
        request.set_merged(true);
      } else {
        request.set_destination_strategy(c.strategy);
        request.set_rank(r);
      }
      if (!c.include_prefix.empty()) request.add_include(c.include_prefix + "*");
      CheckingVisitor visitor(&spec_, destination ? &*destination : nullptr, r, c.include_prefix);
      absl::Status s = client_->Fetch(request, visitor);
      if (s.ok()) s = visitor.Complete();
      if (!s.ok()) {
        Error(absl::StrCat("fetch ", c.name, " rank ", r), s);
        return std::nullopt;
      }
      bytes += visitor.bytes();
      result.verified_bytes += visitor.checked();
    }
    return bytes;
  };
  // One unmeasured pass first, as the transport limit's passes each start with a warm-up stream:
  // the measured passes then find both processes in the state a long-running ckptd and client
  // are in (the storage limit restarts ckptd just before the first case, and a page-fault record
  // of that case's first pass found both processes' heaps growing: see README, Performance).
  {
    const auto start = Clock::now();
    const std::optional<int64_t> bytes = fetch_all();
    if (!bytes) return;
    result.bytes = *bytes;
    result.warmup_gibps = *bytes / kGiB / Seconds(start);
    Progress(absl::StrFormat("fetch %s: warm-up pass, %.3f GiB = %.2f GiB/s (not measured)",
                             c.name, *bytes / kGiB, *result.warmup_gibps));
  }
  auto before = Stats();
  std::vector<double> pass_seconds;
  CpuTally cpu;
  for (int pass = 0; pass < kRepeats; ++pass) {
    TransportPass();  // interleaved: see transport_server_
    const CpuMeter pass_cpu(server_->pid());
    const auto start = Clock::now();
    const std::optional<int64_t> pass_bytes = fetch_all();
    if (!pass_bytes) return;
    pass_seconds.push_back(Seconds(start));
    const std::optional<CpuPerGib> this_pass = pass_cpu.Finish(*pass_bytes);
    pass_cpu.AddTo(&cpu, *pass_bytes);
    if (*pass_bytes != result.bytes) {
      return Error(absl::StrCat("fetch ", c.name),
                   absl::InternalError(absl::StrCat("pass ", pass, " delivered ", *pass_bytes,
                                                    " bytes, the warm-up pass ", result.bytes)));
    }
    result.passes_gibps.push_back(*pass_bytes / kGiB / pass_seconds.back());
    Progress(absl::StrFormat(
        "fetch %s: %d rank(s), %.3f GiB in %.2f s = %.2f GiB/s, CPU per GiB %s, %lld bytes "
        "verified",
        c.name, ranks, *pass_bytes / kGiB, pass_seconds.back(), result.passes_gibps.back(),
        CpuText(this_pass), static_cast<long long>(result.verified_bytes)));
  }
  result.cpu = cpu.PerGib();
  result.seconds = Median(pass_seconds);
  result.gibps = result.bytes / kGiB / result.seconds;
  auto after = Stats();
  if (before.ok() && after.ok()) {
    const int64_t read = after->store_bytes_read() - before->store_bytes_read();
    result.amplification =
        static_cast<double>(read) / static_cast<double>(result.bytes * kRepeats);
  }
  fetch_.push_back(std::move(result));
}

void Harness::MeasureConcurrent() {
  // A fresh server, so that its peak RSS is that of this phase (plus start-up).
  StopServer();
  if (auto s = StartServer(); !s.ok()) return Error("restart ckptd", s);
  std::vector<std::unique_ptr<Child>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    auto child = Child::Spawn({SelfExe(), "--worker", "--server", server_->address(),
                               "--fetch-strategy", kColumnName, "--rank", absl::StrCat(r),
                               "--size-gib", absl::StrFormat("%.17g", size_gib_)},
                              {.pipe_stdin = true, .pipe_stdout = true});
    if (!child.ok()) return Error("spawn worker", child.status());
    workers.push_back(*std::move(child));
  }
  for (auto& w : workers) {
    const auto line = w->ReadLine();
    if (!line || *line != "ready") {
      return Error("worker", absl::InternalError(line ? *line : "exited before ready"));
    }
  }
  // An unmeasured warm-up pass (as for each fetch case), then kRepeats passes, each every worker
  // fetching its rank once (the workers stay up between them): the aggregate is the median
  // pass's.
  std::vector<double> pass_gibps;
  int64_t verified = 0;
  CpuTally cpu;  // server + all workers (their own CPU, during their fetch, not their start-up)
  absl::StatusOr<v1::ServerStats> after_warmup = absl::UnknownError("no warm-up pass");
  for (int pass = -1; pass < kRepeats; ++pass) {
    const bool warmup = pass < 0;
    if (!warmup) TransportPass();  // interleaved: see transport_server_
    const auto start = Clock::now();
    const absl::StatusOr<double> server_cpu_start = ProcessCpuSeconds(server_->pid());
    for (auto& w : workers) {
      if (auto s = w->WriteLine("go"); !s.ok()) return Error("worker", s);
    }
    int64_t bytes = 0;
    for (auto& w : workers) {
      const auto line = w->ReadLine();
      long long b = 0, v = 0;
      double secs = 0, worker_cpu = 0;
      if (!line ||
          std::sscanf(line->c_str(), "ok %lld %lf %lld %lf", &b, &secs, &v, &worker_cpu) != 4) {
        return Error("worker", absl::InternalError(line ? *line : "no result"));
      }
      bytes += b;
      verified += v;
      if (!warmup) cpu.client += worker_cpu;
    }
    const double seconds = Seconds(start);
    if (warmup) {
      concurrent_bytes_ = bytes;
      concurrent_warmup_gibps_ = bytes / kGiB / seconds;
      Progress(absl::StrFormat(
          "concurrent: %d workers, warm-up pass, %.3f GiB = %.2f GiB/s (not measured)", kWorkers,
          bytes / kGiB, *concurrent_warmup_gibps_));
      after_warmup = Stats();
      continue;
    }
    const absl::StatusOr<double> server_cpu_end = ProcessCpuSeconds(server_->pid());
    if (server_cpu_start.ok() && server_cpu_end.ok()) {
      cpu.server += *server_cpu_end - *server_cpu_start;
    } else {
      cpu.complete = false;
    }
    cpu.bytes += bytes;
    if (bytes != concurrent_bytes_) {
      return Error("concurrent", absl::InternalError(absl::StrCat(
                                     "pass ", pass, " delivered ", bytes,
                                     " bytes, the warm-up pass ", concurrent_bytes_)));
    }
    pass_gibps.push_back(bytes / kGiB / seconds);
    Progress(absl::StrFormat("concurrent: %d workers, %.3f GiB in %.2f s = %.2f GiB/s", kWorkers,
                             bytes / kGiB, seconds, pass_gibps.back()));
  }
  for (auto& w : workers) {
    if (auto s = w->WriteLine("quit"); !s.ok()) return Error("worker", s);
    const Child::Exit e = w->Wait();
    if (e.exit_code != 0) {
      return Error("worker", absl::InternalError(absl::StrCat("exit code ", e.exit_code)));
    }
  }
  concurrent_runs_ = pass_gibps;
  concurrent_gibps_ = Median(pass_gibps);
  concurrent_cpu_ = cpu.PerGib();
  auto peak = ProcessPeakRssBytes(server_->pid());
  if (peak.ok()) {
    concurrent_rss_mib_ = *peak / kMiB;
  } else {
    Error("ckptd peak RSS", peak.status());
  }
  if (auto stats = Stats(); stats.ok()) {
    concurrent_stats_rss_mib_ = stats->peak_rss_bytes() / kMiB;
    // The measured passes' reads: the counters since the warm-up pass.
    if (after_warmup.ok()) {
      const int64_t read = stats->store_bytes_read() - after_warmup->store_bytes_read();
      const int64_t copied = stats->store_bytes_copied() - after_warmup->store_bytes_copied();
      if (read > 0) {
        concurrent_copied_fraction_ = static_cast<double>(copied) / static_cast<double>(read);
      }
    }
  }
  Progress(absl::StrFormat(
      "concurrent: median %.2f GiB/s, ckptd VmHWM %.0f MiB, %lld bytes verified",
      *concurrent_gibps_, concurrent_rss_mib_.value_or(-1), static_cast<long long>(verified)));
}

bool Harness::MeasureTransform(int pass) {
  // A fresh ckptd, so that its peak RSS is the job's (plus start-up).
  StopServer();
  if (auto s = StartServer(); !s.ok()) {
    Error("restart ckptd", s);
    return false;
  }
  const std::string export_dir = work_ + "/export";
  const Strategy d3 = ThreeRankStrategy(spec_);
  v1::SubmitTransformRequest request;
  request.set_job_id(absl::StrCat("bench-export-", getpid(), "-", pass));
  request.set_checkpoint_id(kCheckpointId);
  request.set_destination_strategy(kThreeName);
  request.mutable_target()->set_export_dir(export_dir);
  const auto start = Clock::now();
  const absl::StatusOr<double> cpu_start = ProcessCpuSeconds(server_->pid());
  auto submitted = client_->SubmitTransform(request);
  if (!submitted.ok()) {
    if (submitted.status().code() == absl::StatusCode::kUnimplemented) {
      Note(absl::StrCat("ckptd does not implement transform jobs yet (",
                        submitted.status().ToString(), "): transform seconds/peak RSS are null"));
      return false;
    }
    Error("SubmitTransform", submitted.status());
    return false;
  }
  auto job = client_->WatchJob(submitted->job().id());
  const double seconds = Seconds(start);
  if (!job.ok()) {
    Error("WatchJob", job.status());
    return false;
  }
  if (job->state() != v1::JOB_STATE_SUCCEEDED) {
    Error("transform job", absl::InternalError(absl::StrCat(JobStateName(job->state()), ": ",
                                                            job->reason())));
    return false;
  }
  auto peak = ProcessPeakRssBytes(server_->pid());
  if (!peak.ok()) {
    Error("ckptd peak RSS", peak.status());
    return false;
  }
  const absl::StatusOr<double> cpu_end = ProcessCpuSeconds(server_->pid());
  const std::optional<double> cpu = cpu_start.ok() && cpu_end.ok()
                                        ? std::optional<double>(*cpu_end - *cpu_start)
                                        : std::nullopt;
  Progress(absl::StrFormat(
      "transform job (export, 8 -> 3 ranks): %.2f s, ckptd CPU %s, ckptd VmHWM %.0f MiB", seconds,
      cpu ? absl::StrFormat("%.2f s", *cpu) : std::string("n/a"), *peak / kMiB));
  auto checked = VerifyRankFile(spec_, d3, 1, export_dir + "/rank_1/checkpoint_1.ckpt");
  if (!checked.ok()) {
    Error("verify export", checked.status());
    return false;
  }
  transform_runs_.push_back(seconds);
  transform_rss_mib_ = std::max(transform_rss_mib_.value_or(0), *peak / kMiB);
  if (cpu) transform_cpu_runs_.push_back(*cpu);
  int64_t output_bytes = 0;
  for (int r = 0; r < 3; ++r) {
    const std::string file = absl::StrCat(export_dir, "/rank_", r, "/checkpoint_", r, ".ckpt");
    std::error_code size_error;
    const auto size = fs::file_size(file, size_error);
    if (size_error) {
      Error("verify export", absl::NotFoundError(absl::StrCat("rank ", r, " file missing")));
      return false;
    }
    output_bytes += static_cast<int64_t>(size);
  }
  transform_output_bytes_ = output_bytes;
  std::error_code ec;
  fs::remove_all(export_dir, ec);
  return true;
}

bool Harness::MeasureBaseline() {
  const std::string out_dir = work_ + "/baseline";
  const auto start = Clock::now();
  auto child = Child::Spawn({SelfExe(), "--baseline", "--src", work_ + "/src", "--baseline-out",
                             out_dir, "--size-gib", absl::StrFormat("%.17g", size_gib_)},
                            {});
  if (!child.ok()) {
    Error("baseline", child.status());
    return false;
  }
  const Child::Exit e = (*child)->Wait();
  const double seconds = Seconds(start);
  if (e.exit_code != 0) {
    Error("baseline", absl::InternalError(absl::StrCat("exit code ", e.exit_code)));
    return false;
  }
  Progress(absl::StrFormat(
      "naive baseline (merge then split, 8 -> 3 ranks): %.2f s, peak RSS %.0f MiB", seconds,
      e.max_rss_kib / 1024.0));
  auto checked =
      VerifyRankFile(spec_, ThreeRankStrategy(spec_), 1, out_dir + "/rank_1/checkpoint_1.ckpt");
  std::error_code ec;
  fs::remove_all(out_dir, ec);
  if (!checked.ok()) {
    Error("verify baseline output", checked.status());
    return false;
  }
  baseline_runs_.push_back(seconds);
  baseline_rss_mib_ = std::max(baseline_rss_mib_.value_or(0), e.max_rss_kib / 1024.0);
  baseline_cpu_runs_.push_back(e.cpu_seconds);
  return true;
}

void Harness::TransformMedians() {
  if (!transform_runs_.empty()) transform_seconds_ = Median(transform_runs_);
  if (!transform_cpu_runs_.empty()) transform_cpu_seconds_ = Median(transform_cpu_runs_);
  if (!baseline_runs_.empty()) baseline_seconds_ = Median(baseline_runs_);
  if (!baseline_cpu_runs_.empty()) baseline_cpu_seconds_ = Median(baseline_cpu_runs_);
}

void Harness::MeasureDependencies() {
  auto r = MeasureDeps();
  if (!r.ok()) return Error("deps", r.status());
  deps_ = *r;
  Progress(absl::StrFormat("deps --all: %d params, %d -> %d ranks: %.1f / %.1f / %.1f ms",
                           r->params, r->src_world, r->dst_world, r->runs_ms[0], r->runs_ms[1],
                           r->runs_ms[2]));
}


template <typename T>
json Opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

std::optional<double> Limit(const std::optional<double>& a, const std::optional<double>& b) {
  if (a && b) return std::min(*a, *b);
  return std::nullopt;
}

json CpuJson(const std::optional<CpuPerGib>& cpu) {
  if (!cpu) return nullptr;
  return {{"server_cpu_s_per_gib", cpu->server}, {"client_cpu_s_per_gib", cpu->client}};
}

json Harness::Results() const {
  json j;
  j["transport_gibps"] = Opt(transport_gibps_);
  j["transport_cpu"] = CpuJson(transport_cpu_);
  j["transport_passes_gibps"] = transport_passes_;  // in the order run; the limit is their median
  j["verified_read_ceiling"] = {
      {"gibps", Opt(ceiling_gibps_)},
      {"ratio_to_transport", Opt(CeilingRatio())},
      {"cpu", CpuJson(ceiling_cpu_)}};
  j["storage_gibps"] = Opt(storage_gibps_);
  j["storage_passes_gibps"] = storage_runs_;
  const std::optional<double> limit = Limit(transport_gibps_, storage_gibps_);
  j["fetch"] = json::array();
  for (const FetchResult& f : fetch_) {
    j["fetch"].push_back({{"case", f.c.name},
                          {"gibps", f.gibps},
                          {"ratio", limit ? json(f.gibps / *limit) : json(nullptr)},
                          {"read_amplification", Opt(f.amplification)},
                          {"ranks", f.ranks},
                          {"bytes", f.bytes},
                          {"seconds", f.seconds},
                          {"verified_bytes", f.verified_bytes},
                          {"passes_gibps", f.passes_gibps},
                          {"warmup_gibps", Opt(f.warmup_gibps)},
                          {"cpu", CpuJson(f.cpu)}});
  }
  j["concurrent"] = {{"workers", kWorkers},
                     {"gibps", Opt(concurrent_gibps_)},
                     {"server_peak_rss_mib", Opt(concurrent_rss_mib_)},
                     {"server_stats_peak_rss_mib", Opt(concurrent_stats_rss_mib_)},
                     {"store_copied_fraction", Opt(concurrent_copied_fraction_)},
                     {"bytes", concurrent_bytes_},
                     {"runs_gibps", concurrent_runs_},  // the passes; gibps is their median
                     {"warmup_gibps", Opt(concurrent_warmup_gibps_)},
                     {"cpu", CpuJson(concurrent_cpu_)},
                     {"destination", "row_to_col"}};
  j["transform"] = {{"seconds", Opt(transform_seconds_)},
                    {"peak_rss_mib", Opt(transform_rss_mib_)},
                    {"baseline_seconds", Opt(baseline_seconds_)},
                    {"baseline_peak_rss_mib", Opt(baseline_rss_mib_)},
                    {"cpu_seconds", Opt(transform_cpu_seconds_)},
                    {"baseline_cpu_seconds", Opt(baseline_cpu_seconds_)},
                    {"output_bytes", Opt(transform_output_bytes_)},
                    {"runs_seconds", transform_runs_},  // the passes; seconds is their median
                    {"baseline_runs_seconds", baseline_runs_},
                    {"disk_floor_seconds", Opt(TransformDiskFloor())}};
  j["deps_all_ranks_ms"] = deps_ ? json(Median(deps_->runs_ms)) : json(nullptr);
  if (deps_) {
    j["deps_detail"] = {{"runs_ms", deps_->runs_ms},   {"params", deps_->params},
                        {"src_world", deps_->src_world}, {"dst_world", deps_->dst_world},
                        {"max_source_ranks", deps_->max_sources}};
  }
  j["upload"] = {{"gibps", Opt(upload_gibps_)},
                 {"disk_write_gibps", Opt(disk_gibps_)},
                 {"disk_write_runs_gibps", disk_runs_},  // the passes; disk_write_gibps: median
                 {"disk_buffered_write_gibps", Opt(disk_buffered_gibps_)},
                 {"cpu", CpuJson(upload_cpu_)},
                 {"first_pass_gibps", Opt(upload_first_gibps_)},
                 {"first_pass_cpu", CpuJson(upload_first_cpu_)},
                 {"first_fetch_gibps", Opt(first_fetch_gibps_)},
                 {"store_write_gibps", Opt(store_write_gibps_)},
                 {"store_write_cpu_s_per_gib", Opt(store_write_cpu_)}};
  json targets = json::array();
  for (const Row& r : Table()) {
    if (r.result.empty()) continue;
    targets.push_back({{"metric", r.metric}, {"measured", r.measured}, {"target", r.target},
                       {"result", r.result}});
  }
  j["targets"] = targets;
  j["config"] = {{"size_gib", size_gib_},
                 {"checkpoint", spec_.Describe()},
                 {"checkpoint_bytes", spec_.total_bytes},
                 {"source_file_bytes", source_file_bytes_},
                 {"source_ranks", 8},
                 {"message_bytes", kMessageBytes},
                 {"cpus", std::thread::hardware_concurrency()},
                 {"load_average_start", load_at_start_},
                 {"load_average_end", LoadAverage()},
                 {"cpu_steal_fraction", Opt(StealSince(ticks_at_start_))},
                 {"storage_bytes_read", Opt(storage_bytes_)}};
  j["notes"] = notes_;
  j["errors"] = errors_;
  return j;
}

std::string Fmt(const std::optional<double>& v, const char* unit, int precision = 2) {
  if (!v) return "null";
  return absl::StrCat(absl::StrFormat("%.*f", precision, *v), unit);
}

// "N, lo-hi GiB/s" for a limit's passes (not empty).
std::string PassesText(const std::vector<double>& gibps) {
  const auto [lo, hi] = std::minmax_element(gibps.begin(), gibps.end());
  return absl::StrFormat("%d, %.2f-%.2f GiB/s", gibps.size(), *lo, *hi);
}

// The "passes" row of a phase measured after a warm-up pass: its measured passes, then the
// warm-up's GiB/s.
Row WarmedUpPassesRow(const std::vector<double>& gibps, const std::optional<double>& warmup) {
  return {"  passes (median of; after a warm-up)",
          absl::StrCat(PassesText(gibps), "; warm-up ", Fmt(warmup, "")), "", ""};
}

std::string Verdict(const std::optional<bool>& pass) {
  if (!pass) return "n/a";
  return *pass ? "PASS" : "MISS";
}

std::vector<Row> Harness::Table() const {
  std::vector<Row> rows;
  rows.push_back({"transport limit (1 stream, 1 MiB msgs)", Fmt(transport_gibps_, " GiB/s"), "", ""});
  constexpr char kCpuRow[] = "  CPU per GiB (server + client)";
  if (Selected("transport")) {
    if (!transport_passes_.empty()) {
      rows.push_back(
          {"  passes (median of; through the fetches)", PassesText(transport_passes_), "", ""});
    }
    rows.push_back({kCpuRow, CpuText(transport_cpu_), "", ""});
    rows.push_back({"verified-read ceiling (read + xxh3 x2)",
                    absl::StrCat(Fmt(ceiling_gibps_, " GiB/s"), "  ratio ",
                                 Fmt(CeilingRatio(), "")),
                    "", ""});
    rows.push_back({kCpuRow, CpuText(ceiling_cpu_), "", ""});
  }
  rows.push_back({"storage limit (1 thread, store chunks)", Fmt(storage_gibps_, " GiB/s"), "", ""});
  if (!storage_runs_.empty()) {
    rows.push_back({"  passes (median of)", PassesText(storage_runs_), "", ""});
  }
  const std::optional<double> limit = Limit(transport_gibps_, storage_gibps_);
  for (const FetchResult& f : fetch_) {
    std::optional<double> ratio;
    if (limit) ratio = f.gibps / *limit;
    rows.push_back({absl::StrCat("fetch ", f.c.name, " (", f.ranks, f.ranks == 1 ? " rank" : " ranks",
                                 ", 1 worker)"),
                    absl::StrCat(Fmt(f.gibps, " GiB/s"), "  ratio ", Fmt(ratio, "")),
                    "ratio >= 0.85",
                    Verdict(ratio ? std::optional<bool>(*ratio >= 0.85) : std::nullopt)});
    rows.push_back({absl::StrCat("  read amplification (", f.c.split_kind, ")"),
                    Fmt(f.amplification, "", 3), absl::StrFormat("<= %.2f", f.c.max_amplification),
                    Verdict(f.amplification ? std::optional<bool>(*f.amplification <=
                                                                  f.c.max_amplification + 1e-9)
                                            : std::nullopt)});
    rows.push_back({kCpuRow, CpuText(f.cpu), "", ""});
    if (!f.passes_gibps.empty()) {
      rows.push_back(WarmedUpPassesRow(f.passes_gibps, f.warmup_gibps));
    }
  }
  if (Selected("concurrent")) {
    std::optional<double> need;
    if (transport_gibps_) need = 0.8 * *transport_gibps_;
    rows.push_back(
        {absl::StrCat("concurrent (", kWorkers, " workers, row->col, median)"),
         Fmt(concurrent_gibps_, " GiB/s"),
         absl::StrCat(">= 0.8 x transport = ", Fmt(need, " GiB/s")),
         Verdict(concurrent_gibps_ && need ? std::optional<bool>(*concurrent_gibps_ >= *need)
                                           : std::nullopt)});
    if (!concurrent_runs_.empty()) {
      rows.push_back(WarmedUpPassesRow(concurrent_runs_, concurrent_warmup_gibps_));
    }
    rows.push_back({"  CPU per GiB (server + all workers)", CpuText(concurrent_cpu_), "", ""});
    rows.push_back({"  store reads as copies (map budget)", Fmt(concurrent_copied_fraction_, "", 2),
                    "", ""});
    rows.push_back({"  ckptd peak RSS (VmHWM)", Fmt(concurrent_rss_mib_, " MiB", 0), "<= 512 MiB",
                    Verdict(concurrent_rss_mib_
                                ? std::optional<bool>(*concurrent_rss_mib_ <= 512.0)
                                : std::nullopt)});
  }
  if (Selected("transform")) {
    std::optional<double> speedup, rss_ratio;
    if (transform_seconds_ && baseline_seconds_) speedup = *baseline_seconds_ / *transform_seconds_;
    if (transform_rss_mib_ && baseline_rss_mib_) rss_ratio = *transform_rss_mib_ / *baseline_rss_mib_;
    rows.push_back({"transform job (export 8->3, median)", Fmt(transform_seconds_, " s"), "", ""});
    rows.push_back(
        {"  naive baseline (merge+split, median)", Fmt(baseline_seconds_, " s"), "", ""});
    rows.push_back({"  CPU time: ckptd job vs baseline",
                    absl::StrCat(Fmt(transform_cpu_seconds_, " s"), " vs ",
                                 Fmt(baseline_cpu_seconds_, " s")),
                    "", ""});
    // Both write the same output files (and fsync them): writing them at the measured raw disk
    // speed bounds how fast either can be.
    rows.push_back(
        {"  floor: output at raw (direct) disk write", Fmt(TransformDiskFloor(), " s"), "", ""});
    rows.push_back({"  speed-up vs baseline", Fmt(speedup, "x", 1), ">= 5x",
                    Verdict(speedup ? std::optional<bool>(*speedup >= 5.0) : std::nullopt)});
    rows.push_back({"  ckptd peak RSS / baseline peak RSS",
                    absl::StrCat(Fmt(transform_rss_mib_, "", 0), " / ",
                                 Fmt(baseline_rss_mib_, " MiB", 0), " = ", Fmt(rss_ratio, "", 3)),
                    "<= 0.2",
                    Verdict(rss_ratio ? std::optional<bool>(*rss_ratio <= 0.2) : std::nullopt)});
  }
  if (Selected("deps")) {
    std::optional<double> ms;
    if (deps_) ms = Median(deps_->runs_ms);
    rows.push_back({"deps --all (4096 dst ranks, 1000 params)", Fmt(ms, " ms", 1), "<= 1000 ms",
                    Verdict(ms ? std::optional<bool>(*ms <= 1000.0) : std::nullopt)});
  }
  {
    std::optional<double> need;
    if (disk_gibps_) need = 0.5 * *disk_gibps_;
    rows.push_back({"upload (8 ranks, 4 streams, median pass)", Fmt(upload_gibps_, " GiB/s"),
                    absl::StrCat(">= 0.5 x disk write ", Fmt(disk_gibps_, " GiB/s")),
                    Verdict(upload_gibps_ && need ? std::optional<bool>(*upload_gibps_ >= *need)
                                                  : std::nullopt)});
    if (!disk_runs_.empty()) {
      rows.push_back({"  direct disk write passes (median of)", PassesText(disk_runs_), "", ""});
    }
    rows.push_back({"  buffered disk write (page cache + fsync)",
                    Fmt(disk_buffered_gibps_, " GiB/s"), "", ""});
    rows.push_back({kCpuRow, CpuText(upload_cpu_), "", ""});
    rows.push_back({"  first pass (fresh ckptd and store)", Fmt(upload_first_gibps_, " GiB/s"),
                    "", ""});
    rows.push_back({"    CPU per GiB (server + client)", CpuText(upload_first_cpu_), "", ""});
    rows.push_back({"  first fetch after it (merged, from disk)", Fmt(first_fetch_gibps_, " GiB/s"),
                    "", ""});
    rows.push_back({"  store write limit (store, 1 thread)", Fmt(store_write_gibps_, " GiB/s"),
                    "", ""});
    rows.push_back(
        {"    CPU per GiB (RocksDB's threads incl.)", Fmt(store_write_cpu_, " s"), "", ""});
  }
  return rows;
}

void Harness::Print() const {
  const std::optional<double> steal = StealSince(ticks_at_start_);
  const std::string steal_text = steal ? absl::StrFormat("%.1f%%", 100 * *steal) : "unknown";
  std::printf(
      "\nckptd benchmark: %s, 8 source ranks, loopback, %u CPUs, load average %s -> %s, CPU "
      "steal %s\n",
      spec_.Describe().c_str(), std::thread::hardware_concurrency(), load_at_start_.c_str(),
      LoadAverage().c_str(), steal_text.c_str());
  const std::vector<Row> rows = Table();
  size_t w0 = 6, w1 = 8, w2 = 6;
  for (const Row& r : rows) {
    w0 = std::max(w0, r.metric.size());
    w1 = std::max(w1, r.measured.size());
    w2 = std::max(w2, r.target.size());
  }
  std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(w0), "metric", static_cast<int>(w1),
              "measured", static_cast<int>(w2), "target", "result");
  std::printf("%s\n", std::string(w0 + w1 + w2 + 12, '-').c_str());
  for (const Row& r : rows) {
    std::printf("%-*s  %-*s  %-*s  %s\n", static_cast<int>(w0), r.metric.c_str(),
                static_cast<int>(w1), r.measured.c_str(), static_cast<int>(w2), r.target.c_str(),
                r.result.c_str());
  }
  for (const std::string& n : notes_) std::printf("note: %s\n", n.c_str());
  for (const std::string& e : errors_) std::printf("ERROR: %s\n", e.c_str());
  std::printf("results: %s\n", out_.c_str());
}

int Harness::Run() {
  if (auto s = PrepareWorkDir(); !s.ok()) {
    std::fprintf(stderr, "ckpt_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  Progress(absl::StrCat("work dir ", work_));
  if (auto s = Generate(); !s.ok()) {
    Error("generate", s);
  } else if (auto s2 = StartServer(); !s2.ok()) {
    Error("start ckptd", s2);
  } else {
    MeasureUpload();
  }
  if (uploaded_) {
    // From here on this process is the fetching client of every single-stream case (and of the
    // limits they are compared with), so it opts in to the client library's allocator policy for
    // streaming, as ckptctl and the concurrent workers do. The upload and the store write limit
    // above ran with glibc's defaults; the baseline child process keeps them too (it stands for
    // MindSpore's Python tool).
    TuneMallocForStreaming();
    MeasureFirstFetch();
    if (Selected("transport")) MeasureTransportLimit();
    if (Selected("storage")) MeasureStorageLimit();
    const std::vector<FetchCase> cases = {
        {"8to3", kThreeName, "", 1.1, "row split"},
        {"row_to_col", kColumnName, "", 1.25, "column"},
        {"opt_to_plain", kPlainName, "opt.", 1.25, "opt-shard"},
        {"merged", "", "", 1.1, "row split"},
    };
    for (const FetchCase& c : cases) {
      if (server_ && (Selected("fetch") || Selected(c.name))) MeasureFetch(c);
    }
    if (server_ && Selected("concurrent")) MeasureConcurrent();
    StopTransportServer();
    if (server_ && Selected("transform")) {
      // Alternating passes (the disk's speed, which bounds the job, drifts within a run): the
      // job in a fresh ckptd, then the baseline alone on the machine, as the job ran.
      for (int pass = 0; pass < kRepeats; ++pass) {
        if (!MeasureTransform(pass)) break;
        StopServer();
        if (!MeasureBaseline()) break;
      }
      TransformMedians();
    }
  }
  StopServer();
  if (Selected("deps")) MeasureDependencies();

  const json results = Results();
  {
    const fs::path out(out_);
    std::error_code ec;
    if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
    std::ofstream f(out_);
    f << results.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "ckpt_bench: cannot write %s\n", out_.c_str());
      errors_.push_back("cannot write results");
    }
  }
  Print();
  Cleanup();
  return errors_.empty() ? 0 : 1;
}

}  // namespace
}  // namespace ckpt::bench

int main(int argc, char** argv) {
  CLI::App app{"ckpt_bench - ckptd against the limits of this machine (issue 5)"};
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
                 "opt_to_plain, merged), concurrent, transform, deps. Upload always runs.")
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

  std::set<std::string> selected;
  for (absl::string_view c : absl::StrSplit(cases, ',', absl::SkipEmpty())) {
    selected.insert(std::string(c));
  }
  static const std::set<std::string> kKnown = {"all",      "transport",  "storage",
                                               "fetch",    "8to3",       "row_to_col",
                                               "opt_to_plain", "merged", "concurrent",
                                               "transform", "deps",      "upload"};
  for (const std::string& c : selected) {
    if (!kKnown.contains(c)) {
      std::fprintf(stderr, "ckpt_bench: unknown case '%s'\n", c.c_str());
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);  // a dead worker must not kill the harness
  // The in-process store (storage limit) logs its open at info level; keep the table readable.
  spdlog::set_level(spdlog::level::warn);
  ckpt::bench::Harness harness(size_gib, out, work_dir, keep, std::move(selected));
  return harness.Run();
}
