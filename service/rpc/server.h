// ckptd's server: the store, the engine (manager, job runner, executor) and the gRPC service,
// with health and reflection, periodic maintenance and graceful shutdown.
#ifndef CKPT_SERVICE_RPC_SERVER_H_
#define CKPT_SERVICE_RPC_SERVER_H_

#include <grpcpp/server.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/executor.h"
#include "service/engine/job_runner.h"
#include "service/engine/manager.h"
#include "service/metrics/metrics.h"
#include "service/rpc/auth.h"
#include "service/rpc/auth_tls.h"
#include "service/rpc/checkpoint_service.h"
#include "service/rpc/tcp_acceptor.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct ServerOptions {
  // Address to listen on; port 0 picks a free port (see CkptServer::port()).
  std::string listen = "127.0.0.1:50051";
  // Directory of the store: its RocksDB database (metadata, manifests, jobs, chunk locations) and
  // the segment files that hold chunk bytes.
  std::string data_dir = "./data";
  // Address of the Prometheus /metrics endpoint ("HOST:PORT"; port 0: any free port, see
  // CkptServer::metrics_port()); empty: no metrics endpoint.
  std::string metrics_listen;
  // Worker threads for store I/O and planning. Default 4.
  int io_threads = 4;
  // How often idle uploads are expired and orphaned chunks collected. Default 60 s.
  absl::Duration maintenance_interval = absl::Seconds(60);
  // Time given to in-flight RPCs at shutdown. Fetch streams still open when a quarter of it
  // (at most 5 s) remains are ended with UNAVAILABLE "ckptd is shutting down; retry"; gRPC
  // cancels whatever is left at its end. Then ckptd waits, up to the same deadline but at least
  // min(drain_timeout, 5 s), until the clients of the connections gRPC closed have received every
  // byte and closed their end (tcp_acceptor.h), so that bytes already sent are read rather than
  // reset away by the exit. In normal operation too, a connection gRPC closed is held at most
  // this long for its client to do so. Default 30 s.
  absl::Duration drain_timeout = absl::Seconds(30);
  // Connections: the server pings a connection silent for keepalive_time and closes it when no
  // answer comes within keepalive_timeout (a peer that vanished); a connection without calls
  // for max_connection_idle is closed (clients reconnect on their next call; zero: never); at
  // most max_streams_per_connection calls run at once on one connection; at most
  // max_connections TCP connections are served at once (0: no maximum; tcp_acceptor.h).
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration max_connection_idle = absl::Minutes(5);
  int max_streams_per_connection = 1024;
  int64_t max_connections = 4096;
  // HTTP/2 receive window of each call (bytes): what a client may send ahead of the handler,
  // which gRPC holds in memory (an upload stream's data messages wait there while the store
  // writes earlier ones). Fixed, so that ckptd's memory per upload stream is at most this plus
  // the message being read, however long the upload runs. 0: gRPC's automatic window, which
  // follows its estimate of the link's bandwidth-delay product and, on a fast link, grows to
  // tens of MiB per stream as an upload goes on.
  int64_t receive_window_bytes = int64_t{4} << 20;
  StoreOptions store;
  ManagerOptions manager;
  ServiceOptions service;
  // Transform jobs. Its `upload` is replaced by manager.upload, so that job-written checkpoints
  // are chunked like uploaded ones.
  JobRunnerOptions jobs;
  // TLS (tls.enabled()) and mutual TLS (tls.client_ca_file). Plaintext when not enabled.
  TlsOptions tls;
  // Principals (auth_tokens.h) and per-principal limits. auth.client_certs is set by Start()
  // from tls.client_ca_file.
  AuthOptions auth;
  // Secure by default: unless listen is a loopback (or unix:) address, Start() refuses to serve
  // without authentication (auth.tokens_file or tls.client_ca_file) and TLS, so that neither
  // anonymous admins nor clear-text tokens reach a network. `insecure` allows it, with a warning.
  bool insecure = false;
};

// True for 127.0.0.0/8, ::1, localhost and unix: addresses (HOST:PORT, [V6]:PORT or unix:PATH).
bool IsLoopbackAddress(const std::string& listen);

// Thread-safe: Shutdown() may be called from any thread (e.g. a signal watcher).
class CkptServer {
 public:
  static absl::StatusOr<std::unique_ptr<CkptServer>> Start(ServerOptions options);
  ~CkptServer();

  int port() const { return port_; }
  // The bound port of the metrics endpoint; 0 when ServerOptions::metrics_listen is empty.
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // Marks NOT_SERVING, stops the job runner (running jobs stay RUNNING and resume at the next
  // start; job watches end), stops accepting calls, drains in-flight ones (cancelling them after
  // the drain timeout), flushes the store. Idempotent.
  void Shutdown();
  // Blocks until Shutdown() completed.
  void Wait();
  // SIGHUP: re-reads the tokens file (a bad file keeps the current table) and checks the TLS
  // files, which gRPC's watcher picks up by itself within kTlsRefreshSeconds; logs the outcome
  // of each and returns the first error.
  absl::Status Reload();

 private:
  CkptServer() = default;
  void MaintenanceLoop();

  ServerOptions options_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<CheckpointManager> manager_;
  std::unique_ptr<JobRunner> jobs_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<CheckpointServiceImpl> service_;
  // TCP listen addresses are accepted by acceptor_ (tcp_acceptor.h) and handed to gRPC through
  // connections_; other addresses (unix:) are gRPC's own listening ports.
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> connections_;
  std::unique_ptr<TcpAcceptor> acceptor_;  // declared after connections_: stops before it goes
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread maintenance_;
  // Last: destroyed first, so that no scrape reads the service while it is destroyed.
  std::unique_ptr<MetricsExporter> metrics_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_SERVER_H_
