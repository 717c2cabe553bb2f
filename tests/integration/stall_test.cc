// Clients that stop reading, and slow clients at shutdown, against a real ckptd (127.0.0.1:0)
// through the generated stub, so that the stall is real at the TCP level (a reader that does not
// call Read, on a channel without BDP probing: its flow-control window stays at 64 KiB).
//
// Settings reach ckptd through its CKPTD_* environment variables, so that CKPTD_UNDER_TEST may
// name another ckptd binary (one without these settings ignores them) to check what it does.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "ckpt.grpc.pb.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace ckpt {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ServerProcess;
using testing::TempDir;

const char* CkptdPath() {
  const char* other = getenv("CKPTD_UNDER_TEST");
  return other != nullptr && *other != '\0' ? other : CKPTD_PATH;
}

class StallTest : public ::testing::Test {
 protected:
  // Starts ckptd with `env` (NAME=VALUE) set for it, and uploads a whole-file checkpoint "big"
  // of one Float32 tensor of `mib` MiB.
  void Start(const std::vector<std::pair<std::string, std::string>>& env, int64_t mib) {
    for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
    auto s = ServerProcess::Start(CkptdPath(), dir_ / "data");
    for (const auto& [name, value] : env) unsetenv(name.c_str());
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    const std::vector<SampleTensor> tensors = {{"weight", DType::kFloat32, Shape{mib * 256, 1024}}};
    ASSERT_TRUE(WriteWholeSample(tensors, dir_ / "big.ckpt", {}).ok());
    auto up = client_->UploadWholeFile("big", dir_ / "big.ckpt");
    ASSERT_TRUE(up.ok()) << up.status();
    std::filesystem::remove(dir_ / "big.ckpt");
  }

  // A stub on its own connection without BDP probing, so that a reader that stops reading
  // holds its stream at the TCP level.
  std::unique_ptr<v1::CheckpointService::Stub> NarrowStub() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::CheckpointService::NewStub(
        grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
  }

  v1::ServerStats Stats() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerStats s;
    const grpc::Status status = client_stub_->GetStats(&context, v1::GetStatsRequest(), &s);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return s;
  }

  static v1::FetchRequest Merged() {
    v1::FetchRequest request;
    request.set_checkpoint_id("big");
    request.set_merged(true);
    return request;
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
  std::unique_ptr<v1::CheckpointService::Stub> client_stub_;
};

// A client that stops reading is cut off after --stall-timeout: the stream ends, its queued
// bytes return to the budget, the log says why, and later fetches are served in full.
TEST_F(StallTest, AStreamWhoseClientStopsReadingIsCancelledAndItsBudgetReturned) {
  Start({{"CKPTD_STALL_TIMEOUT", "2"}}, 64);
  ASSERT_FALSE(HasFailure());
  client_stub_ = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  auto stub = NarrowStub();
  grpc::ClientContext context;
  auto reader = stub->Fetch(&context, Merged());
  v1::FetchResponse m;
  ASSERT_TRUE(reader->Read(&m));
  ASSERT_TRUE(m.has_summary());
  // Stop reading. The stream stays open on the server for about the stall timeout...
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_EQ(Stats().fetch_streams(), 1);
  EXPECT_GT(Stats().fetch_bytes_in_flight(), 0);
  // ...and is then cancelled, its bytes returned.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  v1::ServerStats s = Stats();
  while ((s.fetch_streams() != 0 || s.fetch_bytes_in_flight() != 0) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    s = Stats();
  }
  EXPECT_EQ(s.fetch_streams(), 0) << "the stalled stream is still open";
  EXPECT_EQ(s.fetch_bytes_in_flight(), 0) << "its queued bytes were not returned";
  const std::string log = server_->Log();
  EXPECT_THAT(log, ContainsRegex("method=Fetch .*status=DEADLINE_EXCEEDED"));
  EXPECT_THAT(log, HasSubstr("no progress for 2s: the client stopped reading"));
  // The client, reading again, finds its stream ended short of the checkpoint.
  int64_t received = 0;
  while (reader->Read(&m)) {
    if (m.has_data()) received += static_cast<int64_t>(m.data().data().size());
  }
  EXPECT_FALSE(reader->Finish().ok());
  EXPECT_LT(received, int64_t{64} << 20);
  // The server serves whole fetches afterwards.
  auto all = client_->FetchAll(Merged());
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_FALSE(all->empty());
  EXPECT_EQ(all->front().header.name(), "weight");
  EXPECT_EQ(all->front().data.size(), size_t{64} << 20);
}

// Reads `request` at about `mib_per_second`, returning the status and the tensor bytes read.
std::pair<grpc::Status, int64_t> ReadSlowly(v1::CheckpointService::Stub* stub,
                                            const v1::FetchRequest& request, double mib_per_second,
                                            int64_t* total) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Fetch(&context, request);
  v1::FetchResponse m;
  int64_t received = 0;
  const auto start = std::chrono::steady_clock::now();
  while (reader->Read(&m)) {
    if (m.has_summary()) *total = m.summary().total_bytes();
    if (!m.has_data()) continue;
    received += static_cast<int64_t>(m.data().data().size());
    const auto due = start + std::chrono::microseconds(static_cast<int64_t>(
                                 received / (mib_per_second * 1048576.0) * 1e6));
    std::this_thread::sleep_until(due);
  }
  return {reader->Finish(), received};
}

// SIGTERM while a 10 MiB/s client fetches 64 MiB: within the grace the client receives every
// byte and OK, and the server logs OK for it; the server exits 0. The server finishes writing
// megabytes before the client has read them, and gRPC then ends the connection: the bytes still
// in socket buffers must reach the client rather than be reset away, and the shutdown log says
// nothing was left unacknowledged.
TEST_F(StallTest, ASlowClientAtShutdownReceivesItsWholeStream) {
  Start({}, 64);
  ASSERT_FALSE(HasFailure());
  // A 16 MiB flow-control window: the server runs megabytes ahead of what the client has read.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 << 20);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = v1::CheckpointService::NewStub(
      grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
  int64_t total = -1;
  auto fetch = std::async(std::launch::async,
                          [&] { return ReadSlowly(stub.get(), Merged(), 10.0, &total); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  client_.reset();
  const int code = server_->Stop();
  const auto [status, received] = fetch.get();
  const std::string log = server_->Log();
  EXPECT_EQ(code, 0) << log;
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message() << "\n" << log;
  EXPECT_GT(received, int64_t{64} << 20);  // the tensor, and the sample's verbatim scalars
  EXPECT_EQ(received, total);
  EXPECT_THAT(log, ContainsRegex(absl::StrCat("method=Fetch .*status=OK bytes=", total)));
  EXPECT_THAT(log, ContainsRegex("phase=linger .*unacknowledged_bytes=0"));
  EXPECT_THAT(log, Not(HasSubstr("is not interposed")));
}

// A client too slow to finish within the grace is told, with a status it receives, that the
// server is shutting down; the log says the same, never OK.
TEST_F(StallTest, AClientTooSlowForTheGraceIsToldTheServerIsShuttingDown) {
  Start({{"CKPTD_SHUTDOWN_GRACE", "10"}}, 64);
  ASSERT_FALSE(HasFailure());
  auto stub = NarrowStub();
  int64_t total = -1;
  auto fetch =
      std::async(std::launch::async, [&] { return ReadSlowly(stub.get(), Merged(), 4.0, &total); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  client_.reset();
  const int code = server_->Stop();
  const auto [status, received] = fetch.get();
  const std::string log = server_->Log();
  EXPECT_EQ(code, 0) << log;
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_code() << " " << status.error_message() << "\n"
      << log;
  EXPECT_THAT(status.error_message(), HasSubstr("shutting down; retry"));
  EXPECT_LT(received, int64_t{64} << 20);
  EXPECT_THAT(log, ContainsRegex("method=Fetch .*status=UNAVAILABLE"));
  EXPECT_THAT(log, Not(ContainsRegex("method=Fetch .*status=OK")));
}

int64_t OpenFds(pid_t pid) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    ++n;
  }
  return n;
}

// ckptd runs out of file descriptors (its limit is lowered to a few more than it has open, and
// idle TCP connections pile up): accept fails, yet once those connections are gone a new client
// is served, because the listener survived.
TEST_F(StallTest, RunningOutOfDescriptorsDoesNotCostTheListener) {
  Start({}, 1);
  ASSERT_FALSE(HasFailure());
  const pid_t pid = server_->pid();
  rlimit limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &limit), 0);
  rlimit low = limit;
  low.rlim_cur = static_cast<rlim_t>(OpenFds(pid) + 24);
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, &low, nullptr), 0);

  const int port = std::stoi(server_->address().substr(server_->address().rfind(':') + 1));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::vector<int> idle;
  for (int i = 0; i < 96; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(fd);
      break;  // the backlog is full: as good as exhausted
    }
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_GE(OpenFds(pid), static_cast<int64_t>(low.rlim_cur) - 2) << "ckptd never ran out";
  EXPECT_THAT(server_->Log(), HasSubstr("Too many open files"));
  for (int fd : idle) close(fd);
  std::this_thread::sleep_for(std::chrono::seconds(1));

  // A new client, on a new connection, is served.
  auto stub = NarrowStub();
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListCheckpointsResponse response;
  const grpc::Status status =
      stub->ListCheckpoints(&context, v1::ListCheckpointsRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message() << "\n"
                           << server_->Log();
  EXPECT_EQ(response.checkpoints_size(), 1);
}

// Beyond --max-connections, a new connection is closed at once: its call fails UNAVAILABLE
// without reaching a handler, the connections already served go on, the log says why, and a
// connection is accepted again once one of the others has gone.
TEST_F(StallTest, ConnectionsBeyondTheMaximumAreRefusedAndServedAgainOnceOthersGo) {
  // client_ (Start's own) and one more fill the maximum of 2.
  Start({{"CKPTD_MAX_CONNECTIONS", "2"}}, 1);
  ASSERT_FALSE(HasFailure());
  auto list = [](v1::CheckpointService::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListCheckpointsResponse response;
    return stub.ListCheckpoints(&context, v1::ListCheckpointsRequest(), &response);
  };
  auto second = NarrowStub();
  ASSERT_TRUE(list(*second).ok());
  auto served = client_->GetStats();
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_EQ(served->connections(), 2) << server_->Log();
  constexpr char kRefused[] = "reason=max_connections connections=2 max_connections=2";
  {
    // The refusal closes the connection at once, and the call fails UNAVAILABLE; on a loaded
    // machine the deadline may come first, and the refusal follows while the channel retries.
    auto third = NarrowStub();
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListCheckpointsResponse response;
    const grpc::Status refused =
        third->ListCheckpoints(&context, v1::ListCheckpointsRequest(), &response);
    EXPECT_FALSE(refused.ok());
    EXPECT_THAT(refused.error_code(), ::testing::AnyOf(grpc::StatusCode::UNAVAILABLE,
                                                       grpc::StatusCode::DEADLINE_EXCEEDED))
        << refused.error_message();
    for (int i = 0; i < 100 && server_->Log().find(kRefused) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_THAT(server_->Log(), HasSubstr(kRefused));
  EXPECT_THAT(server_->Log(), Not(HasSubstr("method=ListCheckpoints status=UNAVAILABLE")));
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->connections(), 2);
  EXPECT_GE(stats->connections_refused(), 1);
  EXPECT_EQ(stats->connections_shed(), 0);
  // The connections already served are not affected.
  EXPECT_TRUE(list(*second).ok());
  EXPECT_TRUE(client_->ListCheckpoints().ok());
  // One of them goes: a new connection is served (within the acceptor's once-a-second look at
  // which connections gRPC still uses).
  second.reset();
  grpc::Status again;
  for (int i = 0; i < 50; ++i) {
    auto fourth = NarrowStub();
    again = list(*fourth);
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(again.ok()) << again.error_code() << " " << again.error_message();
}

}  // namespace
}  // namespace ckpt
