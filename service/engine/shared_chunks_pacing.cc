// SharedChunks' cohorts and pacing (the file comment of shared_chunks.h): joining a cohort and
// pace group, a member's progress and waits, and the timer that leaves stalled members behind.
#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/hash/hash.h"
#include "absl/time/clock.h"
#include "service/engine/shared_chunks.h"

namespace ckpt {

namespace {

// Erases the expired entries of `map` once it has grown to `*sweep_at`, and sets the next size
// to sweep at.
template <typename Map>
void SweepExpired(Map& map, size_t* sweep_at) {
  if (map.size() < *sweep_at) return;
  for (auto it = map.begin(); it != map.end();) {
    if (it->second.expired()) {
      map.erase(it++);
    } else {
      ++it;
    }
  }
  *sweep_at = std::max<size_t>(64, 2 * map.size());
}

}  // namespace

std::unique_ptr<CohortMember> SharedChunks::JoinCohort(const std::string& key,
                                                       const std::string& pace_key,
                                                       int expected_members) {
  std::shared_ptr<FetchCohort> cohort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cohort = cohorts_[key].lock();
    if (!cohort) {
      cohort = std::make_shared<FetchCohort>();
      cohort->key_hash_ = absl::HashOf(key);
      cohorts_[key] = cohort;
    }
    SweepExpired(cohorts_, &cohort_sweep_at_);
  }
  {
    // Counted under solo_mu_, so that a lone call in progress finishes first. The lone ring goes
    // to the table once two members are open, or for a member of a cohort whose chunks it holds
    // (a replica that starts after the first has finished).
    std::lock_guard<std::mutex> solo(solo_mu_);
    const int open = open_members_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (!ring_.empty() && (open > 1 || RingHasCohortLocked(cohort->key_hash_))) {
      MigrateLoneLocked();
    }
  }
  std::unique_lock<std::mutex> lock(pace_mu_);
  const int64_t now = absl::GetCurrentTimeNanos();
  std::shared_ptr<PaceGroup> group = pace_groups_[pace_key].lock();
  if (!group) {
    group = std::make_shared<PaceGroup>();
    group->key = pace_key;
    group->expected = std::max(1, expected_members);
    group->created_ns = now;
    if (auto it = no_gathering_until_.find(pace_key); it != no_gathering_until_.end()) {
      if (it->second > now) {
        group->gathered = true;
      } else {
        no_gathering_until_.erase(it);
      }
    }
    pace_groups_[pace_key] = group;
  }
  SweepExpired(pace_groups_, &pace_group_sweep_at_);
  ++group->joined;
  // The member keeps its cohort and group alive while it is open.
  std::unique_ptr<CohortMember> member(new CohortMember(this, std::move(cohort), group));
  member->it_ = group->members.insert(group->members.end(), member.get());
  member->cohort_->members_.fetch_add(1, std::memory_order_relaxed);
  member->left_behind_.store(true, std::memory_order_relaxed);  // SetPacingLocked flips it
  SetPacingLocked(*member, true);
  // The last stream of a gathering job frees the others.
  std::vector<std::function<void()>> wake;
  CollectReadyLocked(*group, now, &wake);
  lock.unlock();
  for (auto& w : wake) w();
  return member;
}

CohortMember::CohortMember(SharedChunks* owner, std::shared_ptr<FetchCohort> cohort,
                           std::shared_ptr<PaceGroup> group)
    : owner_(owner),
      cohort_(std::move(cohort)),
      group_(std::move(group)),
      last_progress_ns_(absl::GetCurrentTimeNanos()) {}

CohortMember::~CohortMember() {
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(owner_->pace_mu_);
    owner_->StopWaitingLocked(*this);
    if (!left_behind()) owner_->SetPacingLocked(*this, false);
    group_->members.erase(it_);
    cohort_->members_.fetch_sub(1, std::memory_order_relaxed);
    owner_->open_members_.fetch_sub(1, std::memory_order_relaxed);
    // Those waiting for this member go on.
    owner_->CollectReadyLocked(*group_, absl::GetCurrentTimeNanos(), &wake);
  }
  for (auto& w : wake) w();
}

const FetchCohort* CohortMember::cohort() const { return left_behind() ? nullptr : cohort_.get(); }

void CohortMember::Touch() {
  last_progress_ns_.store(absl::GetCurrentTimeNanos(), std::memory_order_relaxed);
}

void CohortMember::Advanced(int64_t bytes) {
  const int64_t now = absl::GetCurrentTimeNanos();
  last_progress_ns_.store(now, std::memory_order_relaxed);
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard<std::mutex> lock(owner_->pace_mu_);
    position_ += bytes;
    if (left_behind()) {
      // Caught up with the slowest pacing member (another: this one is not pacing): paces with
      // the group again.
      if (position_ >= owner_->SlowestTwoLocked(*group_).first) {
        owner_->SetPacingLocked(*this, true);
      }
    } else {
      owner_->CollectReadyLocked(*group_, now, &wake);
    }
  }
  for (auto& w : wake) w();
}

bool CohortMember::MayProceed(std::function<void()> wake) {
  const int64_t now = absl::GetCurrentTimeNanos();
  std::vector<std::function<void()>> others;
  bool go;
  {
    std::lock_guard<std::mutex> lock(owner_->pace_mu_);
    owner_->StopWaitingLocked(*this);
    go = owner_->MayProceedLocked(*this, now);
    if (!go) {
      wake_ = std::move(wake);
      waiting_it_ = owner_->waiting_.insert(owner_->waiting_.end(), this);
      ++group_->waiting;
      ++owner_->pace_waits_;
      owner_->pace_cv_.notify_all();
    }
    // Members left behind just now may free others of the group too.
    owner_->CollectReadyLocked(*group_, now, &others);
  }
  for (auto& w : others) w();
  return go;
}

int64_t SharedChunks::pace_window() const {
  std::lock_guard<std::mutex> lock(pace_mu_);
  return PaceWindowLocked();
}

int64_t SharedChunks::PaceWindowLocked() const {
  return cache_bytes_ / (2 * std::max(1, pacing_cohorts_));
}

SharedChunks::Slowest SharedChunks::SlowestTwoLocked(PaceGroup& group) const {
  Slowest s;
  for (const CohortMember* m : group.members) {
    if (m->left_behind()) continue;
    s.oldest_progress_ns =
        std::min(s.oldest_progress_ns, m->last_progress_ns_.load(std::memory_order_relaxed));
    if (m->position_ < s.first) {
      s.second = s.first;
      s.first = m->position_;
      s.first_member = m;
    } else if (m->position_ < s.second) {
      s.second = m->position_;
    }
  }
  group.slowest_bound = s.first;
  return s;
}

bool SharedChunks::GatheringLocked(PaceGroup& group, int64_t now_ns) {
  if (group.gathered || group.joined < 2) return false;
  if (group.joined >= group.expected) {
    group.gathered = true;
    return false;
  }
  const int64_t bound_ns = absl::ToInt64Nanoseconds(std::min(straggler_bound_, absl::Seconds(1)));
  if (now_ns - group.created_ns <= bound_ns) return true;
  group.gathered = true;
  if (no_gathering_until_.size() >= 1024) no_gathering_until_.clear();  // a bound, not a policy
  no_gathering_until_[group.key] = now_ns + int64_t{60} * 1'000'000'000;
  return false;
}

bool SharedChunks::MayProceedLocked(CohortMember& m, int64_t now_ns, Slowest* known) {
  if (m.left_behind()) return true;  // reads for itself until it catches up
  PaceGroup& group = *m.group_;
  if (GatheringLocked(group, now_ns) &&
      m.position_ > cache_bytes_ / (2 * int64_t{group.expected})) {
    return false;
  }
  const int64_t window = PaceWindowLocked();
  // Within the window of the bound is within the window of every pacing member: no pass over
  // the group (this runs before every message of every stream).
  if (m.position_ - group.slowest_bound <= window) return true;
  Slowest own;
  if (known == nullptr) {
    own = SlowestTwoLocked(group);
    known = &own;
  }
  const int64_t bound_ns = absl::ToInt64Nanoseconds(straggler_bound_);
  while (true) {
    const int64_t slowest = known->Except(&m);
    if (slowest == std::numeric_limits<int64_t>::max() || m.position_ - slowest <= window) {
      return true;
    }
    // Leave behind the members holding `m` back that made no progress for the bound (a member
    // waiting for its own slower peers is not stalled); none can have if no pacing member's last
    // progress is that old.
    if (now_ns - known->oldest_progress_ns <= bound_ns) return false;
    bool dropped = false;
    for (CohortMember* other : group.members) {
      if (other == &m || other->left_behind() || m.position_ - other->position_ <= window ||
          other->wake_) {
        continue;
      }
      if (now_ns - other->last_progress_ns_.load(std::memory_order_relaxed) > bound_ns) {
        SetPacingLocked(*other, false);
        ++left_behind_;
        dropped = true;
      }
    }
    if (!dropped) return false;
    *known = SlowestTwoLocked(group);
  }
}

void SharedChunks::SetPacingLocked(CohortMember& m, bool pacing) {
  FetchCohort& c = *m.cohort_;
  const int before = c.pacing_.load(std::memory_order_relaxed);
  const int after = before + (pacing ? 1 : -1);
  c.pacing_.store(after, std::memory_order_relaxed);
  m.left_behind_.store(!pacing, std::memory_order_relaxed);
  if (pacing) m.group_->slowest_bound = std::min(m.group_->slowest_bound, m.position_);
  if (before == 0 && after == 1) ++pacing_cohorts_;
  if (before == 1 && after == 0) --pacing_cohorts_;
}

void SharedChunks::CollectReadyLocked(PaceGroup& group, int64_t now_ns,
                                      std::vector<std::function<void()>>* wake) {
  // Called on every member's progress: a group has as many members as its job has ranks
  // fetching now, so the slowest positions are found once and only waiters are checked.
  if (group.waiting == 0) return;
  Slowest slowest = SlowestTwoLocked(group);
  for (CohortMember* m : group.members) {
    if (!m->wake_ || !MayProceedLocked(*m, now_ns, &slowest)) continue;
    wake->push_back(StopWaitingLocked(*m));
  }
}

std::function<void()> SharedChunks::StopWaitingLocked(CohortMember& m) {
  if (!m.wake_) return nullptr;
  std::function<void()> wake = std::exchange(m.wake_, nullptr);
  waiting_.erase(m.waiting_it_);
  --m.group_->waiting;
  return wake;
}

void SharedChunks::PaceLoop() {
  const auto period = std::chrono::nanoseconds(
      std::clamp<int64_t>(absl::ToInt64Nanoseconds(straggler_bound_) / 8, 1'000'000, 100'000'000));
  std::unique_lock<std::mutex> lock(pace_mu_);
  while (!pace_stop_) {
    if (waiting_.empty()) {
      pace_cv_.wait(lock, [&] { return pace_stop_ || !waiting_.empty(); });
      continue;
    }
    pace_cv_.wait_for(lock, period);
    if (pace_stop_) break;
    const int64_t now = absl::GetCurrentTimeNanos();
    std::vector<std::function<void()>> wake;
    // The groups of the waiters (a waiter may be woken, and leave waiting_, in the loop).
    std::vector<std::shared_ptr<PaceGroup>> groups;
    for (CohortMember* m : waiting_) {
      if (groups.empty() || groups.back() != m->group_) groups.push_back(m->group_);
    }
    for (const auto& g : groups) CollectReadyLocked(*g, now, &wake);
    if (wake.empty()) continue;
    lock.unlock();
    for (auto& w : wake) w();
    groups.clear();
    lock.lock();
  }
}

}  // namespace ckpt
