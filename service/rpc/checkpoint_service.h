// gRPC handlers of ckpt.v1.CheckpointService (callback API): thin adapters from protos to the
// engine (CheckpointManager, JobRunner). Blocking work runs on the Executor, never on gRPC's
// threads. The unary handlers are in checkpoint_service.cc; the streaming reactors in
// upload_reactor.cc, fetch_reactor.cc and watch_reactor.cc.
#ifndef CKPT_SERVICE_RPC_CHECKPOINT_SERVICE_H_
#define CKPT_SERVICE_RPC_CHECKPOINT_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "ckpt.grpc.pb.h"
#include "service/engine/executor.h"
#include "service/engine/job_runner.h"
#include "service/engine/manager.h"
#include "service/rpc/auth.h"
#include "service/rpc/byte_budget.h"
#include "service/rpc/grpc_status.h"

namespace ckpt {

struct ServiceOptions {
  // Fetch bytes queued for sending by one stream alone, before its producer pauses; concurrent
  // streams share it (FetchQueueShare). Default 8 MiB. Each queued message pins the chunks it
  // references, so read-ahead across the server stays about this size however many streams are
  // open (one message per stream at least): streams keep close enough together to share the
  // store's mapped windows (StoreOptions::mapped_bytes_budget) instead of each reading its own.
  int64_t stream_bytes_in_flight = int64_t{8} << 20;
  // Fetch bytes queued across the server. Default 256 MiB.
  int64_t server_bytes_in_flight = int64_t{256} << 20;
  // Largest accepted upload data message. The API promises ≤ 1 MiB.
  int64_t max_upload_message_bytes = int64_t{1} << 20;
  // The store's directory, whose file system's free space GetStats reports (empty: not measured).
  std::string data_dir;
  // A Fetch stream whose client accepts no message for this long (a write stays pending: the
  // client stopped reading, or its network is gone) is cancelled, logged DEADLINE_EXCEEDED, and
  // its queued bytes return to the server budget. Zero: never. Default 60 s.
  absl::Duration fetch_stall_timeout = absl::Seconds(60);
  // Fetch streams producing at once, server-wide (FetchAdmission); more wait in arrival order
  // for a slot instead of failing. 0: no limit. Default 256: each producing stream holds about a
  // band, a message and its recent chunks, so this bounds ckptd's memory however many streams
  // are open (256 streams, half of them stalled or crawling, stay within 1 GiB: load_test).
  int64_t max_active_fetches = 256;
};

// Fetch and Upload are registered raw (grpc::ByteBuffer) so that data messages can reference
// stored chunks instead of copying them (Fetch), and be chunked straight from gRPC's receive
// buffers instead of being parsed into a string first (Upload); their requests and responses
// are still ckpt.v1 messages.
class CheckpointServiceImpl final : public v1::CheckpointService::WithRawCallbackMethod_Upload<
                                        v1::CheckpointService::WithRawCallbackMethod_Fetch<
                                            v1::CheckpointService::CallbackService>> {
 public:
  // Does not own its arguments, which must outlive it. `jobs` must be started. Every call is
  // authorized by `auth` before any work; null means authentication off (every caller is the
  // anonymous admin).
  CheckpointServiceImpl(CheckpointManager* manager, JobRunner* jobs, Executor* executor,
                        ServiceOptions options, const Authenticator* auth = nullptr);

  // New calls get UNAVAILABLE from now on.
  void StartShutdown() { shutting_down_ = true; }
  // Late in a shutdown's drain: every open Fetch stream stops producing and finishes, once its
  // pending write is out, with UNAVAILABLE "ckptd is shutting down; retry".
  void EndStreamsForShutdown() { stream_watch_.EndAll(); }

  grpc::ServerUnaryReactor* PutStrategy(grpc::CallbackServerContext* ctx,
                                        const v1::PutStrategyRequest* req,
                                        v1::PutStrategyResponse* resp) override;
  grpc::ServerUnaryReactor* GetStrategy(grpc::CallbackServerContext* ctx,
                                        const v1::GetStrategyRequest* req,
                                        v1::GetStrategyResponse* resp) override;
  grpc::ServerUnaryReactor* ListStrategies(grpc::CallbackServerContext* ctx,
                                           const v1::ListStrategiesRequest* req,
                                           v1::ListStrategiesResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteStrategy(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteStrategyRequest* req,
                                           v1::DeleteStrategyResponse* resp) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* Upload(grpc::CallbackServerContext* ctx,
                                                    grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* ctx,
                                            const v1::ListCheckpointsRequest* req,
                                            v1::ListCheckpointsResponse* resp) override;
  grpc::ServerUnaryReactor* DescribeCheckpoint(grpc::CallbackServerContext* ctx,
                                               const v1::DescribeCheckpointRequest* req,
                                               v1::DescribeCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteCheckpoint(grpc::CallbackServerContext* ctx,
                                             const v1::DeleteCheckpointRequest* req,
                                             v1::DeleteCheckpointResponse* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Fetch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* req) override;
  grpc::ServerUnaryReactor* RankDependencies(grpc::CallbackServerContext* ctx,
                                             const v1::RankDependenciesRequest* req,
                                             v1::RankDependenciesResponse* resp) override;

  // Jobs (JobRunner). WatchJob streams on gRPC's threads: JobRunner calls never block long.
  grpc::ServerUnaryReactor* SubmitTransform(grpc::CallbackServerContext* ctx,
                                            const v1::SubmitTransformRequest* req,
                                            v1::SubmitTransformResponse* resp) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* ctx, const v1::GetJobRequest* req,
                                   v1::Job* resp) override;
  grpc::ServerWriteReactor<v1::Job>* WatchJob(grpc::CallbackServerContext* ctx,
                                              const v1::WatchJobRequest* req) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* ctx,
                                      const v1::CancelJobRequest* req, v1::Job* resp) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const v1::ListJobsRequest* req,
                                     v1::ListJobsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* ctx,
                                      const v1::DeleteJobRequest* req,
                                      v1::DeleteJobResponse* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest* req,
                                     v1::ServerStats* resp) override;

  grpc::ServerUnaryReactor* Backup(grpc::CallbackServerContext* ctx, const v1::BackupRequest* req,
                                   v1::BackupResponse* resp) override;

  // Tensor bytes of Fetch data messages written to clients (GetStats).
  void CountFetchBytesSent(int64_t n) { fetch_bytes_sent_.fetch_add(n, std::memory_order_relaxed); }
  // Tensor bytes of Upload data messages received (GetStats).
  void CountUploadBytes(int64_t n) {
    upload_bytes_received_.fetch_add(n, std::memory_order_relaxed);
  }
  // Upload streams open now (UploadStarted .. UploadEnded).
  void UploadStarted() { active_uploads_.fetch_add(1, std::memory_order_relaxed); }
  void UploadEnded() { active_uploads_.fetch_sub(1, std::memory_order_relaxed); }
  // Every RPC's final status, next to its LogRpc line: counts DATA_LOSS.
  void RpcFinished(const absl::Status& status) {
    if (status.code() == absl::StatusCode::kDataLoss) {
      data_loss_rpcs_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // What GetStats returns: the service's, the engine's and the store's counters and gauges now.
  // Cheap enough to call per metrics scrape (CheckpointManager::Summarize). Thread-safe.
  v1::ServerStats Stats();
  // Where Stats() takes the connection counts from (fills connections*). Call before the server
  // starts; `source` must stay valid while the service is used. Unset: zeros.
  void SetConnectionSource(std::function<void(v1::ServerStats*)> source) {
    connection_source_ = std::move(source);
  }

  CheckpointManager* manager() const { return manager_; }
  JobRunner* jobs() const { return jobs_; }
  Executor* executor() const { return executor_; }
  ByteBudget* budget() { return &budget_; }
  FetchAdmission* admission() { return &admission_; }
  StreamWatch* stream_watch() { return &stream_watch_; }
  const ServiceOptions& options() const { return options_; }
  const Authenticator& auth() const { return *auth_; }
  bool shutting_down() const { return shutting_down_; }
  // Fetch streams open now (FetchStarted .. FetchEnded), and each one's queue limit: an equal
  // share among the streams admitted to produce.
  void FetchStarted() { active_fetches_.fetch_add(1, std::memory_order_relaxed); }
  void FetchEnded() { active_fetches_.fetch_sub(1, std::memory_order_relaxed); }
  int64_t open_fetches() const { return active_fetches_.load(std::memory_order_relaxed); }
  int64_t FetchQueueLimit() const {
    return FetchQueueShare(options_.stream_bytes_in_flight, admission_.active());
  }

 private:
  std::function<void(v1::ServerStats*)> connection_source_;  // set before serving
  // Authorizes the call, then runs `fn` (taking no argument, or the caller's const Principal&)
  // on the executor and finishes with its status. Mutating methods (auth_policy.h) are audited
  // with what `target` returns after `fn` ran (e.g. "checkpoint=ID").
  template <typename Fn>
  grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const char* method, Fn fn,
                                  std::function<std::string()> target = nullptr);
  // OK when `who` may `verb` (cancel, remove) job `job_id`: its owner, or a principal of
  // kOthersJobsRole; PERMISSION_DENIED naming the principal and the role needed otherwise, and
  // the lookup's error (NOT_FOUND) for an unknown job.
  absl::Status CheckJobOwner(const Principal& who, const std::string& job_id,
                             std::string_view verb) const;

  CheckpointManager* const manager_;
  JobRunner* const jobs_;
  Executor* const executor_;
  const ServiceOptions options_;
  std::unique_ptr<Authenticator> no_auth_;  // when constructed without an Authenticator
  const Authenticator* const auth_;
  std::mutex submit_mu_;  // serialises the queued-jobs limit check with the submission
  ByteBudget budget_;
  FetchAdmission admission_{options_.max_active_fetches};
  std::atomic<bool> shutting_down_{false};
  std::atomic<int64_t> fetch_bytes_sent_{0};
  std::atomic<int64_t> active_fetches_{0};
  std::atomic<int64_t> upload_bytes_received_{0};
  std::atomic<int64_t> active_uploads_{0};
  std::atomic<int64_t> data_loss_rpcs_{0};
  const absl::Time started_ = absl::Now();
  StreamWatch stream_watch_{StreamWatch::PeriodFor(options_.fetch_stall_timeout)};
};

// Resident set size of this process now and at its peak (VmRSS / VmHWM of /proc/self/status),
// bytes; zero where unavailable.
struct ProcessMemory {
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;
};
ProcessMemory ReadProcessMemory();

// One structured log line per RPC.
void LogRpc(const char* method, const std::string& peer, const absl::Status& status, int64_t bytes,
            absl::Duration latency, const std::string& detail = "");

// The status of calls that arrive while the server shuts down (UNAVAILABLE).
absl::Status ShuttingDownError();

// A streaming call refused before any work (shutting down, not authorized, over a limit): it
// finishes with `status` at once and deletes itself when gRPC is done with it.
template <typename Base>
class RefusedReactor final : public Base {
 public:
  explicit RefusedReactor(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_CHECKPOINT_SERVICE_H_
