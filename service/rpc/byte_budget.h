// Limits on Fetch streams: the server-wide ByteBudget of bytes queued for sending, the
// FetchAdmission of streams producing at once, each stream's share of the per-stream amount,
// and the StreamWatch that ends streams whose client stopped reading
// (so that their bytes return to the budget) or that are still open late in a shutdown.
#ifndef CKPT_SERVICE_RPC_BYTE_BUDGET_H_
#define CKPT_SERVICE_RPC_BYTE_BUDGET_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace ckpt {

// Server-wide cap on fetch bytes queued for sending. Thread-safe.
//
// Fair in arrival order: a request that does not fit joins a FIFO queue, and bytes released are
// granted to the oldest waiter first (taken on its behalf before it is woken), so a stream that
// keeps asking cannot starve one that waits. While anyone waits, TryAcquire refuses everybody
// else: a newcomer queues behind the waiters instead of taking bytes they are owed.
class ByteBudget {
 public:
  explicit ByteBudget(int64_t limit) : limit_(limit) {}
  // Takes `n` bytes if they fit and nobody waits (a single request larger than the limit fits an
  // empty budget).
  bool TryAcquire(int64_t n);
  // Takes `n` bytes now (true, `granted` not called) or queues the request (false): once the
  // bytes are free and every older waiter has had its bytes, they are taken for this request and
  // `granted` is called, once, on the thread that released them, without the budget's lock. The
  // caller then owns the `n` bytes and must Release them, also when it no longer needs them.
  bool AcquireOrWait(int64_t n, std::function<void()> granted);
  // Returns bytes and grants them to the oldest waiters that now fit.
  void Release(int64_t n);
  int64_t in_use() const;
  // Requests waiting now.
  int64_t waiting() const;

 private:
  struct Waiter {
    int64_t bytes;
    std::function<void()> granted;
  };
  // Whether `n` more bytes fit now (mu_ held).
  bool FitsLocked(int64_t n) const { return used_ == 0 || used_ + n <= limit_; }

  mutable std::mutex mu_;
  const int64_t limit_;
  int64_t used_ = 0;
  std::deque<Waiter> waiters_;  // oldest first
};

// Server-wide limit on the Fetch streams that produce at once (--max-active-fetches). A stream
// beyond the limit waits, in arrival order, for a slot instead of failing; a slot freed goes to
// the oldest waiter. Waiting costs a few hundred bytes (the request and the call's state), so the
// server's memory is bounded by the admitted streams however many are open. Thread-safe.
class FetchAdmission {
 public:
  // An admitted stream's slot, given back when destroyed (move-only).
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&& other) noexcept : owner_(std::exchange(other.owner_, nullptr)) {}
    Slot& operator=(Slot&& other) noexcept;
    ~Slot();
    explicit operator bool() const { return owner_ != nullptr; }

   private:
    friend class FetchAdmission;
    explicit Slot(FetchAdmission* owner) : owner_(owner) {}
    FetchAdmission* owner_ = nullptr;
  };
  using Admitted = std::function<void(Slot)>;

  // `limit` <= 0: no limit.
  explicit FetchAdmission(int64_t limit) : limit_(limit) {}
  FetchAdmission(const FetchAdmission&) = delete;
  FetchAdmission& operator=(const FetchAdmission&) = delete;

  // Admits the caller: `admitted` is called with its slot at once (on this thread) when one is
  // free and nobody waits, otherwise later, on the thread that frees a slot, without the lock
  // held. Returns a ticket for Withdraw.
  uint64_t Enter(Admitted admitted);
  // Removes a waiting request (a call cancelled or ended while it waited): true when it was still
  // waiting (its `admitted` will never be called), false when it was admitted already.
  bool Withdraw(uint64_t ticket);

  int64_t limit() const { return limit_; }
  // Streams admitted now (lock-free), waiting now, and those ever made to wait (monotonic).
  int64_t active() const { return active_.load(std::memory_order_relaxed); }
  int64_t waiting() const;
  int64_t waited_total() const;

 private:
  void Free();

  const int64_t limit_;
  mutable std::mutex mu_;
  std::atomic<int64_t> active_{0};  // written under mu_; read without it
  int64_t waited_total_ = 0;
  uint64_t next_ticket_ = 1;
  std::deque<std::pair<uint64_t, Admitted>> waiters_;  // oldest first
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
