// Prometheus metrics for ckptd (--metrics-listen): an HTTP endpoint serving /metrics in the text
// exposition format (prometheus-cpp's Exposer, civetweb underneath).
//
// Two kinds of metrics:
//   - RPC outcomes and latencies, recorded by a gRPC server interceptor (NewInterceptorFactory)
//     for every call of every service, at the moment its status is sent;
//   - the server's state and counters (bytes fetched, uploaded and written by jobs, open streams,
//     jobs by state, stored checkpoints, disk free, mapped bytes, DATA_LOSS, ...), read at scrape
//     time from a v1::ServerStats source (the same numbers the GetStats RPC returns), so that
//     nothing is counted twice and the engine stays free of Prometheus.
// The metric names and labels are listed in docs/operations.md.
#ifndef CKPT_SERVICE_METRICS_METRICS_H_
#define CKPT_SERVICE_METRICS_METRICS_H_

#include <grpcpp/support/server_interceptor.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ckpt.pb.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace ckpt {

class RpcMetrics;
class StatsCollectable;

// Thread-safe. The interceptor factory shares the RPC metrics (a shared_ptr), so the exporter and
// the gRPC server may be destroyed in either order; the stats source must stay valid while the
// exporter lives.
class MetricsExporter {
 public:
  using StatsSource = std::function<v1::ServerStats()>;

  // Listens on `listen` ("HOST:PORT"; port 0 picks a free port, see port()). `version` is
  // reported by ckptd_build_info. UNAVAILABLE naming the address when it cannot listen.
  static absl::StatusOr<std::unique_ptr<MetricsExporter>> Start(const std::string& listen,
                                                                const std::string& version);
  ~MetricsExporter();
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  // The bound port.
  int port() const { return port_; }

  // A factory for ServerBuilder::experimental().SetInterceptorCreators(): its interceptors record
  // ckptd_rpc_requests_total and ckptd_rpc_duration_seconds.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // Where the state metrics come from; called on the exposer's threads at each scrape (and must
  // stay valid until this exporter is destroyed). Until it is set, only the RPC metrics and
  // ckptd_build_info are served.
  void SetStatsSource(StatsSource source);

 private:
  MetricsExporter() = default;

  std::shared_ptr<RpcMetrics> rpc_;
  std::shared_ptr<StatsCollectable> stats_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_METRICS_METRICS_H_
