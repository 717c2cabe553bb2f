// The benchmark harness: generates a checkpoint, starts a fresh ckptd, uploads the checkpoint and
// measures every phase against the limits of the machine measured in the same run, then prints
// the table and writes the results JSON. docs/performance.md (## Method) says what each figure
// means.
//
// Its member functions live in one file per phase: harness.cc (set-up, the order of the phases),
// harness_upload.cc (disk and store write limits, upload, first fetch), harness_limits.cc
// (transport limit, verified-read ceiling, storage limit), harness_fetch.cc (the fetch cases),
// harness_concurrent.cc (concurrent workers), harness_many_tensors.cc (a checkpoint of
// kManyTensors tensors, a 50,000-parameter strategy), harness_storm.cc (64 workers of data-parallel
// replicas at once), harness_growth.cc (cost against bytes, tensors and destination ranks),
// harness_transform.cc (export job against the
// baseline), harness_python.cc (the Python client against the C++ one) and harness_report.cc
// (table and JSON).
#ifndef CKPT_TESTS_BENCH_HARNESS_H_
#define CKPT_TESTS_BENCH_HARNESS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "ckpt.grpc.pb.h"
#include "client/client.h"
#include "nlohmann/json.hpp"
#include "tests/bench/bench_common.h"
#include "tests/bench/bench_data.h"
#include "tests/bench/child.h"
#include "tests/bench/cpu_meter.h"
#include "tests/bench/deps.h"
#include "tests/testing/server_process.h"

namespace ckpt::bench {

// One fetch case: every rank of the uploaded checkpoint re-split to `strategy`.
struct FetchCase {
  std::string name;
  std::string strategy;        // empty: merged
  std::string include_prefix;  // empty: every tensor
  double max_amplification = 1.1;
  std::string split_kind;  // for the table
};

// What one fetch case measured.
struct FetchResult {
  FetchCase c;
  int64_t ranks = 0;
  int64_t bytes = 0;   // of one pass
  double seconds = 0;  // the median pass's
  double gibps = 0;
  std::optional<double> amplification;
  int64_t verified_bytes = 0;
  std::optional<CpuPerGib> cpu;        // over the measured passes
  std::vector<double> passes_gibps;    // each measured pass, in the order run
  std::optional<double> warmup_gibps;  // the unmeasured pass before them
};

// The many-tensors phase's checkpoint: this many tensors (and as many parameters planned).
inline constexpr int64_t kManyTensors = 20000;

// One line of the printed table (and, with a result, of the JSON's "targets").
struct Row {
  std::string metric;
  std::string measured;
  std::string target;
  std::string result;  // PASS / MISS / "" (no target) / "n/a"
};

// A measured figure in the results JSON, null when not measured.
template <typename T>
nlohmann::json Opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// The rows' shared wording (harness_report.cc). `v` with `precision` decimals and `unit`, "null"
// when not measured.
std::string Fmt(const std::optional<double>& v, const char* unit, int precision = 2);
// A target's result: "PASS" or "MISS", "n/a" when not measured.
std::string Verdict(const std::optional<bool>& pass);
// "N, lo-hi GiB/s" for a phase's measured passes (not empty).
std::string PassesText(const std::vector<double>& gibps);
// PassesText, then "; warm-up " and the warm-up pass's GiB/s.
std::string PassesWithWarmup(const std::vector<double>& gibps, const std::optional<double>& warmup);

// Runs once (Run); owns the work directory (removed at the end unless `keep`), the ckptd and
// transport server processes and the client. Not thread-safe.
class Harness {
 public:
  // `cases`: the --cases selection ("all" or case names; the upload always runs).
  Harness(double size_gib, std::string out, std::string work_dir, bool keep,
          std::set<std::string> cases)
      : size_gib_(size_gib),
        out_(std::move(out)),
        work_dir_arg_(std::move(work_dir)),
        keep_(keep),
        cases_(std::move(cases)),
        spec_(MakeSpec(SizeBytes(size_gib))) {}

  ~Harness() { Cleanup(); }

  // Every selected phase, then the table on stdout and the JSON to `out`. 0 when nothing failed.
  int Run();

 private:
  bool Selected(const std::string& name) const {
    return cases_.contains("all") || cases_.contains(name);
  }
  // Records a note (printed and in the JSON) / an error (the same, plus ckptd's log tail).
  void Note(const std::string& note);
  void Error(const std::string& what, const absl::Status& status);
  // A progress line on stderr, with the seconds since the start.
  void Progress(const std::string& what);

  // harness.cc: set-up and the order of the phases.
  absl::Status PrepareWorkDir();
  void Cleanup();
  // ckptd with `extra_args`, and client_ connected with `client_options` (stats_stub_ always
  // plaintext).
  absl::Status StartServer(const std::vector<std::string>& extra_args = {},
                           ClientOptions client_options = {});
  void StopServer();
  absl::StatusOr<v1::ServerStats> Stats();
  absl::Status Generate();
  // Every phase that needs the uploaded checkpoint, in order.
  void MeasureUploaded();
  void MeasureDependencies();
  void WriteResults();

  // harness_upload.cc.
  void MeasureUpload();
  // The raw direct-I/O disk write (kRepeats passes) and the buffered one; false after Error().
  bool MeasureDiskWrite();
  // One raw sequential write of the checkpoint's size to the work directory (direct I/O or
  // through the page cache), GiB/s.
  absl::StatusOr<double> DiskWritePass(bool direct);
  void MeasureStoreWrite();
  // Registers the four strategies; false after Error().
  bool PutStrategies();
  void UploadPasses();
  void MeasureFirstFetch();

  // harness_limits.cc.
  void MeasureTransportLimit();
  // Starts the transport server child; false after Error().
  bool StartTransportServer();
  void MeasureReadCeiling();
  // One plain pass of the transport stream, added to the transport limit (no-op without the
  // transport server). False if it failed (the server is then stopped).
  bool TransportPass();
  void StopTransportServer();
  void MeasureStorageLimit();
  // The storage limit's passes, with ckptd stopped; false after Error().
  bool StoragePasses();

  // harness_fetch.cc.
  void MeasureFetch(const FetchCase& c);
  // Every rank of `c` once, checked: the bytes delivered (their checked bytes added to
  // `*verified_bytes`), or nullopt after Error().
  std::optional<int64_t> FetchAllRanks(const FetchCase& c, const Strategy* destination,
                                       int64_t ranks, int64_t* verified_bytes);

  // harness_concurrent.cc.
  void MeasureConcurrent();
  // `count` worker processes fetching ranks 0..count-1 of `strategy`, each "ready"; false after
  // Error().
  bool SpawnWorkers(std::vector<std::unique_ptr<Child>>* workers, const std::string& strategy,
                    int count);
  // What one pass of the workers delivered, summed over them, and each worker's fetch time.
  struct WorkersPass {
    int64_t bytes = 0;
    int64_t verified = 0;
    std::vector<double> seconds;
  };
  // Every worker fetches its rank once; nullopt after Error(). `worker_cpu`, when not null, gets
  // each worker's CPU seconds added.
  std::optional<WorkersPass> RunWorkersPass(const std::vector<std::unique_ptr<Child>>& workers,
                                            double* worker_cpu);
  // "quit" to every worker and its exit; false after Error().
  bool StopWorkers(const std::vector<std::unique_ptr<Child>>& workers);
  // ckptd's peak RSS and the share of reads that went as copies, after the passes.
  void ConcurrentServerFigures(const absl::StatusOr<v1::ServerStats>& after_warmup);

  // harness_storm.cc: kStormTp x kStormDp worker processes fetch every rank of the storm
  // destination at once from a fresh ckptd; warm-up, then kRepeats passes, each after a
  // transport pass.
  void MeasureStorm();
  nlohmann::json StormJson() const;
  void StormRows(std::vector<Row>* rows) const;

  // harness_growth.cc: upload, fetch and transform time and ckptd's peak RSS as the bytes and
  // the tensors grow, and planning time as the destination ranks grow.
  struct GrowthEntry {
    std::string series;                  // "bytes", "tensors", "ranks"
    std::string op;                      // "upload", "fetch", "transform", "deps"
    int64_t size = 0;                    // tensor bytes, tensors or destination ranks
    double seconds = 0;                  // the median of passes_seconds
    std::vector<double> passes_seconds;  // each measured pass
    std::optional<double> peak_rss_mib;  // ckptd's, for this operation alone (none for deps)
    int64_t bytes = 0;                   // tensor bytes of the step's checkpoint (0 for deps)
    int64_t tensors = 0;
  };
  void MeasureGrowth();
  // One checkpoint: generated, uploaded, fetched (and exported if `transform`), each operation in
  // a fresh ckptd on the step's store; false after Error().
  bool GrowthStep(const std::string& series, const BenchSpec& spec, int64_t size, bool transform);
  std::vector<const GrowthEntry*> GrowthSeries(const std::string& series,
                                               const std::string& op) const;
  nlohmann::json GrowthJson() const;
  void GrowthRows(std::vector<Row>* rows) const;

  // harness_python.cc: the Python client (tests/bench/python_fetch_bench.py in a child process)
  // and this process's C++ client library fetch every rank of the 8to3 case in alternating
  // passes; their medians are compared, and the Python process's peak RSS with the largest
  // rank's bytes.
  void MeasurePython();
  nlohmann::json PythonJson() const;
  void PythonRows(std::vector<Row>* rows) const;

  // harness_many_tensors.cc: a checkpoint of kManyTensors tensors uploaded (kRepeats passes) and
  // fetched 8 -> 6 ranks in passes alternating with the main checkpoint's 8 -> 6 fetch; the time
  // to first byte of each rank; deps --all over 4096 ranks of kManyTensors parameters; and
  // registering a 50,000-parameter JSON strategy file.
  void MeasureManyTensors();
  struct ManyResult;
  // PutStrategyFile of a 50,000-parameter JSON strategy file, kRepeats passes, into `result`.
  void MeasureStrategyRegistration(ManyResult* result);
  // The upload passes of the checkpoint in `dir`, and the fetch passes alternating with the main
  // checkpoint's, into `result`; false after Error().
  bool ManyTensorsUploadPasses(const std::string& dir, ManyResult* result);
  bool ManyTensorsFetchPasses(ManyResult* result);
  // ckptd restarted over the store, then two fetches of every destination rank at once (workers
  // starting together against a ckptd that has loaded nothing), into `result`; false after
  // Error().
  bool ManyTensorsColdStart(ManyResult* result);
  nlohmann::json ManyTensorsJson() const;
  void ManyTensorsRows(std::vector<Row>* rows) const;

  // harness_transform.cc.
  // kRepeats alternating passes of the export job and the baseline, then their medians.
  void MeasureTransformPhase();
  // One pass of each (false: it failed, the error recorded); TransformMedians sums them up.
  bool MeasureTransform(int pass);
  bool MeasureBaseline();
  void TransformMedians();

  // harness_tls.cc.
  void MeasureTls();
  // A warm-up and kRepeats merged fetches (their GiB/s appended to `passes`): the median GiB/s,
  // or nullopt after Error().
  std::optional<double> MergedFetchPasses(const std::string& label, std::vector<double>* passes,
                                          std::optional<CpuPerGib>* cpu);

  // harness_report.cc.
  nlohmann::json Results() const;
  nlohmann::json ConcurrentJson() const;
  nlohmann::json TransformJson() const;
  nlohmann::json UploadJson() const;
  nlohmann::json ConfigJson() const;
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
  void LimitRows(std::vector<Row>* rows) const;
  void FetchRows(std::vector<Row>* rows) const;
  void ConcurrentRows(std::vector<Row>* rows) const;
  void TransformRows(std::vector<Row>* rows) const;
  void UploadRows(std::vector<Row>* rows) const;
  void TlsRows(std::vector<Row>* rows) const;
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
  const std::vector<CpuSpeed> speeds_at_start_ = MeasureCpuSpeeds();

  // State.
  std::vector<CpuSpeed> speeds_at_end_;  // measured once every case has run
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
  // server kept up until then. The machine's speed drifts over a run; limit and fetches are so
  // measured over the same spell instead of the limit over the seconds before them.
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
  std::vector<FetchResult> fetch_;
  std::optional<double> concurrent_gibps_;
  std::optional<double> concurrent_rss_mib_;
  std::optional<CpuPerGib> concurrent_cpu_;  // server + all workers
  std::optional<double> concurrent_stats_rss_mib_;
  // Share of the phase's store reads that went as copies (the map budget was spent).
  std::optional<double> concurrent_copied_fraction_;
  int64_t concurrent_bytes_ = 0;                   // of one pass
  std::vector<double> concurrent_runs_;            // GiB/s of each measured pass
  std::optional<double> concurrent_warmup_gibps_;  // the unmeasured pass before them
  // The transform job and the baseline run kRepeats alternating passes; seconds and CPU are the
  // medians, peak RSS the largest of the passes.
  std::vector<double> transform_runs_, transform_cpu_runs_, baseline_runs_, baseline_cpu_runs_;
  std::optional<double> transform_seconds_;
  std::optional<double> transform_rss_mib_;
  std::optional<int64_t> transform_output_bytes_;  // bytes of the exported files
  std::optional<double> transform_cpu_seconds_;    // ckptd's, during the job
  std::optional<double> baseline_seconds_;
  std::optional<double> baseline_rss_mib_;
  std::optional<double> baseline_cpu_seconds_;
  // The Python client's 8to3 fetch (harness_python.cc); nullopt: not measured.
  struct PythonResult {
    double gibps = 0;                  // median of its measured passes
    std::vector<double> passes_gibps;  // each measured pass
    std::optional<double> warmup_gibps;
    double cpp_gibps = 0;                  // the C++ library's, median of its measured passes
    std::vector<double> cpp_passes_gibps;  // each measured pass (the one before each Python's)
    std::optional<double> cpp_warmup_gibps;
    int64_t bytes = 0;                    // of one pass (every rank)
    int64_t max_rank_bytes = 0;           // the most tensor bytes it held at once
    int64_t peak_rss_bytes = 0;           // the child's ru_maxrss
    int64_t baseline_rss_bytes = 0;       // resident after import and connect, before fetching
    std::optional<double> cpu_s_per_gib;  // the Python process's own
    // CPU seconds per GiB over the measured passes: ckptd's while the Python client fetched,
    // and ckptd's and the C++ library's (this process) while the library fetched.
    std::optional<double> server_cpu_s_per_gib;
    std::optional<CpuPerGib> cpp_cpu;
    std::string path;  // the Python fetch path measured: "native" or "grpcio"
  };
  std::optional<PythonResult> python_;
  // The storm phase (harness_storm.cc); nullopt: not measured.
  struct StormResult {
    int workers = 0;
    int64_t bytes = 0;         // delivered by one pass, all workers
    int64_t unique_bytes = 0;  // of them, distinct (bytes / kStormDp)
    double gibps = 0;          // median of the measured passes, aggregate
    std::vector<double> passes_gibps;
    std::optional<double> warmup_gibps;
    // Store bytes read in a pass / unique_bytes: each pass's (warm-up first), and the largest.
    std::vector<double> passes_amplification;
    std::optional<double> read_amplification;
    // Slowest worker's time / the median worker's: each measured pass's, and their median.
    std::vector<double> passes_slowest_over_median;
    double slowest_over_median = 0;
    std::optional<double> server_peak_rss_mib;
    std::optional<CpuPerGib> cpu;  // server + all workers, over the measured passes
    std::string load_average;      // when the phase ended
  };
  std::optional<StormResult> storm_;
  // The many-tensors phase (harness_many_tensors.cc); nullopt: not measured.
  struct ManyResult {
    BenchSpec spec;
    int64_t tensors = 0;
    int64_t file_bytes = 0;      // of the source rank files
    int64_t fetch_bytes = 0;     // one pass, every destination rank
    int64_t verified_bytes = 0;  // checked against the generator, over every pass
    // Time from the Fetch call to its first tensor byte, per rank: the measured passes' (the
    // target is on their largest) and the warm-up pass's (the plan not built yet).
    std::vector<double> ttfb_runs_ms, cold_ttfb_ms;
    double ttfb_ms = 0, ttfb_median_ms = 0, cold_ttfb_max_ms = 0;
    double gibps = 0, large_gibps = 0, ratio = 0;  // medians, and gibps / large_gibps
    std::vector<double> passes_gibps, large_passes_gibps;
    double warmup_gibps = 0;
    double upload_gibps = 0;  // median of the passes
    std::vector<double> upload_passes_gibps;
    std::optional<double> upload_ratio;  // to upload_gibps_
    DepsResult deps;
    double deps_ms = 0;
    // PutStrategyFile of the 50,000-parameter JSON file: median seconds (nullopt: it failed), the
    // passes, and the client-side parse alone (LoadStrategyPath).
    std::optional<double> strategy_register_s;
    std::vector<double> strategy_register_runs_s;
    double strategy_parse_s = 0;
    int64_t strategy_file_bytes = 0;
    // ManyTensorsColdStart: the fetches started together, the time until all were done, ckptd's
    // CPU seconds over it and its peak RSS (VmHWM of the restarted process), the largest time
    // to first byte.
    int cold_workers = 0;
    double cold_seconds = 0;
    std::optional<double> cold_server_cpu_s, cold_server_peak_rss_mib;
    double cold_ttfb_worst_ms = 0;
  };
  std::optional<ManyResult> many_;
  std::optional<DepsResult> deps_;
  std::vector<GrowthEntry> growth_;  // in the order measured
  std::optional<double> upload_gibps_;
  std::optional<CpuPerGib> upload_cpu_;       // of the median pass
  std::optional<double> upload_first_gibps_;  // the first pass, into a fresh ckptd and store
  std::optional<CpuPerGib> upload_first_cpu_;
  // One merged fetch right after the upload: ckptd writes whole blocks past the page cache, so
  // this first read comes from the disk (and warms the page cache for the cases after it).
  std::optional<double> first_fetch_gibps_;
  // 1 MiB chunks put into a fresh store and committed, in this process: what the store alone
  // costs to ingest the bytes (the floor of the upload's server side).
  std::optional<double> store_write_gibps_;
  std::optional<double> store_write_cpu_;  // s per GiB, this process (RocksDB's threads included)
  std::optional<double> disk_gibps_;       // direct I/O where the file system allows it
  std::vector<double> disk_runs_;          // its passes; disk_gibps_ is their median
  std::optional<double> disk_buffered_gibps_;  // through the page cache
  // Merged fetch over TLS with a token and in plaintext, measured back to back (MeasureTls), and
  // one core's AES-GCM encryption speed.
  std::optional<double> tls_gibps_, plain_gibps_;
  std::vector<double> tls_passes_, plain_passes_;
  std::optional<CpuPerGib> tls_cpu_, plain_cpu_;  // over the measured passes
  std::optional<double> aes128_gcm_gibps_, aes256_gcm_gibps_;
  std::vector<std::string> notes_;
  std::vector<std::string> errors_;
};

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_HARNESS_H_
