#include "client/ckptctl/retry.h"

#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/duration_text.h"

namespace ckpt {

absl::Duration RetryBackoff(const RetryOptions& options, int retry, double unit_random) {
  absl::Duration backoff = options.initial_backoff;
  for (int i = 1; i < retry && backoff < options.max_backoff; ++i) backoff *= 2;
  backoff = std::min(backoff, options.max_backoff);
  return backoff * (0.5 + std::clamp(unit_random, 0.0, 1.0));
}

absl::Status RunWithRetries(const RetryOptions& options, bool idempotent, const ConnectFn& connect,
                            const AttemptFn& attempt, const std::function<void()>& before_retry,
                            std::ostream& err) {
  const bool waiting = options.wait_for_server > absl::ZeroDuration();
  const absl::Time deadline = absl::Now() + options.wait_for_server;
  std::mt19937_64 random(std::random_device{}());
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  bool announced = false;
  for (int attempts = 1;; ++attempts) {
    // With --wait-for-server, each attempt waits for a ready channel, at most 1 s per channel:
    // a fresh channel then connects at once when the server appears, where an old one may be in
    // gRPC's reconnect backoff.
    const absl::Duration connect_timeout =
        waiting ? absl::Trunc(
                      std::clamp(deadline - absl::Now(), absl::Milliseconds(100), absl::Seconds(1)),
                      absl::Milliseconds(100))
                : absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<CkptClient>> client = connect(connect_timeout);
    const bool connected = client.ok();
    absl::Status status = connected ? attempt(**client) : client.status();
    if (status.code() != absl::StatusCode::kUnavailable) return status;
    // A failed connect sent nothing; a failed call may have had effects unless idempotent.
    const bool may_retry = !connected || idempotent;
    if (!may_retry) return status;
    absl::Duration backoff = RetryBackoff(options, attempts, unit(random));
    if (waiting) {
      if (!announced) {
        err << "ckptctl: server unavailable, retrying for up to "
            << FormatDurationText(options.wait_for_server) << " (--wait-for-server)\n"
            << std::flush;
        announced = true;
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::UnavailableError(absl::StrCat(status.message(), " (gave up after waiting ",
                                                   FormatDurationText(options.wait_for_server),
                                                   ", ", attempts,
                                                   attempts == 1 ? " attempt)" : " attempts)"));
      }
      backoff = std::min(backoff, left);  // one last attempt at the deadline
    } else if (!idempotent || attempts >= options.attempts_without_wait) {
      return status;
    }
    absl::SleepFor(backoff);
    if (before_retry) before_retry();
  }
}

}  // namespace ckpt
