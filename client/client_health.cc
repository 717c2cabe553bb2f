// CkptClient::CheckHealth: the standard gRPC health check, called with hand-encoded messages so
// that the client library needs no generated code of grpc.health.v1 (whose descriptors would
// clash with a program that links its own copy).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/client_internal.h"
#include "core/absl_compat.h"
#include "grpcpp/client_context.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"

namespace ckpt {
namespace {

void AppendVarint(uint64_t value, std::string& out) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// HealthCheckResponse { ServingStatus status = 1; }: the status number, 0 (UNKNOWN) when the
// field is absent; nullopt when the bytes are not such a message.
std::optional<uint64_t> ParseServingStatus(const std::string& bytes) {
  uint64_t status = 0;
  size_t i = 0;
  while (i < bytes.size()) {
    const uint8_t tag = static_cast<uint8_t>(bytes[i++]);
    if (tag != 0x08) return std::nullopt;  // only field 1, varint
    uint64_t value = 0;
    int shift = 0;
    while (true) {
      if (i >= bytes.size() || shift > 63) return std::nullopt;
      const uint8_t b = static_cast<uint8_t>(bytes[i++]);
      value |= static_cast<uint64_t>(b & 0x7f) << shift;
      shift += 7;
      if ((b & 0x80) == 0) break;
    }
    status = value;
  }
  return status;
}

}  // namespace

absl::StatusOr<std::string> CkptClient::CheckHealth(const std::string& service) {
  // HealthCheckRequest { string service = 1; }
  std::string request_bytes;
  if (!service.empty()) {
    request_bytes.push_back(0x0a);
    AppendVarint(service.size(), request_bytes);
    request_bytes.append(service);
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  if (options_.unary_timeout != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.unary_timeout));
  }
  static const grpc::internal::RpcMethod kCheck("/grpc.health.v1.Health/Check",
                                                grpc::internal::RpcMethod::NORMAL_RPC);
  const grpc::Status status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      channel_.get(), kCheck, &context, request, &response);
  if (!status.ok()) {
    absl::Status s = Annotate(FromGrpcStatus(status));
    if (s.code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(absl::StrCat(
          "ckptd at ", address_, " has no health status for service \"", service, "\""));
    }
    return s;
  }
  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!response.Dump(&slices).ok()) return absl::InternalError("cannot read the health answer");
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  const std::optional<uint64_t> serving = ParseServingStatus(bytes);
  if (!serving.has_value()) {
    return absl::InternalError(
        absl::StrCat("ckptd at ", address_, " sent a malformed health check answer"));
  }
  switch (*serving) {
    case 1:
      return std::string("SERVING");
    case 2:
      return std::string("NOT_SERVING");
    case 3:
      return std::string("SERVICE_UNKNOWN");
    default:
      return std::string("UNKNOWN");
  }
}

}  // namespace ckpt
