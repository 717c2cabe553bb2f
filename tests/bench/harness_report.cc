// The harness's output: the results JSON (every figure, the targets and the run's conditions) and
// the printed table (the same figures, each target with PASS / MISS / n/a).
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

constexpr char kCpuRow[] = "  CPU per GiB (server + client)";

// The lower of two limits, when both were measured.
std::optional<double> Limit(const std::optional<double>& a, const std::optional<double>& b) {
  if (a && b) return std::min(*a, *b);
  return std::nullopt;
}

json CpuJson(const std::optional<CpuPerGib>& cpu) {
  if (!cpu) return nullptr;
  return {{"server_cpu_s_per_gib", cpu->server}, {"client_cpu_s_per_gib", cpu->client}};
}

// One fetch case; `limit` is min(transport, storage), the ratio's denominator.
json FetchJson(const FetchResult& f, const std::optional<double>& limit) {
  return {{"case", f.c.name},
          {"gibps", f.gibps},
          {"ratio", limit ? json(f.gibps / *limit) : json(nullptr)},
          {"read_amplification", Opt(f.amplification)},
          {"ranks", f.ranks},
          {"bytes", f.bytes},
          {"seconds", f.seconds},
          {"verified_bytes", f.verified_bytes},
          {"passes_gibps", f.passes_gibps},
          {"warmup_gibps", Opt(f.warmup_gibps)},
          {"cpu", CpuJson(f.cpu)}};
}

// The "passes" row of a phase measured after a warm-up pass: its measured passes, then the
// warm-up's GiB/s.
Row WarmedUpPassesRow(const std::vector<double>& gibps, const std::optional<double>& warmup) {
  return {"  passes (median of; after a warm-up)", PassesWithWarmup(gibps, warmup), "", ""};
}

// Each CPU's speed ({cpu, mega_steps_per_s}), as MeasureCpuSpeeds gives them.
json SpeedsJson(const std::vector<CpuSpeed>& speeds) {
  json out = json::array();
  for (const CpuSpeed& s : speeds) {
    out.push_back({{"cpu", s.cpu}, {"mega_steps_per_s", s.mega_steps_per_s}});
  }
  return out;
}

}  // namespace

std::string Fmt(const std::optional<double>& v, const char* unit, int precision) {
  if (!v) return "null";
  return absl::StrCat(absl::StrFormat("%.*f", precision, *v), unit);
}

std::string Verdict(const std::optional<bool>& pass) {
  if (!pass) return "n/a";
  return *pass ? "PASS" : "MISS";
}

std::string PassesText(const std::vector<double>& gibps) {
  const auto [lo, hi] = std::minmax_element(gibps.begin(), gibps.end());
  return absl::StrFormat("%d, %.2f-%.2f GiB/s", gibps.size(), *lo, *hi);
}

std::string PassesWithWarmup(const std::vector<double>& gibps,
                             const std::optional<double>& warmup) {
  return absl::StrCat(PassesText(gibps), "; warm-up ", Fmt(warmup, ""));
}

// ------------------------------------------------------------------ results JSON

json Harness::Results() const {
  json j;
  j["transport_gibps"] = Opt(transport_gibps_);
  j["transport_cpu"] = CpuJson(transport_cpu_);
  j["transport_passes_gibps"] = transport_passes_;  // in the order run; the limit is their median
  j["verified_read_ceiling"] = {{"gibps", Opt(ceiling_gibps_)},
                                {"ratio_to_transport", Opt(CeilingRatio())},
                                {"cpu", CpuJson(ceiling_cpu_)}};
  j["storage_gibps"] = Opt(storage_gibps_);
  j["storage_passes_gibps"] = storage_runs_;
  const std::optional<double> limit = Limit(transport_gibps_, storage_gibps_);
  j["fetch"] = json::array();
  for (const FetchResult& f : fetch_) j["fetch"].push_back(FetchJson(f, limit));
  j["concurrent"] = ConcurrentJson();
  j["storm"] = StormJson();
  j["transform"] = TransformJson();
  j["deps_all_ranks_ms"] = deps_ ? json(Median(deps_->runs_ms)) : json(nullptr);
  if (deps_) {
    j["deps_detail"] = {{"runs_ms", deps_->runs_ms},
                        {"params", deps_->params},
                        {"src_world", deps_->src_world},
                        {"dst_world", deps_->dst_world},
                        {"max_source_ranks", deps_->max_sources}};
  }
  j["upload"] = UploadJson();
  j["growth"] = GrowthJson();
  j["python"] = PythonJson();
  j["many_tensors"] = ManyTensorsJson();
  j["tls"] = {
      {"gibps", Opt(tls_gibps_)},
      {"plaintext_gibps", Opt(plain_gibps_)},
      {"ratio", tls_gibps_ && plain_gibps_ && *plain_gibps_ > 0 ? json(*tls_gibps_ / *plain_gibps_)
                                                                : json(nullptr)},
      {"passes_gibps", tls_passes_},
      {"plaintext_passes_gibps", plain_passes_},
      {"aes_128_gcm_gibps", Opt(aes128_gcm_gibps_)},
      {"aes_256_gcm_gibps", Opt(aes256_gcm_gibps_)},
      {"cpu", CpuJson(tls_cpu_)},
      {"plaintext_cpu", CpuJson(plain_cpu_)}};
  json targets = json::array();
  for (const Row& r : Table()) {
    if (r.result.empty()) continue;
    targets.push_back({{"metric", r.metric},
                       {"measured", r.measured},
                       {"target", r.target},
                       {"result", r.result}});
  }
  j["targets"] = targets;
  j["config"] = ConfigJson();
  j["notes"] = notes_;
  j["errors"] = errors_;
  return j;
}

json Harness::ConcurrentJson() const {
  return {{"workers", kWorkers},
          {"gibps", Opt(concurrent_gibps_)},
          {"server_peak_rss_mib", Opt(concurrent_rss_mib_)},
          {"server_stats_peak_rss_mib", Opt(concurrent_stats_rss_mib_)},
          {"store_copied_fraction", Opt(concurrent_copied_fraction_)},
          {"bytes", concurrent_bytes_},
          {"runs_gibps", concurrent_runs_},  // the passes; gibps is their median
          {"warmup_gibps", Opt(concurrent_warmup_gibps_)},
          {"cpu", CpuJson(concurrent_cpu_)},
          {"destination", "row_to_col"}};
}

json Harness::TransformJson() const {
  return {{"seconds", Opt(transform_seconds_)},
          {"peak_rss_mib", Opt(transform_rss_mib_)},
          {"baseline_seconds", Opt(baseline_seconds_)},
          {"baseline_peak_rss_mib", Opt(baseline_rss_mib_)},
          {"cpu_seconds", Opt(transform_cpu_seconds_)},
          {"baseline_cpu_seconds", Opt(baseline_cpu_seconds_)},
          {"output_bytes", Opt(transform_output_bytes_)},
          {"runs_seconds", transform_runs_},  // the passes; seconds is their median
          {"baseline_runs_seconds", baseline_runs_},
          {"disk_floor_seconds", Opt(TransformDiskFloor())}};
}

json Harness::UploadJson() const {
  return {{"gibps", Opt(upload_gibps_)},
          {"disk_write_gibps", Opt(disk_gibps_)},
          {"disk_write_runs_gibps", disk_runs_},  // the passes; disk_write_gibps: median
          {"disk_buffered_write_gibps", Opt(disk_buffered_gibps_)},
          {"cpu", CpuJson(upload_cpu_)},
          {"first_pass_gibps", Opt(upload_first_gibps_)},
          {"first_pass_cpu", CpuJson(upload_first_cpu_)},
          {"first_fetch_gibps", Opt(first_fetch_gibps_)},
          {"store_write_gibps", Opt(store_write_gibps_)},
          {"store_write_cpu_s_per_gib", Opt(store_write_cpu_)}};
}

json Harness::ConfigJson() const {
  return {{"size_gib", size_gib_},
          {"checkpoint", spec_.Describe()},
          {"checkpoint_bytes", spec_.total_bytes},
          {"source_file_bytes", source_file_bytes_},
          {"source_ranks", 8},
          {"message_bytes", kMessageBytes},
          {"cpus", std::thread::hardware_concurrency()},
          {"cpu_model", CpuModel()},
          {"load_average_start", load_at_start_},
          {"load_average_end", LoadAverage()},
          {"cpu_steal_fraction", Opt(StealSince(ticks_at_start_))},
          {"cpu_speeds_start", SpeedsJson(speeds_at_start_)},
          {"cpu_speeds_end", SpeedsJson(speeds_at_end_)},
          {"storage_bytes_read", Opt(storage_bytes_)}};
}

// ------------------------------------------------------------------ the table

std::vector<Row> Harness::Table() const {
  std::vector<Row> rows;
  LimitRows(&rows);
  FetchRows(&rows);
  if (Selected("python")) PythonRows(&rows);
  if (Selected("tls")) TlsRows(&rows);
  if (Selected("concurrent")) ConcurrentRows(&rows);
  if (Selected("storm")) StormRows(&rows);
  if (Selected("transform")) TransformRows(&rows);
  if (Selected("deps")) {
    std::optional<double> ms;
    if (deps_) ms = Median(deps_->runs_ms);
    rows.push_back({"deps --all (4096 dst ranks, 1000 params)", Fmt(ms, " ms", 1), "<= 1000 ms",
                    Verdict(ms ? std::optional<bool>(*ms <= 1000.0) : std::nullopt)});
  }
  UploadRows(&rows);
  if (Selected("many_tensors")) ManyTensorsRows(&rows);
  if (Selected("growth")) GrowthRows(&rows);
  return rows;
}

void Harness::LimitRows(std::vector<Row>* rows) const {
  rows->push_back(
      {"transport limit (1 stream, 1 MiB msgs)", Fmt(transport_gibps_, " GiB/s"), "", ""});
  if (Selected("transport")) {
    if (!transport_passes_.empty()) {
      rows->push_back(
          {"  passes (median of; through the fetches)", PassesText(transport_passes_), "", ""});
    }
    rows->push_back({kCpuRow, CpuText(transport_cpu_), "", ""});
    rows->push_back(
        {"verified-read ceiling (read + xxh3 x2)",
         absl::StrCat(Fmt(ceiling_gibps_, " GiB/s"), "  ratio ", Fmt(CeilingRatio(), "")), "", ""});
    rows->push_back({kCpuRow, CpuText(ceiling_cpu_), "", ""});
  }
  rows->push_back(
      {"storage limit (1 thread, store chunks)", Fmt(storage_gibps_, " GiB/s"), "", ""});
  if (!storage_runs_.empty()) {
    rows->push_back({"  passes (median of)", PassesText(storage_runs_), "", ""});
  }
}

void Harness::FetchRows(std::vector<Row>* rows) const {
  const std::optional<double> limit = Limit(transport_gibps_, storage_gibps_);
  for (const FetchResult& f : fetch_) {
    std::optional<double> ratio;
    if (limit) ratio = f.gibps / *limit;
    rows->push_back({absl::StrCat("fetch ", f.c.name, " (", f.ranks,
                                  f.ranks == 1 ? " rank" : " ranks", ", 1 worker)"),
                     absl::StrCat(Fmt(f.gibps, " GiB/s"), "  ratio ", Fmt(ratio, "")),
                     "ratio >= 0.85",
                     Verdict(ratio ? std::optional<bool>(*ratio >= 0.85) : std::nullopt)});
    rows->push_back({absl::StrCat("  read amplification (", f.c.split_kind, ")"),
                     Fmt(f.amplification, "", 3), absl::StrFormat("<= %.2f", f.c.max_amplification),
                     Verdict(f.amplification ? std::optional<bool>(*f.amplification <=
                                                                   f.c.max_amplification + 1e-9)
                                             : std::nullopt)});
    rows->push_back({kCpuRow, CpuText(f.cpu), "", ""});
    if (!f.passes_gibps.empty()) {
      rows->push_back(WarmedUpPassesRow(f.passes_gibps, f.warmup_gibps));
    }
  }
}

void Harness::TlsRows(std::vector<Row>* rows) const {
  std::optional<double> ratio;
  if (tls_gibps_ && plain_gibps_ && *plain_gibps_ > 0) ratio = *tls_gibps_ / *plain_gibps_;
  rows->push_back({"fetch merged over TLS + token / plaintext",
                   absl::StrCat(Fmt(tls_gibps_, " GiB/s"), " / ", Fmt(plain_gibps_, " GiB/s"),
                                "  ratio ", Fmt(ratio, "")),
                   "ratio >= 0.7",
                   Verdict(ratio ? std::optional<bool>(*ratio >= 0.7) : std::nullopt)});
  if (!tls_passes_.empty() && !plain_passes_.empty()) {
    rows->push_back({"  passes TLS; plaintext (after a warm-up each)",
                     absl::StrCat(PassesText(tls_passes_), "; ", PassesText(plain_passes_)), "",
                     ""});
  }
  // The arithmetic. ckptd and the client share the machine's cores, so a fetch runs at most at
  // the cores over the CPU seconds one GiB costs both processes together. Of TLS's added CPU,
  // encrypting every byte on the server and decrypting it on the client cost 2 / aes
  // (AES-256-GCM: the first TLS 1.3 suite OpenSSL offers); the rest is gRPC's TLS framing (copies
  // into and out of 16 KiB records). With nothing but AES added, a TLS fetch could run at most at
  // cores / (plaintext CPU + 2 / aes): over the plaintext rate measured, that caps the ratio. At
  // the plaintext pass's own use of the cores the cap is plaintext / (plaintext + 2 / aes), and
  // with TLS's measured CPU it is plaintext CPU / TLS CPU.
  rows->push_back(
      {"  AES-GCM, 1 core (128 / 256-bit)",
       absl::StrCat(Fmt(aes128_gcm_gibps_, ""), " / ", Fmt(aes256_gcm_gibps_, " GiB/s")), "", ""});
  rows->push_back({"  CPU per GiB TLS; plaintext",
                   absl::StrCat(CpuText(tls_cpu_), "; ", CpuText(plain_cpu_)), "", ""});
  if (!tls_cpu_ || !plain_cpu_ || !aes256_gcm_gibps_ || *aes256_gcm_gibps_ <= 0) return;
  const double plain = plain_cpu_->server + plain_cpu_->client;
  const double tls = tls_cpu_->server + tls_cpu_->client;
  const double aes = 2.0 / *aes256_gcm_gibps_;
  rows->push_back({"  TLS CPU added per GiB; of it AES both ends",
                   absl::StrFormat("%.2f s; %.2f s (2 / aes256)", tls - plain, aes), "", ""});
  if (plain_gibps_ && *plain_gibps_ > 0) {
    const double cores = std::thread::hardware_concurrency();
    rows->push_back({"  bound from AES alone, all cores busy",
                     absl::StrFormat("%.2f (%.0f cores / (plain CPU + 2/aes) / plain GiB/s)",
                                     std::min(1.0, cores / (plain + aes) / *plain_gibps_), cores),
                     "", ""});
  }
  rows->push_back({"  bound from AES alone: plain / (plain + 2/aes)",
                   absl::StrFormat("%.2f", plain / (plain + aes)), "", ""});
  rows->push_back({"  bound from CPU measured: plain CPU / TLS CPU",
                   absl::StrFormat("%.2f", tls > 0 ? plain / tls : 0.0), "", ""});
}

void Harness::ConcurrentRows(std::vector<Row>* rows) const {
  std::optional<double> need;
  if (transport_gibps_) need = 0.8 * *transport_gibps_;
  rows->push_back(
      {absl::StrCat("concurrent (", kWorkers, " workers, row->col, median)"),
       Fmt(concurrent_gibps_, " GiB/s"), absl::StrCat(">= 0.8 x transport = ", Fmt(need, " GiB/s")),
       Verdict(concurrent_gibps_ && need ? std::optional<bool>(*concurrent_gibps_ >= *need)
                                         : std::nullopt)});
  if (!concurrent_runs_.empty()) {
    rows->push_back(WarmedUpPassesRow(concurrent_runs_, concurrent_warmup_gibps_));
  }
  rows->push_back({"  CPU per GiB (server + all workers)", CpuText(concurrent_cpu_), "", ""});
  rows->push_back(
      {"  store reads as copies (map budget)", Fmt(concurrent_copied_fraction_, "", 2), "", ""});
  rows->push_back({"  ckptd peak RSS (VmHWM)", Fmt(concurrent_rss_mib_, " MiB", 0), "<= 512 MiB",
                   Verdict(concurrent_rss_mib_ ? std::optional<bool>(*concurrent_rss_mib_ <= 512.0)
                                               : std::nullopt)});
}

void Harness::TransformRows(std::vector<Row>* rows) const {
  std::optional<double> speedup, rss_ratio;
  if (transform_seconds_ && baseline_seconds_) speedup = *baseline_seconds_ / *transform_seconds_;
  if (transform_rss_mib_ && baseline_rss_mib_) {
    rss_ratio = *transform_rss_mib_ / *baseline_rss_mib_;
  }
  rows->push_back({"transform job (export 8->3, median)", Fmt(transform_seconds_, " s"), "", ""});
  rows->push_back({"  naive baseline (merge+split, median)", Fmt(baseline_seconds_, " s"), "", ""});
  rows->push_back(
      {"  CPU time: ckptd job vs baseline",
       absl::StrCat(Fmt(transform_cpu_seconds_, " s"), " vs ", Fmt(baseline_cpu_seconds_, " s")),
       "", ""});
  // Both write the same output files (and fsync them): writing them at the measured raw disk
  // speed bounds how fast either can be.
  rows->push_back(
      {"  floor: output at raw (direct) disk write", Fmt(TransformDiskFloor(), " s"), "", ""});
  rows->push_back({"  speed-up vs baseline", Fmt(speedup, "x", 1), ">= 5x",
                   Verdict(speedup ? std::optional<bool>(*speedup >= 5.0) : std::nullopt)});
  rows->push_back({"  ckptd peak RSS / baseline peak RSS",
                   absl::StrCat(Fmt(transform_rss_mib_, "", 0), " / ",
                                Fmt(baseline_rss_mib_, " MiB", 0), " = ", Fmt(rss_ratio, "", 3)),
                   "<= 0.2",
                   Verdict(rss_ratio ? std::optional<bool>(*rss_ratio <= 0.2) : std::nullopt)});
}

void Harness::UploadRows(std::vector<Row>* rows) const {
  std::optional<double> need;
  if (disk_gibps_) need = 0.5 * *disk_gibps_;
  rows->push_back({"upload (8 ranks, 4 streams, median pass)", Fmt(upload_gibps_, " GiB/s"),
                   absl::StrCat(">= 0.5 x disk write ", Fmt(disk_gibps_, " GiB/s")),
                   Verdict(upload_gibps_ && need ? std::optional<bool>(*upload_gibps_ >= *need)
                                                 : std::nullopt)});
  if (!disk_runs_.empty()) {
    rows->push_back({"  direct disk write passes (median of)", PassesText(disk_runs_), "", ""});
  }
  rows->push_back(
      {"  buffered disk write (page cache + fsync)", Fmt(disk_buffered_gibps_, " GiB/s"), "", ""});
  rows->push_back({kCpuRow, CpuText(upload_cpu_), "", ""});
  rows->push_back(
      {"  first pass (fresh ckptd and store)", Fmt(upload_first_gibps_, " GiB/s"), "", ""});
  rows->push_back({"    CPU per GiB (server + client)", CpuText(upload_first_cpu_), "", ""});
  rows->push_back(
      {"  first fetch after it (merged, from disk)", Fmt(first_fetch_gibps_, " GiB/s"), "", ""});
  rows->push_back(
      {"  store write limit (store, 1 thread)", Fmt(store_write_gibps_, " GiB/s"), "", ""});
  rows->push_back(
      {"    CPU per GiB (RocksDB's threads incl.)", Fmt(store_write_cpu_, " s"), "", ""});
}

void Harness::Print() const {
  const std::optional<double> steal = StealSince(ticks_at_start_);
  const std::string steal_text = steal ? absl::StrFormat("%.1f%%", 100 * *steal) : "unknown";
  std::printf(
      "\nckptd benchmark: %s, 8 source ranks, loopback, %u CPUs (%s), load average %s -> %s, "
      "CPU steal %s\nCPU speeds (one at a time, fixed loop): start %s; end %s\n",
      spec_.Describe().c_str(), std::thread::hardware_concurrency(), CpuModel().c_str(),
      load_at_start_.c_str(), LoadAverage().c_str(), steal_text.c_str(),
      CpuSpeedText(speeds_at_start_).c_str(), CpuSpeedText(speeds_at_end_).c_str());
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

}  // namespace ckpt::bench
