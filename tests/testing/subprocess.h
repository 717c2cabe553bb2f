// Runs a program as a child process and captures what it prints, for tests that drive the real
// binaries (ckptctl, later ckptd) exactly as a user would.
#ifndef CKPT_TESTS_TESTING_SUBPROCESS_H_
#define CKPT_TESTS_TESTING_SUBPROCESS_H_

#include <chrono>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::testing {

struct SubprocessOptions {
  // The child is killed (SIGKILL) when it has not exited after this long. Default 60 s.
  std::chrono::milliseconds timeout{60'000};
  // Working directory of the child. Empty (default): the caller's.
  std::string working_dir;
};

struct SubprocessResult {
  // The exit status when the child exited normally, else 128 + the signal number (as shells
  // report it).
  int exit_code = -1;
  // The signal that ended the child, 0 when it exited normally.
  int term_signal = 0;
  // True when the child was killed because it exceeded SubprocessOptions::timeout.
  bool timed_out = false;
  std::string stdout_text;
  std::string stderr_text;
};

// Runs argv[0] (an absolute or relative path; PATH is not searched) with arguments argv[1..],
// the caller's environment and /dev/null as stdin, and waits for it. stdout and stderr are
// captured separately through pipes. Errors (INTERNAL / INVALID_ARGUMENT) only when the child
// cannot be started; a failing child is a successful run with a non-zero exit_code.
// Thread-safe: all descriptors are created close-on-exec, so concurrent calls do not leak pipes
// into each other's children.
absl::StatusOr<SubprocessResult> RunSubprocess(const std::vector<std::string>& argv,
                                               const SubprocessOptions& options = {});

// Splits captured output into lines (without their '\n'); a final unterminated line counts.
std::vector<std::string> SplitLines(const std::string& text);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_SUBPROCESS_H_
