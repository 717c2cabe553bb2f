#include "client/ckptctl/exit_codes.h"

namespace ckpt {

ExitCode ExitCodeFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return ExitCode::kOk;
    case absl::StatusCode::kNotFound:
      return ExitCode::kNotFound;
    case absl::StatusCode::kAlreadyExists:
      return ExitCode::kAlreadyExists;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return ExitCode::kInvalidArgument;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
      return ExitCode::kUnavailable;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return ExitCode::kPermissionDenied;
    case absl::StatusCode::kDataLoss:
      return ExitCode::kDataLoss;
    default:
      return ExitCode::kOther;
  }
}

std::string_view ExitCodeName(ExitCode code) {
  switch (code) {
    case ExitCode::kOk:
      return "success";
    case ExitCode::kOther:
      return "other";
    case ExitCode::kUsage:
      return "usage";
    case ExitCode::kNotFound:
      return "not found";
    case ExitCode::kAlreadyExists:
      return "already exists";
    case ExitCode::kInvalidArgument:
      return "invalid argument";
    case ExitCode::kUnavailable:
      return "unavailable";
    case ExitCode::kPermissionDenied:
      return "permission denied";
    case ExitCode::kDataLoss:
      return "data loss";
  }
  return "other";
}

}  // namespace ckpt
