#include "service/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace ckpt {

absl::StatusOr<std::unique_ptr<CkptServer>> CkptServer::Start(ServerOptions options) {
  std::unique_ptr<CkptServer> s(new CkptServer());
  s->options_ = options;
  CKPT_ASSIGN_OR_RETURN(s->store_, OpenSegmentStore(options.data_dir, options.store));
  s->manager_ = std::make_unique<CheckpointManager>(s->store_.get(), options.manager);
  JobRunnerOptions job_options = options.jobs;
  job_options.upload = options.manager.upload;
  s->jobs_ = std::make_unique<JobRunner>(s->manager_.get(), job_options);
  CKPT_RETURN_IF_ERROR(s->jobs_->Start());
  s->jobs_->RemoveExpired(absl::Now());  // finished jobs past --job-retention
  s->executor_ = std::make_unique<Executor>(options.io_threads);
  s->service_ = std::make_unique<CheckpointServiceImpl>(s->manager_.get(), s->jobs_.get(),
                                                        s->executor_.get(), options.service);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &s->port_);
  // gRPC sets SO_REUSEPORT by default, so a second ckptd on a taken port would start and share
  // the connections silently; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(s->service_.get());
  // Data messages are ≤ 1 MiB; leave room for headers.
  builder.SetMaxReceiveMessageSize(4 << 20);
  builder.SetMaxSendMessageSize(4 << 20);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen,
                                               " (address in use or invalid?)"));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  s->maintenance_ = std::thread([raw = s.get()] { raw->MaintenanceLoop(); });
  spdlog::info("event=start listen={} port={} data={} io_threads={} job_workers={}",
               options.listen, s->port_, options.data_dir, options.io_threads,
               options.jobs.workers);
  return s;
}

CkptServer::~CkptServer() {
  Shutdown();
  if (maintenance_.joinable()) maintenance_.join();
}

void CkptServer::MaintenanceLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.maintenance_interval));
    if (stopping_) break;
    lock.unlock();
    const int expired = manager_->ExpireIdleUploads();
    jobs_->RemoveExpired(absl::Now());
    auto collected = store_->CollectGarbage();
    if (expired > 0 || (collected.ok() && *collected > 0)) {
      spdlog::info("event=maintenance expired_uploads={} collected={}", expired,
                   collected.ok() ? *collected : -1);
    }
    lock.lock();
  }
}

void CkptServer::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  spdlog::info("event=shutdown phase=drain");
  // Members may be missing when Start() failed half way (e.g. the port was taken).
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  if (service_) service_->StartShutdown();
  // Before draining: jobs stop promptly (running ones stay RUNNING and resume at the next
  // start), and WatchJob streams end instead of holding the drain until its timeout.
  if (jobs_) jobs_->Shutdown();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.drain_timeout));
    server_->Wait();
  }
  executor_.reset();  // finishes queued work
  if (absl::Status s = store_ ? store_->Flush() : absl::OkStatus(); !s.ok()) {
    spdlog::error("event=shutdown phase=flush error=\"{}\"", std::string(s.message()));
  }
  spdlog::info("event=shutdown phase=done");
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

void CkptServer::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stopped_; });
}

}  // namespace ckpt
