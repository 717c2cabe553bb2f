// CheckpointServiceImpl's unary handlers, and the helpers its streaming reactors share. The
// reactors are in upload_reactor.cc, fetch_reactor.cc and watch_reactor.cc.
#include "service/rpc/checkpoint_service.h"

#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/rpc/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

const std::shared_ptr<spdlog::logger>& Logger() {
  static const std::shared_ptr<spdlog::logger> logger = spdlog::default_logger()->clone("service");
  return logger;
}

}  // namespace

absl::Status ShuttingDownError() { return absl::UnavailableError("ckptd is shutting down"); }

void LogRpc(const char* method, const std::string& peer, const absl::Status& status, int64_t bytes,
            absl::Duration latency, const std::string& detail) {
  const auto level = status.ok() ? spdlog::level::info : spdlog::level::warn;
  Logger()->log(level, "event=rpc method={} peer={} status={} bytes={} ms={:.1f}{}{}{}", method,
                peer, absl::StatusCodeToString(status.code()), bytes,
                absl::ToDoubleMilliseconds(latency), detail.empty() ? "" : " ", detail,
                status.ok() ? "" : absl::StrCat(" error=\"", status.message(), "\""));
}

// ------------------------------------------------------------------------------- unary

CheckpointServiceImpl::CheckpointServiceImpl(CheckpointManager* manager, JobRunner* jobs,
                                             Executor* executor, ServiceOptions options)
    : manager_(manager),
      jobs_(jobs),
      executor_(executor),
      options_(options),
      budget_(options.server_bytes_in_flight) {}

template <typename Fn>
grpc::ServerUnaryReactor* CheckpointServiceImpl::Unary(grpc::CallbackServerContext* ctx,
                                                       const char* method, Fn fn) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  if (shutting_down_) {
    LogRpc(method, ctx->peer(), ShuttingDownError(), 0, absl::Now() - start);
    reactor->Finish(ToGrpcStatus(ShuttingDownError()));
    return reactor;
  }
  executor_->Submit([ctx, reactor, method, start, fn = std::move(fn)]() mutable {
    const absl::Status status = fn();
    LogRpc(method, ctx->peer(), status, 0, absl::Now() - start);
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::PutStrategy(grpc::CallbackServerContext* ctx,
                                                             const v1::PutStrategyRequest* req,
                                                             v1::PutStrategyResponse* resp) {
  return Unary(ctx, "PutStrategy", [this, req, resp]() -> absl::Status {
    auto info = manager_->PutStrategy(req->name(), req->content(), req->format(), req->overwrite());
    if (!info.ok()) return info.status();
    *resp->mutable_info() = *info;
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetStrategy(grpc::CallbackServerContext* ctx,
                                                             const v1::GetStrategyRequest* req,
                                                             v1::GetStrategyResponse* resp) {
  return Unary(ctx, "GetStrategy", [this, req, resp]() -> absl::Status {
    auto s = manager_->GetStrategy(req->name());
    if (!s.ok()) return s.status();
    *resp->mutable_info() = CheckpointManager::InfoOf(req->name(), **s);
    resp->set_content(SerializeStrategy(**s, req->format() == v1::STRATEGY_FORMAT_JSON
                                                 ? StrategyFormat::kJson
                                                 : StrategyFormat::kBinary));
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListStrategies(grpc::CallbackServerContext* ctx,
                                                                const v1::ListStrategiesRequest*,
                                                                v1::ListStrategiesResponse* resp) {
  return Unary(ctx, "ListStrategies", [this, resp]() -> absl::Status {
    auto list = manager_->ListStrategies();
    if (!list.ok()) return list.status();
    for (auto& info : *list) *resp->add_strategies() = std::move(info);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DeleteStrategy(
    grpc::CallbackServerContext* ctx, const v1::DeleteStrategyRequest* req,
    v1::DeleteStrategyResponse*) {
  return Unary(ctx, "DeleteStrategy",
               [this, req]() { return manager_->DeleteStrategy(req->name()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListCheckpoints(
    grpc::CallbackServerContext* ctx, const v1::ListCheckpointsRequest*,
    v1::ListCheckpointsResponse* resp) {
  return Unary(ctx, "ListCheckpoints", [this, resp]() -> absl::Status {
    auto list = manager_->ListCheckpoints();
    if (!list.ok()) return list.status();
    for (auto& info : *list) *resp->add_checkpoints() = std::move(info);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DescribeCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::DescribeCheckpointRequest* req,
    v1::DescribeCheckpointResponse* resp) {
  return Unary(ctx, "DescribeCheckpoint", [this, req, resp]() -> absl::Status {
    auto d = manager_->DescribeCheckpoint(req->checkpoint_id());
    if (!d.ok()) return d.status();
    *resp = std::move(*d);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DeleteCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::DeleteCheckpointRequest* req,
    v1::DeleteCheckpointResponse*) {
  return Unary(ctx, "DeleteCheckpoint",
               [this, req]() { return manager_->DeleteCheckpoint(req->checkpoint_id()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::RankDependencies(
    grpc::CallbackServerContext* ctx, const v1::RankDependenciesRequest* req,
    v1::RankDependenciesResponse* resp) {
  return Unary(ctx, "RankDependencies", [this, req, resp]() -> absl::Status {
    auto r = manager_->RankDependencies(*req);
    if (!r.ok()) return r.status();
    *resp = std::move(*r);
    return absl::OkStatus();
  });
}

// ------------------------------------------------------------------------------- jobs

grpc::ServerUnaryReactor* CheckpointServiceImpl::SubmitTransform(
    grpc::CallbackServerContext* ctx, const v1::SubmitTransformRequest* req,
    v1::SubmitTransformResponse* resp) {
  return Unary(ctx, "SubmitTransform", [this, req, resp]() -> absl::Status {
    auto r = jobs_->Submit(*req);
    if (!r.ok()) return r.status();
    *resp->mutable_job() = std::move(r->job);
    resp->set_created(r->created);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetJob(grpc::CallbackServerContext* ctx,
                                                        const v1::GetJobRequest* req,
                                                        v1::Job* resp) {
  return Unary(ctx, "GetJob", [this, req, resp]() -> absl::Status {
    auto job = jobs_->Get(req->job_id());
    if (!job.ok()) return job.status();
    *resp = std::move(*job);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::CancelJob(grpc::CallbackServerContext* ctx,
                                                           const v1::CancelJobRequest* req,
                                                           v1::Job* resp) {
  // Waits (bounded) on the executor for the job to stop and remove its partial output, so the
  // reply normally shows CANCELLED.
  return Unary(ctx, "CancelJob", [this, req, resp]() -> absl::Status {
    auto job = jobs_->Cancel(req->job_id());
    if (!job.ok()) return job.status();
    *resp = std::move(*job);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                          const v1::ListJobsRequest*,
                                                          v1::ListJobsResponse* resp) {
  return Unary(ctx, "ListJobs", [this, resp]() -> absl::Status {
    for (v1::Job& job : jobs_->List()) *resp->add_jobs() = std::move(job);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::DeleteJob(grpc::CallbackServerContext* ctx,
                                                           const v1::DeleteJobRequest* req,
                                                           v1::DeleteJobResponse*) {
  return Unary(ctx, "DeleteJob", [this, req]() -> absl::Status {
    return jobs_->Delete(req->job_id());
  });
}

ProcessMemory ReadProcessMemory() {
  ProcessMemory memory;
  std::ifstream status("/proc/self/status");
  std::string line;
  // Lines such as "VmHWM:    123456 kB".
  auto kib = [](const std::string& text) -> int64_t {
    try {
      return std::stoll(text) * 1024;
    } catch (const std::exception&) {
      return 0;
    }
  };
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) memory.rss_bytes = kib(line.substr(6));
    if (line.rfind("VmHWM:", 0) == 0) memory.peak_rss_bytes = kib(line.substr(6));
  }
  return memory;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetStats(grpc::CallbackServerContext* ctx,
                                                          const v1::GetStatsRequest*,
                                                          v1::ServerStats* resp) {
  return Unary(ctx, "GetStats", [this, resp]() -> absl::Status {
    const StoreStats store = manager_->store()->stats();
    resp->set_store_bytes_read(store.chunk_bytes_read);
    resp->set_store_chunks_read(store.chunks_read);
    resp->set_store_bytes_written(store.chunk_bytes_written);
    resp->set_store_chunks_written(store.chunks_written);
    resp->set_store_bytes_copied(store.chunk_bytes_copied);
    resp->set_store_mapped_bytes(store.mapped_bytes);
    resp->set_fetch_bytes_sent(fetch_bytes_sent_.load(std::memory_order_relaxed));
    resp->set_fetch_bytes_in_flight(budget_.in_use());
    resp->set_fetch_streams(active_fetches_.load(std::memory_order_relaxed));
    const ProcessMemory memory = ReadProcessMemory();
    resp->set_rss_bytes(memory.rss_bytes);
    resp->set_peak_rss_bytes(memory.peak_rss_bytes);
    return absl::OkStatus();
  });
}

}  // namespace ckpt
