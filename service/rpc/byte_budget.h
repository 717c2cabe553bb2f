// Limits on the Fetch bytes queued for sending: the server-wide ByteBudget and each stream's
// share of the per-stream amount.
#ifndef CKPT_SERVICE_RPC_BYTE_BUDGET_H_
#define CKPT_SERVICE_RPC_BYTE_BUDGET_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

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

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_BYTE_BUDGET_H_
