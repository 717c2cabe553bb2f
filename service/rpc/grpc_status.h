// The one place a grpc::Status is made from an absl::Status (codes are numerically identical).
#ifndef CKPT_SERVICE_RPC_GRPC_STATUS_H_
#define CKPT_SERVICE_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace ckpt {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_GRPC_STATUS_H_
