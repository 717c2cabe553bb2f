// ckptd: the sharded-checkpoint service. Flags fall back to CKPTD_* environment variables.
#include <malloc.h>

#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

#include "CLI/CLI.hpp"
#include "service/rpc/server.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  // Fetch and upload allocate and free buffers of about 1 MiB all the time (chunk reads, bands,
  // gRPC frames). glibc would serve each with a fresh mmap (page faults, TLB shootdowns on
  // munmap) and trim its heaps after frees; keep such buffers in the heap instead.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  ckpt::ServerOptions options;
  std::string port_file;
  std::string log_level = "info";
  int64_t min_free_mib = options.store.min_free_disk_bytes >> 20;
  int64_t map_budget_mib = options.store.mapped_bytes_budget >> 20;
  int64_t stream_mib = options.service.stream_bytes_in_flight >> 20;
  int64_t server_mib = options.service.server_bytes_in_flight >> 20;
  int64_t idle_minutes = absl::ToInt64Minutes(options.manager.upload_idle_timeout);
  int64_t job_bandwidth_mib = options.jobs.max_bytes_per_second >> 20;

  CLI::App app{"ckptd - serves sharded deep-learning checkpoints, re-sharded on demand"};
  // CKPT_VERSION is the CMake project version (service/CMakeLists.txt).
  app.set_version_flag("--version", "ckptd " CKPT_VERSION, "Print the version and exit");
  app.add_option("--listen", options.listen, "Address to listen on (port 0: any free port)")
      ->envname("CKPTD_LISTEN")
      ->capture_default_str();
  app.add_option("--data", options.data_dir, "Directory of the embedded RocksDB store")
      ->envname("CKPTD_DATA")
      ->capture_default_str();
  app.add_option("--port-file", port_file, "Write the bound port to this file once listening")
      ->envname("CKPTD_PORT_FILE");
  app.add_option("--io-threads", options.io_threads, "Worker threads for store I/O")
      ->envname("CKPTD_IO_THREADS")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--min-free-disk-mib", min_free_mib,
                 "Refuse writes while free disk is below this (MiB)")
      ->envname("CKPTD_MIN_FREE_DISK_MIB")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--map-budget-mib", map_budget_mib,
                 "Segment-file bytes mapped at once to serve chunks without copying (MiB); "
                 "chunks beyond it are read as copies")
      ->envname("CKPTD_MAP_BUDGET_MIB")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--stream-inflight-mib", stream_mib, "Fetch bytes a lone stream queues (MiB); open streams share it equally")
      ->envname("CKPTD_STREAM_INFLIGHT_MIB")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--server-inflight-mib", server_mib, "Fetch bytes queued per server (MiB)")
      ->envname("CKPTD_SERVER_INFLIGHT_MIB")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--upload-idle-minutes", idle_minutes,
                 "Discard uploads idle for this long (minutes)")
      ->envname("CKPTD_UPLOAD_IDLE_MINUTES")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--job-workers", options.jobs.workers,
                 "Transform jobs running at the same time (each on its own thread)")
      ->envname("CKPTD_JOB_WORKERS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--job-rank-workers", options.jobs.rank_workers,
                 "Destination ranks one export or new-checkpoint job writes at the same time")
      ->envname("CKPTD_JOB_RANK_WORKERS")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--job-bandwidth-mib", job_bandwidth_mib,
                 "Cap on the MiB/s all transform jobs together move (0: unlimited)")
      ->envname("CKPTD_JOB_BANDWIDTH_MIB")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->envname("CKPTD_LOG_LEVEL")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  options.store.min_free_disk_bytes = min_free_mib << 20;
  options.store.mapped_bytes_budget = map_budget_mib << 20;
  options.service.stream_bytes_in_flight = stream_mib << 20;
  options.service.server_bytes_in_flight = server_mib << 20;
  options.manager.upload_idle_timeout = absl::Minutes(idle_minutes);
  options.jobs.max_bytes_per_second = job_bandwidth_mib << 20;
  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n %v");

  // Block the shutdown signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto server = ckpt::CkptServer::Start(options);
  if (!server.ok()) {
    std::cerr << "ckptd: " << server.status().message() << "\n";
    return 1;
  }
  if (!port_file.empty()) {
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << (*server)->port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }
  std::thread watcher([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("event=signal signal={}", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    (*server)->Shutdown();
  });
  (*server)->Wait();
  watcher.join();
  return 0;
}
