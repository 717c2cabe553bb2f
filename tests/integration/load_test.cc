// The load campaign, on loopback against a real ckptd: 256 concurrent Fetch streams of which half
// are an attack (64 clients that never read, 64 that read at 1 MiB/s) and half are healthy
// fetches. The healthy fetches must keep at least half the throughput they have on an idle
// server (measured first, in the same run), ckptd's peak RSS must stay bounded and its file
// descriptors far from the limit, and a new client must still be served during the attack.
#include <grpcpp/grpcpp.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt.grpc.pb.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace ckpt {
namespace {

using testing::ServerProcess;
using testing::TempDir;

constexpr int kHealthy = 128;
constexpr int kStalled = 64;
constexpr int kSlow = 64;
constexpr int64_t kHealthyMiB = 4;  // each healthy fetch
constexpr int64_t kAttackMiB = 32;  // each attacking fetch: more than any buffering holds
// ckptd's peak RSS bound under the attack: the fetch budget (256 MiB), the mapped window
// (192 MiB) and gRPC's buffers, with room to spare.
constexpr int64_t kPeakRssBound = int64_t{1} << 30;

// Field `key` ("VmHWM:") of /proc/PID/status, bytes; -1 when unreadable.
int64_t ProcStatusBytes(pid_t pid, const std::string& key) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream in(line.substr(key.size()));
      int64_t kib = 0;
      in >> kib;
      return kib << 10;
    }
  }
  return -1;
}

int64_t OpenFds(pid_t pid) {
  int64_t n = 0;
  for ([[maybe_unused]] const auto& e :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/fd"))) {
    ++n;
  }
  return n;
}

// A stub on a connection of its own; `narrow`: without BDP probing, so that a client that does
// not read holds its streams at the TCP level.
std::unique_ptr<v1::CheckpointService::Stub> Stub(const std::string& address, bool narrow) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (narrow) args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  return v1::CheckpointService::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

v1::FetchRequest Merged(const std::string& id) {
  v1::FetchRequest request;
  request.set_checkpoint_id(id);
  request.set_merged(true);
  return request;
}

// kHealthy concurrent fetches of "small" over 4 connections; returns MiB/s over all of them,
// or -1 when one failed or came short.
double HealthyThroughput(const std::string& address) {
  std::vector<std::unique_ptr<v1::CheckpointService::Stub>> stubs;
  for (int i = 0; i < 4; ++i) stubs.push_back(Stub(address, false));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kHealthy; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      auto reader = stubs[i % stubs.size()]->Fetch(&context, Merged("small"));
      v1::FetchResponse m;
      int64_t received = 0;
      int64_t total = -1;
      while (reader->Read(&m)) {
        if (m.has_summary()) total = m.summary().total_bytes();
        if (m.has_data()) received += static_cast<int64_t>(m.data().data().size());
      }
      const grpc::Status status = reader->Finish();
      // The tensor, and the sample's verbatim scalars.
      if (!status.ok() || received != total || received <= kHealthyMiB << 20) {
        ADD_FAILURE() << "healthy fetch: " << status.error_code() << " " << status.error_message()
                      << ", " << received << " bytes";
        ++failures;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failures > 0) return -1;
  return static_cast<double>(kHealthy * kHealthyMiB) / seconds;
}

TEST(LoadTest, HealthyFetchesKeepHalfTheirThroughputWhileHalfTheStreamsStallOrCrawl) {
  TempDir dir;
  const char* other = getenv("CKPTD_UNDER_TEST");  // another ckptd binary to measure
  auto server =
      ServerProcess::Start(other != nullptr && *other != 0 ? other : CKPTD_PATH, dir / "data");
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  const pid_t pid = (*server)->pid();
  {
    auto client = CkptClient::Connect(address);
    ASSERT_TRUE(client.ok()) << client.status();
    for (const auto& [id, mib] : {std::pair{"small", kHealthyMiB}, {"big", kAttackMiB}}) {
      const std::string file = dir / absl::StrCat(id, ".ckpt");
      ASSERT_TRUE(
          WriteWholeSample({{"weight", DType::kFloat32, Shape{mib * 256, 1024}}}, file, {}).ok());
      auto up = (*client)->UploadWholeFile(id, file);
      ASSERT_TRUE(up.ok()) << up.status();
      std::filesystem::remove(file);
    }
  }

  // Idle: the healthy fetches alone (once to warm up, once measured).
  ASSERT_GT(HealthyThroughput(address), 0);
  const double idle = HealthyThroughput(address);
  ASSERT_GT(idle, 0);

  // The attack: clients that read one message and stop, and clients that read at 1 MiB/s.
  std::vector<std::unique_ptr<v1::CheckpointService::Stub>> attack_stubs;
  for (int i = 0; i < 16; ++i) attack_stubs.push_back(Stub(address, true));
  std::vector<std::unique_ptr<grpc::ClientContext>> stalled_contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::FetchResponse>>> stalled;
  for (int i = 0; i < kStalled; ++i) {
    stalled_contexts.push_back(std::make_unique<grpc::ClientContext>());
    stalled.push_back(attack_stubs[i % 8]->Fetch(stalled_contexts.back().get(), Merged("big")));
    v1::FetchResponse m;
    ASSERT_TRUE(stalled.back()->Read(&m));
  }
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<grpc::ClientContext>> slow_contexts(kSlow);
  for (auto& c : slow_contexts) c = std::make_unique<grpc::ClientContext>();
  std::vector<std::thread> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.emplace_back([&, i] {
      auto reader = attack_stubs[8 + i % 8]->Fetch(slow_contexts[i].get(), Merged("big"));
      v1::FetchResponse m;
      int64_t received = 0;
      const auto start = std::chrono::steady_clock::now();
      while (!stop && reader->Read(&m)) {
        if (m.has_data()) received += static_cast<int64_t>(m.data().data().size());
        std::this_thread::sleep_until(start + std::chrono::microseconds(received));  // 1 MB/s
      }
      (void)reader->Finish();
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto stats_stub = Stub(address, false);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerStats stats;
    const grpc::Status s = stats_stub->GetStats(&context, v1::GetStatsRequest(), &stats);
    ASSERT_TRUE(s.ok()) << "a new client is not served during the attack: " << s.error_message();
    EXPECT_EQ(stats.fetch_streams(), kStalled + kSlow) << "the attack is not in place";
  }

  // Under attack: the same healthy fetches, measured.
  const double attacked = HealthyThroughput(address);
  const int64_t fds = OpenFds(pid);
  const int64_t peak = ProcStatusBytes(pid, "VmHWM:");
  rlimit limit{};
  ASSERT_EQ(prlimit(pid, RLIMIT_NOFILE, nullptr, &limit), 0);
  std::cout << "healthy fetch throughput: idle " << idle << " MiB/s, under attack " << attacked
            << " MiB/s (" << attacked / idle << "x); ckptd peak RSS " << (peak >> 20)
            << " MiB, open fds " << fds << " of " << limit.rlim_cur << std::endl;
  EXPECT_GE(attacked, 0.5 * idle);
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, kPeakRssBound);
  EXPECT_LT(fds, static_cast<int64_t>(limit.rlim_cur) / 2);

  stop = true;
  for (auto& c : slow_contexts) c->TryCancel();
  for (auto& c : stalled_contexts) c->TryCancel();
  for (std::thread& t : slow) t.join();
  for (auto& r : stalled) (void)r->Finish();
  stalled.clear();
  attack_stubs.clear();  // their connections close
  // After the attack, a new client is served at once.
  {
    auto after = Stub(address, false);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ListCheckpointsResponse response;
    const grpc::Status s =
        after->ListCheckpoints(&context, v1::ListCheckpointsRequest(), &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.checkpoints_size(), 2);
  }
  // The exit status is not checked: after a run like this one gRPC's server shutdown takes
  // about 20 s, as long as ServerProcess waits before it kills.
  (*server)->Stop();
}

}  // namespace
}  // namespace ckpt
