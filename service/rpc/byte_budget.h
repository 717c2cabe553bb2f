// Limits on the Fetch bytes queued for sending: the server-wide ByteBudget, each stream's share
// of the per-stream amount, and the StreamWatch that ends streams whose client stopped reading
// (so that their bytes return to the budget) or that are still open late in a shutdown.
#ifndef CKPT_SERVICE_RPC_BYTE_BUDGET_H_
#define CKPT_SERVICE_RPC_BYTE_BUDGET_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"

namespace ckpt {

// Server-wide cap on fetch bytes queued for sending. Thread-safe.
class ByteBudget {
 public:
  explicit ByteBudget(int64_t limit) : limit_(limit) {}
  // Takes `n` bytes if they fit (a single request larger than the limit fits an empty budget).
  bool TryAcquire(int64_t n);
  // Returns bytes and wakes the streams waiting for room.
  void Release(int64_t n);
  // Calls `wake` once when bytes are next released.
  void Wait(std::function<void()> wake);
  int64_t in_use() const;

 private:
  mutable std::mutex mu_;
  const int64_t limit_;
  int64_t used_ = 0;
  std::vector<std::function<void()>> waiters_;
};

// The bytes one Fetch stream may queue for sending while `active_streams` Fetch streams are open:
// an equal share of `stream_bytes_in_flight`, the most a lone stream queues. A stream always
// queues at least one message, however small its share.
int64_t FetchQueueShare(int64_t stream_bytes_in_flight, int64_t active_streams);

// Open streams, checked by one thread every `period`: a check finds out whether its stream made
// no progress for too long and ends it. EndAll() tells every stream, now and from then on, that
// the server is about to stop. Thread-safe; checks run on the watch's thread (or the caller of
// EndAll) without its lock held, so they may take their stream's locks. The destructor joins the
// thread; checks must not outlive what they reference (hold weak pointers).
class StreamWatch {
 public:
  // Called with the current time and whether the server is ending its streams; returns false
  // once its stream needs no more checks (it is done).
  using Check = std::function<bool(absl::Time now, bool ending)>;

  // A check period of a quarter of `stall_timeout`, between 10 ms and 1 s.
  static absl::Duration PeriodFor(absl::Duration stall_timeout);

  explicit StreamWatch(absl::Duration period);
  ~StreamWatch();
  StreamWatch(const StreamWatch&) = delete;
  StreamWatch& operator=(const StreamWatch&) = delete;

  void Add(Check check);
  // Runs every check with `ending` true now, and every later check too.
  void EndAll();
  // Streams being watched.
  int64_t size() const;

 private:
  void Loop();
  // Runs the checks once, outside the lock, and keeps those that return true.
  void RunChecks(bool ending);

  const absl::Duration period_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::list<Check> checks_;  // guarded by mu_
  bool ending_ = false;      // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  std::mutex run_mu_;        // one RunChecks at a time
  std::thread thread_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_BYTE_BUDGET_H_
