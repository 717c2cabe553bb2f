#include "service/rpc/byte_budget.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/time/clock.h"

namespace ckpt {

bool ByteBudget::TryAcquire(int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!waiters_.empty() || !FitsLocked(n)) return false;
  used_ += n;
  return true;
}

bool ByteBudget::AcquireOrWait(int64_t n, std::function<void()> granted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (waiters_.empty() && FitsLocked(n)) {
    used_ += n;
    return true;
  }
  waiters_.push_back({n, std::move(granted)});
  return false;
}

void ByteBudget::Release(int64_t n) {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= n;
    // Strictly in order: a large request at the front is not overtaken by smaller ones behind it
    // (which could otherwise keep it waiting for ever).
    while (!waiters_.empty() && FitsLocked(waiters_.front().bytes)) {
      used_ += waiters_.front().bytes;
      wake.push_back(std::move(waiters_.front().granted));
      waiters_.pop_front();
    }
  }
  for (auto& w : wake) w();
}

int64_t ByteBudget::in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

int64_t ByteBudget::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(waiters_.size());
}

FetchAdmission::Slot& FetchAdmission::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    if (owner_ != nullptr) owner_->Free();
    owner_ = std::exchange(other.owner_, nullptr);
  }
  return *this;
}

FetchAdmission::Slot::~Slot() {
  if (owner_ != nullptr) owner_->Free();
}

uint64_t FetchAdmission::Enter(Admitted admitted) {
  uint64_t ticket;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ticket = next_ticket_++;
    if (!waiters_.empty() || (limit_ > 0 && active_.load(std::memory_order_relaxed) >= limit_)) {
      waiters_.emplace_back(ticket, std::move(admitted));
      ++waited_total_;
      return ticket;
    }
    active_.fetch_add(1, std::memory_order_relaxed);
  }
  admitted(Slot(this));
  return ticket;
}

bool FetchAdmission::Withdraw(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
    if (it->first == ticket) {
      waiters_.erase(it);
      return true;
    }
  }
  return false;
}

void FetchAdmission::Free() {
  Admitted next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiters_.empty()) {
      active_.fetch_sub(1, std::memory_order_relaxed);
      return;
    }
    // The slot passes straight to the oldest waiter: active_ stays the same.
    next = std::move(waiters_.front().second);
    waiters_.pop_front();
  }
  next(Slot(this));
}

int64_t FetchAdmission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(waiters_.size());
}

int64_t FetchAdmission::waited_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waited_total_;
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
