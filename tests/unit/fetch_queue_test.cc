// The Fetch queue limits of byte_budget.h: the server-wide ByteBudget, each stream's share of
// --stream-inflight-mib, and the StreamWatch that checks open streams.
#include <atomic>
#include <cstdint>

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

TEST(ByteBudgetTest, WaitersAreWokenOnceByTheNextReleaseOrAtOnceWhenEmpty) {
  ByteBudget budget(4);
  int woken = 0;
  budget.Wait([&] { ++woken; });  // empty: right away
  EXPECT_EQ(woken, 1);
  ASSERT_TRUE(budget.TryAcquire(4));
  budget.Wait([&] { ++woken; });
  budget.Wait([&] { ++woken; });
  EXPECT_EQ(woken, 1);
  budget.Release(1);
  EXPECT_EQ(woken, 3);
  budget.Release(1);  // each waiter is called once
  EXPECT_EQ(woken, 3);
  EXPECT_EQ(budget.in_use(), 2);
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
