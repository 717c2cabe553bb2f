// CPU time per GiB moved, and the machine's load and CPU steal: what tells a slow figure's cause
// on a shared machine. The harness reads CPU time of its server processes from /proc and its own
// with getrusage (tests/bench/child.h).
#ifndef CKPT_TESTS_BENCH_CPU_METER_H_
#define CKPT_TESTS_BENCH_CPU_METER_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ckpt::bench {

// /proc/loadavg's first three fields: other work on the machine skews every figure.
std::string LoadAverage();

// The first processor's "model name" from /proc/cpuinfo and whether it has AVX-512: figures from
// machines "of the same kind" differ with both.
std::string CpuModel();

// The speed of each CPU this process may run on, one after another: a thread pinned to it runs a
// fixed chain of integer multiply-adds for about `seconds`; in millions of steps per second, in
// the order of the CPU numbers. A paravirtualised guest can report no steal while one of its
// vCPUs runs markedly slower than the other (its host core busy with other guests), which moves
// every figure of a run; the report shows these at the start and the end of the run. A CPU the
// thread could not be pinned to is left out.
struct CpuSpeed {
  int cpu = 0;
  double mega_steps_per_s = 0;
};
std::vector<CpuSpeed> MeasureCpuSpeeds(double seconds = 0.1);
// "cpu0 812, cpu1 497 M steps/s (slowest 0.61 of fastest)", or "unknown" without a figure.
std::string CpuSpeedText(const std::vector<CpuSpeed>& speeds);

// /proc/stat's aggregate CPU line: steal (time the hypervisor gave this VM's CPUs to others) and
// the total, in ticks. A shared VM's figures move with its steal.
struct CpuTicks {
  uint64_t steal = 0;
  uint64_t total = 0;
};
CpuTicks ReadCpuTicks();
// Share of CPU time stolen since `start`, if /proc/stat could be read.
std::optional<double> StealSince(const CpuTicks& start);

// CPU seconds per GiB moved, of the serving process and of this (receiving) process: what a
// transfer costs each side, steadier than wall time on a shared VM and telling where a
// throughput gap comes from.
struct CpuPerGib {
  double server = 0;
  double client = 0;
};

// CPU seconds of a server process and of this one, and the bytes moved, summed over several
// spans (passes that other work runs between).
struct CpuTally {
  double server = 0;
  double client = 0;
  int64_t bytes = 0;
  bool complete = true;  // false once a span's server CPU time could not be read

  std::optional<CpuPerGib> PerGib() const;
};

// Measures CpuPerGib over a span: construct at its start, Finish(bytes) (or AddTo) at its end.
// Not thread-safe.
class CpuMeter {
 public:
  explicit CpuMeter(pid_t server);
  // nullopt when the server's CPU time cannot be read (or nothing moved).
  std::optional<CpuPerGib> Finish(int64_t bytes) const;
  // Adds the span's CPU time and `bytes` to `tally`.
  void AddTo(CpuTally* tally, int64_t bytes) const;

 private:
  pid_t server_pid_;
  double client_start_;
  std::optional<double> server_start_;
};

// "server + client" CPU seconds per GiB ("null" without a figure).
std::string CpuText(const std::optional<CpuPerGib>& cpu);

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_CPU_METER_H_
