// CkptClient: the channel, unary calls and their error mapping, strategies, checkpoints and
// jobs. Uploads, fetches and the client-side export live in client_upload.cc, client_fetch.cc and
// client_export.cc.
#include "client/client.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/client_internal.h"
#include "client/strategy_files.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/sync_stream.h"

namespace ckpt {
namespace {

// FromGrpcStatus casts the code: that is only correct while both enums number the codes alike.
static_assert(static_cast<int>(grpc::StatusCode::OK) == static_cast<int>(absl::StatusCode::kOk));
static_assert(static_cast<int>(grpc::StatusCode::CANCELLED) ==
              static_cast<int>(absl::StatusCode::kCancelled));
static_assert(static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT) ==
              static_cast<int>(absl::StatusCode::kInvalidArgument));
static_assert(static_cast<int>(grpc::StatusCode::DEADLINE_EXCEEDED) ==
              static_cast<int>(absl::StatusCode::kDeadlineExceeded));
static_assert(static_cast<int>(grpc::StatusCode::NOT_FOUND) ==
              static_cast<int>(absl::StatusCode::kNotFound));
static_assert(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION) ==
              static_cast<int>(absl::StatusCode::kFailedPrecondition));
static_assert(static_cast<int>(grpc::StatusCode::OUT_OF_RANGE) ==
              static_cast<int>(absl::StatusCode::kOutOfRange));
static_assert(static_cast<int>(grpc::StatusCode::UNAVAILABLE) ==
              static_cast<int>(absl::StatusCode::kUnavailable));
static_assert(static_cast<int>(grpc::StatusCode::DATA_LOSS) ==
              static_cast<int>(absl::StatusCode::kDataLoss));
static_assert(static_cast<int>(grpc::StatusCode::UNAUTHENTICATED) ==
              static_cast<int>(absl::StatusCode::kUnauthenticated));

std::chrono::system_clock::time_point DeadlineAfter(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::Status WithPrefix(const absl::Status& status, std::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(Sv(prefix), status.message()));
}

absl::Status CkptClient::CancelGroup::RunTasks(
    size_t count, int parallelism, const std::function<absl::Status(size_t index)>& task) {
  std::mutex mu;
  absl::Status first_error;  // guarded by mu
  std::atomic<size_t> next{0};
  auto worker = [&]() {
    while (true) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      absl::Status status = task(i);
      if (!status.ok()) {
        {
          std::lock_guard<std::mutex> lock(mu);
          // Tasks cancelled because of this failure report CANCELLED; keep the cause.
          if (first_error.ok()) first_error = std::move(status);
        }
        CancelAll();
        return;
      }
    }
  };
  const size_t thread_count = std::min(count, static_cast<size_t>(parallelism));
  std::vector<std::thread> threads;
  threads.reserve(thread_count);
  for (size_t i = 0; i < thread_count; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  return first_error;
}

namespace {

// Adds "authorization: Bearer <token>" to the initial metadata of every call on the channel,
// TLS or not (a plaintext channel carries it too, as loopback tests and sidecar-terminated TLS
// need).
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* const header_;
};

class BearerTokenFactory final : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenFactory(std::string token) : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;  // outlives the channel's interceptors: the channel owns this
};

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The channel's credentials: TLS from the options' files, or plaintext.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options) {
  if (options.tls_ca.empty() && options.tls_cert.empty() && options.tls_key.empty()) {
    return grpc::InsecureChannelCredentials();
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "the TLS client certificate and key go together (mutual TLS needs both)");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.tls_ca.empty()) {
    CKPT_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadSmallFile(options.tls_ca, "TLS CA file"));
  }
  if (!options.tls_cert.empty()) {
    CKPT_ASSIGN_OR_RETURN(ssl.pem_cert_chain,
                          ReadSmallFile(options.tls_cert, "TLS certificate file"));
    CKPT_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadSmallFile(options.tls_key, "TLS key file"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

CkptClient::CkptClient(std::string address, ClientOptions options,
                       std::shared_ptr<grpc::Channel> channel)
    : address_(std::move(address)),
      options_(options),
      channel_(std::move(channel)),
      stub_(v1::CheckpointService::NewStub(channel_)) {}

absl::StatusOr<std::unique_ptr<CkptClient>> CkptClient::Connect(const std::string& address,
                                                                ClientOptions options) {
  if (address.empty()) return absl::InvalidArgumentError("empty server address");
  if (options.unary_timeout <= absl::ZeroDuration() ||
      options.stream_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("client timeouts must be positive");
  }
  if (options.max_receive_message_bytes <= 0) {
    return absl::InvalidArgumentError("max_receive_message_bytes must be positive");
  }
  if (options.stream_window_bytes < 0) {
    return absl::InvalidArgumentError("stream_window_bytes must not be negative");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
  if (options.stream_window_bytes > 0) {
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, options.stream_window_bytes);
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentials(options);
  if (!credentials.ok()) return credentials.status();
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadSmallFile(options.token_file, "token file");
    if (!token.ok()) return token.status();
    const absl::string_view trimmed = absl::StripAsciiWhitespace(*token);
    if (trimmed.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the token file ", options.token_file, " is empty"));
    }
    for (char c : trimmed) {
      if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) {
        return absl::InvalidArgumentError(
            absl::StrCat("the token file ", options.token_file,
                         " must hold one token of printable ASCII characters without spaces"));
      }
    }
    interceptors.push_back(std::make_unique<BearerTokenFactory>(std::string(trimmed)));
  }
  std::shared_ptr<grpc::Channel> channel = grpc::experimental::CreateCustomChannelWithInterceptors(
      address, *credentials, args, std::move(interceptors));
  if (channel == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot create a channel to ", address));
  }
  if (options.connect_timeout > absl::ZeroDuration() &&
      !channel->WaitForConnected(DeadlineAfter(options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("ckptd at ", address, " is not reachable within ",
                                               absl::FormatDuration(options.connect_timeout)));
  }
  return std::unique_ptr<CkptClient>(new CkptClient(address, options, std::move(channel)));
}

absl::Status CkptClient::Annotate(absl::Status status) const {
  // These two mean the server never answered; the address is then the useful context. Other
  // codes carry the server's own message, which already names what failed.
  if (status.code() == absl::StatusCode::kUnavailable ||
      status.code() == absl::StatusCode::kDeadlineExceeded) {
    return WithPrefix(status, absl::StrCat("ckptd at ", address_, ": "));
  }
  // gRPC's own answer for a method the server does not have carries no message.
  if (status.code() == absl::StatusCode::kUnimplemented && status.message().empty()) {
    return absl::UnimplementedError(absl::StrCat(
        "ckptd at ", address_, " does not support this call (is it older than this ckptctl?)"));
  }
  return status;
}

void CkptClient::SetStreamDeadline(grpc::ClientContext* context) const {
  if (options_.stream_timeout != absl::InfiniteDuration()) {
    context->set_deadline(DeadlineAfter(options_.stream_timeout));
  }
}

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> CkptClient::Unary(Method method, const Request& request) {
  grpc::ClientContext context;
  if (options_.unary_timeout != absl::InfiniteDuration()) {
    context.set_deadline(DeadlineAfter(options_.unary_timeout));
  }
  Response response;
  const grpc::Status status = (stub_.get()->*method)(&context, request, &response);
  if (!status.ok()) return Annotate(FromGrpcStatus(status));
  return response;
}

// ---------------------------------------------------------------- strategies

absl::StatusOr<v1::StrategyInfo> CkptClient::PutStrategy(const std::string& name,
                                                         const Strategy& strategy, bool overwrite) {
  v1::PutStrategyRequest request;
  request.set_name(name);
  request.set_content(SerializeStrategy(strategy, StrategyFormat::kBinary));
  request.set_format(v1::STRATEGY_FORMAT_BINARY);
  request.set_overwrite(overwrite);
  CKPT_ASSIGN_OR_RETURN(v1::PutStrategyResponse response,
                        (Unary<v1::PutStrategyRequest, v1::PutStrategyResponse>(
                            &v1::CheckpointService::Stub::PutStrategy, request)));
  return response.info();
}

absl::StatusOr<v1::StrategyInfo> CkptClient::PutStrategyFile(const std::string& name,
                                                             const std::string& path,
                                                             bool overwrite) {
  CKPT_ASSIGN_OR_RETURN(Strategy strategy, LoadStrategyPath(path));
  return PutStrategy(name, strategy, overwrite);
}

absl::StatusOr<RemoteStrategy> CkptClient::GetStrategy(const std::string& name) {
  v1::GetStrategyRequest request;
  request.set_name(name);
  request.set_format(v1::STRATEGY_FORMAT_JSON);
  CKPT_ASSIGN_OR_RETURN(v1::GetStrategyResponse response,
                        (Unary<v1::GetStrategyRequest, v1::GetStrategyResponse>(
                            &v1::CheckpointService::Stub::GetStrategy, request)));
  absl::StatusOr<Strategy> strategy = ParseStrategy(response.content(), StrategyFormat::kJson);
  if (!strategy.ok()) {
    return WithPrefix(strategy.status(), absl::StrCat("strategy ", name, " from the server: "));
  }
  return RemoteStrategy{response.info(), *std::move(strategy)};
}

absl::StatusOr<v1::StrategyInfo> CkptClient::GetStrategyInfo(const std::string& name) {
  v1::GetStrategyRequest request;
  request.set_name(name);
  request.set_info_only(true);
  CKPT_ASSIGN_OR_RETURN(v1::GetStrategyResponse response,
                        (Unary<v1::GetStrategyRequest, v1::GetStrategyResponse>(
                            &v1::CheckpointService::Stub::GetStrategy, request)));
  return std::move(*response.mutable_info());
}

absl::StatusOr<std::vector<v1::StrategyInfo>> CkptClient::ListStrategies() {
  CKPT_ASSIGN_OR_RETURN(v1::ListStrategiesResponse response,
                        (Unary<v1::ListStrategiesRequest, v1::ListStrategiesResponse>(
                            &v1::CheckpointService::Stub::ListStrategies, {})));
  return std::vector<v1::StrategyInfo>(response.strategies().begin(), response.strategies().end());
}

absl::Status CkptClient::DeleteStrategy(const std::string& name) {
  v1::DeleteStrategyRequest request;
  request.set_name(name);
  return Unary<v1::DeleteStrategyRequest, v1::DeleteStrategyResponse>(
             &v1::CheckpointService::Stub::DeleteStrategy, request)
      .status();
}

absl::StatusOr<int64_t> CkptClient::StrategyWorldSize(const std::string& strategy_name) {
  CKPT_ASSIGN_OR_RETURN(const v1::StrategyInfo info, GetStrategyInfo(strategy_name));
  if (info.world_size() < 1) {
    return absl::InternalError(absl::StrCat("ckptd reports a world of ", info.world_size(),
                                            " ranks for strategy ", strategy_name));
  }
  return info.world_size();
}

// ---------------------------------------------------------------- checkpoints

absl::StatusOr<std::vector<v1::CheckpointInfo>> CkptClient::ListCheckpoints() {
  CKPT_ASSIGN_OR_RETURN(v1::ListCheckpointsResponse response,
                        (Unary<v1::ListCheckpointsRequest, v1::ListCheckpointsResponse>(
                            &v1::CheckpointService::Stub::ListCheckpoints, {})));
  return std::vector<v1::CheckpointInfo>(response.checkpoints().begin(),
                                         response.checkpoints().end());
}

absl::StatusOr<v1::DescribeCheckpointResponse> CkptClient::DescribeCheckpoint(
    const std::string& checkpoint_id) {
  v1::DescribeCheckpointRequest request;
  request.set_checkpoint_id(checkpoint_id);
  return Unary<v1::DescribeCheckpointRequest, v1::DescribeCheckpointResponse>(
      &v1::CheckpointService::Stub::DescribeCheckpoint, request);
}

absl::Status CkptClient::DeleteCheckpoint(const std::string& checkpoint_id) {
  v1::DeleteCheckpointRequest request;
  request.set_checkpoint_id(checkpoint_id);
  return Unary<v1::DeleteCheckpointRequest, v1::DeleteCheckpointResponse>(
             &v1::CheckpointService::Stub::DeleteCheckpoint, request)
      .status();
}

absl::StatusOr<v1::BackupResponse> CkptClient::Backup(const std::string& target_dir) {
  v1::BackupRequest request;
  request.set_target_dir(target_dir);
  return Unary<v1::BackupRequest, v1::BackupResponse>(&v1::CheckpointService::Stub::Backup,
                                                      request);
}

absl::StatusOr<v1::RankDependenciesResponse> CkptClient::RankDependencies(
    const v1::RankDependenciesRequest& request) {
  return Unary<v1::RankDependenciesRequest, v1::RankDependenciesResponse>(
      &v1::CheckpointService::Stub::RankDependencies, request);
}

absl::StatusOr<v1::ServerStats> CkptClient::GetStats() {
  return Unary<v1::GetStatsRequest, v1::ServerStats>(&v1::CheckpointService::Stub::GetStats, {});
}

// ---------------------------------------------------------------- jobs

bool IsTerminalJobState(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string JobStateName(v1::JobState state) {
  constexpr std::string_view kPrefix = "JOB_STATE_";
  if (!v1::JobState_IsValid(state)) return absl::StrCat("STATE_", static_cast<int>(state));
  const std::string& name = v1::JobState_Name(state);
  return name.starts_with(kPrefix) ? name.substr(kPrefix.size()) : name;
}

absl::StatusOr<v1::SubmitTransformResponse> CkptClient::SubmitTransform(
    const v1::SubmitTransformRequest& request) {
  return Unary<v1::SubmitTransformRequest, v1::SubmitTransformResponse>(
      &v1::CheckpointService::Stub::SubmitTransform, request);
}

absl::StatusOr<v1::Job> CkptClient::GetJob(const std::string& job_id) {
  v1::GetJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::GetJobRequest, v1::Job>(&v1::CheckpointService::Stub::GetJob, request);
}

absl::StatusOr<v1::Job> CkptClient::CancelJob(const std::string& job_id) {
  v1::CancelJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::CancelJobRequest, v1::Job>(&v1::CheckpointService::Stub::CancelJob, request);
}

absl::StatusOr<std::vector<v1::Job>> CkptClient::ListJobs() {
  CKPT_ASSIGN_OR_RETURN(v1::ListJobsResponse response,
                        (Unary<v1::ListJobsRequest, v1::ListJobsResponse>(
                            &v1::CheckpointService::Stub::ListJobs, {})));
  return std::vector<v1::Job>(response.jobs().begin(), response.jobs().end());
}

absl::Status CkptClient::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  return Unary<v1::DeleteJobRequest, v1::DeleteJobResponse>(&v1::CheckpointService::Stub::DeleteJob,
                                                            request)
      .status();
}

absl::StatusOr<v1::Job> CkptClient::WatchJob(const std::string& job_id,
                                             std::function<void(const v1::Job&)> on_update) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  // A job legitimately runs for hours: the stream deadline (none by default) applies.
  SetStreamDeadline(&context);
  std::unique_ptr<grpc::ClientReader<v1::Job>> stream = stub_->WatchJob(&context, request);
  std::optional<v1::Job> last;
  v1::Job job;
  while (stream->Read(&job)) {
    if (on_update) on_update(job);
    last = job;
  }
  const absl::Status status = FromGrpcStatus(stream->Finish());
  if (!status.ok()) {
    return WithPrefix(Annotate(status), absl::StrCat("watching job ", job_id, ": "));
  }
  if (!last.has_value()) {
    return absl::InternalError(
        absl::StrCat("ckptd ended the watch of job ", job_id, " without sending its state"));
  }
  if (!IsTerminalJobState(last->state())) {
    // A server that stops streaming early (e.g. shutting down) should fail the call; be safe.
    return absl::UnavailableError(absl::StrCat("ckptd ended the watch of job ", job_id,
                                               " while it was ", JobStateName(last->state()),
                                               "; the job continues on the server"));
  }
  return *std::move(last);
}

}  // namespace ckpt
