// C++ client library of ckptd (proto/ckpt.proto): strategies, uploads of MindSpore rank
// directories, streamed fetches with checksum verification of every byte, dependency queries,
// transform jobs, and a client-side export of every rank of a re-sharded checkpoint.
// Every method returns absl::Status / absl::StatusOr with the server's gRPC code unchanged (the
// codes are numerically identical), so callers handle one error type.
#ifndef CKPT_CLIENT_CLIENT_H_
#define CKPT_CLIENT_CLIENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt.grpc.pb.h"
#include "ckpt.pb.h"
#include "core/rank_files.h"
#include "core/strategy.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"

namespace ckpt {

// Converts a gRPC status to an absl::Status with the same code and message. The only place the
// client reads a grpc::Status.
absl::Status FromGrpcStatus(const grpc::Status& status);

// Reports bytes transferred so far and the expected total (0 when unknown). Called from the thread
// doing the transfer; UploadDirectory calls it from several threads, so it must be thread-safe
// there.
using ProgressFn = std::function<void(int64_t done_bytes, int64_t total_bytes)>;

struct ClientOptions {
  // Deadline of each unary call. Default 30 s.
  absl::Duration unary_timeout = absl::Seconds(30);
  // Deadline of each Upload or Fetch stream. Default: none, because a rank file of hundreds of
  // GiB legitimately takes hours; cancel through the process instead.
  absl::Duration stream_timeout = absl::InfiniteDuration();
  // Largest message accepted from the server. Default 64 MiB, ckptd's own bound (data messages
  // are ≤ 1 MiB; strategy and describe responses of a large model can be several MiB).
  int max_receive_message_bytes = 64 << 20;
  // When positive, Connect() waits up to this long for the channel to become ready and fails
  // with UNAVAILABLE otherwise. Default 0: connect lazily; the first call reports an unreachable
  // server (calls fail fast rather than waiting for it).
  absl::Duration connect_timeout = absl::ZeroDuration();
  // TLS is used when any of tls_ca, tls_cert, tls_key is set (ckptctl: --tls-ca etc., or
  // $CKPT_TLS_CA, $CKPT_TLS_CERT, $CKPT_TLS_KEY). tls_ca: PEM file of the CA that signed the
  // server's certificate (empty: the system's trusted roots).
  std::string tls_ca;
  // PEM client certificate and key for mutual TLS; both or neither.
  std::string tls_cert;
  std::string tls_key;
  // File holding a bearer token ($CKPT_TOKEN_FILE), sent as "authorization: Bearer <token>"
  // with every call. Read once by Connect(); surrounding whitespace is ignored.
  std::string token_file;
  // When positive, each stream's HTTP/2 flow-control window is fixed at this many bytes (what
  // the server may send ahead of what the client has read, and so what the client may buffer)
  // instead of growing with gRPC's bandwidth-delay probing. Default 0: gRPC's probing.
  int stream_window_bytes = 0;
};

struct UploadDirectoryOptions {
  // Rank files uploaded at the same time (each on its own stream and thread). Default 4.
  int parallelism = 4;
};

// One rank of an UploadDirectory.
struct RankUploadResult {
  int64_t rank = 0;
  std::string file;        // the .ckpt chosen in rank_<r>/
  int64_t file_bytes = 0;  // its size
  v1::UploadResponse response;
};

struct UploadSummary {
  std::string checkpoint_id;
  // True when one of these ranks completed the checkpoint and the server committed it.
  bool committed = false;
  // Ranks the server has received (at the last response) and the ranks the checkpoint needs.
  int64_t ranks_received = 0;
  int64_t ranks_total = 0;
  // Sum of the uploaded files' sizes and of the bytes the server stored after de-duplication.
  int64_t file_bytes = 0;
  int64_t bytes_stored = 0;
  // By rank.
  std::vector<RankUploadResult> ranks;
};

// One rank of an ExportRanks.
struct RankExportResult {
  int64_t rank = 0;
  // Final path of the rank's file: DIR/rank_<r>/<prefix><r>.ckpt.
  std::string file;
  // What the server planned and delivered (tensor count, bytes, source ranks, warnings).
  v1::FetchPlanSummary summary;
};

struct ExportSummary {
  // The directory now holding the export.
  std::string dir;
  // Sums over the ranks of the delivered tensors and tensor bytes.
  int64_t tensors = 0;
  int64_t bytes = 0;
  // By rank, ascending.
  std::vector<RankExportResult> ranks;
};

// The descriptor an output path names without being a file to replace: 1 for "-" and
// /dev/stdout, 2 for /dev/stderr, N for /dev/fd/N and /proc/self/fd/N; -1 otherwise. Pure.
int OutputDescriptor(std::string_view path);

// True for SUCCEEDED, FAILED and CANCELLED: the job will not change any more.
bool IsTerminalJobState(v1::JobState state);
// "RUNNING" for JOB_STATE_RUNNING, and so on; the number for a state this client does not know.
std::string JobStateName(v1::JobState state);

// A strategy read back from the server.
struct RemoteStrategy {
  v1::StrategyInfo info;
  Strategy strategy;
};

// Receives a Fetch stream in order: OnSummary once, then per tensor OnTensor, OnData for each
// piece (already checksum-verified, sizes checked against the header) and OnTensorEnd. A non-OK
// return aborts the fetch (the stream is cancelled) and Fetch returns that status. Called on the
// thread that called Fetch.
class TensorVisitor {
 public:
  virtual ~TensorVisitor() = default;
  virtual absl::Status OnSummary(const v1::FetchPlanSummary& summary) = 0;
  virtual absl::Status OnTensor(const v1::FetchTensorHeader& header) = 0;
  // The current tensor's next bytes, already verified, in pieces of any size (as gRPC received
  // them). `data` is valid only during the call.
  virtual absl::Status OnData(std::string_view data) = 0;
  virtual absl::Status OnTensorEnd() = 0;
};

class CkptWriter;  // core/ckpt_format.h

// Starts the tensor `header` announces in `writer` as MindSpore stores it (str values with dims
// [0], scalars with empty dims), for a visitor that writes a fetch as a .ckpt (FetchToFile's,
// and the Python client's native fetch_to_file). INTERNAL naming the tensor for a dtype this
// client does not know; the writer's error otherwise.
absl::Status BeginFetchedTensor(const v1::FetchTensorHeader& header, CkptWriter& writer);

// One tensor of FetchAll.
struct FetchedTensor {
  v1::FetchTensorHeader header;
  std::string data;
};

// Client of one ckptd server. Thread-safe: every method may be called concurrently (each call has
// its own gRPC context); owns its channel.
class CkptClient {
 public:
  // `address` is a gRPC target ("HOST:PORT", "unix:PATH", ...). Plaintext channel.
  static absl::StatusOr<std::unique_ptr<CkptClient>> Connect(const std::string& address,
                                                             ClientOptions options = {});

  CkptClient(const CkptClient&) = delete;
  CkptClient& operator=(const CkptClient&) = delete;

  const std::string& address() const { return address_; }

  // ------------------------------------------------------------------------------- strategies

  // Registers `strategy` under `name`, sent in ckptd's binary form (MindSpore's ParallelStrategyMap
  // with each parameter's global shape in ParallelLayouts.ckptd_tensor_shape), which ckptd parses
  // several times faster than the JSON form.
  absl::StatusOr<v1::StrategyInfo> PutStrategy(const std::string& name, const Strategy& strategy,
                                               bool overwrite);
  // Registers a binary or .json strategy file, or a directory of per-stage files merged: loaded
  // and checked here (LoadStrategyPath, errors name the file), then sent as PutStrategy does.
  absl::StatusOr<v1::StrategyInfo> PutStrategyFile(const std::string& name, const std::string& path,
                                                   bool overwrite);
  absl::StatusOr<RemoteStrategy> GetStrategy(const std::string& name);
  // A registered strategy's summary alone (world size, parameters), without its content
  // (GetStrategyRequest.info_only). NOT_FOUND naming it when it is not registered.
  absl::StatusOr<v1::StrategyInfo> GetStrategyInfo(const std::string& name);
  absl::StatusOr<std::vector<v1::StrategyInfo>> ListStrategies();
  absl::Status DeleteStrategy(const std::string& name);

  // ------------------------------------------------------------------------------- uploads

  // Streams one source rank's MindSpore .ckpt: one Value in memory at a time, sent as ≤ 1 MiB
  // data messages, one UploadTensorHeader per tensor (consecutive same-name Values are one
  // tensor). `progress` gets file bytes consumed / file size. INVALID_ARGUMENT naming the file
  // and tensor for a malformed file.
  absl::StatusOr<v1::UploadResponse> UploadRank(const std::string& checkpoint_id,
                                                const std::string& source_strategy, int64_t rank,
                                                const std::string& file_path,
                                                ProgressFn progress = nullptr);
  // Uploads DIR/rank_<r>/ for every rank r of the source strategy's world (see ResolveRankFiles
  // in client/rank_directory.h), at most options.parallelism at a time. The first failure
  // cancels the other streams and is returned. `progress` (thread-safe) gets the summed file
  // bytes of all ranks.
  absl::StatusOr<UploadSummary> UploadDirectory(const std::string& checkpoint_id,
                                                const std::string& source_strategy,
                                                const std::string& dir,
                                                UploadDirectoryOptions options = {},
                                                ProgressFn progress = nullptr);
  // A whole-tensor checkpoint (one file, no strategy): rank 0 with an empty strategy name.
  absl::StatusOr<v1::UploadResponse> UploadWholeFile(const std::string& checkpoint_id,
                                                     const std::string& path,
                                                     ProgressFn progress = nullptr);

  // ------------------------------------------------------------------------------- fetch

  // Streams `request` into `visitor`, verifying the protocol (summary first, data inside a
  // tensor, byte totals equal to the headers and summary) and every part checksum of every data
  // message, and assembling bands of tiles into rows (proto/ckpt.proto FetchData). DATA_LOSS
  // naming the tensor on a checksum or size mismatch; the visitor's error if it aborts.
  absl::Status Fetch(const v1::FetchRequest& request, TensorVisitor& visitor);
  // Everything in memory (tests, small checkpoints). `summary` receives the plan when non-null.
  absl::StatusOr<std::vector<FetchedTensor>> FetchAll(const v1::FetchRequest& request,
                                                      v1::FetchPlanSummary* summary = nullptr);
  // Writes the fetched tensors as a MindSpore .ckpt at `path`, streaming. `progress` gets data
  // bytes received / the plan's total. Returns the plan summary. Where the bytes go:
  //  - "-", /dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N: that open descriptor, written
  //    in place (see OutputDescriptor); a failed fetch may have written part of the file there.
  //  - an existing character device or pipe: written in place.
  //  - otherwise a regular file that appears (atomically) only when the whole fetch succeeded,
  //    its missing parent directories created first. A symbolic link is followed: the file it
  //    names is replaced and the link stays. Never renamed over: anything not a regular file
  //    (directories, sockets and block devices are refused with INVALID_ARGUMENT).
  absl::StatusOr<v1::FetchPlanSummary> FetchToFile(const v1::FetchRequest& request,
                                                   const std::string& path,
                                                   ProgressFn progress = nullptr);

  // ------------------------------------------------------------------------------- checkpoints

  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints();
  absl::StatusOr<v1::DescribeCheckpointResponse> DescribeCheckpoint(
      const std::string& checkpoint_id);
  absl::Status DeleteCheckpoint(const std::string& checkpoint_id);
  // A consistent copy of the live store in the new server-side directory `target_dir` (an
  // absolute path beneath the server's --export-root). Needs the admin role.
  absl::StatusOr<v1::BackupResponse> Backup(const std::string& target_dir);
  absl::StatusOr<v1::RankDependenciesResponse> RankDependencies(
      const v1::RankDependenciesRequest& request);
  // The server's counters and gauges (GetStats).
  absl::StatusOr<v1::ServerStats> GetStats();

  // ------------------------------------------------------------------------------- jobs

  // Submits a transform job. Idempotent for a client-chosen request.job_id: resubmitting the
  // same request returns the existing job with `created` false (ALREADY_EXISTS when the id is
  // taken by a different request).
  absl::StatusOr<v1::SubmitTransformResponse> SubmitTransform(
      const v1::SubmitTransformRequest& request);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Asks the server to cancel a queued or running job; returns the job as the server left it.
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id);
  absl::StatusOr<std::vector<v1::Job>> ListJobs();
  // Removes a finished job's record (FAILED_PRECONDITION while it runs, NOT_FOUND if unknown).
  absl::Status DeleteJob(const std::string& job_id);
  // Streams the job's state into `on_update` (may be null; called on this thread, in order) until
  // the server ends the stream, and returns the last state, which is terminal (see
  // IsTerminalJobState). The stream's error otherwise, e.g. UNAVAILABLE when the server went away
  // (the job itself keeps running on the server; watch it again).
  absl::StatusOr<v1::Job> WatchJob(const std::string& job_id,
                                   std::function<void(const v1::Job&)> on_update = nullptr);

  // ------------------------------------------------------------------------------- health

  // The standard gRPC health check (grpc.health.v1.Health/Check) of `service` ("" for the
  // server as a whole): "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN". NOT_FOUND
  // when the server does not know `service`; UNAVAILABLE when it cannot be reached.
  absl::StatusOr<std::string> CheckHealth(const std::string& service);

  // ------------------------------------------------------------------------------- export

  // Client-side export for users who cannot reach the server's disk: fetches destination ranks
  // `ranks` (ascending and distinct; empty = every rank of `destination_strategy`) of
  // `checkpoint_id`, `parallelism` at a time, and writes MindSpore's layout
  // DIR/rank_<r>/<prefix><r>.ckpt locally. The files are written into a hidden temporary sibling
  // of DIR (".<name>.ckptctl-export-*"), which is renamed to DIR only when every rank succeeded:
  // a failed export leaves no DIR (the temporary is removed). DIR must not exist or be an empty
  // directory (ALREADY_EXISTS otherwise); its parent is created when missing. The first failing
  // rank cancels the others and its error is returned. INVALID_ARGUMENT for a prefix outside
  // ValidateRankFilePrefix's rule (core/rank_files.h), OUT_OF_RANGE for a rank outside the
  // destination world. `progress` (thread-safe) gets the summed tensor bytes received over all
  // ranks and the total, which is estimated from the ranks whose plan is known until every rank
  // has started.
  absl::StatusOr<ExportSummary> ExportRanks(const std::string& checkpoint_id,
                                            const std::string& destination_strategy,
                                            const std::string& dir,
                                            const std::vector<int64_t>& ranks,
                                            const std::string& prefix = kDefaultRankFilePrefix,
                                            int parallelism = 4, ProgressFn progress = nullptr);

 private:
  class CancelGroup;

  CkptClient(std::string address, ClientOptions options, std::shared_ptr<grpc::Channel> channel);

  // Runs one unary RPC with the unary deadline.
  template <typename Request, typename Response, typename Method>
  absl::StatusOr<Response> Unary(Method method, const Request& request);
  // UploadRank, registering its stream in `group` (may be null) so that a sibling's failure can
  // cancel it.
  absl::StatusOr<v1::UploadResponse> UploadRankImpl(const std::string& checkpoint_id,
                                                    const std::string& source_strategy,
                                                    int64_t rank, const std::string& file_path,
                                                    const ProgressFn& progress, CancelGroup* group);
  // Fetch / FetchToFile, registering the stream in `group` (may be null) so that a sibling's
  // failure can cancel it.
  absl::Status FetchImpl(const v1::FetchRequest& request, TensorVisitor& visitor,
                         CancelGroup* group);
  absl::StatusOr<v1::FetchPlanSummary> FetchToFileImpl(const v1::FetchRequest& request,
                                                       const std::string& path,
                                                       const ProgressFn& progress,
                                                       CancelGroup* group);
  // The world size of a registered strategy, from its summary alone (GetStrategyInfo).
  absl::StatusOr<int64_t> StrategyWorldSize(const std::string& strategy_name);
  // Adds the server address to transport-level failures (nothing answered).
  absl::Status Annotate(absl::Status status) const;
  void SetStreamDeadline(grpc::ClientContext* context) const;

  const std::string address_;
  const ClientOptions options_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::CheckpointService::Stub> stub_;
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_CLIENT_H_
