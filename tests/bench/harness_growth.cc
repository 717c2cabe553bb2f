// The growth case: how cost grows with the size of the problem. Three series:
//   - bytes: the checkpoint of --size-gib (x1), then the same tensors with 2 and 4 times the rows
//     (x2, x4): upload, fetch of every rank of the 8 -> 3 re-split, and the export job 8 -> 3.
//   - tensors: 100, 1,000 and 20,000 tensors sharing about the same total bytes: upload and fetch.
//   - ranks: dependency planning (`deps --all`, 1000 parameters from 1024 source ranks) to 8, 64,
//     512 and 4,096 destination ranks, in this process.
// Each upload, fetch and export runs in a fresh ckptd on the step's store, so that ckptd's peak
// RSS (VmHWM) is that operation's alone; each is kRepeats passes (a fetch after a checked,
// unmeasured warm-up pass) and its seconds are their median. The table judges the cost per unit
// at the largest size against the smallest (or against 1,000 tensors, or 512 ranks) and shows the
// growth exponent (least-squares slope of log seconds over log size) beside it.
// docs/performance.md (## Growth) shows the figures and plots of one run.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "tests/bench/fetch_verify.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGrowthBytesFactors[] = {1, 2, 4};
constexpr int64_t kGrowthTensorCounts[] = {100, 1000, 20000};
// Destination ranks of the planning series: dev_matrix per stage over 4 pipeline stages.
struct RanksStep {
  int64_t ranks;
  std::vector<int64_t> dev_matrix;
};
const RanksStep kGrowthRanks[] = {
    {8, {2, 1, 1}}, {64, {1, 4, 4}}, {512, {2, 8, 8}}, {4096, {16, 8, 8}}};
// Slack of the flat-memory target: ckptd's peak RSS at x4 <= 1.25 x its peak at x1 + this.
constexpr double kRssSlackMib = 64;
// The per-unit targets: bytes x4 against x1; tensors 20,000 against 1,000; ranks 4,096 against
// 512.
constexpr double kLinearBytes = 1.25;
constexpr double kNearLinear = 2.0;

// `spec` with every tensor's rows multiplied by `factor` (same tensors, names and layouts; every
// row count stays a multiple of 24).
BenchSpec ScaledSpec(const BenchSpec& spec, int64_t factor) {
  BenchSpec out = spec;
  out.total_bytes = 0;
  for (BenchTensor& t : out.tensors) {
    t.rows *= factor;
    out.total_bytes += t.bytes();
  }
  return out;
}

// `count` tensors of about `size_bytes` in all, with MakeSpec's dtypes and layouts (alternately
// row-split and optimizer-sharded). Each tensor keeps its template's columns while that leaves it
// at least 24 rows, else gets fewer columns (a multiple of 8); rows are multiples of 24, so every
// destination of the bench divides them.
BenchSpec CountSpec(int64_t count, int64_t size_bytes) {
  const BenchSpec base = MakeSpec(int64_t{8} << 20);  // 64 templates (even: the layouts alternate)
  const int64_t target = std::max<int64_t>(1, size_bytes / count);
  BenchSpec out;
  for (int64_t i = 0; i < count; ++i) {
    const BenchTensor& from = base.tensors[static_cast<size_t>(i) % base.tensors.size()];
    BenchTensor t = from;
    t.name = absl::StrFormat("%s.%05d.weight", t.opt_sharded ? "opt" : "row", i);
    // Each tensor's bytes differ from its template's: the row keys depend on the seed.
    t.seed = from.seed + static_cast<uint64_t>(i + 1) * 0x9E3779B97F4A7C15ull;
    if (target / t.row_bytes() < 24) {
      t.cols = std::max<int64_t>(8, target / 24 / t.element_bytes / 8 * 8);
    }
    t.rows = std::max<int64_t>(24, (target / t.row_bytes() + 12) / 24 * 24);
    out.total_bytes += t.bytes();
    out.index.emplace(t.name, out.tensors.size());
    out.tensors.push_back(std::move(t));
  }
  return out;
}

// Counts what a Fetch delivers, checking nothing else: the measured fetch passes of the growth
// case use it, so that their time is ckptd's and the client library's, not the harness's checks
// (the warm-up pass checks every byte with CheckingVisitor). Not thread-safe.
class CountingVisitor final : public TensorVisitor {
 public:
  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const v1::FetchTensorHeader&) override {
    ++tensors_;
    return absl::OkStatus();
  }
  absl::Status OnData(std::string_view data) override {
    bytes_ += static_cast<int64_t>(data.size());
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }

  int64_t bytes() const { return bytes_; }
  int64_t tensors() const { return tensors_; }

 private:
  int64_t bytes_ = 0;
  int64_t tensors_ = 0;
};

// Hands every call to `a`, then to `b` (neither owned); the first error stops it.
class TeeVisitor final : public TensorVisitor {
 public:
  TeeVisitor(TensorVisitor* a, TensorVisitor* b) : a_(a), b_(b) {}
  absl::Status OnSummary(const v1::FetchPlanSummary& summary) override {
    CKPT_RETURN_IF_ERROR(a_->OnSummary(summary));
    return b_->OnSummary(summary);
  }
  absl::Status OnTensor(const v1::FetchTensorHeader& header) override {
    CKPT_RETURN_IF_ERROR(a_->OnTensor(header));
    return b_->OnTensor(header);
  }
  absl::Status OnData(std::string_view data) override {
    CKPT_RETURN_IF_ERROR(a_->OnData(data));
    return b_->OnData(data);
  }
  absl::Status OnTensorEnd() override {
    CKPT_RETURN_IF_ERROR(a_->OnTensorEnd());
    return b_->OnTensorEnd();
  }

 private:
  TensorVisitor* a_;
  TensorVisitor* b_;
};

// Least-squares slope of log(seconds) over log(size); nullopt for fewer than 2 usable points.
std::optional<double> Exponent(const std::vector<std::pair<double, double>>& points) {
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [size, seconds] : points) {
    if (size <= 0 || seconds <= 0) continue;
    const double x = std::log(size), y = std::log(seconds);
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double d = n * sxx - sx * sx;
  if (n < 2 || d <= 0) return std::nullopt;
  return (n * sxy - sx * sy) / d;
}

// "100", "1,000", "20,000".
std::string Count(int64_t n) {
  std::string digits = absl::StrCat(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

void Harness::MeasureGrowth() {
  StopServer();
  // Bytes: the checkpoint of --size-gib and its x2 and x4, the same tensors.
  const BenchSpec base = MakeSpec(SizeBytes(size_gib_));
  for (int64_t factor : kGrowthBytesFactors) {
    const BenchSpec spec = ScaledSpec(base, factor);
    if (!GrowthStep("bytes", spec, spec.total_bytes, /*transform=*/true)) return;
  }
  // Tensors: a fixed total (an eighth of the checkpoint, 32-256 MiB) cut into more and more
  // tensors.
  const int64_t tensor_series_bytes =
      std::clamp<int64_t>(SizeBytes(size_gib_) / 8, int64_t{32} << 20, int64_t{256} << 20);
  for (int64_t count : kGrowthTensorCounts) {
    if (!GrowthStep("tensors", CountSpec(count, tensor_series_bytes), count,
                    /*transform=*/false)) {
      return;
    }
  }
  // Ranks: planning only, no server.
  for (const RanksStep& step : kGrowthRanks) {
    auto r = MeasureDepsTo(step.dev_matrix, 4);
    if (!r.ok()) return Error(absl::StrCat("growth: deps to ", step.ranks, " ranks"), r.status());
    if (r->dst_world != step.ranks) {
      return Error("growth: deps",
                   absl::InternalError(absl::StrCat("destination has ", r->dst_world,
                                                    " ranks, expected ", step.ranks)));
    }
    GrowthEntry e;
    e.series = "ranks";
    e.op = "deps";
    e.size = step.ranks;
    for (double ms : r->runs_ms) e.passes_seconds.push_back(ms / 1000.0);
    e.seconds = Median(e.passes_seconds);
    growth_.push_back(e);
    Progress(absl::StrFormat("growth: deps --all to %d ranks: %.2f ms (median of %d)", step.ranks,
                             e.seconds * 1000.0, r->runs_ms.size()));
  }
}

bool Harness::GrowthStep(const std::string& series, const BenchSpec& spec, int64_t size,
                         bool transform) {
  const std::string src = work_ + "/growth-src";
  std::error_code ec;
  fs::remove_all(src, ec);
  StopServer();
  fs::remove_all(work_ + "/data", ec);  // a fresh store for every step
  const auto generated = WriteSourceCheckpoint(spec, SourceStrategy(spec), src, 2);
  if (!generated.ok()) {
    Error(absl::StrCat("growth: generate ", spec.Describe()), generated.status());
    return false;
  }
  const std::string what = absl::StrCat("growth ", series, " ", Count(size), ": ");
  Progress(absl::StrCat(what, spec.Describe()));
  const Strategy d3 = ThreeRankStrategy(spec);
  GrowthEntry entry;
  entry.series = series;
  entry.size = size;
  entry.bytes = spec.total_bytes;
  entry.tensors = static_cast<int64_t>(spec.tensors.size());
  // One operation in a fresh ckptd (on the step's store): `run` returns the seconds of each of
  // its measured passes; the entry gets their median and ckptd's peak RSS over all of them.
  const auto measure = [&](const std::string& op, auto&& run) -> bool {
    StopServer();
    if (auto s = StartServer(); !s.ok()) {
      Error(absl::StrCat(what, "start ckptd"), s);
      return false;
    }
    absl::StatusOr<std::vector<double>> passes = run();
    if (!passes.ok()) {
      Error(absl::StrCat(what, op), passes.status());
      return false;
    }
    GrowthEntry e = entry;
    e.op = op;
    e.passes_seconds = *std::move(passes);
    e.seconds = Median(e.passes_seconds);
    if (auto peak = ProcessPeakRssBytes(server_->pid()); peak.ok()) {
      e.peak_rss_mib = *peak / kMiB;
    } else {
      Error(absl::StrCat(what, "ckptd peak RSS"), peak.status());
    }
    Progress(absl::StrFormat(
        "%s%s %.3f s (median of %s s), ckptd VmHWM %s", what, op, e.seconds,
        absl::StrJoin(e.passes_seconds, " / ",
                      [](std::string* out, double v) { absl::StrAppendFormat(out, "%.3f", v); }),
        Fmt(e.peak_rss_mib, " MiB", 0)));
    growth_.push_back(e);
    StopServer();
    return true;
  };

  // kRepeats uploads into the same ckptd, the checkpoint deleted between them (the last one
  // stays).
  const bool uploaded = measure("upload", [&]() -> absl::StatusOr<std::vector<double>> {
    for (const char* name : {kSourceName, kThreeName}) {
      auto put = client_->PutStrategy(name, *StrategyByName(spec, name), true);
      if (!put.ok()) return put.status();
    }
    std::vector<double> passes;
    for (int pass = 0; pass < kRepeats; ++pass) {
      if (pass > 0) CKPT_RETURN_IF_ERROR(client_->DeleteCheckpoint(kCheckpointId));
      const auto start = Clock::now();
      auto up = client_->UploadDirectory(kCheckpointId, kSourceName, src);
      passes.push_back(Seconds(start));
      if (!up.ok()) return up.status();
      if (!up->committed) return absl::InternalError("checkpoint not committed");
    }
    return passes;
  });
  fs::remove_all(src, ec);  // the store has the bytes now; keep the disk for the next step
  if (!uploaded) return false;

  // Every rank of the 8 -> 3 re-split: a warm-up pass, checked (it also reads the fresh store
  // from the disk), then the median of kRepeats passes, which must deliver the same bytes and
  // tensors as the checked one.
  const bool fetched = measure("fetch", [&]() -> absl::StatusOr<std::vector<double>> {
    std::vector<double> passes;
    std::vector<std::pair<int64_t, int64_t>> checked;  // bytes, tensors of each rank
    for (int pass = -1; pass < kRepeats; ++pass) {
      const auto start = Clock::now();
      for (int64_t r = 0; r < d3.world_size(); ++r) {
        v1::FetchRequest request;
        request.set_checkpoint_id(kCheckpointId);
        request.set_destination_strategy(kThreeName);
        request.set_rank(r);
        if (pass < 0) {
          CheckingVisitor visitor(&spec, &d3, r, "");
          CountingVisitor counter;
          TeeVisitor both(&visitor, &counter);
          CKPT_RETURN_IF_ERROR(client_->Fetch(request, both));
          CKPT_RETURN_IF_ERROR(visitor.Complete());
          checked.emplace_back(counter.bytes(), counter.tensors());
        } else {
          CountingVisitor counter;
          CKPT_RETURN_IF_ERROR(client_->Fetch(request, counter));
          if (std::make_pair(counter.bytes(), counter.tensors()) !=
              checked[static_cast<size_t>(r)]) {
            return absl::InternalError(absl::StrCat(
                "rank ", r, " delivered ", counter.bytes(), " bytes in ", counter.tensors(),
                " tensors, the checked pass ", checked[static_cast<size_t>(r)].first, " in ",
                checked[static_cast<size_t>(r)].second));
          }
        }
      }
      if (pass >= 0) passes.push_back(Seconds(start));
    }
    return passes;
  });
  if (!fetched) return false;
  if (!transform) return true;

  // kRepeats export jobs, each output checked (one rank file) and removed.
  return measure("transform", [&]() -> absl::StatusOr<std::vector<double>> {
    const std::string export_dir = work_ + "/growth-export";
    std::vector<double> passes;
    for (int pass = 0; pass < kRepeats; ++pass) {
      fs::remove_all(export_dir, ec);
      v1::SubmitTransformRequest request;
      request.set_job_id(absl::StrCat("growth-", getpid(), "-", size, "-", pass));
      request.set_checkpoint_id(kCheckpointId);
      request.set_destination_strategy(kThreeName);
      request.mutable_target()->set_export_dir("growth-export");  // under --export-root work_
      const auto start = Clock::now();
      auto submitted = client_->SubmitTransform(request);
      if (!submitted.ok()) return submitted.status();
      auto job = client_->WatchJob(submitted->job().id());
      passes.push_back(Seconds(start));
      if (!job.ok()) return job.status();
      if (job->state() != v1::JOB_STATE_SUCCEEDED) {
        return absl::InternalError(absl::StrCat(JobStateName(job->state()), ": ", job->reason()));
      }
      auto checked = VerifyRankFile(spec, d3, 1, export_dir + "/rank_1/checkpoint_1.ckpt");
      fs::remove_all(export_dir, ec);
      if (!checked.ok()) return checked.status();
    }
    return passes;
  });
}

std::vector<const Harness::GrowthEntry*> Harness::GrowthSeries(const std::string& series,
                                                               const std::string& op) const {
  std::vector<const GrowthEntry*> out;
  for (const GrowthEntry& e : growth_) {
    if (e.series == series && e.op == op) out.push_back(&e);
  }
  return out;
}

nlohmann::json Harness::GrowthJson() const {
  nlohmann::json j = nlohmann::json::array();
  for (const GrowthEntry& e : growth_) {
    j.push_back({{"case", absl::StrCat(e.op, "_", e.series)},
                 {"series", e.series},
                 {"op", e.op},
                 {"size", e.size},
                 {"seconds", e.seconds},
                 {"passes_seconds", e.passes_seconds},
                 {"peak_rss_mib", e.peak_rss_mib ? nlohmann::json(*e.peak_rss_mib) : nullptr},
                 {"bytes", e.bytes ? nlohmann::json(e.bytes) : nullptr},
                 {"tensors", e.tensors ? nlohmann::json(e.tensors) : nullptr}});
  }
  return j;
}

void Harness::GrowthRows(std::vector<Row>* rows) const {
  // Seconds per unit at the largest size over the smallest `from` size; the rows of one series.
  const auto per_unit = [](const std::vector<const GrowthEntry*>& s,
                           int64_t from) -> std::optional<double> {
    const GrowthEntry* lo = nullptr;
    for (const GrowthEntry* e : s) {
      if (e->size == from) lo = e;
    }
    if (lo == nullptr || s.back() == lo || lo->seconds <= 0) return std::nullopt;
    const GrowthEntry* hi = s.back();
    return (hi->seconds / static_cast<double>(hi->size)) /
           (lo->seconds / static_cast<double>(lo->size));
  };
  const auto exponent = [](const std::vector<const GrowthEntry*>& s) {
    std::vector<std::pair<double, double>> points;
    for (const GrowthEntry* e : s) points.emplace_back(static_cast<double>(e->size), e->seconds);
    return Exponent(points);
  };
  const auto seconds_text = [](const std::vector<const GrowthEntry*>& s, double scale,
                               const char* unit) {
    std::vector<std::string> parts;
    for (const GrowthEntry* e : s) parts.push_back(absl::StrFormat("%.3g", e->seconds * scale));
    return absl::StrCat(absl::StrJoin(parts, " / "), unit);
  };
  const auto rss_text = [](const std::vector<const GrowthEntry*>& s) {
    std::vector<std::string> parts;
    for (const GrowthEntry* e : s) parts.push_back(Fmt(e->peak_rss_mib, "", 0));
    return absl::StrCat(absl::StrJoin(parts, " / "), " MiB");
  };

  for (const char* op : {"upload", "fetch", "transform"}) {
    const auto s = GrowthSeries("bytes", op);
    const std::optional<double> ratio = s.empty() ? std::nullopt : per_unit(s, s.front()->size);
    rows->push_back(
        {absl::StrCat("growth: ", op, ", bytes x1/x2/x4",
                      s.empty() ? "" : absl::StrCat(" (", s.front()->tensors, " tensors)")),
         absl::StrCat("s/GiB x4 / x1 = ", Fmt(ratio, ""), "  exp ", Fmt(exponent(s), "")),
         absl::StrFormat("s/GiB x4 <= %.2f x x1", kLinearBytes),
         Verdict(ratio ? std::optional<bool>(*ratio <= kLinearBytes) : std::nullopt)});
    rows->push_back({"  seconds", seconds_text(s, 1, " s"), "", ""});
    std::optional<double> rss_lo, rss_hi;
    if (s.size() >= 2) {
      rss_lo = s.front()->peak_rss_mib;
      rss_hi = s.back()->peak_rss_mib;
    }
    std::optional<double> rss_limit;
    if (rss_lo) rss_limit = kLinearBytes * *rss_lo + kRssSlackMib;
    rows->push_back(
        {"  ckptd peak RSS (VmHWM)", rss_text(s),
         absl::StrCat("x4 <= 1.25 x x1 + 64 = ", Fmt(rss_limit, " MiB", 0)),
         Verdict(rss_hi && rss_limit ? std::optional<bool>(*rss_hi <= *rss_limit) : std::nullopt)});
  }
  for (const char* op : {"upload", "fetch"}) {
    const auto s = GrowthSeries("tensors", op);
    const std::optional<double> ratio = s.empty() ? std::nullopt : per_unit(s, 1000);
    rows->push_back(
        {absl::StrCat("growth: ", op, ", tensors 100/1,000/20,000",
                      s.empty() ? "" : absl::StrFormat(" (%.0f MiB)", s.front()->bytes / kMiB)),
         absl::StrCat("s/tensor 20,000 / 1,000 = ", Fmt(ratio, ""), "  exp ", Fmt(exponent(s), "")),
         absl::StrFormat("<= %.0f", kNearLinear),
         Verdict(ratio ? std::optional<bool>(*ratio <= kNearLinear) : std::nullopt)});
    rows->push_back({"  seconds", seconds_text(s, 1, " s"), "", ""});
    rows->push_back({"  ckptd peak RSS (VmHWM)", rss_text(s), "", ""});
  }
  const auto s = GrowthSeries("ranks", "deps");
  const std::optional<double> ratio = s.empty() ? std::nullopt : per_unit(s, 512);
  rows->push_back(
      {"growth: deps --all, dst ranks 8/64/512/4,096",
       absl::StrCat("s/rank 4,096 / 512 = ", Fmt(ratio, ""), "  exp ", Fmt(exponent(s), "")),
       absl::StrFormat("<= %.0f", kNearLinear),
       Verdict(ratio ? std::optional<bool>(*ratio <= kNearLinear) : std::nullopt)});
  rows->push_back({"  milliseconds", seconds_text(s, 1000, " ms"), "", ""});
}

}  // namespace ckpt::bench
