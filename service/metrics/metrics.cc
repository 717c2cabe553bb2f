#include "service/metrics/metrics.h"

#include <google/protobuf/descriptor.h>

#include <chrono>
#include <exception>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace ckpt {
namespace {

// Latency buckets (seconds): unary calls take milliseconds, a Fetch or Upload of a large rank
// minutes.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,
      2.5,   5,      10,    30,   60,    120,  300, 600,  1800, 3600};
  return buckets;
}

// Splits gRPC's "/package.Service/Method" into service and method. Names that no compiled-in
// service defines (a client calling an unknown method) become "unknown", so that clients cannot
// grow the label sets without bound.
std::pair<std::string, std::string> SplitMethod(const char* full) {
  std::string_view path = full == nullptr ? std::string_view() : std::string_view(full);
  if (!path.empty() && path.front() == '/') path.remove_prefix(1);
  const size_t slash = path.find('/');
  if (slash != std::string_view::npos) {
    std::string service(path.substr(0, slash));
    std::string method(path.substr(slash + 1));
    const google::protobuf::ServiceDescriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    if (descriptor != nullptr && descriptor->FindMethodByName(method) != nullptr) {
      return {std::move(service), std::move(method)};
    }
    // gRPC's built-in health service has no generated descriptor in the pool.
    if (service == "grpc.health.v1.Health" && (method == "Check" || method == "Watch")) {
      return {std::move(service), std::move(method)};
    }
  }
  return {"unknown", "unknown"};
}

}  // namespace

// ckptd_rpc_requests_total{service,method,code} and ckptd_rpc_duration_seconds{service,method}.
// Owns the registry they live in. Thread-safe (prometheus-cpp's families lock on Add; counters
// and histograms are atomic).
class RpcMetrics {
 public:
  RpcMetrics()
      : registry_(std::make_shared<prometheus::Registry>()),
        requests_(prometheus::BuildCounter()
                      .Name("ckptd_rpc_requests_total")
                      .Help("RPCs finished, by gRPC service, method and status code")
                      .Register(*registry_)),
        duration_(prometheus::BuildHistogram()
                      .Name("ckptd_rpc_duration_seconds")
                      .Help("Time from an RPC's arrival to its status being sent, by gRPC "
                            "service and method (streams: the whole stream)")
                      .Register(*registry_)) {}

  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void Record(const std::string& service, const std::string& method, grpc::StatusCode code,
              double seconds) {
    const std::string code_name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
    requests_.Add({{"service", service}, {"method", method}, {"code", code_name}}).Increment();
    duration_.Add({{"service", service}, {"method", method}}, LatencyBuckets()).Observe(seconds);
  }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& duration_;
};

namespace {

// One per call: times it from creation (the call's arrival) to the status being sent. A call
// that ends without sending a status (the client went away) is recorded as CANCELLED when the
// interceptor is destroyed with the call.
class RpcInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(grpc::experimental::ServerRpcInfo* info, std::shared_ptr<RpcMetrics> metrics)
      : metrics_(std::move(metrics)), start_(std::chrono::steady_clock::now()) {
    std::tie(service_, method_) = SplitMethod(info->method());
  }

  ~RpcInterceptor() override {
    if (!recorded_) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (!recorded_ && methods->QueryInterceptionHookPoint(
                          grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    recorded_ = true;
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    metrics_->Record(service_, method_, code, elapsed.count());
  }

  const std::shared_ptr<RpcMetrics> metrics_;
  const std::chrono::steady_clock::time_point start_;
  std::string service_;
  std::string method_;
  bool recorded_ = false;
};

class RpcInterceptorFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(std::shared_ptr<RpcMetrics> metrics)
      : metrics_(std::move(metrics)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcInterceptor(info, metrics_);
  }

 private:
  const std::shared_ptr<RpcMetrics> metrics_;
};

// Builders of metric families from plain values.
prometheus::ClientMetric Value(prometheus::MetricType type, double value,
                               std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

void Add(std::vector<prometheus::MetricFamily>& out, prometheus::MetricType type, std::string name,
         std::string help, std::vector<prometheus::ClientMetric> metrics) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  f.metric = std::move(metrics);
  out.push_back(std::move(f));
}

void Counter(std::vector<prometheus::MetricFamily>& out, std::string name, std::string help,
             int64_t value) {
  Add(out, prometheus::MetricType::Counter, std::move(name), std::move(help),
      {Value(prometheus::MetricType::Counter, static_cast<double>(value))});
}

void Gauge(std::vector<prometheus::MetricFamily>& out, std::string name, std::string help,
           double value) {
  Add(out, prometheus::MetricType::Gauge, std::move(name), std::move(help),
      {Value(prometheus::MetricType::Gauge, value)});
}

}  // namespace

// The state metrics, built from a fresh v1::ServerStats at each scrape, and ckptd_build_info.
class StatsCollectable final : public prometheus::Collectable {
 public:
  explicit StatsCollectable(std::string version) : version_(std::move(version)) {}

  void SetSource(MetricsExporter::StatsSource source) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    using prometheus::MetricType;
    std::vector<prometheus::MetricFamily> out;
    Add(out, MetricType::Gauge, "ckptd_build_info", "Always 1; labels carry the ckptd version",
        {Value(MetricType::Gauge, 1, {{"version", version_}})});
    v1::ServerStats s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!source_) return out;
      s = source_();
    }
    Counter(out, "ckptd_fetch_bytes_total", "Tensor bytes sent to clients by Fetch streams",
            s.fetch_bytes_sent());
    Counter(out, "ckptd_upload_bytes_total", "Tensor bytes received from clients by Upload streams",
            s.upload_bytes_received());
    Counter(out, "ckptd_job_written_bytes_total",
            "Tensor bytes written by transform jobs (a job that runs again counts again)",
            s.job_bytes_written());
    Gauge(out, "ckptd_fetch_streams", "Fetch streams open now", s.fetch_streams());
    Gauge(out, "ckptd_fetch_streams_waiting",
          "Fetch streams waiting now for a --max-active-fetches slot", s.fetch_streams_waiting());
    Counter(out, "ckptd_fetch_streams_waited_total",
            "Fetch streams that had to wait for a --max-active-fetches slot",
            s.fetch_streams_waited());
    Counter(out, "ckptd_fetch_pace_waits_total",
            "Times a Fetch stream waited for slower replicas of its rank to catch up",
            s.fetch_pace_waits());
    Counter(out, "ckptd_fetch_replicas_left_behind_total",
            "Fetch streams left behind by their replicas after making no progress",
            s.fetch_replicas_left_behind());
    Add(out, MetricType::Counter, "ckptd_fetch_chunks_shared_total",
        "Fetch streams' chunk requests served without a store read of their own, by where from",
        {Value(MetricType::Counter, s.fetch_chunks_joined(), {{"from", "read_in_flight"}}),
         Value(MetricType::Counter, s.fetch_chunks_live(), {{"from", "other_stream"}}),
         Value(MetricType::Counter, s.fetch_chunks_cached(), {{"from", "cache"}})});
    Gauge(out, "ckptd_fetch_cache_bytes",
          "Bytes of recently verified chunks kept for Fetch streams", s.fetch_cache_bytes());
    Gauge(out, "ckptd_fetch_cache_pinned_bytes",
          "Bytes of segment-file mappings the kept chunks hold resident",
          s.fetch_cache_pinned_bytes());
    Counter(out, "ckptd_fetch_cache_evictions_for_pins_total",
            "Kept chunks evicted to keep the mappings they hold within the cache's budget",
            s.fetch_cache_evicted_for_pins());
    Gauge(out, "ckptd_fetch_in_flight_bytes", "Fetch bytes queued for sending now, server-wide",
          s.fetch_bytes_in_flight());
    Gauge(out, "ckptd_connections", "TCP connections served now", s.connections());
    Counter(out, "ckptd_connections_refused_total",
            "Connections closed at accept for being over --max-connections",
            s.connections_refused());
    Counter(out, "ckptd_connections_shed_total",
            "Connections closed at accept for want of file descriptors", s.connections_shed());
    Gauge(out, "ckptd_upload_streams", "Upload streams open now", s.upload_streams());
    Gauge(out, "ckptd_pending_uploads", "Checkpoints being uploaded, not committed yet",
          s.pending_uploads());
    Add(out, MetricType::Gauge, "ckptd_jobs", "Transform jobs known now, by state",
        {Value(MetricType::Gauge, s.jobs_queued(), {{"state", "queued"}}),
         Value(MetricType::Gauge, s.jobs_running(), {{"state", "running"}}),
         Value(MetricType::Gauge, s.jobs_succeeded(), {{"state", "succeeded"}}),
         Value(MetricType::Gauge, s.jobs_failed(), {{"state", "failed"}}),
         Value(MetricType::Gauge, s.jobs_cancelled(), {{"state", "cancelled"}})});
    Gauge(out, "ckptd_checkpoints", "Committed checkpoints in the store", s.checkpoints());
    Gauge(out, "ckptd_checkpoint_stored_bytes", "Bytes the committed checkpoints store",
          s.checkpoint_stored_bytes());
    if (s.disk_free_bytes() >= 0) {
      Gauge(out, "ckptd_disk_free_bytes",
            "Bytes available on the file system of the store's directory", s.disk_free_bytes());
    }
    Counter(out, "ckptd_store_read_bytes_total", "Chunk bytes read from the store",
            s.store_bytes_read());
    Counter(out, "ckptd_store_read_chunks_total", "Chunks read from the store",
            s.store_chunks_read());
    Counter(out, "ckptd_store_copied_bytes_total",
            "Of the chunk bytes read, those read as copies instead of mapped views",
            s.store_bytes_copied());
    Counter(out, "ckptd_store_written_bytes_total", "Chunk bytes written to the store",
            s.store_bytes_written());
    Counter(out, "ckptd_store_written_chunks_total", "Chunks written to the store",
            s.store_chunks_written());
    Gauge(out, "ckptd_store_mapped_bytes", "Bytes of segment-file pages mapped now",
          s.store_mapped_bytes());
    Add(out, MetricType::Counter, "ckptd_data_loss_total",
        "Stored data that failed its checksum: RPCs that ended with DATA_LOSS and jobs that "
        "failed with it",
        {Value(MetricType::Counter, s.data_loss_rpcs(), {{"source", "rpc"}}),
         Value(MetricType::Counter, s.data_loss_jobs(), {{"source", "job"}})});
    Gauge(out, "process_resident_memory_bytes", "Resident set size of ckptd (VmRSS)",
          s.rss_bytes());
    Gauge(out, "ckptd_resident_memory_peak_bytes", "Peak resident set size of ckptd (VmHWM)",
          s.peak_rss_bytes());
    Gauge(out, "ckptd_uptime_seconds", "Seconds since ckptd started serving", s.uptime_seconds());
    return out;
  }

 private:
  const std::string version_;
  mutable std::mutex mu_;
  MetricsExporter::StatsSource source_;
};

absl::StatusOr<std::unique_ptr<MetricsExporter>> MetricsExporter::Start(
    const std::string& listen, const std::string& version) {
  if (listen.empty() || listen.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen, ": expected HOST:PORT, e.g. 127.0.0.1:9464"));
  }
  std::unique_ptr<MetricsExporter> m(new MetricsExporter());
  m->rpc_ = std::make_shared<RpcMetrics>();
  m->stats_ = std::make_shared<StatsCollectable>(version);
  try {
    // civetweb's "listening_ports": "v4addr:port" or "host:port" (Debian's build refuses
    // "[v6addr]:port"). Two threads: scrapes are rare and cheap.
    m->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty() || ports.front() <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen));
  }
  m->port_ = ports.front();
  m->exposer_->RegisterCollectable(m->rpc_->registry());
  m->exposer_->RegisterCollectable(m->stats_);
  return m;
}

MetricsExporter::~MetricsExporter() {
  // Stop serving before the collectables (and the stats source's referents) go away.
  exposer_.reset();
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
MetricsExporter::NewInterceptorFactory() {
  return std::make_unique<RpcInterceptorFactory>(rpc_);
}

void MetricsExporter::SetStatsSource(StatsSource source) { stats_->SetSource(std::move(source)); }

}  // namespace ckpt
