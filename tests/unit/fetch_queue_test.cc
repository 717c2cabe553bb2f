// The Fetch queue limits of byte_budget.h: the server-wide ByteBudget and each stream's
// share of --stream-inflight-mib.
#include <cstdint>

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

}  // namespace
}  // namespace ckpt
