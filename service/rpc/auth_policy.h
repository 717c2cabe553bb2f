// Who may call what: the one role table of ckpt.v1.CheckpointService. Every method of the service
// descriptor must have an entry (CheckPolicyCoversService, checked when the server starts and by
// the auth test), so a new RPC cannot ship unguarded. Pure data and functions; thread-safe.
#ifndef CKPT_SERVICE_RPC_AUTH_POLICY_H_
#define CKPT_SERVICE_RPC_AUTH_POLICY_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace ckpt {

// Ordered: each role may do everything the roles below it may.
enum class Role { kReader = 1, kWriter = 2, kAdmin = 3 };

// "reader", "writer", "admin".
std::string_view RoleName(Role role);
// The role named `name` (exactly as RoleName spells it), or nullopt.
std::optional<Role> ParseRole(std::string_view name);

// One row of the table.
struct MethodPolicy {
  // Full gRPC method name, "/ckpt.v1.CheckpointService/Fetch".
  std::string_view method;
  // The least role that may call it.
  Role min_role;
  // Changes server state: every call is written to the audit log (denied calls of any method
  // are audited too).
  bool mutating;
};

// The whole table, in the service's declaration order. CancelJob and DeleteJob are `writer` here
// with one more rule applied by their handlers: below `admin`, a principal may cancel or remove
// only jobs it owns (Job.owner); see kOthersJobsRole.
const std::vector<MethodPolicy>& MethodPolicies();
// The role needed to cancel or remove a job submitted by another principal.
inline constexpr Role kOthersJobsRole = Role::kAdmin;

// The row of `full_method`, or null when the table has none (the call must then be refused).
const MethodPolicy* FindMethodPolicy(std::string_view full_method);

// OK when every method of ckpt.v1.CheckpointService (read from the generated descriptor pool) has
// a row and every row names a method of the service; otherwise INTERNAL naming the strays.
absl::Status CheckPolicyCoversService();

// Full method name of `method` ("Fetch") in ckpt.v1.CheckpointService.
std::string FullMethodName(std::string_view method);

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_AUTH_POLICY_H_
