// A scoped cap on the size of files the process writes, for tests of write errors.
#ifndef CKPT_TESTS_TESTING_FILE_SIZE_LIMIT_H_
#define CKPT_TESTS_TESTING_FILE_SIZE_LIMIT_H_

#include <signal.h>
#include <sys/resource.h>

#include <cstdint>

namespace ckpt::testing {

// While it lives, writes past `bytes` of a file fail with EFBIG (RLIMIT_FSIZE, with SIGXFSZ
// ignored so that the process is not killed); both are restored when it is destroyed. Tests check
// ok() first.
class ScopedFileSizeLimit {
 public:
  explicit ScopedFileSizeLimit(uint64_t bytes);
  ~ScopedFileSizeLimit();
  ScopedFileSizeLimit(const ScopedFileSizeLimit&) = delete;
  ScopedFileSizeLimit& operator=(const ScopedFileSizeLimit&) = delete;

  bool ok() const { return limited_; }

 private:
  struct rlimit old_limit_ = {};
  struct sigaction old_action_ = {};
  bool ignoring_ = false;
  bool limited_ = false;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_FILE_SIZE_LIMIT_H_
