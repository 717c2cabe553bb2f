// The Fetch limits of byte_budget.h: the server-wide ByteBudget (granted in arrival order), the
// FetchAdmission of streams producing at once, each stream's share of --stream-inflight-mib, and
// the StreamWatch that checks open streams.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "service/rpc/byte_budget.h"

namespace ckpt {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

TEST(FetchQueueShareTest, ALoneStreamQueuesEverythingConcurrentStreamsAnEqualShare) {
  EXPECT_EQ(FetchQueueShare(8 * kMiB, 1), 8 * kMiB);
  EXPECT_EQ(FetchQueueShare(8 * kMiB, 2), 4 * kMiB);
  EXPECT_EQ(FetchQueueShare(8 * kMiB, 8), kMiB);
  EXPECT_EQ(FetchQueueShare(8 * kMiB, 3), 8 * kMiB / 3);
  // Many streams: a share below one message still lets each queue one (the producer always
  // queues a message when its queue is empty); the share itself never goes negative.
  EXPECT_EQ(FetchQueueShare(8 * kMiB, 1 << 20), 8);
  EXPECT_EQ(FetchQueueShare(8 * kMiB, int64_t{1} << 40), 0);
  // No stream counted (never so for a running stream, which counts itself): the whole amount.
  EXPECT_EQ(FetchQueueShare(8 * kMiB, 0), 8 * kMiB);
  EXPECT_EQ(FetchQueueShare(8 * kMiB, -1), 8 * kMiB);
}

TEST(ByteBudgetTest, AcquiresWithinTheLimitAndOneOversizedRequestWhenEmpty) {
  ByteBudget budget(10);
  EXPECT_TRUE(budget.TryAcquire(6));
  EXPECT_TRUE(budget.TryAcquire(4));
  EXPECT_FALSE(budget.TryAcquire(1));
  EXPECT_EQ(budget.in_use(), 10);
  budget.Release(10);
  EXPECT_EQ(budget.in_use(), 0);
  // A message larger than the whole budget still goes, alone.
  EXPECT_TRUE(budget.TryAcquire(25));
  EXPECT_FALSE(budget.TryAcquire(1));
  budget.Release(25);
  EXPECT_TRUE(budget.TryAcquire(1));
}

TEST(ByteBudgetTest, FreedBytesGoToTheOldestWaiterFirstAndNewcomersQueueBehind) {
  ByteBudget budget(4);
  std::vector<int> granted;
  EXPECT_TRUE(budget.AcquireOrWait(4, [&] { granted.push_back(0); }));  // fits: taken at once
  EXPECT_FALSE(budget.AcquireOrWait(3, [&] { granted.push_back(1); }));
  EXPECT_FALSE(budget.AcquireOrWait(1, [&] { granted.push_back(2); }));
  EXPECT_FALSE(budget.AcquireOrWait(2, [&] { granted.push_back(3); }));
  EXPECT_EQ(budget.waiting(), 3);
  // Room for the 1-byte request, but the 3-byte one is older: nobody jumps the queue, not even
  // a newcomer that fits.
  budget.Release(1);
  EXPECT_TRUE(granted.empty());
  EXPECT_FALSE(budget.TryAcquire(1));
  // Enough for the oldest and the next (3 + 1), taken on their behalf before they are told.
  budget.Release(3);
  EXPECT_EQ(granted, (std::vector<int>{1, 2}));
  EXPECT_EQ(budget.in_use(), 4);
  budget.Release(3);  // the 3-byte grant back: room for the 2-byte waiter
  EXPECT_EQ(granted, (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(budget.in_use(), 3);
  EXPECT_EQ(budget.waiting(), 0);
  budget.Release(3);
  EXPECT_EQ(budget.in_use(), 0);
  // An oversized request waits for an empty budget, then goes alone.
  ASSERT_TRUE(budget.TryAcquire(1));
  EXPECT_FALSE(budget.AcquireOrWait(9, [&] { granted.push_back(4); }));
  budget.Release(1);
  EXPECT_EQ(granted.back(), 4);
  EXPECT_EQ(budget.in_use(), 9);
}

// A stream that keeps asking (many threads acquiring and releasing in a loop) never starves
// one that waits: every request is granted, in order, and the budget is never exceeded.
TEST(ByteBudgetTest, NoWaiterStarvesUnderContention) {
  ByteBudget budget(8);
  std::atomic<int64_t> peak{0};
  std::atomic<int> done{0};
  constexpr int kThreads = 8, kRounds = 2000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        const int64_t n = 1 + (t + i) % 5;
        std::mutex mu;
        std::condition_variable cv;
        bool ok = false;
        if (!budget.AcquireOrWait(n, [&] {
              std::lock_guard<std::mutex> lock(mu);
              ok = true;
              cv.notify_all();
            })) {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return ok; });
        }
        int64_t now = budget.in_use();
        int64_t p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        budget.Release(n);
      }
      ++done;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(done.load(), kThreads);
  EXPECT_LE(peak.load(), 8);
  EXPECT_EQ(budget.in_use(), 0);
  EXPECT_EQ(budget.waiting(), 0);
}

TEST(FetchAdmissionTest, AdmitsInArrivalOrderAndPassesFreedSlotsToTheOldestWaiter) {
  FetchAdmission admission(2);
  std::vector<int> order;
  std::vector<FetchAdmission::Slot> slots(10);
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 10; ++i) {
    tickets.push_back(admission.Enter([&, i](FetchAdmission::Slot slot) {
      order.push_back(i);
      slots[i] = std::move(slot);
    }));
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1}));
  EXPECT_EQ(admission.active(), 2);
  EXPECT_EQ(admission.waiting(), 8);
  EXPECT_EQ(admission.waited_total(), 8);
  // A waiting request withdrawn (its call was cancelled) is skipped and never called.
  EXPECT_TRUE(admission.Withdraw(tickets[2]));
  EXPECT_FALSE(admission.Withdraw(tickets[2]));
  EXPECT_FALSE(admission.Withdraw(tickets[0]));  // admitted already
  slots[1] = FetchAdmission::Slot();             // a slot freed goes to the oldest waiter
  EXPECT_EQ(order, (std::vector<int>{0, 1, 3}));
  slots[0] = FetchAdmission::Slot();
  slots[3] = FetchAdmission::Slot();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 3, 4, 5}));
  // A slot dropped by a call that is gone passes on at once.
  EXPECT_EQ(admission.active(), 2);
  for (int i = 4; i < 10; ++i) slots[i] = FetchAdmission::Slot();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(admission.active(), 0);
  EXPECT_EQ(admission.waiting(), 0);
  // No limit: everyone at once.
  FetchAdmission open(0);
  int admitted = 0;
  std::vector<FetchAdmission::Slot> held;
  for (int i = 0; i < 100; ++i) open.Enter([&](FetchAdmission::Slot s) {
    ++admitted;
    held.push_back(std::move(s));
  });
  EXPECT_EQ(admitted, 100);
  EXPECT_EQ(open.waiting(), 0);
}

// Many more streams than slots, each run by a pool of threads that holds its slot for a while:
// every one is admitted, and never more than the limit at once. (The order of admission is
// checked by the test above, deterministically: here a thread that frees a slot may be
// descheduled before the next waiter's callback records it, however FIFO the hand-over is.)
TEST(FetchAdmissionTest, ManyMoreStreamsThanSlotsAllRunNeverMoreThanTheLimitAtOnce) {
  constexpr int kLimit = 4, kStreams = 200, kRunners = 8;
  FetchAdmission admission(kLimit);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> order;
  std::deque<std::unique_ptr<FetchAdmission::Slot>> admitted;
  int finished = 0, running = 0, peak = 0;
  std::vector<std::thread> runners;
  for (int r = 0; r < kRunners; ++r) {
    runners.emplace_back([&] {
      std::unique_lock<std::mutex> lock(mu);
      while (true) {
        cv.wait(lock, [&] { return !admitted.empty() || finished == kStreams; });
        if (admitted.empty()) return;
        std::unique_ptr<FetchAdmission::Slot> slot = std::move(admitted.front());
        admitted.pop_front();
        peak = std::max(peak, ++running);
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        lock.lock();
        --running;
        ++finished;
        cv.notify_all();
        lock.unlock();
        slot.reset();  // the next waiter's callback runs here, taking mu
        lock.lock();
      }
    });
  }
  for (int i = 0; i < kStreams; ++i) {
    admission.Enter([&, i](FetchAdmission::Slot slot) {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
      admitted.push_back(std::make_unique<FetchAdmission::Slot>(std::move(slot)));
      cv.notify_all();
    });
  }
  for (std::thread& t : runners) t.join();
  EXPECT_EQ(finished, kStreams);
  EXPECT_LE(peak, kLimit);
  EXPECT_GT(admission.waited_total(), 0);
  ASSERT_EQ(order.size(), static_cast<size_t>(kStreams));
  std::sort(order.begin(), order.end());
  for (int p = 0; p < kStreams; ++p) EXPECT_EQ(order[p], p) << "admitted twice or never";
  EXPECT_EQ(admission.active(), 0);
}

TEST(StreamWatchTest, ChecksRunPeriodicallyUntilTheyReturnFalseAndEndAllTellsEveryOne) {
  StreamWatch watch(absl::Milliseconds(10));
  std::atomic<int> runs{0};
  std::atomic<int> ended{0};
  std::atomic<bool> done{false};
  watch.Add([&](absl::Time, bool ending) {
    ++runs;
    if (ending) ++ended;
    return !done.load();
  });
  EXPECT_EQ(watch.size(), 1);
  for (int i = 0; i < 500 && runs < 3; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_GE(runs.load(), 3);
  EXPECT_EQ(ended.load(), 0);
  watch.EndAll();  // runs the check at once, with ending set
  EXPECT_GE(ended.load(), 1);
  done = true;
  for (int i = 0; i < 500 && watch.size() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(watch.size(), 0);
}

TEST(StreamWatchTest, PeriodIsAQuarterOfTheStallTimeoutWithinBounds) {
  EXPECT_EQ(StreamWatch::PeriodFor(absl::Seconds(2)), absl::Milliseconds(500));
  EXPECT_EQ(StreamWatch::PeriodFor(absl::Seconds(60)), absl::Seconds(1));
  EXPECT_EQ(StreamWatch::PeriodFor(absl::Milliseconds(1)), absl::Milliseconds(10));
  EXPECT_EQ(StreamWatch::PeriodFor(absl::ZeroDuration()), absl::Seconds(1));
}

}  // namespace
}  // namespace ckpt
