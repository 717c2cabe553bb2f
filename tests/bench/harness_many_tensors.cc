// The many-tensors phase: a checkpoint of kManyTensors tensors (mostly small, every 100th large),
// uploaded from 8 source ranks and fetched to 6 destination ranks, against the same fetch of the
// main (large-tensor) checkpoint in alternating passes; the time to the first byte of every
// rank's fetch; planning every destination rank's source ranks for 4096 ranks of a strategy of as
// many parameters; and registering a 50,000-parameter JSON strategy file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/strategy_files.h"
#include "tests/bench/cpu_meter.h"
#include "tests/bench/fetch_verify.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

constexpr char kManyId[] = "many";
constexpr char kManySourceName[] = "many_src8";
constexpr char kManySixName[] = "many_d6";
constexpr char kLargeSixName[] = "d6";
constexpr char kBigStrategyName[] = "json50k";
constexpr int64_t kBigStrategyParams = 50000;

// The Fetch of `rank` of `strategy`, as the client library reads it (batches: FetchChecker).
v1::FetchRequest RankRequest(const char* id, const char* strategy, int64_t rank) {
  v1::FetchRequest request;
  request.set_checkpoint_id(id);
  request.set_destination_strategy(strategy);
  request.set_rank(rank);
  request.set_accept_batches(true);
  return request;
}

// A CheckingVisitor that also notes when the first tensor byte arrived.
class TimedVisitor final : public TensorVisitor {
 public:
  TimedVisitor(const BenchSpec* spec, const Strategy* destination, int64_t rank,
               std::vector<std::optional<Box>>* expected_boxes)
      : inner_(spec, destination, rank, "", expected_boxes) {}

  absl::Status OnSummary(const v1::FetchPlanSummary& s) override { return inner_.OnSummary(s); }
  absl::Status OnTensor(const v1::FetchTensorHeader& h) override { return inner_.OnTensor(h); }
  absl::Status OnData(std::string_view data) override {
    if (!first_byte_) first_byte_ = Clock::now();
    return inner_.OnData(data);
  }
  absl::Status OnTensorEnd() override { return inner_.OnTensorEnd(); }

  const CheckingVisitor& inner() const { return inner_; }
  std::optional<Clock::time_point> first_byte() const { return first_byte_; }

 private:
  CheckingVisitor inner_;
  std::optional<Clock::time_point> first_byte_;
};

// kBigStrategyParams parameters over dev_matrix [8, 8] with their shapes, as a large language
// model's strategy has them: per layer a row-split, a column-split, a 2-D-split and an
// optimizer-sharded weight, a replicated norm and a 1-D bias.
Strategy BigJsonStrategy() {
  auto layout = [](std::vector<std::vector<int32_t>> map, int64_t opt = 0) {
    Layout l;
    l.dev_matrix = {8, 8};
    l.tensor_map = std::move(map);
    if (opt != 0) {
      l.opt_shard_size = opt;
      l.opt_shard_step = 1;
    }
    return l;
  };
  std::map<std::string, StrategyParam> params;
  for (int64_t i = 0; i < kBigStrategyParams; ++i) {
    StrategyParam p;
    switch (i % 6) {
      case 0:
        p.layout = layout({{0}, {}});
        p.tensor_shape = Shape{4096, 1024};
        break;
      case 1:
        p.layout = layout({{}, {0}});
        p.tensor_shape = Shape{1024, 4096};
        break;
      case 2:
        p.layout = layout({{1}, {0}});
        p.tensor_shape = Shape{2048, 2048};
        break;
      case 3:
        p.layout = layout({{0}, {}}, 8);
        p.tensor_shape = Shape{4096, 4096};
        break;
      case 4:
        p.layout = layout({{}});
        p.tensor_shape = Shape{4096};
        break;
      default:
        p.layout = layout({{1}});
        p.tensor_shape = Shape{1024};
        break;
    }
    params[absl::StrFormat("model.layers.%05d.param_%d", i / 6, i % 6)] = std::move(p);
  }
  auto s = Strategy::Create(std::move(params), 1);
  if (!s.ok()) {
    std::fprintf(stderr, "ckpt_bench: bad built-in strategy: %s\n", s.status().ToString().c_str());
    std::abort();
  }
  return *std::move(s);
}

}  // namespace

void Harness::MeasureStrategyRegistration(ManyResult* result) {
  const std::string path = work_ + "/strategy-50k.json";
  if (auto s = WriteStrategyFile(BigJsonStrategy(), path); !s.ok()) {
    return Error("many tensors: write the 50,000-parameter strategy", s);
  }
  result->strategy_file_bytes = static_cast<int64_t>(fs::file_size(path));
  const auto parse_start = Clock::now();
  auto parsed = LoadStrategyPath(path);
  result->strategy_parse_s = Seconds(parse_start);
  if (!parsed.ok()) return Error("many tensors: parse the strategy file", parsed.status());
  std::vector<double> runs;
  for (int pass = 0; pass < kRepeats; ++pass) {
    const auto start = Clock::now();
    auto put = client_->PutStrategyFile(kBigStrategyName, path, /*overwrite=*/true);
    runs.push_back(Seconds(start));
    if (!put.ok()) {
      return Error(absl::StrFormat("many tensors: register the 50,000-parameter strategy (after "
                                   "%.1f s)",
                                   runs.back()),
                   put.status());
    }
    if (put->parameter_count() != kBigStrategyParams) {
      return Error(
          "many tensors: register the 50,000-parameter strategy",
          absl::InternalError(absl::StrCat("registered ", put->parameter_count(), " parameters")));
    }
  }
  result->strategy_register_runs_s = runs;
  result->strategy_register_s = Median(runs);
  std::error_code ec;
  fs::remove(path, ec);
  Progress(
      absl::StrFormat("many tensors: registering a %d-parameter JSON strategy (%.1f MiB): "
                      "%.3f s (median); client-side parse alone %.3f s",
                      kBigStrategyParams, result->strategy_file_bytes / kMiB,
                      *result->strategy_register_s, result->strategy_parse_s));
}

bool Harness::ManyTensorsUploadPasses(const std::string& dir, ManyResult* result) {
  // Upload: kRepeats passes, deleted between them; the last stays for the fetches.
  std::vector<double> upload_seconds;
  for (int pass = 0; pass < kRepeats; ++pass) {
    if (pass > 0) {
      if (auto s = client_->DeleteCheckpoint(kManyId); !s.ok()) {
        Error("many tensors: delete before the next upload pass", s);
        return false;
      }
    }
    const auto start = Clock::now();
    auto up = client_->UploadDirectory(kManyId, kManySourceName, dir);
    upload_seconds.push_back(Seconds(start));
    if (!up.ok()) {
      Error("many tensors: upload", up.status());
      return false;
    }
    if (!up->committed) {
      Error("many tensors: upload", absl::InternalError("checkpoint not committed"));
      return false;
    }
    result->upload_passes_gibps.push_back(up->file_bytes / kGiB / upload_seconds.back());
    Progress(absl::StrFormat("many tensors: upload pass %d: %.3f GiB in %.2f s = %.3f GiB/s",
                             pass + 1, up->file_bytes / kGiB, upload_seconds.back(),
                             result->upload_passes_gibps.back()));
  }
  result->upload_gibps = Median(result->upload_passes_gibps);
  if (upload_gibps_) result->upload_ratio = result->upload_gibps / *upload_gibps_;
  return true;
}

bool Harness::ManyTensorsFetchPasses(ManyResult* result) {
  const BenchSpec& many = result->spec;
  // Fetch: every rank of the 6-rank destination, the many-tensor checkpoint and then the large
  // one in each pass (a warm-up pass first, whose times to first byte are those of a plan not
  // built yet).
  const Strategy many_six = SixRankStrategy(many);
  const Strategy large_six = SixRankStrategy(spec_);
  // Every rank of `destination` once, checked: GiB/s, or nullopt after Error(). `ttfb_ms` (when
  // not null) gets each rank's time to its first tensor byte.
  // The boxes each rank expects, by checkpoint and rank, worked out in the first pass.
  std::map<std::pair<const BenchSpec*, int64_t>, std::vector<std::optional<Box>>> expected_boxes;
  auto fetch_all = [&](const BenchSpec& spec, const char* id, const char* strategy,
                       const Strategy& destination,
                       std::vector<double>* ttfb_ms) -> std::optional<double> {
    int64_t bytes = 0;
    const auto start = Clock::now();
    for (int64_t r = 0; r < destination.world_size(); ++r) {
      const v1::FetchRequest request = RankRequest(id, strategy, r);
      TimedVisitor visitor(&spec, &destination, r, &expected_boxes[{&spec, r}]);
      const auto rank_start = Clock::now();
      absl::Status s = client_->Fetch(request, visitor);
      if (s.ok()) s = visitor.inner().Complete();
      if (!s.ok()) {
        Error(absl::StrCat("many tensors: fetch ", id, " rank ", r), s);
        return std::nullopt;
      }
      if (ttfb_ms && visitor.first_byte()) {
        ttfb_ms->push_back(
            std::chrono::duration<double, std::milli>(*visitor.first_byte() - rank_start).count());
      }
      bytes += visitor.inner().bytes();
      if (&spec == &many) result->verified_bytes += visitor.inner().checked();
    }
    if (&spec == &many) result->fetch_bytes = bytes;
    return bytes / kGiB / Seconds(start);
  };
  {
    auto warm = fetch_all(many, kManyId, kManySixName, many_six, &result->cold_ttfb_ms);
    if (!warm) return false;
    result->warmup_gibps = *warm;
    if (!fetch_all(spec_, kCheckpointId, kLargeSixName, large_six, nullptr)) return false;
  }
  for (int pass = 0; pass < kRepeats; ++pass) {
    // ckptd's and this process's CPU seconds for the pass: steadier than its wall time.
    const CpuMeter many_cpu(server_->pid());
    const absl::StatusOr<v1::ServerStats> stats_before = Stats();
    auto g = fetch_all(many, kManyId, kManySixName, many_six, &result->ttfb_runs_ms);
    if (!g) return false;
    CpuTally many_tally;
    many_cpu.AddTo(&many_tally, 0);
    // Chunks the pass read from the store and found in ckptd's shared chunk cache.
    const absl::StatusOr<v1::ServerStats> stats_after = Stats();
    int64_t store_reads = -1, cache_hits = -1;
    if (stats_before.ok() && stats_after.ok()) {
      store_reads = stats_after->store_chunks_read() - stats_before->store_chunks_read();
      cache_hits = stats_after->fetch_chunks_cached() - stats_before->fetch_chunks_cached();
    }
    result->passes_gibps.push_back(*g);
    const CpuMeter large_cpu(server_->pid());
    auto l = fetch_all(spec_, kCheckpointId, kLargeSixName, large_six, nullptr);
    if (!l) return false;
    CpuTally large_tally;
    large_cpu.AddTo(&large_tally, 0);
    result->large_passes_gibps.push_back(*l);
    Progress(
        absl::StrFormat("many tensors: fetch 8->6 pass %d: %.3f GiB/s (CPU s: ckptd %.3f, "
                        "client %.3f; chunks: %d store reads, %d cache hits); large "
                        "tensors %.3f GiB/s (CPU s: ckptd %.3f, client %.3f)",
                        pass + 1, *g, many_tally.server, many_tally.client, store_reads, cache_hits,
                        *l, large_tally.server, large_tally.client));
  }
  result->gibps = Median(result->passes_gibps);
  result->large_gibps = Median(result->large_passes_gibps);
  result->ratio = result->gibps / result->large_gibps;
  result->ttfb_ms = *std::max_element(result->ttfb_runs_ms.begin(), result->ttfb_runs_ms.end());
  result->ttfb_median_ms = Median(result->ttfb_runs_ms);
  result->cold_ttfb_max_ms =
      *std::max_element(result->cold_ttfb_ms.begin(), result->cold_ttfb_ms.end());
  return true;
}

bool Harness::ManyTensorsColdStart(ManyResult* result) {
  StopServer();
  if (auto s = StartServer(); !s.ok()) {
    Error("many tensors: restart ckptd", s);
    return false;
  }
  const Strategy many_six = SixRankStrategy(result->spec);
  const int workers = 2 * static_cast<int>(many_six.world_size());
  // A connection of its own for each worker, made before the clock starts.
  std::vector<std::unique_ptr<CkptClient>> clients;
  for (int i = 0; i < workers; ++i) {
    ClientOptions options;
    options.connect_timeout = absl::Seconds(20);
    auto c = CkptClient::Connect(server_->address(), options);
    if (!c.ok()) {
      Error("many tensors: cold start: connect", c.status());
      return false;
    }
    clients.push_back(*std::move(c));
  }
  std::vector<absl::Status> status(workers);
  std::vector<double> ttfb_ms(workers, 0);
  const absl::StatusOr<double> cpu_start = ProcessCpuSeconds(server_->pid());
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      const int64_t rank = i % many_six.world_size();
      const v1::FetchRequest request = RankRequest(kManyId, kManySixName, rank);
      std::vector<std::optional<Box>> boxes;  // this worker's own
      TimedVisitor visitor(&result->spec, &many_six, rank, &boxes);
      absl::Status s = clients[i]->Fetch(request, visitor);
      if (s.ok()) s = visitor.inner().Complete();
      if (s.ok() && visitor.first_byte()) {
        ttfb_ms[i] =
            std::chrono::duration<double, std::milli>(*visitor.first_byte() - start).count();
      }
      status[i] = s;
    });
  }
  for (std::thread& t : threads) t.join();
  result->cold_seconds = Seconds(start);
  const absl::StatusOr<double> cpu_end = ProcessCpuSeconds(server_->pid());
  for (int i = 0; i < workers; ++i) {
    if (!status[i].ok()) {
      Error(absl::StrCat("many tensors: cold start: worker ", i), status[i]);
      return false;
    }
  }
  result->cold_workers = workers;
  result->cold_ttfb_worst_ms = *std::max_element(ttfb_ms.begin(), ttfb_ms.end());
  if (cpu_start.ok() && cpu_end.ok()) result->cold_server_cpu_s = *cpu_end - *cpu_start;
  if (auto peak = ProcessPeakRssBytes(server_->pid()); peak.ok()) {
    result->cold_server_peak_rss_mib = *peak / kMiB;
  }
  Progress(absl::StrFormat(
      "many tensors: cold start, %d fetches at once: all done in %.2f s, first byte within "
      "%.0f ms; ckptd CPU %s, VmHWM %s",
      workers, result->cold_seconds, result->cold_ttfb_worst_ms,
      Fmt(result->cold_server_cpu_s, " s", 2), Fmt(result->cold_server_peak_rss_mib, " MiB", 0)));
  return true;
}

void Harness::MeasureManyTensors() {
  ManyResult result;
  result.spec =
      MakeManySpec(std::max<int64_t>(spec_.total_bytes / 4, int64_t{16} << 20), kManyTensors);
  result.tensors = static_cast<int64_t>(result.spec.tensors.size());
  const BenchSpec& many = result.spec;
  Progress(absl::StrCat("many tensors: generating ", many.Describe(), " over 8 source ranks"));
  const std::string dir = work_ + "/many-src";
  absl::StatusOr<int64_t> file_bytes = WriteSourceCheckpoint(many, SourceStrategy(many), dir, 2);
  if (!file_bytes.ok()) return Error("many tensors: generate", file_bytes.status());
  result.file_bytes = *file_bytes;

  // Registering a 50,000-parameter JSON strategy file (the client parses it and sends it as JSON,
  // ckptd parses, checks and stores it). A failure is recorded and the phase goes on without it.
  MeasureStrategyRegistration(&result);

  for (const auto& [name, strategy] :
       {std::pair<const char*, Strategy>{kManySourceName, SourceStrategy(many)},
        {kManySixName, SixRankStrategy(many)},
        {kLargeSixName, SixRankStrategy(spec_)}}) {
    if (auto put = client_->PutStrategy(name, strategy, true); !put.ok()) {
      return Error(absl::StrCat("many tensors: PutStrategy ", name), put.status());
    }
  }

  if (!ManyTensorsUploadPasses(dir, &result) || !ManyTensorsFetchPasses(&result) ||
      !ManyTensorsColdStart(&result)) {
    return;
  }

  // Planning: every destination rank's source ranks, 1024 -> 4096 ranks, as many parameters as
  // the checkpoint has tensors.
  auto deps = MeasureDeps(kManyTensors);
  if (!deps.ok()) return Error("many tensors: deps", deps.status());
  result.deps = *deps;
  result.deps_ms = Median(deps->runs_ms);
  Progress(absl::StrFormat(
      "many tensors: ttfb max %.1f ms (median %.1f, before the plan is cached %.1f); fetch ratio "
      "%.2f; deps %.1f ms; upload ratio %s",
      result.ttfb_ms, result.ttfb_median_ms, result.cold_ttfb_max_ms, result.ratio, result.deps_ms,
      result.upload_ratio ? absl::StrFormat("%.2f", *result.upload_ratio) : "null"));
  // --keep keeps the checkpoint in the store and its rank files, as it keeps the work directory.
  if (!keep_) {
    if (auto s = client_->DeleteCheckpoint(kManyId); !s.ok()) {
      Note(absl::StrCat("many tensors: deleting the checkpoint afterwards: ", s.ToString()));
    }
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  many_ = std::move(result);
}

nlohmann::json Harness::ManyTensorsJson() const {
  if (!many_) {
    return {{"tensors", nullptr}, {"ttfb_ms", nullptr},      {"ratio", nullptr},
            {"deps_ms", nullptr}, {"upload_ratio", nullptr}, {"strategy_register_s", nullptr}};
  }
  const ManyResult& m = *many_;
  return {{"tensors", m.tensors},
          {"ttfb_ms", m.ttfb_ms},
          {"ratio", m.ratio},
          {"deps_ms", m.deps_ms},
          {"upload_ratio", m.upload_ratio ? nlohmann::json(*m.upload_ratio) : nullptr},
          {"strategy_register_s",
           m.strategy_register_s ? nlohmann::json(*m.strategy_register_s) : nullptr},
          {"checkpoint", m.spec.Describe()},
          {"file_bytes", m.file_bytes},
          {"fetch_bytes", m.fetch_bytes},
          {"verified_bytes", m.verified_bytes},
          {"ttfb_median_ms", m.ttfb_median_ms},
          {"ttfb_runs_ms", m.ttfb_runs_ms},
          {"cold_ttfb_ms", m.cold_ttfb_ms},
          {"gibps", m.gibps},
          {"passes_gibps", m.passes_gibps},
          {"warmup_gibps", m.warmup_gibps},
          {"large_gibps", m.large_gibps},
          {"large_passes_gibps", m.large_passes_gibps},
          {"upload_gibps", m.upload_gibps},
          {"upload_passes_gibps", m.upload_passes_gibps},
          {"deps_runs_ms", m.deps.runs_ms},
          {"deps_params", m.deps.params},
          {"deps_src_world", m.deps.src_world},
          {"deps_dst_world", m.deps.dst_world},
          {"strategy_register_runs_s", m.strategy_register_runs_s},
          {"strategy_parse_s", m.strategy_parse_s},
          {"strategy_file_bytes", m.strategy_file_bytes},
          {"cold_start",
           {{"workers", m.cold_workers},
            {"seconds", m.cold_seconds},
            {"ttfb_worst_ms", m.cold_ttfb_worst_ms},
            {"server_cpu_s", m.cold_server_cpu_s ? nlohmann::json(*m.cold_server_cpu_s) : nullptr},
            {"server_peak_rss_mib",
             m.cold_server_peak_rss_mib ? nlohmann::json(*m.cold_server_peak_rss_mib) : nullptr}}}};
}

void Harness::ManyTensorsRows(std::vector<Row>* rows) const {
  const ManyResult* m = many_ ? &*many_ : nullptr;
  auto verdict = [&](bool pass) { return m ? Verdict(pass) : std::string("n/a"); };
  rows->push_back({absl::StrFormat("many tensors (%d, 8 -> 6 ranks)", kManyTensors),
                   m ? m->spec.Describe() : "null", "", ""});
  rows->push_back({"  time to first byte (max over ranks)",
                   m ? absl::StrFormat("%.1f ms (median %.1f; uncached plan %.1f)", m->ttfb_ms,
                                       m->ttfb_median_ms, m->cold_ttfb_max_ms)
                     : "null",
                   "<= 50 ms", verdict(m && m->ttfb_ms <= 50.0)});
  rows->push_back(
      {"  fetch GiB/s / large-tensor fetch's",
       m ? absl::StrFormat("%.3f / %.3f GiB/s  ratio %.2f", m->gibps, m->large_gibps, m->ratio)
         : "null",
       "ratio >= 0.7", verdict(m && m->ratio >= 0.7)});
  rows->push_back({absl::StrFormat("  deps --all (4096 dst ranks, %d params)", kManyTensors),
                   m ? absl::StrFormat("%.1f ms", m->deps_ms) : "null", "<= 200 ms",
                   verdict(m && m->deps_ms <= 200.0)});
  rows->push_back(
      {"  upload GiB/s / large-tensor upload's",
       m ? absl::StrFormat("%.3f / %s GiB/s  ratio %s", m->upload_gibps,
                           upload_gibps_ ? absl::StrFormat("%.3f", *upload_gibps_) : "null",
                           m->upload_ratio ? absl::StrFormat("%.2f", *m->upload_ratio) : "null")
         : "null",
       "ratio >= 0.5",
       m && m->upload_ratio ? Verdict(*m->upload_ratio >= 0.5) : std::string("n/a")});
  rows->push_back(
      {absl::StrFormat("  register a %d-param JSON strategy", kBigStrategyParams),
       m && m->strategy_register_s ? absl::StrFormat("%.3f s (client parse %.3f s)",
                                                     *m->strategy_register_s, m->strategy_parse_s)
                                   : "null",
       "<= 1 s",
       m && m->strategy_register_s ? Verdict(*m->strategy_register_s <= 1.0) : std::string("n/a")});
  rows->push_back({m ? absl::StrFormat("  cold start: %d fetches at once", m->cold_workers)
                     : std::string("  cold start"),
                   m ? absl::StrFormat("%.2f s (first byte within %.0f ms); ckptd CPU %s, VmHWM %s",
                                       m->cold_seconds, m->cold_ttfb_worst_ms,
                                       Fmt(m->cold_server_cpu_s, " s", 2),
                                       Fmt(m->cold_server_peak_rss_mib, " MiB", 0))
                     : "null",
                   "", ""});
}

}  // namespace ckpt::bench
