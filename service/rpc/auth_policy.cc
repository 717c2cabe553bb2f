#include "service/rpc/auth_policy.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt.pb.h"
#include "core/absl_compat.h"
#include "google/protobuf/descriptor.h"

namespace ckpt {
namespace {

constexpr std::string_view kServiceName = "ckpt.v1.CheckpointService";

}  // namespace

std::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader:
      return "reader";
    case Role::kWriter:
      return "writer";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

std::optional<Role> ParseRole(std::string_view name) {
  for (Role r : {Role::kReader, Role::kWriter, Role::kAdmin}) {
    if (RoleName(r) == name) return r;
  }
  return std::nullopt;
}

std::string FullMethodName(std::string_view method) {
  return absl::StrCat("/", Sv(kServiceName), "/", Sv(method));
}

const std::vector<MethodPolicy>& MethodPolicies() {
  // reader: read checkpoints, strategies and jobs, fetch. writer: + register strategies, upload,
  // submit transforms, cancel and remove its own jobs. admin: + deletes, others' jobs, server
  // statistics.
  static const std::vector<MethodPolicy> table = {
      {"/ckpt.v1.CheckpointService/PutStrategy", Role::kWriter, true},
      {"/ckpt.v1.CheckpointService/GetStrategy", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/ListStrategies", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/DeleteStrategy", Role::kAdmin, true},
      {"/ckpt.v1.CheckpointService/Upload", Role::kWriter, true},
      {"/ckpt.v1.CheckpointService/ListCheckpoints", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/DescribeCheckpoint", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/DeleteCheckpoint", Role::kAdmin, true},
      {"/ckpt.v1.CheckpointService/Fetch", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/RankDependencies", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/SubmitTransform", Role::kWriter, true},
      {"/ckpt.v1.CheckpointService/GetJob", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/WatchJob", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/CancelJob", Role::kWriter, true},
      {"/ckpt.v1.CheckpointService/ListJobs", Role::kReader, false},
      {"/ckpt.v1.CheckpointService/GetStats", Role::kAdmin, false},
      {"/ckpt.v1.CheckpointService/DeleteJob", Role::kWriter, true},
      {"/ckpt.v1.CheckpointService/Backup", Role::kAdmin, true},
  };
  return table;
}

const MethodPolicy* FindMethodPolicy(std::string_view full_method) {
  for (const MethodPolicy& p : MethodPolicies()) {
    if (p.method == full_method) return &p;
  }
  return nullptr;
}

absl::Status CheckPolicyCoversService() {
  // Linking ckpt.pb.cc registers the file; touching a message's descriptor makes sure of it.
  (void)v1::Job::descriptor();
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          std::string(kServiceName));
  if (service == nullptr) {
    return absl::InternalError(absl::StrCat("service ", Sv(kServiceName), " is not in the pool"));
  }
  std::vector<std::string> missing;
  std::set<std::string> methods;
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string full = FullMethodName(service->method(i)->name());
    methods.insert(full);
    if (FindMethodPolicy(full) == nullptr) missing.push_back(full);
  }
  std::vector<std::string> strays;
  for (const MethodPolicy& p : MethodPolicies()) {
    if (!methods.count(std::string(p.method))) strays.emplace_back(p.method);
  }
  if (missing.empty() && strays.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(
      "the role table (service/rpc/auth_policy.cc) does not match ", Sv(kServiceName),
      missing.empty() ? ""
                      : absl::StrCat(": methods without a role: ", absl::StrJoin(missing, ", ")),
      strays.empty() ? "" : absl::StrCat(": rows of no method: ", absl::StrJoin(strays, ", "))));
}

}  // namespace ckpt
