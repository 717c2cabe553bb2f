// The start-up storm against a real ckptd on 127.0.0.1:0: the 64 ranks of a destination of
// 8 tensor-parallel groups x 8 data-parallel replicas fetch at once, each through its own client,
// so that every stored chunk is wanted by 8 streams at the same moment. They must get exactly what
// lone fetches get while the store reads each chunk about once; a damaged shared chunk must fail
// every replica that needs it with DATA_LOSS; replicas that give up mid-stream must not harm the
// others.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt.grpc.pb.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/stored_chunks.h"

namespace ckpt {
namespace {

using testing::ServerProcess;
using testing::TempDir;

constexpr int kTp = 8;
constexpr int kDp = 8;
constexpr int kRanks = kTp * kDp;
constexpr uint64_t kSeed = 1;  // SampleOptions default

std::vector<SampleTensor> Tensors() {
  std::vector<SampleTensor> out;
  for (int i = 0; i < 8; ++i) {
    out.push_back({absl::StrCat(i % 2 ? "col." : "row.", i),
                   i % 3 == 2 ? DType::kBFloat16 : DType::kFloat32,
                   {192, 512}});
  }
  return out;
}

// Source: 8 ranks, every tensor split by rows. Destination: dev_matrix [dp, tp]; col.* split by
// columns and row.* by rows over the tensor-parallel (inner) axis, the outer axis splitting
// nothing, so ranks r and r + 8k are replicas.
Strategy MakeStrategy(bool destination) {
  std::map<std::string, StrategyParam> params;
  for (const SampleTensor& t : Tensors()) {
    Layout l;
    l.dev_matrix = destination ? std::vector<int64_t>{kDp, kTp} : std::vector<int64_t>{8};
    const bool columns = destination && t.name.starts_with("col.");
    l.tensor_map = columns ? std::vector<std::vector<int32_t>>{{}, {0}}
                           : std::vector<std::vector<int32_t>>{{0}, {}};
    params[t.name].layout = l;
  }
  return *Strategy::Create(std::move(params), 1);
}

// A rank's tensors in delivery order, name and bytes; or the fetch's error.
struct Outcome {
  absl::Status status;
  std::vector<std::pair<std::string, std::string>> tensors;
};

// Collects a fetch; with `give_up_after_bytes`, aborts it (the client cancels the stream) once
// that many bytes have arrived.
class Collector final : public TensorVisitor {
 public:
  explicit Collector(Outcome* out, int64_t give_up_after_bytes = -1)
      : out_(out), give_up_(give_up_after_bytes) {}
  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const v1::FetchTensorHeader& h) override {
    out_->tensors.push_back({h.name(), ""});
    return absl::OkStatus();
  }
  absl::Status OnData(std::string_view data) override {
    out_->tensors.back().second += data;
    received_ += static_cast<int64_t>(data.size());
    if (give_up_ >= 0 && received_ >= give_up_) return absl::CancelledError("the worker gave up");
    return absl::OkStatus();
  }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }

 private:
  Outcome* out_;
  int64_t give_up_;
  int64_t received_ = 0;
};

class StormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartServer();
    ASSERT_TRUE(client_->PutStrategy("src", MakeStrategy(false), false).ok());
    ASSERT_TRUE(client_->PutStrategy("dst", MakeStrategy(true), false).ok());
    SampleOptions options;
    options.verbatim_scalars = false;
    ASSERT_TRUE(WriteShardedSample(MakeStrategy(false), Tensors(), dir_ / "src", options).ok());
    auto up = client_->UploadDirectory("ck", "src", dir_ / "src");
    ASSERT_TRUE(up.ok()) << up.status();
    ASSERT_TRUE(up->committed);
    for (const SampleTensor& t : Tensors()) {
      unique_bytes_ += *ByteSizeOf(t.dtype, *NumElements(t.global_shape));
    }
  }

  void StartServer() {
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", server_args_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    stats_ = v1::CheckpointService::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  void RestartServer() {
    client_.reset();
    stats_.reset();
    ASSERT_EQ(server_->Stop(), 0) << server_->Log();
    StartServer();
  }

  v1::ServerStats Stats() {
    grpc::ClientContext context;
    v1::ServerStats stats;
    const grpc::Status s = stats_->GetStats(&context, v1::GetStatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return stats;
  }
  int64_t StoreBytesRead() { return Stats().store_bytes_read(); }

  // Waits (up to 20 s) until `done(stats)` holds.
  bool AwaitStats(const std::function<bool(const v1::ServerStats&)>& done) {
    for (int i = 0; i < 2000; ++i) {
      if (done(Stats())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  static v1::FetchRequest Request(int rank) {
    v1::FetchRequest req;
    req.set_checkpoint_id("ck");
    req.set_destination_strategy("dst");
    req.set_rank(rank);
    return req;
  }

  // Rank `rank` alone, checked against independently generated slices.
  Outcome Single(int rank) {
    Outcome out;
    Collector collector(&out);
    out.status = client_->Fetch(Request(rank), collector);
    EXPECT_TRUE(out.status.ok()) << rank << ": " << out.status;
    const Strategy dst = MakeStrategy(true);
    EXPECT_EQ(out.tensors.size(), Tensors().size());
    for (const auto& [name, bytes] : out.tensors) {
      for (const SampleTensor& t : Tensors()) {
        if (t.name != name) continue;
        const Box box = *dst.Find(name)->layout.SliceBox(t.global_shape, rank);
        EXPECT_EQ(bytes, SampleSlice(t.name, t.dtype, t.global_shape, box, kSeed))
            << name << " rank " << rank;
      }
    }
    return out;
  }

  // Every rank at once, each through a client of its own, released together. `give_up(r)`:
  // bytes after which rank r aborts its fetch (-1: never).
  std::vector<Outcome> Storm(const std::function<int64_t(int)>& give_up = {}) {
    std::vector<std::unique_ptr<CkptClient>> clients;
    for (int r = 0; r < kRanks; ++r) {
      auto c = CkptClient::Connect(server_->address());
      EXPECT_TRUE(c.ok()) << c.status();
      if (!c.ok()) return {};
      clients.push_back(std::move(*c));
    }
    std::vector<Outcome> out(kRanks);
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < kRanks; ++r) {
      threads.emplace_back([&, r] {
        ++ready;
        while (ready.load() < kRanks) std::this_thread::yield();
        Collector collector(&out[r], give_up ? give_up(r) : -1);
        out[r].status = clients[r]->Fetch(Request(r), collector);
      });
    }
    for (std::thread& t : threads) t.join();
    return out;
  }

  // Flips one byte of the first stored chunk (in key order) behind a stopped server's back.
  void CorruptFirstChunk() {
    const absl::Status s = testing::FlipByteOfFirstStoredChunk(dir_ / "data");
    ASSERT_TRUE(s.ok()) << s;
  }

  TempDir dir_;
  std::vector<std::string> server_args_;  // ckptd's flags beyond --listen and --data
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
  std::unique_ptr<v1::CheckpointService::Stub> stats_;
  int64_t unique_bytes_ = 0;
};

TEST_F(StormTest, SixtyFourConcurrentFetchesMatchLoneFetchesAndReadEachChunkOnce) {
  std::vector<Outcome> single;
  for (int r = 0; r < kRanks; ++r) single.push_back(Single(r));
  RestartServer();  // nothing cached from the lone fetches
  const v1::ServerStats start = Stats();
  const int64_t before = start.store_bytes_read();
  const std::vector<Outcome> together = Storm();
  ASSERT_EQ(together.size(), static_cast<size_t>(kRanks));
  const v1::ServerStats end = Stats();
  const int64_t read = end.store_bytes_read() - before;
  // Each chunk is wanted by the kDp replicas of its rank: one reads it, the others are served
  // from that read (joined in flight, still held, or cached), and GetStats counts them.
  const int64_t chunks_read = end.store_chunks_read() - start.store_chunks_read();
  const int64_t shared = end.fetch_chunks_joined() + end.fetch_chunks_live() +
                         end.fetch_chunks_cached() - start.fetch_chunks_joined() -
                         start.fetch_chunks_live() - start.fetch_chunks_cached();
  EXPECT_GE(shared, (kDp - 2) * chunks_read)
      << shared << " chunk requests shared for " << chunks_read << " chunks read";
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(together[r].status.ok()) << r << ": " << together[r].status;
    EXPECT_TRUE(together[r].tensors == single[r].tensors) << "rank " << r << " differs";
  }
  EXPECT_LE(static_cast<double>(read), 1.1 * static_cast<double>(unique_bytes_))
      << read << " bytes read from the store for " << unique_bytes_ << " unique bytes";
  EXPECT_GE(read, unique_bytes_);
}

TEST_F(StormTest, ReplicasGivingUpMidStreamNeverHarmTheOthers) {
  std::vector<Outcome> single;
  for (int r = 0; r < kRanks; ++r) single.push_back(Single(r));
  RestartServer();
  // Every other data-parallel replica gives up after its first bytes, while its reads are being
  // shared with the replicas that go on.
  const std::vector<Outcome> together =
      Storm([](int r) { return (r / kTp) % 2 == 1 ? int64_t{1} : int64_t{-1}; });
  ASSERT_EQ(together.size(), static_cast<size_t>(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    if ((r / kTp) % 2 == 1) {
      EXPECT_EQ(together[r].status.code(), absl::StatusCode::kCancelled) << together[r].status;
      continue;
    }
    ASSERT_TRUE(together[r].status.ok()) << r << ": " << together[r].status;
    EXPECT_TRUE(together[r].tensors == single[r].tensors) << "rank " << r << " differs";
  }
  // And the server serves the whole storm again afterwards.
  const std::vector<Outcome> again = Storm();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(again[r].status.ok()) << r << ": " << again[r].status;
    EXPECT_TRUE(again[r].tensors == single[r].tensors) << "rank " << r << " differs";
  }
}

TEST_F(StormTest, DamagedSharedChunkFailsEveryReplicaThatNeedsItWithDataLoss) {
  std::vector<Outcome> single;
  for (int r = 0; r < kRanks; ++r) single.push_back(Single(r));
  client_.reset();
  stats_.reset();
  ASSERT_EQ(server_->Stop(), 0);
  CorruptFirstChunk();
  StartServer();
  const std::vector<Outcome> together = Storm();
  ASSERT_EQ(together.size(), static_cast<size_t>(kRanks));
  int failed_groups = 0;
  for (int tp = 0; tp < kTp; ++tp) {
    // The replicas of a group need the same chunks: all fail with DATA_LOSS, or none does.
    const bool fails = !together[tp].status.ok();
    failed_groups += fails;
    for (int d = 0; d < kDp; ++d) {
      const Outcome& o = together[d * kTp + tp];
      if (fails) {
        EXPECT_EQ(o.status.code(), absl::StatusCode::kDataLoss)
            << "rank " << d * kTp + tp << ": " << o.status;
      } else {
        ASSERT_TRUE(o.status.ok()) << "rank " << d * kTp + tp << ": " << o.status;
        EXPECT_TRUE(o.tensors == single[d * kTp + tp].tensors) << "rank " << d * kTp + tp;
      }
    }
  }
  EXPECT_GE(failed_groups, 1) << "the damaged chunk went unnoticed";
}

// Far more streams than --max-active-fetches: the streams beyond the limit wait for a slot
// instead of failing, and every one of them completes with exactly what it gets alone.
TEST_F(StormTest, StreamsBeyondTheActiveLimitWaitTheirTurnAndAllComplete) {
  std::vector<Outcome> single;
  for (int r = 0; r < kRanks; ++r) single.push_back(Single(r));
  server_args_ = {"--max-active-fetches", "3"};
  RestartServer();
  const std::vector<Outcome> together = Storm();
  ASSERT_EQ(together.size(), static_cast<size_t>(kRanks));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_TRUE(together[r].status.ok()) << r << ": " << together[r].status;
    EXPECT_TRUE(together[r].tensors == single[r].tensors) << "rank " << r << " differs";
  }
  const v1::ServerStats stats = Stats();
  EXPECT_GT(stats.fetch_streams_waited(), 0) << "no stream waited for a slot";
  EXPECT_EQ(stats.fetch_streams_waiting(), 0);
  EXPECT_EQ(stats.fetch_streams(), 0);
}

// A stream waiting for a slot ends when its deadline passes or its client cancels it, leaves the
// queue, and takes no slot with it: once the stream holding the only slot goes, the next fetch
// runs.
TEST_F(StormTest, AWaitingStreamEndsOnItsDeadlineOrCancellationAndLeavesTheQueue) {
  server_args_ = {"--max-active-fetches", "1"};
  RestartServer();
  // 32 MiB in one tensor: more than the connection and ckptd's queue hold for a client that
  // does not read.
  const std::filesystem::path file = dir_ / "big.ckpt";
  ASSERT_TRUE(
      WriteWholeSample({{"weight", DType::kFloat32, Shape{32 * 256, 1024}}}, file, {}).ok());
  auto up = client_->UploadWholeFile("big", file);
  ASSERT_TRUE(up.ok()) << up.status();
  grpc::ChannelArguments narrow;
  narrow.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  narrow.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto holder_stub = v1::CheckpointService::NewStub(
      grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), narrow));
  auto stub = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  // The holder reads the plan summary (it was admitted) and then nothing: it keeps the slot.
  grpc::ClientContext holder_context;
  v1::FetchRequest big;
  big.set_checkpoint_id("big");
  big.set_merged(true);
  auto holder = holder_stub->Fetch(&holder_context, big);
  v1::FetchResponse first;
  ASSERT_TRUE(holder->Read(&first));
  ASSERT_TRUE(first.has_summary());
  // A fetch with a deadline waits, then ends DEADLINE_EXCEEDED without a byte.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    auto waiter = stub->Fetch(&context, Request(1));
    v1::FetchResponse message;
    EXPECT_FALSE(waiter->Read(&message));
    EXPECT_EQ(waiter->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_TRUE(AwaitStats([](const v1::ServerStats& s) { return s.fetch_streams_waiting() == 0; }));
  // A fetch its client cancels while it waits ends CANCELLED.
  {
    grpc::ClientContext context;
    auto waiter = stub->Fetch(&context, Request(2));
    ASSERT_TRUE(
        AwaitStats([](const v1::ServerStats& s) { return s.fetch_streams_waiting() == 1; }));
    context.TryCancel();
    v1::FetchResponse message;
    EXPECT_FALSE(waiter->Read(&message));
    EXPECT_EQ(waiter->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(AwaitStats([](const v1::ServerStats& s) { return s.fetch_streams_waiting() == 0; }));
  EXPECT_EQ(Stats().fetch_streams_waited(), 2);
  // The holder goes; a fetch now gets the slot and everything.
  holder_context.TryCancel();
  holder->Finish();
  const Outcome after = Single(3);
  EXPECT_TRUE(after.status.ok()) << after.status;
}

}  // namespace
}  // namespace ckpt
