// ckptctl's exit status: one number per class of failure, so that a script can tell a retryable
// failure from a wrong request without reading the message. The table in docs/ckptctl.md lists
// the same classes; ExitCodeFor is the only mapping from a status code to an exit status.
#ifndef CKPT_CLIENT_CKPTCTL_EXIT_CODES_H_
#define CKPT_CLIENT_CKPTCTL_EXIT_CODES_H_

#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

enum class ExitCode : int {
  kOk = 0,
  // Any failure of no class below: INTERNAL, UNKNOWN, UNIMPLEMENTED, ABORTED (a watched job
  // failed), CANCELLED (a watched job was cancelled).
  kOther = 1,
  // The command line does not parse (unknown option, missing argument); nothing was attempted.
  kUsage = 2,
  // NOT_FOUND: no such checkpoint, strategy, job or file.
  kNotFound = 3,
  // ALREADY_EXISTS: the name or id is taken.
  kAlreadyExists = 4,
  // INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION: the request cannot succeed as given
  // (bad input, a rank outside the world, an output that exists, a running job); retrying it
  // unchanged fails again.
  kInvalidArgument = 5,
  // UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED: the server cannot be reached, is
  // shutting down, did not answer in time, or is out of disk or another limit; retrying later
  // may succeed.
  kUnavailable = 6,
  // UNAUTHENTICATED, PERMISSION_DENIED: no or a bad credential, or not allowed (including a local
  // file ckptctl may not read or write).
  kPermissionDenied = 7,
  // DATA_LOSS: stored or received bytes failed their checksum; nothing wrong was written.
  kDataLoss = 8,
};

// The exit status for a failure with `code`; kOk for absl::StatusCode::kOk. gRPC codes are the
// same numbers (client/client.h's FromGrpcStatus).
ExitCode ExitCodeFor(absl::StatusCode code);
inline int ExitStatusFor(const absl::Status& status) {
  return static_cast<int>(ExitCodeFor(status.code()));
}

// "not found", "unavailable", ...: the class name of the docs' table.
std::string_view ExitCodeName(ExitCode code);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_EXIT_CODES_H_
