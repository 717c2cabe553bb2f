#include "tests/testing/file_size_limit.h"

namespace ckpt::testing {

ScopedFileSizeLimit::ScopedFileSizeLimit(uint64_t bytes) {
  struct sigaction ignore = {};
  ignore.sa_handler = SIG_IGN;
  ignoring_ = ::sigaction(SIGXFSZ, &ignore, &old_action_) == 0;
  if (!ignoring_ || ::getrlimit(RLIMIT_FSIZE, &old_limit_) != 0) return;
  struct rlimit limit = old_limit_;
  limit.rlim_cur = static_cast<rlim_t>(bytes);
  limited_ = ::setrlimit(RLIMIT_FSIZE, &limit) == 0;
}

ScopedFileSizeLimit::~ScopedFileSizeLimit() {
  if (limited_) (void)::setrlimit(RLIMIT_FSIZE, &old_limit_);
  if (ignoring_) (void)::sigaction(SIGXFSZ, &old_action_, nullptr);
}

}  // namespace ckpt::testing
