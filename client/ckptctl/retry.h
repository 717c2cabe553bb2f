// Retries of ckptctl commands while ckptd is unavailable: --wait-for-server DURATION, and a few
// bounded retries with exponential backoff and jitter for idempotent commands, so that a
// program started before ckptd (an init container) or during its restart still succeeds.
#ifndef CKPT_CLIENT_CKPTCTL_RETRY_H_
#define CKPT_CLIENT_CKPTCTL_RETRY_H_

#include <functional>
#include <memory>
#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace ckpt {

struct RetryOptions {
  // --wait-for-server: how long ckptctl keeps trying while the server is UNAVAILABLE: every
  // command waits that long for the channel to become ready before its first call, and an
  // idempotent one is also tried again within that time. Zero (default): no waiting.
  absl::Duration wait_for_server = absl::ZeroDuration();
  // Without wait_for_server: attempts in all of an idempotent command (the first included).
  int attempts_without_wait = 3;
  // Backoff before the n-th retry: initial_backoff * 2^(n-1), at most max_backoff, times a
  // random factor in [0.5, 1.5) so that many clients do not retry in step.
  absl::Duration initial_backoff = absl::Milliseconds(250);
  absl::Duration max_backoff = absl::Seconds(5);
};

// The backoff before retry `retry` (1 for the first) with `unit_random` in [0, 1). Pure.
absl::Duration RetryBackoff(const RetryOptions& options, int retry, double unit_random);

// Makes the client of one attempt. A positive `connect_timeout` asks it to wait up to that long
// for the channel to be ready (ClientOptions::connect_timeout), failing with UNAVAILABLE.
using ConnectFn =
    std::function<absl::StatusOr<std::unique_ptr<CkptClient>>(absl::Duration connect_timeout)>;
// One attempt of the command.
using AttemptFn = std::function<absl::Status(CkptClient& client)>;

// Runs `attempt` with a client from `connect` (a fresh one for each attempt, so that a channel
// in reconnect backoff does not delay a retry). An attempt that fails with UNAVAILABLE is run
// again, after RetryBackoff, when `idempotent` (up to attempts_without_wait attempts, or until
// wait_for_server has passed, the last attempt at that deadline); a failure to connect (nothing
// was sent) is retried within wait_for_server for any command. `before_retry` (may be null) runs
// before each new attempt, e.g. to discard the failed attempt's output. When waiting, one line on
// `err` says so. Returns the last status. Not thread-safe.
absl::Status RunWithRetries(const RetryOptions& options, bool idempotent, const ConnectFn& connect,
                            const AttemptFn& attempt, const std::function<void()>& before_retry,
                            std::ostream& err);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_RETRY_H_
