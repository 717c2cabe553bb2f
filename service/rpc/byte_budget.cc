#include "service/rpc/byte_budget.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"

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

absl::Duration StreamWatch::PeriodFor(absl::Duration stall_timeout) {
  if (stall_timeout <= absl::ZeroDuration()) return absl::Seconds(1);  // only EndAll matters
  return std::clamp(stall_timeout / 4, absl::Milliseconds(10), absl::Seconds(1));
}

StreamWatch::StreamWatch(absl::Duration period) : period_(period) {
  thread_ = std::thread([this] { Loop(); });
}

StreamWatch::~StreamWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamWatch::Add(Check check) {
  std::lock_guard<std::mutex> lock(mu_);
  checks_.push_back(std::move(check));
}

void StreamWatch::EndAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ending_ = true;
  }
  RunChecks(true);
}

int64_t StreamWatch::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(checks_.size());
}

void StreamWatch::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(period_));
    if (stop_) break;
    const bool ending = ending_;
    lock.unlock();
    RunChecks(ending);
    lock.lock();
  }
}

void StreamWatch::RunChecks(bool ending) {
  std::lock_guard<std::mutex> run(run_mu_);
  std::list<Check> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(checks_);
  }
  const absl::Time now = absl::Now();
  for (auto it = batch.begin(); it != batch.end();) {
    it = (*it)(now, ending) ? std::next(it) : batch.erase(it);
  }
  std::lock_guard<std::mutex> lock(mu_);
  checks_.splice(checks_.end(), batch);
}

}  // namespace ckpt
