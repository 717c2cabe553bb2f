#include "tests/bench/cpu_meter.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/bench_common.h"
#include "tests/bench/child.h"

namespace ckpt::bench {

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return absl::StrCat(a, " ", b, " ", c);
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU";
  bool avx512 = false;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = line.substr(0, line.find_first_of(" \t:"));
    if (key == "model" && line.rfind("model name", 0) == 0 && colon + 2 <= line.size()) {
      model = line.substr(colon + 2);
    } else if (key == "flags") {
      avx512 = line.find(" avx512f") != std::string::npos;
      break;  // the first processor's entry says it for all
    }
  }
  return absl::StrCat(model, avx512 ? " (AVX-512)" : " (no AVX-512)");
}

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

std::optional<double> StealSince(const CpuTicks& start) {
  const CpuTicks now = ReadCpuTicks();
  if (now.total <= start.total) return std::nullopt;
  return static_cast<double>(now.steal - start.steal) /
         static_cast<double>(now.total - start.total);
}

std::optional<CpuPerGib> CpuTally::PerGib() const {
  if (!complete || bytes <= 0) return std::nullopt;
  const double gib = static_cast<double>(bytes) / kGiB;
  return CpuPerGib{server / gib, client / gib};
}

CpuMeter::CpuMeter(pid_t server) : server_pid_(server), client_start_(SelfCpuSeconds()) {
  if (auto s = ProcessCpuSeconds(server); s.ok()) server_start_ = *s;
}

std::optional<CpuPerGib> CpuMeter::Finish(int64_t bytes) const {
  CpuTally tally;
  AddTo(&tally, bytes);
  return tally.PerGib();
}

void CpuMeter::AddTo(CpuTally* tally, int64_t bytes) const {
  tally->client += SelfCpuSeconds() - client_start_;
  tally->bytes += bytes;
  auto server = ProcessCpuSeconds(server_pid_);
  if (!server.ok() || !server_start_) {
    tally->complete = false;
    return;
  }
  tally->server += *server - *server_start_;
}

std::string CpuText(const std::optional<CpuPerGib>& cpu) {
  if (!cpu) return "null";
  return absl::StrFormat("%.2f + %.2f s", cpu->server, cpu->client);
}

}  // namespace ckpt::bench
