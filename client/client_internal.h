// Private parts of CkptClient shared by its implementation files (client.cc, client_upload.cc,
// client_fetch.cc, client_export.cc). Not part of the library's interface: include client.h.
#ifndef CKPT_CLIENT_CLIENT_INTERNAL_H_
#define CKPT_CLIENT_CLIENT_INTERNAL_H_

#include <cstddef>
#include <functional>
#include <mutex>
#include <set>
#include <string_view>

#include "absl/status/status.h"
#include "client/client.h"
#include "grpcpp/client_context.h"

namespace ckpt {

// `status` with `prefix` put before its message; the code is kept.
absl::Status WithPrefix(const absl::Status& status, std::string_view prefix);

// The streams of one call over several ranks (UploadDirectory, ExportRanks): the first failure
// cancels every registered stream and keeps new ones from starting. Thread-safe.
class CkptClient::CancelGroup {
 public:
  // False when the group is already cancelled: the caller must not start its stream.
  bool Add(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancelled_) return false;
    active_.insert(context);
    return true;
  }
  // Must be called before `context` is destroyed.
  void Remove(grpc::ClientContext* context) {
    std::lock_guard<std::mutex> lock(mu_);
    active_.erase(context);
  }
  void CancelAll() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    // TryCancel only flags the call; it never blocks, so holding mu_ is fine.
    for (grpc::ClientContext* context : active_) context->TryCancel();
  }

  // Runs `task(i)` for every i in [0, count) on min(count, parallelism) threads, each taking the
  // next index until none is left, and returns when all threads ended. A failing task cancels the
  // group (the other tasks' streams end, and tasks that start later must fail at once through
  // Membership) and ends its thread. Returns the first failure, which is the cause: the failures
  // it provoked in other tasks come later. `parallelism` must be at least 1.
  absl::Status RunTasks(size_t count, int parallelism,
                        const std::function<absl::Status(size_t index)>& task);

  // Registers `context` in `group` (may be null: then always joined) for its own lifetime, which
  // must end before `context` is destroyed.
  class Membership {
   public:
    Membership(CancelGroup* group, grpc::ClientContext* context)
        : group_(group), context_(context), joined_(group == nullptr || group->Add(context)) {}
    ~Membership() {
      if (group_ != nullptr && joined_) group_->Remove(context_);
    }
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

    // False when the group was already cancelled: the call must not start.
    bool joined() const { return joined_; }

   private:
    CancelGroup* const group_;
    grpc::ClientContext* const context_;
    const bool joined_;
  };

 private:
  std::mutex mu_;
  bool cancelled_ = false;                 // guarded by mu_
  std::set<grpc::ClientContext*> active_;  // guarded by mu_
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_CLIENT_INTERNAL_H_
