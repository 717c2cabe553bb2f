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

#include <condition_variable>
#include <memory>
#include <mutex>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

template <typename Key, typename Value>
class SingleFlight {
 public:
  // `compute()`, or the result of the call of it for `key` that is running now.
  absl::StatusOr<Value> Do(const Key& key, absl::FunctionRef<absl::StatusOr<Value>()> compute) {
    std::shared_ptr<Flight> flight;
    {
      std::unique_lock<std::mutex> lock(mu_);
      std::shared_ptr<Flight>& slot = flights_[key];
      if (slot) {
        flight = slot;  // another caller computes it: wait for its result
        done_.wait(lock, [&flight] { return flight->done; });
        return flight->result;
      }
      slot = std::make_shared<Flight>();
      flight = slot;
    }
    absl::StatusOr<Value> result = compute();
    {
      std::lock_guard<std::mutex> lock(mu_);
      flight->result = result;
      flight->done = true;
      flights_.erase(key);
    }
    done_.notify_all();
    return result;
  }

 private:
  struct Flight {
    bool done = false;  // guarded by mu_, as is result
    absl::StatusOr<Value> result = absl::UnknownError("not computed");
  };
  std::mutex mu_;
  std::condition_variable done_;                               // notified when a computation ends
  absl::flat_hash_map<Key, std::shared_ptr<Flight>> flights_;  // guarded by mu_
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_SINGLE_FLIGHT_H_
