#include "service/rpc/grpc_status.h"

#include <string>

namespace ckpt {

static_assert(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT) ==
              static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(static_cast<int>(grpc::StatusCode::NOT_FOUND) ==
              static_cast<int>(absl::StatusCode::kNotFound));
static_assert(static_cast<int>(grpc::StatusCode::OUT_OF_RANGE) ==
              static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(static_cast<int>(grpc::StatusCode::DATA_LOSS) ==
              static_cast<int>(absl::StatusCode::kDataLoss));
static_assert(static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED) ==
              static_cast<int>(absl::StatusCode::kResourceExhausted));
static_assert(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED) ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace ckpt
