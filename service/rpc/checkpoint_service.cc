// CheckpointServiceImpl's unary handlers, and the helpers its streaming reactors share. The
// reactors are in upload_reactor.cc, fetch_reactor.cc and watch_reactor.cc.
#include "service/rpc/checkpoint_service.h"

#include <fstream>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/names.h"
#include "core/status_macros.h"
#include "service/engine/store_maintenance.h"
#include "service/rpc/grpc_status.h"
#include "spdlog/spdlog.h"
#include "storage/file_stream.h"

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
  Logger()->log(
      level, "event=rpc method={} peer={} status={} bytes={} ms={:.1f}{}{}{}", method, peer,
      absl::StatusCodeToString(status.code()), bytes, absl::ToDoubleMilliseconds(latency),
      detail.empty() ? "" : " ", EscapeForLog(detail),
      status.ok() ? ""
                  : absl::StrCat(" error=\"", EscapeForLog(std::string(status.message())), "\""));
}

// ------------------------------------------------------------------------------- unary

CheckpointServiceImpl::CheckpointServiceImpl(CheckpointManager* manager, JobRunner* jobs,
                                             Executor* executor, ServiceOptions options,
                                             const Authenticator* auth)
    : manager_(manager),
      jobs_(jobs),
      executor_(executor),
      options_(options),
      no_auth_(auth == nullptr ? Authenticator::Disabled() : nullptr),
      auth_(auth == nullptr ? no_auth_.get() : auth),
      budget_(options.server_bytes_in_flight) {}

template <typename Fn>
grpc::ServerUnaryReactor* CheckpointServiceImpl::Unary(grpc::CallbackServerContext* ctx,
                                                       const char* method, Fn fn,
                                                       std::function<std::string()> target) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  const absl::Time start = absl::Now();
  if (shutting_down_) {
    LogRpc(method, ctx->peer(), ShuttingDownError(), 0, absl::Now() - start);
    RpcFinished(ShuttingDownError());
    reactor->Finish(ToGrpcStatus(ShuttingDownError()));
    return reactor;
  }
  const std::string full_method = FullMethodName(method);
  absl::StatusOr<Principal> principal = auth_->Authorize(*ctx, full_method);
  if (!principal.ok()) {
    LogRpc(method, ctx->peer(), principal.status(), 0, absl::Now() - start);
    reactor->Finish(ToGrpcStatus(principal.status()));
    return reactor;
  }
  executor_->Submit([this, ctx, reactor, method, start, full_method, target = std::move(target),
                     principal = std::move(*principal), fn = std::move(fn)]() mutable {
    absl::Status status;
    if constexpr (std::is_invocable_v<Fn&, const Principal&>) {
      status = fn(principal);
    } else {
      status = fn();
    }
    LogRpc(method, ctx->peer(), status, 0, absl::Now() - start);
    RpcFinished(status);
    const MethodPolicy* policy = FindMethodPolicy(full_method);
    if ((policy != nullptr && policy->mutating) ||
        status.code() == absl::StatusCode::kPermissionDenied) {
      Audit(&principal, full_method, ctx->peer(), target ? target() : "-", status);
    }
    reactor->Finish(ToGrpcStatus(status));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::PutStrategy(grpc::CallbackServerContext* ctx,
                                                             const v1::PutStrategyRequest* req,
                                                             v1::PutStrategyResponse* resp) {
  return Unary(
      ctx, "PutStrategy",
      [this, req, resp]() -> absl::Status {
        auto info =
            manager_->PutStrategy(req->name(), req->content(), req->format(), req->overwrite());
        if (!info.ok()) return info.status();
        *resp->mutable_info() = *info;
        return absl::OkStatus();
      },
      [req] { return absl::StrCat("strategy=", req->name()); });
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::GetStrategy(grpc::CallbackServerContext* ctx,
                                                             const v1::GetStrategyRequest* req,
                                                             v1::GetStrategyResponse* resp) {
  return Unary(ctx, "GetStrategy", [this, req, resp]() -> absl::Status {
    auto s = manager_->GetStrategy(req->name());
    if (!s.ok()) return s.status();
    *resp->mutable_info() = CheckpointManager::InfoOf(req->name(), **s);
    if (req->info_only()) return absl::OkStatus();
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
  return Unary(
      ctx, "DeleteStrategy", [this, req]() { return manager_->DeleteStrategy(req->name()); },
      [req] { return absl::StrCat("strategy=", req->name()); });
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
  return Unary(
      ctx, "DeleteCheckpoint",
      [this, req]() { return manager_->DeleteCheckpoint(req->checkpoint_id()); },
      [req] { return absl::StrCat("checkpoint=", req->checkpoint_id()); });
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
  return Unary(
      ctx, "SubmitTransform",
      [this, req, resp](const Principal& who) -> absl::Status {
        // The per-principal cap on unfinished jobs, checked and submitted under one lock so that
        // concurrent submissions cannot pass it together.
        std::lock_guard<std::mutex> lock(submit_mu_);
        const int limit = auth_->options().max_queued_jobs;
        if (auth_->enabled() && limit > 0) {
          int unfinished = 0;
          bool resubmission = false;
          for (const v1::Job& job : jobs_->List()) {
            if (!req->job_id().empty() && job.id() == req->job_id()) resubmission = true;
            if (job.owner() == who.name && !JobRunner::IsTerminal(job.state())) ++unfinished;
          }
          if (!resubmission && unfinished >= limit) {
            return absl::ResourceExhaustedError(
                absl::StrCat("principal ", who.name, " already has ", unfinished,
                             " queued or running jobs, the limit per principal "
                             "(--max-queued-jobs-per-principal=",
                             limit, ")"));
          }
        }
        auto r = jobs_->Submit(*req, who.name);
        if (!r.ok()) return r.status();
        *resp->mutable_job() = std::move(r->job);
        resp->set_created(r->created);
        return absl::OkStatus();
      },
      [req, resp] {
        return absl::StrCat("job=", resp->job().id().empty() ? req->job_id() : resp->job().id(),
                            " checkpoint=", req->checkpoint_id());
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
  return Unary(
      ctx, "CancelJob",
      [this, req, resp](const Principal& who) -> absl::Status {
        CKPT_RETURN_IF_ERROR(CheckJobOwner(who, req->job_id(), "cancel"));
        auto job = jobs_->Cancel(req->job_id());
        if (!job.ok()) return job.status();
        *resp = std::move(*job);
        return absl::OkStatus();
      },
      [req] { return absl::StrCat("job=", req->job_id()); });
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
  return Unary(
      ctx, "DeleteJob",
      [this, req](const Principal& who) -> absl::Status {
        CKPT_RETURN_IF_ERROR(CheckJobOwner(who, req->job_id(), "remove"));
        return jobs_->Delete(req->job_id());
      },
      [req] { return absl::StrCat("job=", req->job_id()); });
}

absl::Status CheckpointServiceImpl::CheckJobOwner(const Principal& who, const std::string& job_id,
                                                  std::string_view verb) const {
  // The role table lets writers call CancelJob and DeleteJob; only for their own jobs, though.
  if (who.role >= kOthersJobsRole) return absl::OkStatus();
  auto existing = jobs_->Get(job_id);
  if (!existing.ok()) return existing.status();
  if (existing->owner() == who.name) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat("principal ", who.name, " (role ", Sv(RoleName(who.role)), ") may ", Sv(verb),
                   " only its own jobs; to ", Sv(verb), " another principal's job needs role ",
                   Sv(RoleName(kOthersJobsRole))));
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
    *resp = Stats();
    return absl::OkStatus();
  });
}

v1::ServerStats CheckpointServiceImpl::Stats() {
  v1::ServerStats out;
  const StoreStats store = manager_->store()->stats();
  out.set_store_bytes_read(store.chunk_bytes_read);
  out.set_store_chunks_read(store.chunks_read);
  out.set_store_bytes_written(store.chunk_bytes_written);
  out.set_store_chunks_written(store.chunks_written);
  out.set_store_bytes_copied(store.chunk_bytes_copied);
  out.set_store_mapped_bytes(store.mapped_bytes);
  out.set_fetch_bytes_sent(fetch_bytes_sent_.load(std::memory_order_relaxed));
  out.set_fetch_bytes_in_flight(budget_.in_use());
  out.set_fetch_streams(active_fetches_.load(std::memory_order_relaxed));
  out.set_fetch_streams_waiting(admission_.waiting());
  out.set_fetch_streams_waited(admission_.waited_total());
  const SharedChunkStats shared = manager_->shared_chunks()->stats();
  out.set_fetch_pace_waits(shared.pace_waits);
  out.set_fetch_replicas_left_behind(shared.left_behind);
  out.set_fetch_chunks_joined(shared.joined_reads);
  out.set_fetch_chunks_live(shared.live_hits);
  out.set_fetch_chunks_cached(shared.cache_hits);
  out.set_fetch_cache_bytes(shared.cached_bytes);
  out.set_fetch_cache_pinned_bytes(shared.pinned_bytes);
  out.set_fetch_cache_evicted_for_pins(shared.evicted_for_pins);
  if (connection_source_) connection_source_(&out);
  const ProcessMemory memory = ReadProcessMemory();
  out.set_rss_bytes(memory.rss_bytes);
  out.set_peak_rss_bytes(memory.peak_rss_bytes);
  if (auto summary = manager_->Summarize(); summary.ok()) {
    out.set_checkpoints(summary->checkpoints);
    out.set_checkpoint_stored_bytes(summary->stored_bytes);
    out.set_pending_uploads(summary->pending_uploads);
  } else {
    Logger()->warn("event=stats error=\"{}\"", std::string(summary.status().message()));
  }
  out.set_disk_free_bytes(-1);
  if (!options_.data_dir.empty()) {
    if (auto free = FreeDiskBytes(options_.data_dir); free.ok()) out.set_disk_free_bytes(*free);
  }
  out.set_upload_streams(active_uploads_.load(std::memory_order_relaxed));
  out.set_upload_bytes_received(upload_bytes_received_.load(std::memory_order_relaxed));
  out.set_job_bytes_written(jobs_->bytes_written());
  for (const auto& [state, count] : jobs_->CountByState()) {
    switch (state) {
      case v1::JOB_STATE_QUEUED:
        out.set_jobs_queued(count);
        break;
      case v1::JOB_STATE_RUNNING:
        out.set_jobs_running(count);
        break;
      case v1::JOB_STATE_SUCCEEDED:
        out.set_jobs_succeeded(count);
        break;
      case v1::JOB_STATE_FAILED:
        out.set_jobs_failed(count);
        break;
      case v1::JOB_STATE_CANCELLED:
        out.set_jobs_cancelled(count);
        break;
      default:
        break;
    }
  }
  out.set_data_loss_rpcs(data_loss_rpcs_.load(std::memory_order_relaxed));
  out.set_data_loss_jobs(jobs_->data_loss_failures());
  out.set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  out.set_version(CKPT_VERSION);
  return out;
}

grpc::ServerUnaryReactor* CheckpointServiceImpl::Backup(grpc::CallbackServerContext* ctx,
                                                        const v1::BackupRequest* req,
                                                        v1::BackupResponse* resp) {
  return Unary(
      ctx, "Backup",
      [this, req, resp]() -> absl::Status {
        auto r = BackupStore(*manager_->store(), jobs_->export_root(), req->target_dir());
        if (!r.ok()) return r.status();
        *resp = std::move(*r);
        return absl::OkStatus();
      },
      [req] { return absl::StrCat("target_dir=", req->target_dir()); });
}

}  // namespace ckpt
