// Operating ckptd: its Prometheus endpoint (--metrics-listen) checked by Debian's promtool and
// scraped by Debian's real prometheus server, `ckptctl stats`, JSON logs (--log-format json) and
// the gRPC health service by name. A real ckptd on 127.0.0.1:0, driven through ckptctl.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/ckpt_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_check.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/server_process.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;
using testing::TempDir;

constexpr char kPromtool[] = "/usr/bin/promtool";
constexpr char kPrometheus[] = "/usr/bin/prometheus";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Waits up to 30 s for a file holding a port number.
int WaitForPortFile(const std::string& path) {
  for (int i = 0; i < 300; ++i) {
    int port = 0;
    std::string text = ReadFile(path);
    if (!text.empty() && text.back() == '\n' &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) {
      return port;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

// A free TCP port on 127.0.0.1 (bound and released; good enough for a test).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

struct HttpResponse {
  int status = 0;
  std::string content_type;
  std::string body;
};

// A plain HTTP/1.0 GET of http://127.0.0.1:PORT/TARGET; status 0 when it could not connect.
HttpResponse HttpGet(int port, const std::string& target) {
  HttpResponse r;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return r;
  }
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  const std::string request =
      absl::StrCat("GET ", target, " HTTP/1.0\r\nHost: 127.0.0.1:", port, "\r\n\r\n");
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return r;
  }
  std::string raw;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return r;
  std::vector<std::string> head = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status_line = absl::StrSplit(head[0], ' ');
  if (status_line.size() < 2 || !absl::SimpleAtoi(status_line[1], &r.status)) return r;
  for (const std::string& h : head) {
    if (absl::StartsWithIgnoreCase(h, "content-type:")) {
      r.content_type = std::string(absl::StripAsciiWhitespace(h.substr(13)));
    }
  }
  r.body = raw.substr(end + 4);
  return r;
}

// The value of the sample `series` (name with its labels exactly as exposed, e.g.
// `ckptd_jobs{state="queued"}`) in a text exposition; -1 when absent.
double Sample(const std::string& exposition, const std::string& series) {
  for (const std::string& line : testing::SplitLines(exposition)) {
    if (line.rfind(series + " ", 0) == 0) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

// Tensor bytes of a MindSpore .ckpt file: what Fetch sends for it, or Upload receives.
int64_t TensorBytes(const std::string& path) {
  auto tensors = DecodeCkpt(ReadFile(path));
  EXPECT_TRUE(tensors.ok()) << path << ": " << tensors.status();
  int64_t total = 0;
  if (tensors.ok()) {
    for (const CkptTensor& t : *tensors) total += static_cast<int64_t>(t.data.size());
  }
  return total;
}

// A child process in the background (prometheus), its output to a log file; SIGTERM and reaped
// by the destructor.
class Background {
 public:
  Background(const std::vector<std::string>& args, const std::string& log_path) {
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    pid_ = fork();
    if (pid_ == 0) {
      const int null_fd = open("/dev/null", O_RDONLY);
      dup2(null_fd, 0);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(log_fd);
  }
  ~Background() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  bool started() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

class ObservabilityTest : public ::testing::Test {
 protected:
  // Starts ckptd with `extra` flags (on top of --listen 127.0.0.1:0 --data).
  void StartServer(std::vector<std::string> extra = {}) {
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", extra);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  testing::SubprocessResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {CKPTCTL_PATH, "--server", server_->address()});
    auto r = testing::RunSubprocess(args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : testing::SubprocessResult{};
  }

  void CtlOk(std::vector<std::string> args) {
    const std::string what = absl::StrJoin(args, " ");
    auto r = Ctl(std::move(args));
    ASSERT_EQ(r.exit_code, 0) << what << ": " << r.stderr_text << r.stdout_text;
  }

  // The `ckptctl sample` demo uploaded as checkpoint "demo" and rank 1 of "dst" fetched into
  // r1.ckpt; returns the tensor bytes uploaded and fetched.
  std::pair<int64_t, int64_t> UploadAndFetch() {
    CtlOk({"sample", dir_ / "demo"});
    CtlOk({"strategy", "put", "src", dir_ / "demo/src_strategy.ckpt"});
    CtlOk({"strategy", "put", "dst", dir_ / "demo/dst_strategy.json"});
    CtlOk({"upload", "demo", "--strategy", "src", "--dir", dir_ / "demo/checkpoint"});
    CtlOk({"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out", dir_ / "r1.ckpt"});
    int64_t uploaded = 0;
    for (const auto& entry :
         std::filesystem::recursive_directory_iterator(dir_ / "demo/checkpoint")) {
      if (entry.path().extension() == ".ckpt") uploaded += TensorBytes(entry.path());
    }
    return {uploaded, TensorBytes(dir_ / "r1.ckpt")};
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ObservabilityTest, MetricsEndpointPassesPromtoolAndPrometheusScrapesIt) {
  StartServer({"--metrics-listen", "127.0.0.1:0", "--metrics-port-file", dir_ / "metrics_port"});
  const int metrics_port = WaitForPortFile(dir_ / "metrics_port");
  ASSERT_GT(metrics_port, 0) << server_->Log();
  EXPECT_THAT(server_->Log(),
              HasSubstr(absl::StrCat("event=metrics listen=127.0.0.1:0 port=", metrics_port)));
  const auto [uploaded, fetched] = UploadAndFetch();
  ASSERT_GT(fetched, 0);
  ASSERT_GT(uploaded, fetched);

  const HttpResponse r = HttpGet(metrics_port, "/metrics");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.content_type, HasSubstr("text/plain"));
  const std::string& m = r.body;
  EXPECT_EQ(Sample(m, "ckptd_fetch_bytes_total"), static_cast<double>(fetched)) << m;
  EXPECT_EQ(Sample(m, "ckptd_upload_bytes_total"), static_cast<double>(uploaded)) << m;
  EXPECT_EQ(Sample(m, "ckptd_build_info{version=\"" CKPT_VERSION "\"}"), 1) << m;
  // Every source rank is one Upload stream, each finished OK; one Fetch.
  EXPECT_EQ(Sample(m,
                   "ckptd_rpc_requests_total{code=\"OK\",method=\"Upload\",service=\"ckpt.v1."
                   "CheckpointService\"}"),
            8)
      << m;
  EXPECT_EQ(Sample(m,
                   "ckptd_rpc_requests_total{code=\"OK\",method=\"Fetch\",service=\"ckpt.v1."
                   "CheckpointService\"}"),
            1)
      << m;
  EXPECT_EQ(Sample(m,
                   "ckptd_rpc_duration_seconds_count{method=\"Fetch\",service=\"ckpt.v1."
                   "CheckpointService\"}"),
            1)
      << m;
  EXPECT_EQ(Sample(m, "ckptd_checkpoints"), 1) << m;
  EXPECT_GT(Sample(m, "ckptd_checkpoint_stored_bytes"), 0) << m;
  EXPECT_GT(Sample(m, "ckptd_disk_free_bytes"), 0) << m;
  EXPECT_EQ(Sample(m, "ckptd_fetch_streams"), 0) << m;
  EXPECT_EQ(Sample(m, "ckptd_upload_streams"), 0) << m;
  EXPECT_GE(Sample(m, "ckptd_connections"), 0) << m;  // present (-1: missing)
  EXPECT_EQ(Sample(m, "ckptd_connections_refused_total"), 0) << m;
  EXPECT_EQ(Sample(m, "ckptd_connections_shed_total"), 0) << m;
  EXPECT_EQ(Sample(m, "ckptd_jobs{state=\"running\"}"), 0) << m;
  EXPECT_EQ(Sample(m, "ckptd_data_loss_total{source=\"rpc\"}"), 0) << m;
  EXPECT_GE(Sample(m, "ckptd_store_mapped_bytes"), 0) << m;
  EXPECT_GE(Sample(m, "ckptd_fetch_chunks_shared_total{from=\"cache\"}"), 0) << m;
  EXPECT_GE(Sample(m, "ckptd_fetch_cache_bytes"), 0) << m;
  EXPECT_GE(Sample(m, "ckptd_fetch_cache_pinned_bytes"), 0) << m;
  EXPECT_GE(Sample(m, "ckptd_fetch_cache_evictions_for_pins_total"), 0) << m;
  EXPECT_GT(Sample(m, "ckptd_store_written_bytes_total"), 0) << m;

  // A misspelt method is counted, but under "unknown", not under a name the client chose.
  {
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    grpc::GenericStub generic(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    grpc::Status status;
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    generic.UnaryCall(&ctx, "/ckpt.v1.CheckpointService/NoSuchMethod", grpc::StubOptions(),
                      &request, &response, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_all();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  const std::string after = HttpGet(metrics_port, "/metrics").body;
  EXPECT_THAT(after, ::testing::Not(HasSubstr("NoSuchMethod")));
  EXPECT_EQ(Sample(after,
                   "ckptd_rpc_requests_total{code=\"UNIMPLEMENTED\",method=\"unknown\","
                   "service=\"unknown\"}"),
            1)
      << after;

  // Debian's promtool lints the exposition (names, units, HELP and TYPE lines).
  if (!std::filesystem::exists(kPromtool) || !std::filesystem::exists(kPrometheus)) {
    GTEST_SKIP() << "promtool/prometheus not installed (Debian package prometheus; "
                    "deploy/install-deps.sh installs it): exposition not linted, not scraped";
  }
  {
    std::ofstream(dir_ / "metrics.txt") << m;
    auto lint = testing::RunSubprocess(
        {"/bin/sh", "-c", absl::StrCat(kPromtool, " check metrics < ", dir_ / "metrics.txt")});
    ASSERT_TRUE(lint.ok()) << lint.status();
    EXPECT_EQ(lint->exit_code, 0) << lint->stdout_text << lint->stderr_text;
  }

  // Debian's prometheus server scrapes ckptd every second and answers a query for the fetched
  // bytes.
  const int prometheus_port = FreePort();
  ASSERT_GT(prometheus_port, 0);
  std::ofstream(dir_ / "prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "scrape_configs:\n  - job_name: ckptd\n    static_configs:\n"
      << "      - targets: ['127.0.0.1:" << metrics_port << "']\n";
  Background prometheus({kPrometheus, "--config.file=" + dir_ / "prometheus.yml",
                         "--storage.tsdb.path=" + dir_ / "tsdb",
                         absl::StrCat("--web.listen-address=127.0.0.1:", prometheus_port)},
                        dir_ / "prometheus.log");
  ASSERT_TRUE(prometheus.started());
  std::string answer;
  std::string value;
  for (int i = 0; i < 600 && value.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const HttpResponse q = HttpGet(prometheus_port, "/api/v1/query?query=ckptd_fetch_bytes_total");
    if (q.status != 200) continue;
    answer = q.body;
    auto j = nlohmann::json::parse(q.body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") continue;
    const auto& result = j["data"]["result"];
    if (!result.is_array() || result.empty()) continue;
    EXPECT_EQ(result[0]["metric"]["job"], "ckptd");
    value = result[0]["value"][1].get<std::string>();
  }
  ASSERT_FALSE(value.empty()) << "prometheus did not answer with the sample; last answer: "
                              << answer << "\nprometheus log:\n"
                              << ReadFile(dir_ / "prometheus.log");
  EXPECT_EQ(value, std::to_string(fetched));
  // The scrape itself was healthy.
  const HttpResponse up = HttpGet(prometheus_port, "/api/v1/query?query=up%7Bjob%3D%22ckptd%22%7D");
  auto j = nlohmann::json::parse(up.body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << up.body;
  EXPECT_EQ(j["data"]["result"][0]["value"][1], "1") << up.body;
}

TEST_F(ObservabilityTest, MetricsAreOffByDefaultAndABadAddressIsRefused) {
  StartServer();
  EXPECT_THAT(server_->Log(), ::testing::Not(HasSubstr("event=metrics")));
  auto r = testing::RunSubprocess({CKPTD_PATH, "--listen", "127.0.0.1:0", "--data", dir_ / "d2",
                                   "--metrics-listen", "no-port-here"});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->exit_code, 0);
  EXPECT_THAT(r->stderr_text, HasSubstr("--metrics-listen no-port-here: expected HOST:PORT"));
}

TEST_F(ObservabilityTest, StatsShowsTheServersCounters) {
  StartServer();
  const auto [uploaded, fetched] = UploadAndFetch();
  auto json = Ctl({"stats", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.stderr_text;
  auto j = nlohmann::json::parse(json.stdout_text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << json.stdout_text;
  EXPECT_EQ(j["version"], CKPT_VERSION);
  EXPECT_EQ(j["fetch_bytes_sent"], fetched);
  EXPECT_EQ(j["upload_bytes_received"], uploaded);
  EXPECT_EQ(j["checkpoints"], 1);
  EXPECT_GT(j["checkpoint_stored_bytes"].get<int64_t>(), 0);
  EXPECT_GT(j["disk_free_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["fetch_streams"], 0);
  EXPECT_EQ(j["jobs"]["succeeded"], 0);
  EXPECT_EQ(j["data_loss_rpcs"], 0);

  // Human output: sizes in binary units, not raw byte counts.
  auto human = Ctl({"stats"});
  ASSERT_EQ(human.exit_code, 0) << human.stderr_text;
  EXPECT_THAT(human.stdout_text, HasSubstr("ckptd " CKPT_VERSION ", up "));
  EXPECT_THAT(human.stdout_text, HasSubstr("checkpoints   1 ("));
  EXPECT_THAT(human.stdout_text, ::testing::ContainsRegex("sent +[0-9.]+ (KiB|MiB)"));
  EXPECT_THAT(human.stdout_text, ::testing::Not(HasSubstr(std::to_string(fetched))));

  // A transform job shows up by state and in the bytes written by jobs.
  CtlOk({"transform", "demo", "--dst-strategy", "dst", "--as", "demo-dst", "--wait"});
  j = nlohmann::json::parse(Ctl({"stats", "--json"}).stdout_text, nullptr, false);
  ASSERT_FALSE(j.is_discarded());
  EXPECT_EQ(j["jobs"]["succeeded"], 1);
  EXPECT_GT(j["job_bytes_written"].get<int64_t>(), 0);
}

TEST_F(ObservabilityTest, JsonLogsAreOneObjectPerLineWithZonedTime) {
  StartServer({"--log-format", "json"});
  UploadAndFetch();
  ASSERT_EQ(server_->Stop(), 0);  // SIGTERM: the shutdown lines too
  const std::string log = server_->Log();
  const std::regex zoned_time(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d)");
  std::map<std::string, int> events;
  int lines = 0;
  for (const std::string& line : testing::SplitLines(log)) {
    if (line.empty()) continue;
    ++lines;
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "not a JSON object: " << line;
    ASSERT_TRUE(j.contains("time") && j["time"].is_string()) << line;
    EXPECT_TRUE(std::regex_match(j["time"].get<std::string>(), zoned_time)) << line;
    EXPECT_TRUE(j.contains("level") && j["level"].is_string()) << line;
    EXPECT_TRUE(j.contains("logger") && j["logger"].is_string()) << line;
    EXPECT_TRUE(j.contains("msg") && j["msg"].is_string()) << line;
    if (j.contains("event")) ++events[j["event"].get<std::string>()];
    if (j.value("event", "") == "start") {
      EXPECT_EQ(j["logger"], "ckptd") << line;
      EXPECT_TRUE(j["port"].is_number_integer()) << line;
    }
    if (j.value("event", "") == "rpc" && j.value("method", "") == "Fetch") {
      EXPECT_EQ(j["logger"], "service") << line;
      EXPECT_EQ(j["status"], "OK") << line;
      EXPECT_TRUE(j["bytes"].is_number_integer()) << line;
      EXPECT_EQ(j["target"], "dst/1") << line;
    }
  }
  EXPECT_GT(lines, 10) << log;
  EXPECT_EQ(events["start"], 1) << log;
  EXPECT_GE(events["rpc"], 8 + 1 + 2) << log;  // 8 uploads, 1 fetch, 2 PutStrategy at least
  EXPECT_GE(events["shutdown"], 2) << log;     // drain and done at least
}

TEST_F(ObservabilityTest, TextLogsCarryTheirZoneAndTheMainLoggerName) {
  StartServer();
  ASSERT_EQ(server_->Stop(), 0);
  const std::regex start_line(
      R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d info ckptd event=start .*)");
  bool found = false;
  for (const std::string& line : testing::SplitLines(server_->Log())) {
    found = found || std::regex_match(line, start_line);
  }
  EXPECT_TRUE(found) << server_->Log();
}

// Probes ask for the service by name as well as for the server as a whole ("").
TEST_F(ObservabilityTest, HealthServiceAnswersByServiceName) {
  StartServer();
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto check = [&](const std::string& name, grpc::StatusCode* code) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(name);
    grpc::health::v1::HealthCheckResponse resp;
    *code = health->Check(&ctx, req, &resp).error_code();
    return resp.status();
  };
  grpc::StatusCode code;
  EXPECT_EQ(check("", &code), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(code, grpc::StatusCode::OK);
  EXPECT_EQ(check("ckpt.v1.CheckpointService", &code),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(code, grpc::StatusCode::OK);
  check("no.such.Service", &code);
  EXPECT_EQ(code, grpc::StatusCode::NOT_FOUND);

  // A watcher of the service hears NOT_SERVING when the server starts to drain.
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service("ckpt.v1.CheckpointService");
  auto watch = health->Watch(&watch_ctx, req);
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(watch->Read(&resp));
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  std::thread stopper([&] { EXPECT_EQ(server_->Stop(), 0); });
  bool saw_not_serving = false;
  while (watch->Read(&resp)) {
    if (resp.status() == grpc::health::v1::HealthCheckResponse::NOT_SERVING) {
      saw_not_serving = true;
      break;
    }
  }
  watch_ctx.TryCancel();
  watch->Finish();
  stopper.join();
  EXPECT_TRUE(saw_not_serving) << server_->Log();
}

}  // namespace
}  // namespace ckpt
