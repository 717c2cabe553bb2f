// ckptd: the sharded-checkpoint service. Flags fall back to CKPTD_* environment variables.
#include <malloc.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/synchronization/mutex.h"
#include "core/duration_flag.h"
#include "core/duration_text.h"
#include "service/engine/store_maintenance.h"
#include "service/log_format.h"
#include "service/rpc/server.h"
#include "spdlog/spdlog.h"

namespace {

// The command line: ServerOptions, with sizes in MiB and durations in minutes as the flags give
// them until Apply() converts them.
struct Flags {
  ckpt::ServerOptions options;
  std::string port_file;
  std::string log_level = "info";
  std::string log_format = "text";
  std::string metrics_port_file;
  int64_t min_free_mib = options.store.min_free_disk_bytes >> 20;
  int64_t map_budget_mib = options.store.mapped_bytes_budget >> 20;
  int64_t stream_mib = options.service.stream_bytes_in_flight >> 20;
  int64_t server_mib = options.service.server_bytes_in_flight >> 20;
  int64_t idle_minutes = absl::ToInt64Minutes(options.manager.upload_idle_timeout);
  int64_t job_bandwidth_mib = options.jobs.max_bytes_per_second >> 20;
  int64_t max_upload_gib = options.manager.upload.max_upload_bytes >> 30;
  std::string job_retention = ckpt::FormatDurationText(options.jobs.retention);
  double stall_seconds = absl::ToDoubleSeconds(options.service.fetch_stall_timeout);
  double grace_seconds = absl::ToDoubleSeconds(options.drain_timeout);
  int64_t connection_idle_seconds = absl::ToInt64Seconds(options.max_connection_idle);
  int64_t shared_chunk_cache_mib = options.manager.shared_chunk_cache_bytes >> 20;
  int64_t receive_window_mib = options.receive_window_bytes >> 20;

  // Copies the MiB and minute values into `options`.
  void Apply() {
    options.store.min_free_disk_bytes = min_free_mib << 20;
    options.store.mapped_bytes_budget = map_budget_mib << 20;
    options.service.stream_bytes_in_flight = stream_mib << 20;
    options.service.server_bytes_in_flight = server_mib << 20;
    options.manager.upload_idle_timeout = absl::Minutes(idle_minutes);
    options.jobs.max_bytes_per_second = job_bandwidth_mib << 20;
    options.manager.upload.max_upload_bytes = max_upload_gib << 30;
    // Validated by the flag's check; "0" keeps finished jobs forever.
    const absl::Duration retention = *ckpt::ParseDurationText(job_retention);
    options.jobs.retention =
        retention == absl::ZeroDuration() ? absl::InfiniteDuration() : retention;
    options.service.fetch_stall_timeout = absl::Seconds(stall_seconds);
    options.drain_timeout = absl::Seconds(grace_seconds);
    options.max_connection_idle = absl::Seconds(connection_idle_seconds);
    options.manager.shared_chunk_cache_bytes = shared_chunk_cache_mib << 20;
    options.receive_window_bytes = receive_window_mib << 20;
  }
};

// Where ckptd listens and keeps its data, and how much memory and disk its store uses.
void AddServerFlags(CLI::App& app, Flags& f) {
  app.add_option("--listen", f.options.listen, "Address to listen on (port 0: any free port)")
      ->envname("CKPTD_LISTEN")
      ->capture_default_str();
  app.add_option("--data", f.options.data_dir, "Directory of the embedded RocksDB store")
      ->envname("CKPTD_DATA")
      ->capture_default_str();
  app.add_option("--port-file", f.port_file, "Write the bound port to this file once listening")
      ->envname("CKPTD_PORT_FILE");
  app.add_option("--metrics-listen", f.options.metrics_listen,
                 "Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT; port 0: any free "
                 "port; default: off)")
      ->envname("CKPTD_METRICS_LISTEN");
  app.add_option("--metrics-port-file", f.metrics_port_file,
                 "Write the bound metrics port to this file once listening")
      ->envname("CKPTD_METRICS_PORT_FILE");
  app.add_option("--io-threads", f.options.io_threads, "Worker threads for store I/O")
      ->envname("CKPTD_IO_THREADS")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--min-free-disk-mib", f.min_free_mib,
                 "Refuse writes while free disk is below this (MiB)")
      ->envname("CKPTD_MIN_FREE_DISK_MIB")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--map-budget-mib", f.map_budget_mib,
                 "Segment-file bytes mapped at once to serve chunks without copying (MiB); "
                 "chunks beyond it are read as copies")
      ->envname("CKPTD_MAP_BUDGET_MIB")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
}

// Streams and connections: fetch send budgets, sharing and admission, upload limits, stalls,
// shutdown and idle connections.
void AddStreamFlags(CLI::App& app, Flags& f) {
  app.add_option("--stream-inflight-mib", f.stream_mib,
                 "Fetch bytes a lone stream queues (MiB); open streams share it equally")
      ->envname("CKPTD_STREAM_INFLIGHT_MIB")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--server-inflight-mib", f.server_mib, "Fetch bytes queued per server (MiB)")
      ->envname("CKPTD_SERVER_INFLIGHT_MIB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--shared-chunk-cache-mib", f.shared_chunk_cache_mib,
                 "Recently read chunks kept for other fetch streams that need them (MiB)")
      ->envname("CKPTD_SHARED_CHUNK_CACHE_MIB")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--max-active-fetches", f.options.service.max_active_fetches,
                 "Fetch streams producing at once; more wait in arrival order (0: no limit)")
      ->envname("CKPTD_MAX_ACTIVE_FETCHES")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--upload-idle-minutes", f.idle_minutes,
                 "Discard uploads idle for this long (minutes)")
      ->envname("CKPTD_UPLOAD_IDLE_MINUTES")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--max-upload-gib", f.max_upload_gib,
                 "Most tensor bytes one rank's upload stream may announce (GiB); larger "
                 "uploads are refused with RESOURCE_EXHAUSTED")
      ->envname("CKPTD_MAX_UPLOAD_GIB")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--stall-timeout", f.stall_seconds,
                 "Cancel a fetch stream whose client accepts nothing for this long (seconds; "
                 "0: never)")
      ->envname("CKPTD_STALL_TIMEOUT")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--shutdown-grace", f.grace_seconds,
                 "At SIGTERM, time given to open calls and to clients reading their last bytes "
                 "(seconds)")
      ->envname("CKPTD_SHUTDOWN_GRACE")
      ->check(CLI::Range(0.0, 1e5))
      ->capture_default_str();
  app.add_option("--max-connection-idle", f.connection_idle_seconds,
                 "Close a client connection without calls for this long (seconds; 0: never)")
      ->envname("CKPTD_MAX_CONNECTION_IDLE")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 31))
      ->capture_default_str();
  app.add_option("--max-streams-per-connection", f.options.max_streams_per_connection,
                 "Calls one client connection may run at once")
      ->envname("CKPTD_MAX_STREAMS_PER_CONNECTION")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--receive-window-mib", f.receive_window_mib,
                 "Bytes a client may send on one call ahead of ckptd handling them (MiB), held "
                 "in memory: per upload stream; 0: gRPC's automatic window, which grows with "
                 "the link and the upload")
      ->envname("CKPTD_RECEIVE_WINDOW_MIB")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  app.add_option("--max-connections", f.options.max_connections,
                 "Client TCP connections served at once; one more is closed at accept and its "
                 "client retries (0: no maximum)")
      ->envname("CKPTD_MAX_CONNECTIONS")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24))
      ->capture_default_str();
}

// Transform jobs.
void AddJobFlags(CLI::App& app, Flags& f) {
  app.add_option("--job-workers", f.options.jobs.workers,
                 "Transform jobs running at the same time (each on its own thread)")
      ->envname("CKPTD_JOB_WORKERS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--job-rank-workers", f.options.jobs.rank_workers,
                 "Destination ranks one export or new-checkpoint job writes at the same time")
      ->envname("CKPTD_JOB_RANK_WORKERS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--export-root", f.options.jobs.export_root,
                 "Directory beneath which transform jobs write --export-dir/--merged-file "
                 "outputs (their paths are relative to it); unset: such jobs are refused")
      ->envname("CKPTD_EXPORT_ROOT");
  app.add_option("--job-bandwidth-mib", f.job_bandwidth_mib,
                 "Cap on the MiB/s all transform jobs together move (0: unlimited)")
      ->envname("CKPTD_JOB_BANDWIDTH_MIB")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--job-retention", f.job_retention,
                 "Remove finished jobs' records this long after they ended, e.g. 12h, 7d "
                 "(0: keep them)")
      ->envname("CKPTD_JOB_RETENTION")
      ->check(ckpt::DurationValidator())
      ->capture_default_str();
}

// TLS, authentication and per-principal limits (docs/security.md).
void AddSecurityFlags(CLI::App& app, Flags& f) {
  app.add_option("--tls-cert", f.options.tls.cert_file,
                 "PEM certificate chain of the server: serve TLS (re-read when it changes)")
      ->envname("CKPTD_TLS_CERT");
  app.add_option("--tls-key", f.options.tls.key_file, "PEM private key of --tls-cert")
      ->envname("CKPTD_TLS_KEY");
  app.add_option("--tls-client-ca", f.options.tls.client_ca_file,
                 "PEM CA that client certificates must chain to: require mutual TLS; a "
                 "certificate's common name names the principal")
      ->envname("CKPTD_TLS_CLIENT_CA");
  app.add_option("--auth-tokens", f.options.auth.tokens_file,
                 "Principals file: lines NAME ROLE SHA256HEX (or NAME ROLE cert); re-read on "
                 "SIGHUP")
      ->envname("CKPTD_AUTH_TOKENS");
  app.add_flag("--insecure", f.options.insecure,
               "Allow listening beyond loopback without authentication or TLS")
      ->envname("CKPTD_INSECURE");
  app.add_option("--max-fetch-streams-per-principal", f.options.auth.max_fetch_streams,
                 "Open Fetch streams per principal (0: unlimited)")
      ->envname("CKPTD_MAX_FETCH_STREAMS_PER_PRINCIPAL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-uploads-per-principal", f.options.auth.max_uploads,
                 "Open Upload streams per principal (0: unlimited)")
      ->envname("CKPTD_MAX_UPLOADS_PER_PRINCIPAL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--max-queued-jobs-per-principal", f.options.auth.max_queued_jobs,
                 "Queued or running transform jobs per principal (0: unlimited)")
      ->envname("CKPTD_MAX_QUEUED_JOBS_PER_PRINCIPAL")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

void AddLogFlags(CLI::App& app, Flags& f) {
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->envname("CKPTD_LOG_LEVEL")
      ->capture_default_str();
  app.add_option("--log-format", f.log_format,
                 "text (time level logger key=value...) or json (one object per line)")
      ->envname("CKPTD_LOG_FORMAT")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
}

// Writes the port atomically (a temporary file renamed into place), so that a reader never sees
// a partial number.
void WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << port << "\n";
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  // Fetch and upload allocate and free buffers of about 1 MiB all the time (chunk reads, bands,
  // gRPC frames). glibc would serve each with a fresh mmap (page faults, TLB shootdowns on
  // munmap) and trim its heaps after frees; keep such buffers in the heap instead.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  // Two heaps instead of glibc's 8 per core: each heap keeps its own freed memory (the trim
  // threshold above), so with many heaps an upload's buffers and records spread over heaps that
  // each keep what was freed in them, and resident memory follows how long ckptd has run rather
  // than what it uses. glibc's per-thread caches keep the heaps' locks off the common path.
  mallopt(M_ARENA_MAX, 2);
  // Debian builds abseil without NDEBUG, which leaves absl::Mutex's deadlock detection on: every
  // lock gRPC takes then records itself in the thread's held locks and, under one process-wide
  // spin lock, in a graph of lock orders, and a cycle found there aborts the process. A debugging
  // aid: off in ckptd.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  Flags flags;
  CLI::App app{"ckptd - serves sharded deep-learning checkpoints, re-sharded on demand"};
  // CKPT_VERSION is the CMake project version (service/CMakeLists.txt).
  app.set_version_flag("--version", "ckptd " CKPT_VERSION, "Print the version and exit");
  AddServerFlags(app, flags);
  AddStreamFlags(app, flags);
  AddJobFlags(app, flags);
  AddSecurityFlags(app, flags);
  AddLogFlags(app, flags);
  // Offline maintenance of the store in --data, then exit (docs/storage.md). Not read from the
  // environment: a variable left set would turn every start into a one-shot run.
  bool verify = false;
  bool salvage = false;
  CLI::Option* verify_flag = app.add_flag(
      "--verify", verify,
      "Check every checkpoint in --data offline (read-only), list what is damaged, and exit: "
      "0 clean, 1 damaged, 2 the store cannot be opened");
  app.add_flag("--salvage,--repair", salvage,
               "Repair the index in --data offline (RocksDB RepairDB), drop the checkpoints that "
               "fail verification (listed), and exit: 0 the store is usable, 2 it is not")
      ->excludes(verify_flag);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  flags.Apply();
  spdlog::set_level(spdlog::level::from_str(flags.log_level));
  ckpt::SetUpLogging("ckptd", flags.log_format);
  if (verify || salvage) {
    // The report goes to stdout; keep the store's informational log lines out of it.
    if (flags.log_level == "info") spdlog::set_level(spdlog::level::warn);
    return verify ? ckpt::RunVerify(flags.options.data_dir, flags.options.store, stdout, stderr)
                  : ckpt::RunSalvage(flags.options.data_dir, flags.options.store, stdout, stderr);
  }

  // Block the shutdown signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);  // reload tokens and check certificates (CkptServer::Reload)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = ckpt::CkptServer::Start(flags.options);
  if (!server.ok()) {
    std::cerr << "ckptd: " << server.status().message() << "\n";
    return 1;
  }
  if (!flags.port_file.empty()) WritePortFile(flags.port_file, (*server)->port());
  if (!flags.metrics_port_file.empty() && (*server)->metrics_port() != 0) {
    WritePortFile(flags.metrics_port_file, (*server)->metrics_port());
  }
  std::thread watcher([&] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
      spdlog::info("event=signal signal=SIGHUP");
      (void)(*server)->Reload();  // logs its outcome; the server keeps running either way
    }
    spdlog::info("event=signal signal={}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (*server)->Shutdown();
  });
  (*server)->Wait();
  watcher.join();
  return 0;
}
