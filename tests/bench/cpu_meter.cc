#include "tests/bench/cpu_meter.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

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

std::vector<CpuSpeed> MeasureCpuSpeeds(double seconds) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return {};
  std::vector<CpuSpeed> speeds;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed)) continue;
    std::optional<double> rate;
    // One CPU at a time, so that the threads do not compete; the caller's own affinity is kept.
    std::thread([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      if (::pthread_setaffinity_np(::pthread_self(), sizeof(one), &one) != 0) return;
      // A dependent chain (each step needs the last): its rate is the core's speed, not memory's.
      uint64_t x = 1;
      int64_t steps = 0;
      const auto start = std::chrono::steady_clock::now();
      double elapsed = 0;
      do {
        for (int i = 0; i < (1 << 20); ++i) {
          x = x * 6364136223846793005ULL + 1442695040888963407ULL;
          asm volatile("" : "+r"(x));  // opaque to the compiler, which so keeps every step
        }
        steps += 1 << 20;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < seconds);
      rate = static_cast<double>(steps) / elapsed / 1e6;
    }).join();
    if (rate) speeds.push_back({cpu, *rate});
  }
  return speeds;
}

std::string CpuSpeedText(const std::vector<CpuSpeed>& speeds) {
  if (speeds.empty()) return "unknown";
  std::string text;
  double slowest = speeds.front().mega_steps_per_s, fastest = slowest;
  for (const CpuSpeed& s : speeds) {
    absl::StrAppendFormat(&text, "%scpu%d %.0f", text.empty() ? "" : ", ", s.cpu,
                          s.mega_steps_per_s);
    slowest = std::min(slowest, s.mega_steps_per_s);
    fastest = std::max(fastest, s.mega_steps_per_s);
  }
  absl::StrAppendFormat(&text, " M steps/s (slowest %.2f of fastest)", slowest / fastest);
  return text;
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
