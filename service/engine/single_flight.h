// Concurrent requests for one value computed once. When the workers of a job start together and
// the value they all need is not cached yet (a checkpoint's manifest after ckptd started, the
// plan of a destination strategy), each would otherwise decode or plan it again on its own thread,
// at once: N times the CPU and N copies in memory, and every one of them late. With SingleFlight
// the first caller computes it and the others wait for that result.
//
// Thread-safe. `compute` runs on the first caller's thread with no lock of this object held; the
// callers that arrive while it runs block (they do not compute) and get the same result, a value
// or an error alike. Nothing is remembered once the computation ends: caching the value is the
// caller's business (its cache is checked before Do, and again inside `compute`, so that a caller
// that missed the cache just before the value was cached does not compute it again). `compute`
// must not wait for another SingleFlight computation that may be waiting for this one.
#ifndef CKPT_SERVICE_ENGINE_SINGLE_FLIGHT_H_
#define CKPT_SERVICE_ENGINE_SINGLE_FLIGHT_H_

#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"

namespace ckpt {

template <typename Key, typename Value>
class SingleFlight {
 public:
  // `compute()`, or the result of the call of it for `key` that is running now.
  absl::StatusOr<Value> Do(const Key& key, absl::FunctionRef<absl::StatusOr<Value>()> compute) {
    std::shared_ptr<Flight> flight;
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::shared_ptr<Flight>& slot = flights_[key];
      if (!slot) {
        slot = std::make_shared<Flight>();
        first = true;
      }
      flight = slot;
    }
    if (!first) {
      flight->done.WaitForNotification();
      return flight->result;
    }
    flight->result = compute();
    {
      std::lock_guard<std::mutex> lock(mu_);
      flights_.erase(key);
    }
    flight->done.Notify();  // result is not written after this: waiters read it unlocked
    return flight->result;
  }

 private:
  struct Flight {
    absl::Notification done;
    absl::StatusOr<Value> result = absl::UnknownError("not computed");
  };
  std::mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<Flight>> flights_;  // guarded by mu_
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_SINGLE_FLIGHT_H_
