// Child processes of the benchmark: the bench binary re-executed in another mode (transport
// server, fetch worker, naive transform baseline), so that each one's CPU and peak memory are its
// own and measured by the kernel (wait4 rusage), not guessed.
#ifndef CKPT_TESTS_BENCH_CHILD_H_
#define CKPT_TESTS_BENCH_CHILD_H_

#include <sys/resource.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

// The running bench executable (/proc/self/exe resolved), for re-executing it.
std::string SelfExe();

// One child process. Owns its pipe ends; the destructor kills (SIGKILL) and reaps a child that
// was not waited for, so an error path never leaves one behind. Not thread-safe.
class Child {
 public:
  struct Options {
    // Give the child a pipe as stdin (write with WriteLine) / stdout (read with ReadLine).
    bool pipe_stdin = false;
    bool pipe_stdout = false;
  };
  static absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::vector<std::string>& argv,
                                                      Options options);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // Writes `line` + '\n' to the child's stdin.
  absl::Status WriteLine(const std::string& line);
  // The next line of the child's stdout (without '\n'); nullopt at end of file.
  std::optional<std::string> ReadLine();
  // Sends `sig` (no-op once waited for).
  void Signal(int sig);

  struct Exit {
    int exit_code = -1;    // exit status, or 128 + signal
    int64_t max_rss_kib = 0;  // ru_maxrss of the child
    double cpu_seconds = 0;   // ru_utime + ru_stime of the child
  };
  // Blocks until the child exits (wait4) and returns its status and peak RSS.
  Exit Wait();

 private:
  Child() = default;

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string read_buffer_;
  bool eof_ = false;
};

// Peak resident set (VmHWM) of a live process, bytes; error when /proc cannot tell.
absl::StatusOr<int64_t> ProcessPeakRssBytes(pid_t pid);

// CPU time (user + system, all threads) a live process has used so far, seconds; error when
// /proc cannot tell. CPU time, unlike wall time, does not count what other tenants of a shared
// machine take (steal), so it compares the work per byte of two programs more steadily.
absl::StatusOr<double> ProcessCpuSeconds(pid_t pid);
// The same for this process (getrusage).
double SelfCpuSeconds();

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_CHILD_H_
