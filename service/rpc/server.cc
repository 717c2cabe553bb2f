#include "service/rpc/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/resource.h>

#include <algorithm>
#include <iostream>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "core/status_macros.h"
#include "spdlog/spdlog.h"

namespace ckpt {

bool IsLoopbackAddress(const std::string& listen) {
  if (listen.rfind("unix:", 0) == 0 || listen.rfind("unix-abstract:", 0) == 0) return true;
  std::string host = listen;
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    if (close == std::string::npos) return false;
    host = host.substr(1, close - 1);
  } else if (const size_t colon = host.rfind(':'); colon != std::string::npos) {
    host = host.substr(0, colon);
  }
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  int parts = 0;
  for (absl::string_view part : absl::StrSplit(host, '.')) {
    int value = 0;
    if (!absl::SimpleAtoi(part, &value) || value < 0 || value > 255) return false;
    if (parts == 0 && value != 127) return false;
    ++parts;
  }
  return parts == 4;
}

namespace {

// Secure by default (ServerOptions::insecure): OK, or FAILED_PRECONDITION saying what to add.
absl::Status CheckExposure(const ServerOptions& options) {
  if (!options.tls.client_ca_file.empty() && !options.tls.enabled()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  const bool authenticated =
      !options.auth.tokens_file.empty() || !options.tls.client_ca_file.empty();
  if (IsLoopbackAddress(options.listen)) return absl::OkStatus();
  std::string problem;
  if (!authenticated) {
    problem = absl::StrCat("refusing to listen on ", options.listen,
                           " without authentication: give --auth-tokens FILE (with --tls-cert and "
                           "--tls-key) or --tls-client-ca FILE, listen on 127.0.0.1, or pass "
                           "--insecure to serve every client as admin");
  } else if (!options.tls.enabled()) {
    problem = absl::StrCat("refusing to listen on ", options.listen,
                           " without TLS: bearer tokens would cross the network in clear text; "
                           "give --tls-cert and --tls-key, or pass --insecure");
  }
  if (problem.empty()) return absl::OkStatus();
  if (!options.insecure) return absl::FailedPreconditionError(problem);
  const std::string warning =
      absl::StrCat("WARNING: --insecure: serving on ", options.listen,
                   authenticated ? " without TLS (tokens travel in clear text)"
                                 : " without authentication (every client is admin)");
  std::cerr << "ckptd: " << warning << std::endl;
  spdlog::warn("event=insecure listen={} message=\"{}\"", options.listen, warning);
  return absl::OkStatus();
}

// Raises this process's soft limit on open files to its hard limit: every connection holds a
// descriptor, and the store needs its own. Returns the limit in force.
int64_t RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return -1;
  if (limit.rlim_cur < limit.rlim_max) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  return limit.rlim_cur == RLIM_INFINITY ? -1 : static_cast<int64_t>(limit.rlim_cur);
}

// The server's transport credentials: TLS when configured (its files checked first and
// described in the log), else insecure.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerCredentials(
    const ServerOptions& options) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (options.tls.enabled()) {
    absl::StatusOr<std::string> tls = CheckTlsFiles(options.tls);
    if (!tls.ok()) return tls.status();
    spdlog::info("event=tls {}{}", *tls,
                 options.tls.client_ca_file.empty() ? "" : " client_certificates=required");
    credentials = MakeTlsServerCredentials(options.tls);
  }
  return credentials;
}

// The channel arguments that bound the server's connections.
void AddConnectionLimits(const ServerOptions& options, grpc::ServerBuilder& builder) {
  // gRPC sets SO_REUSEPORT by default, so a second ckptd on a taken port would start and share
  // the connections silently; refuse instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Bounded connections (ServerOptions): dead peers found by keepalive pings, idle connections
  // closed, calls per connection capped. No maximum connection age: a long fetch must not be
  // cut.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  if (options.max_connection_idle > absl::ZeroDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_IDLE_MS,
        static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(options.max_connection_idle),
                                           std::numeric_limits<int>::max())));
  }
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_streams_per_connection);
  // A fixed receive window per call (ServerOptions::receive_window_bytes): without the
  // bandwidth-delay-product probe, gRPC keeps the window it is given.
  if (options.receive_window_bytes > 0) {
    builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                               static_cast<int>(std::min<int64_t>(
                                   options.receive_window_bytes, std::numeric_limits<int>::max())));
  }
}

// The start line: where the server listens, its resources and its security.
void LogStart(const ServerOptions& options, int port, int64_t open_files, bool auth_enabled) {
  spdlog::info(
      "event=start listen={} port={} data={} io_threads={} job_workers={} open_files={} "
      "tls={} auth={}",
      options.listen, port, options.data_dir, options.io_threads, options.jobs.workers, open_files,
      !options.tls.enabled()               ? "off"
      : options.tls.client_ca_file.empty() ? "on"
                                           : "mutual",
      !auth_enabled                      ? "off"
      : options.auth.tokens_file.empty() ? "client-certificates"
                                         : "tokens");
}

}  // namespace

absl::StatusOr<std::unique_ptr<CkptServer>> CkptServer::Start(ServerOptions options) {
  options.auth.client_certs = !options.tls.client_ca_file.empty();
  CKPT_RETURN_IF_ERROR(CheckPolicyCoversService());
  CKPT_RETURN_IF_ERROR(CheckExposure(options));
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                        ServerCredentials(options));
  absl::StatusOr<std::unique_ptr<Authenticator>> auth = Authenticator::Create(options.auth);
  if (!auth.ok()) return auth.status();
  std::unique_ptr<CkptServer> s(new CkptServer());
  s->auth_ = std::move(*auth);
  s->options_ = options;
  CKPT_ASSIGN_OR_RETURN(s->store_, OpenSegmentStore(options.data_dir, options.store));
  s->manager_ = std::make_unique<CheckpointManager>(s->store_.get(), options.manager);
  JobRunnerOptions job_options = options.jobs;
  job_options.upload = options.manager.upload;
  s->jobs_ = std::make_unique<JobRunner>(s->manager_.get(), job_options);
  CKPT_RETURN_IF_ERROR(s->jobs_->Start());
  s->jobs_->RemoveExpired(absl::Now());  // finished jobs past --job-retention
  s->executor_ = std::make_unique<Executor>(options.io_threads);
  ServiceOptions service_options = options.service;
  service_options.data_dir = options.data_dir;  // GetStats' disk free
  s->service_ = std::make_unique<CheckpointServiceImpl>(
      s->manager_.get(), s->jobs_.get(), s->executor_.get(), service_options, s->auth_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (std::optional<TcpListenAddress> tcp = ParseTcpListenAddress(options.listen)) {
    CKPT_ASSIGN_OR_RETURN(s->acceptor_, TcpAcceptor::Listen(*tcp, options.drain_timeout));
    s->port_ = s->acceptor_->port();
    s->acceptor_->set_max_connections(options.max_connections);
    s->service_->SetConnectionSource([acceptor = s->acceptor_.get()](v1::ServerStats* out) {
      out->set_connections(acceptor->connections());
      out->set_connections_refused(acceptor->refused());
      out->set_connections_shed(acceptor->shed());
    });
    s->connections_ = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
  } else {
    builder.AddListeningPort(options.listen, credentials, &s->port_);
  }
  AddConnectionLimits(options, builder);
  // The open-file limit is raised to its hard limit (logged at start).
  const int64_t open_files = RaiseOpenFileLimit();
  builder.RegisterService(s->service_.get());
  // Interceptors, in order, for every call of every service.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  if (!options.metrics_listen.empty()) {
    CKPT_ASSIGN_OR_RETURN(s->metrics_,
                          MetricsExporter::Start(options.metrics_listen, CKPT_VERSION));
    interceptors.push_back(s->metrics_->NewInterceptorFactory());
  }
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  // Data messages are ≤ 1 MiB, but a strategy (PutStrategy, GetStrategy) of a large model is
  // one message of several MiB: 64 MiB bounds what one message may make the server hold.
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid?)"));
  }
  s->server_->GetHealthCheckService()->SetServingStatus(true);
  // By name too, for probes that ask for the service (Shutdown's SetServingStatus(false) covers
  // every name).
  s->server_->GetHealthCheckService()->SetServingStatus(v1::CheckpointService::service_full_name(),
                                                        true);
  if (s->metrics_) {
    s->metrics_->SetStatsSource([service = s->service_.get()] { return service->Stats(); });
    spdlog::info("event=metrics listen={} port={}", options.metrics_listen, s->metrics_->port());
  }
  if (s->acceptor_) s->acceptor_->Start(s->connections_.get());
  s->maintenance_ = std::thread([raw = s.get()] { raw->MaintenanceLoop(); });
  LogStart(options, s->port_, open_files, s->auth_->enabled());
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
    manager_->ReleaseFreedUploadMemory();
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
  const absl::Time deadline = absl::Now() + options_.drain_timeout;
  spdlog::info("event=shutdown phase=drain grace_ms={}",
               absl::ToInt64Milliseconds(options_.drain_timeout));
  // Members may be missing when Start() failed half way (e.g. the port was taken).
  if (server_) server_->GetHealthCheckService()->SetServingStatus(false);
  if (service_) service_->StartShutdown();
  if (acceptor_) acceptor_->Stop();  // no new connections; open ones drain below
  // Before draining: jobs stop promptly (running ones stay RUNNING and resume at the next
  // start), and WatchJob streams end instead of holding the drain until its timeout.
  if (jobs_) jobs_->Shutdown();
  if (server_) {
    // Fetch streams still open when a quarter of the grace (at most 5 s) remains are ended with
    // UNAVAILABLE, a status their clients see; gRPC cancels what is left at the deadline.
    std::mutex drain_mu;
    std::condition_variable drain_cv;
    bool drained = false;
    std::thread ender([&] {
      const absl::Time end_at = deadline - std::min(options_.drain_timeout / 4, absl::Seconds(5));
      std::unique_lock<std::mutex> lock(drain_mu);
      if (!drain_cv.wait_until(lock, absl::ToChronoTime(end_at), [&] { return drained; })) {
        lock.unlock();
        spdlog::warn("event=shutdown phase=end_streams fetch_streams={} status=UNAVAILABLE",
                     service_->stream_watch()->size());
        service_->EndStreamsForShutdown();
      }
    });
    server_->Shutdown(absl::ToChronoTime(deadline));
    server_->Wait();
    {
      std::lock_guard<std::mutex> lock(drain_mu);
      drained = true;
    }
    drain_cv.notify_all();
    ender.join();
    // Every call has ended, and gRPC has closed or is closing its connections, the last bytes
    // of a stream possibly still in socket buffers, not yet read by a slow client. The acceptor
    // holds each socket until its client has read to the end and closed it (tcp_acceptor.h);
    // exiting earlier would reset those connections and lose the bytes. Wait for that, until the
    // grace ends but at least min(grace, 5 s) from now; clients that have acknowledged every
    // byte are let go by the acceptor after TcpAcceptor::kAckedLinger.
    if (acceptor_) {
      const absl::Time linger_until =
          std::max(deadline, absl::Now() + std::min(options_.drain_timeout, absl::Seconds(5)));
      const absl::Time linger_start = absl::Now();
      TcpAcceptor::Held held = acceptor_->held();
      while (held.open > 0 && absl::Now() < linger_until) {
        absl::SleepFor(absl::Milliseconds(20));
        held = acceptor_->held();
      }
      const int64_t ms = absl::ToInt64Milliseconds(absl::Now() - linger_start);
      if (held.unacknowledged > 0) {
        spdlog::warn(
            "event=shutdown phase=linger ms={} connections_left={} unacknowledged_connections={} "
            "unacknowledged_bytes={} (those clients may miss the end of what they were sent)",
            ms, held.open, held.unacknowledged, held.unacknowledged_bytes);
      } else {
        spdlog::info("event=shutdown phase=linger ms={} connections_left={} unacknowledged_bytes=0",
                     ms, held.open);
      }
    }
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

absl::Status CkptServer::Reload() {
  absl::Status first;
  if (!options_.auth.tokens_file.empty()) {
    if (absl::Status s = auth_->Reload(); !s.ok()) {
      spdlog::error("event=reload what=tokens outcome=kept_previous error=\"{}\"",
                    std::string(s.message()));
      first.Update(s);
    } else {
      spdlog::info("event=reload what=tokens outcome=ok file={}", options_.auth.tokens_file);
    }
  }
  if (options_.tls.enabled()) {
    absl::StatusOr<std::string> tls = CheckTlsFiles(options_.tls);
    if (!tls.ok()) {
      spdlog::error("event=reload what=tls outcome=invalid error=\"{}\"",
                    std::string(tls.status().message()));
      first.Update(tls.status());
    } else {
      spdlog::info("event=reload what=tls outcome=ok {} (new connections within {} s)", *tls,
                   kTlsRefreshSeconds);
    }
  }
  return first;
}

void CkptServer::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return stopped_; });
}

}  // namespace ckpt
