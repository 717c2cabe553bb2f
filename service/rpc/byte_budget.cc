#include "service/rpc/byte_budget.h"

#include <algorithm>
#include <utility>

namespace ckpt {

bool ByteBudget::TryAcquire(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (used_ > 0 && used_ + n > limit_) return false;
  used_ += n;
  return true;
}

void ByteBudget::Release(int64_t n) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= n;
    wake.swap(waiters_);
  }
  for (auto& w : wake) w();
}

void ByteBudget::Wait(std::function<void()> wake) {
  std::unique_lock<std::mutex> lock(mu_);
  if (used_ == 0) {
    lock.unlock();
    wake();
    return;
  }
  waiters_.push_back(std::move(wake));
}

int64_t ByteBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t FetchQueueShare(int64_t stream_bytes_in_flight, int64_t active_streams) {
  return stream_bytes_in_flight / std::max<int64_t>(1, active_streams);
}

}  // namespace ckpt
