// End to end against a real ckptd on 127.0.0.1:0, driven through the client library and ckptctl
// the way users do. Every fetched byte is compared with slices generated
// independently of the server (client/ckptctl/sample.h: bytes are a pure function of name and
// index).
#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "client/strategy_files.h"
#include "core/checksum.h"
#include "core/ckpt_format.h"
#include "core/reshard.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health_check.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fixtures.h"
#include "tests/testing/server_process.h"
#include "tests/testing/stored_chunks.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;
using testing::TempDir;

constexpr uint64_t kSeed = 1;  // SampleOptions default

// Global shapes for a strategy's parameters: 24 on every dim divides every split used here.
std::vector<SampleTensor> ShapesFor(const Strategy& s) {
  std::vector<SampleTensor> out;
  for (const auto& [name, p] : s.params()) {
    out.push_back({name, DType::kFloat32, Shape(p.layout.tensor_map.size(), 24)});
  }
  return out;
}

// A single-stage destination over `devices` devices splitting dim `dim` of every tensor of
// rank > dim (others replicated), optionally with an optimizer shard.
Strategy Destination(const Strategy& like, int64_t devices, size_t dim, int64_t opt_shard = 0) {
  std::map<std::string, StrategyParam> params;
  for (const auto& [name, p] : like.params()) {
    Layout l;
    l.dev_matrix = {devices};
    l.tensor_map.assign(p.layout.tensor_map.size(), {});
    if (l.tensor_map.size() > dim) l.tensor_map[dim] = {0};
    if (opt_shard != 0) {
      l.dev_matrix = {devices / 2, 2};  // dim split over the outer axis, shard the inner one
      if (l.tensor_map.size() > dim) l.tensor_map[dim] = {1};
      if (!l.tensor_map.empty()) {
        l.opt_shard_size = opt_shard;
        l.opt_shard_step = 1;
      }
    }
    params[name].layout = l;
  }
  return *Strategy::Create(std::move(params), 1);
}

// A reader that takes 100 ms over each tensor header and drops the bytes: too slow for a short
// stream deadline.
struct SleepyVisitor : TensorVisitor {
  absl::Status OnSummary(const v1::FetchPlanSummary&) override { return absl::OkStatus(); }
  absl::Status OnTensor(const v1::FetchTensorHeader&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return absl::OkStatus();
  }
  absl::Status OnData(std::string_view) override { return absl::OkStatus(); }
  absl::Status OnTensorEnd() override { return absl::OkStatus(); }
};

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void StartServer() {
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", {"--export-root", dir_.path()});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  void RestartServer() {
    client_.reset();
    ASSERT_EQ(server_->Stop(), 0) << server_->Log();
    StartServer();
  }

  testing::SubprocessResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {CKPTCTL_PATH, "--server", server_->address()});
    auto r = testing::RunSubprocess(args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : testing::SubprocessResult{};
  }

  // Every tensor every rank of `dst` receives equals the independently generated slice.
  void ExpectServes(const std::string& ckpt, const std::string& dst_name, const Strategy& dst,
                    const std::vector<SampleTensor>& tensors) {
    for (int64_t r = 0; r < dst.world_size(); ++r) {
      v1::FetchRequest req;
      req.set_checkpoint_id(ckpt);
      req.set_destination_strategy(dst_name);
      req.set_rank(r);
      auto got = client_->FetchAll(req);
      ASSERT_TRUE(got.ok()) << got.status();
      ExpectTensors(*got, &dst, r, tensors);
    }
  }

  void ExpectTensors(const std::vector<FetchedTensor>& got, const Strategy* dst, int64_t rank,
                     const std::vector<SampleTensor>& tensors) {
    std::set<std::string> seen;
    const int32_t stage = dst ? static_cast<int32_t>(rank / dst->devices_per_stage()) : 0;
    for (const SampleTensor& t : tensors) {
      const Layout* l = dst ? ResolveLayout(*dst, t.name, true) : nullptr;
      if (l && !std::count(l->stages.begin(), l->stages.end(), stage)) continue;
      const Box box = l ? *l->SliceBox(t.global_shape, rank % dst->devices_per_stage())
                        : Box::Whole(t.global_shape);
      auto it = std::find_if(got.begin(), got.end(),
                             [&](const FetchedTensor& f) { return f.header.name() == t.name; });
      ASSERT_NE(it, got.end()) << t.name << " not delivered to rank " << rank;
      ASSERT_EQ(Shape(it->header.local_shape().begin(), it->header.local_shape().end()),
                box.shape())
          << t.name;
      ASSERT_EQ(it->data, SampleSlice(t.name, t.dtype, t.global_shape, box, kSeed))
          << t.name << " rank " << rank;
      seen.insert(t.name);
    }
    // The verbatim scalars written by the sample come along, unchanged.
    for (const FetchedTensor& f : got) {
      if (seen.contains(f.header.name())) continue;
      ASSERT_TRUE(f.header.verbatim()) << f.header.name();
      if (f.header.name() == "global_step") {
        int32_t v = 0;
        std::memcpy(&v, f.data.data(), 4);
        EXPECT_EQ(v, 10);
      }
    }
    EXPECT_EQ(got.size(), seen.size() + 2) << "expected the 2 verbatim scalars";
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
};

TEST_F(ServerTest, FixtureLayoutsServedToEveryRankOfOtherStrategiesAcrossARestart) {
  CKPT_REQUIRE_FIXTURE(strategy_bytes, "strategy_8_npus.ckpt");
  const std::string fixture = *testing::FixturePath("strategy_8_npus.ckpt");
  const Strategy src = *LoadStrategyPath(fixture);
  ASSERT_EQ(src.world_size(), 8);
  const std::vector<SampleTensor> tensors = ShapesFor(src);
  ASSERT_TRUE(WriteShardedSample(src, tensors, dir_ / "src", {}).ok());

  // Register through ckptctl, upload through the library.
  auto put = Ctl({"strategy", "put", "gpt8", fixture});
  ASSERT_EQ(put.exit_code, 0) << put.stderr_text;
  const Strategy three = Destination(src, 3, 0);
  const Strategy six = Destination(src, 6, 1);
  const Strategy opt = Destination(src, 4, 0, /*opt_shard=*/2);
  ASSERT_TRUE(client_->PutStrategy("three", three, false).ok());
  ASSERT_TRUE(client_->PutStrategy("six", six, false).ok());
  ASSERT_TRUE(client_->PutStrategy("opt", opt, false).ok());
  auto up = client_->UploadDirectory("gpt", "gpt8", dir_ / "src");
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(up->committed);
  EXPECT_EQ(up->ranks_total, 8);

  RestartServer();

  ExpectServes("gpt", "three", three, tensors);  // 8 -> 3, two stages -> one
  ExpectServes("gpt", "six", six, tensors);      // 8 -> 6, rows -> columns
  ExpectServes("gpt", "opt", opt, tensors);      // -> optimizer-sharded
  ExpectServes("gpt", "gpt8", src, tensors);     // back to the source layout
  v1::FetchRequest merged;
  merged.set_checkpoint_id("gpt");
  merged.set_merged(true);
  auto whole = client_->FetchAll(merged);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ExpectTensors(*whole, nullptr, 0, tensors);

  // The fetched file through ckptctl is a MindSpore .ckpt with exactly rank 1's tensors.
  auto fetched =
      Ctl({"fetch", "gpt", "--dst-strategy", "three", "--rank", "1", "--out", dir_ / "r1.ckpt"});
  ASSERT_EQ(fetched.exit_code, 0) << fetched.stderr_text;
  auto decoded = DecodeCkpt(testing::ReadFileOrDie(dir_ / "r1.ckpt"));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  std::vector<FetchedTensor> as_fetched;
  for (const CkptTensor& t : *decoded) {
    FetchedTensor f;
    f.header.set_name(t.name);
    for (int64_t d : t.shape()) f.header.add_local_shape(d);
    f.header.set_verbatim(t.name == "global_step" || t.name == "learning_rate");
    f.data = t.data;
    as_fetched.push_back(std::move(f));
  }
  ExpectTensors(as_fetched, &three, 1, tensors);

  // Dependencies, as CI asks for them.
  auto deps = Ctl({"deps", "gpt", "--dst-strategy", "three", "--all", "--json"});
  ASSERT_EQ(deps.exit_code, 0) << deps.stderr_text;
  auto j = nlohmann::json::parse(deps.stdout_text);
  ASSERT_EQ(j.size(), 3u);
  // Same answer as planning on the stored checkpoint in process.
  auto planner = Resharder::CreateFromLayouts(std::make_shared<Strategy>(src),
                                              std::make_shared<Strategy>(three));
  ASSERT_TRUE(planner.ok()) << planner.status();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(j[r]["rank"], r);
    EXPECT_FALSE(j[r]["source_ranks"].empty());
    // Layout-only planning ignores the verbatim scalars, which may add one rank at most.
    const std::vector<int64_t> by_layout = *planner->SourceRanks(r);
    for (int64_t s : by_layout) {
      EXPECT_TRUE(std::count(j[r]["source_ranks"].begin(), j[r]["source_ranks"].end(), s))
          << "rank " << r << " misses source " << s;
    }
  }
}

TEST_F(ServerTest, DemoCheckpointThroughCtlAndWholeFileSource) {
  auto sample = Ctl({"sample", dir_ / "demo"});
  ASSERT_EQ(sample.exit_code, 0) << sample.stderr_text;
  ASSERT_EQ(Ctl({"strategy", "put", "src", dir_ / "demo/src_strategy.ckpt"}).exit_code, 0);
  ASSERT_EQ(Ctl({"strategy", "put", "dst", dir_ / "demo/dst_strategy.json"}).exit_code, 0);
  auto up = Ctl({"upload", "demo", "--strategy", "src", "--dir", dir_ / "demo/checkpoint"});
  ASSERT_EQ(up.exit_code, 0) << up.stderr_text;
  auto whole = Ctl({"upload", "whole", "--file", dir_ / "demo/whole.ckpt"});
  ASSERT_EQ(whole.exit_code, 0) << whole.stderr_text;
  const Strategy dst = DemoDestinationStrategy();
  ExpectServes("demo", "dst", dst, DemoTensors());
  ExpectServes("whole", "dst", dst, DemoTensors());  // a whole file served sharded
  auto ls = Ctl({"ls"});
  EXPECT_EQ(ls.exit_code, 0);
  EXPECT_THAT(ls.stdout_text, HasSubstr("demo"));
  EXPECT_THAT(ls.stdout_text, HasSubstr("whole"));
  auto describe = Ctl({"describe", "demo"});
  EXPECT_EQ(describe.exit_code, 0) << describe.stderr_text;
  EXPECT_THAT(describe.stdout_text, HasSubstr("layers.1.ffn.weight"));
  ASSERT_EQ(Ctl({"rm", "whole"}).exit_code, 0);
  EXPECT_THAT(Ctl({"ls"}).stdout_text, ::testing::Not(HasSubstr("whole")));
}

// Slices of more than one upload message (the client sends ≤ 1 MiB messages that reference the
// bytes it read, cut at 1 MiB boundaries that are not element rows) arrive intact, from rank
// files and from a whole file.
// The demo tensors with every dim x16: the embedding is [1536, 384] Float32 (2.25 MiB whole),
// so its slices span several messages and its chunks are tens of KiB. Uploaded from rank files
// as checkpoint `big` with strategies `src` and `dst` registered.
std::vector<SampleTensor> UploadLargeDemo(CkptClient& client, const std::filesystem::path& dir) {
  std::vector<SampleTensor> tensors = DemoTensors();
  for (SampleTensor& t : tensors) {
    for (int64_t& d : t.global_shape) d *= 16;
  }
  EXPECT_GT(tensors[0].global_shape[0] * tensors[0].global_shape[1] * 4, int64_t{2} << 20);
  EXPECT_TRUE(WriteShardedSample(DemoSourceStrategy(), tensors, dir / "big", {}).ok());
  EXPECT_TRUE(client.PutStrategy("src", DemoSourceStrategy(), false).ok());
  EXPECT_TRUE(client.PutStrategy("dst", DemoDestinationStrategy(), false).ok());
  auto up = client.UploadDirectory("big", "src", dir / "big");
  EXPECT_TRUE(up.ok()) << up.status();
  EXPECT_TRUE(up.ok() && up->committed);
  return tensors;
}

TEST_F(ServerTest, SlicesLargerThanOneMessageArriveIntact) {
  const std::vector<SampleTensor> tensors = UploadLargeDemo(*client_, dir_.path());
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(WriteWholeSample(tensors, dir_ / "whole.ckpt", {}).ok());
  auto whole = client_->UploadWholeFile("whole", dir_ / "whole.ckpt");
  ASSERT_TRUE(whole.ok()) << whole.status();
  const Strategy dst = DemoDestinationStrategy();
  ExpectServes("big", "dst", dst, tensors);
  ExpectServes("whole", "dst", dst, tensors);
}

// Every data message, as a plain protobuf client (the generated stub) receives it, is cut into
// parts whose sizes cover it and whose XXH3-64 checksums match its bytes; some combine several
// stored chunks as parts of their own; the data adds up to the plan's total.
TEST_F(ServerTest, EveryDataMessageHasPartsThatMatchItsBytes) {
  const std::vector<SampleTensor> tensors = UploadLargeDemo(*client_, dir_.path());
  ASSERT_FALSE(HasFailure());
  auto stub = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  const Strategy dst = DemoDestinationStrategy();
  int several_parts = 0;
  for (int64_t r = -1; r < dst.world_size(); ++r) {  // -1: merged
    SCOPED_TRACE(r);
    v1::FetchRequest request;
    request.set_checkpoint_id("big");
    if (r < 0) {
      request.set_merged(true);
    } else {
      request.set_destination_strategy("dst");
      request.set_rank(r);
    }
    grpc::ClientContext context;
    auto reader = stub->Fetch(&context, request);
    v1::FetchResponse m;
    int64_t total = -1, received = 0;
    while (reader->Read(&m)) {
      if (m.has_summary()) total = m.summary().total_bytes();
      if (!m.has_data()) continue;
      const std::string& data = m.data().data();
      ASSERT_GE(m.data().part_bytes_size(), 1);
      ASSERT_EQ(m.data().part_bytes_size(), m.data().part_checksums_size());
      if (m.data().part_bytes_size() > 1 && m.data().tile_box_size() == 0) ++several_parts;
      size_t offset = 0;
      for (int i = 0; i < m.data().part_bytes_size(); ++i) {
        const std::string part = data.substr(offset, m.data().part_bytes(i));
        EXPECT_EQ(part.size(), m.data().part_bytes(i));
        EXPECT_EQ(m.data().part_checksums(i), Checksum(part)) << "part " << i;
        offset += part.size();
      }
      EXPECT_EQ(offset, data.size());
      received += static_cast<int64_t>(data.size());
    }
    EXPECT_TRUE(reader->Finish().ok());
    EXPECT_EQ(received, total);
  }
  EXPECT_GT(several_parts, 0) << "no fetch of the large demo combined stored chunks";
}

// A .json strategy file is checked by the client and registered as it is: compact or indented,
// the server holds the same strategy; a damaged one is refused naming the file, and nothing is
// registered.
TEST_F(ServerTest, JsonStrategyFilesAreCheckedThenSentAsTheyAre) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  auto strategy = LoadStrategyPath(dir_ / "demo/src_strategy.ckpt");
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  const std::string indented = SerializeStrategy(*strategy, StrategyFormat::kJson);
  const std::string compact = nlohmann::json::parse(indented).dump();
  ASSERT_NE(compact, indented);
  for (const auto& [file, text] : {std::pair<std::string, std::string>{"compact.json", compact},
                                   {"indented.json", indented}}) {
    { std::ofstream(dir_ / file) << text; }
    auto info = client_->PutStrategyFile(file, dir_ / file, false);
    ASSERT_TRUE(info.ok()) << info.status();
    auto held = client_->GetStrategy(file);
    ASSERT_TRUE(held.ok()) << held.status();
    EXPECT_EQ(held->strategy, *strategy) << file;
  }
  { std::ofstream(dir_ / "damaged.json") << compact.substr(0, compact.size() / 2); }
  auto damaged = client_->PutStrategyFile("damaged", dir_ / "damaged.json", false);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kInvalidArgument) << damaged.status();
  EXPECT_THAT(damaged.status().message(), ::testing::HasSubstr("damaged.json: "));
  EXPECT_EQ(client_->GetStrategy("damaged").status().code(), absl::StatusCode::kNotFound);
}

// GetStrategy with info_only answers the summary alone: the same info as the full answer, no
// content; an unknown name is NOT_FOUND either way.
TEST_F(ServerTest, StrategyInfoOnlyLeavesTheContentOut) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  ASSERT_TRUE(client_->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", false).ok());
  auto stub = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  v1::GetStrategyRequest request;
  request.set_name("src");
  v1::GetStrategyResponse full, summary;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->GetStrategy(&context, request, &full).ok());
  }
  request.set_info_only(true);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub->GetStrategy(&context, request, &summary).ok());
  }
  EXPECT_FALSE(full.content().empty());
  EXPECT_TRUE(summary.content().empty());
  EXPECT_EQ(summary.info().SerializeAsString(), full.info().SerializeAsString());
  EXPECT_EQ(summary.info().world_size(), 8);

  auto info = client_->GetStrategyInfo("src");
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->SerializeAsString(), full.info().SerializeAsString());
  auto missing = client_->GetStrategyInfo("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(missing.status().message(), ::testing::HasSubstr("nope"));
}

TEST_F(ServerTest, CorruptedChunkIsDataLossNeverWrongBytes) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  ASSERT_TRUE(client_->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", false).ok());
  ASSERT_TRUE(client_->UploadDirectory("demo", "src", dir_ / "demo/checkpoint").ok());
  client_.reset();
  ASSERT_EQ(server_->Stop(), 0);
  // Flip one byte of one stored chunk behind the server's back.
  ASSERT_TRUE(testing::FlipByteOfFirstStoredChunk(dir_ / "data").ok());
  StartServer();
  v1::FetchRequest merged;
  merged.set_checkpoint_id("demo");
  merged.set_merged(true);
  auto got = client_->FetchAll(merged);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("checkpoint demo tensor "));
  // That fetch sent the damaged chunk whole, and the client found the damage. A transform job
  // reads in ckptd, which verifies every chunk: it fails with DATA_LOSS, and ckptd counts it
  // (`ckptctl stats`, ckptd_data_loss_total).
  v1::SubmitTransformRequest job;
  job.set_checkpoint_id("demo");
  job.mutable_target()->set_merged_file("merged.ckpt");  // beneath --export-root
  auto submitted = client_->SubmitTransform(job);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto ended = client_->WatchJob(submitted->job().id());
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended->reason(), HasSubstr("DATA_LOSS")) << ended->reason();
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->data_loss_jobs(), 1);
  EXPECT_EQ(stats->data_loss_rpcs(), 0);
  EXPECT_EQ(stats->jobs_failed(), 1);
}

TEST_F(ServerTest, KilledUploadLeavesNothingVisible) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  ASSERT_TRUE(client_->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", false).ok());
  // Seven ranks complete, the eighth's client dies mid-tensor.
  for (int r = 0; r < 7; ++r) {
    auto u = client_->UploadRank(
        "demo", "src", r, dir_ / absl::StrCat("demo/checkpoint/rank_", r, "/sample-1_10.ckpt"));
    ASSERT_TRUE(u.ok()) << u.status();
    EXPECT_FALSE(u->committed());
  }
  {
    auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    auto stub = v1::CheckpointService::NewStub(channel);
    grpc::ClientContext ctx;
    v1::UploadResponse resp;
    auto writer = stub->Upload(&ctx, &resp);
    v1::UploadRequest m;
    m.mutable_header()->set_checkpoint_id("demo");
    m.mutable_header()->set_source_strategy("src");
    m.mutable_header()->set_rank(7);
    ASSERT_TRUE(writer->Write(m));
    m.mutable_tensor()->set_name("embedding.word_embedding.embedding_table");
    m.mutable_tensor()->set_dtype("Float32");
    m.mutable_tensor()->add_dims(48);
    m.mutable_tensor()->add_dims(24);
    m.mutable_tensor()->set_total_bytes(48 * 24 * 4);
    ASSERT_TRUE(writer->Write(m));
    m.set_data(std::string(1000, 'x'));
    ASSERT_TRUE(writer->Write(m));
    ctx.TryCancel();  // the client is gone
    EXPECT_FALSE(writer->Finish().ok());
  }
  auto ls = client_->ListCheckpoints();
  ASSERT_TRUE(ls.ok());
  EXPECT_TRUE(ls->empty()) << "a half-uploaded checkpoint became visible";
  // The rank can be sent again, and then the checkpoint commits.
  auto last =
      client_->UploadRank("demo", "src", 7, dir_ / "demo/checkpoint/rank_7/sample-1_10.ckpt");
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->committed());
  ExpectServes("demo", "src", DemoSourceStrategy(), DemoTensors());
}

// ckptd reads upload data messages straight from gRPC's buffers when they are exactly
// UploadRequest{data}, and parses anything else with protobuf. Messages are written here as raw
// bytes: plain data messages, ones whose tag and length are split over slices, ones with a field
// ckptd does not know (parsed by protobuf), and an empty one. The committed tensor must equal
// what was sent; malformed and oversized messages are refused and leave nothing behind.
TEST_F(ServerTest, RawUploadMessagesInAnyLayoutAreReadExactly) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  static const grpc::internal::RpcMethod kUpload("/ckpt.v1.CheckpointService/Upload",
                                                 grpc::internal::RpcMethod::CLIENT_STREAMING);
  auto serialized = [](const v1::UploadRequest& m) {
    std::string bytes;
    EXPECT_TRUE(m.SerializeToString(&bytes));
    return bytes;
  };
  // Uploads `messages` (each a list of slices) as checkpoint `id`: the call's status, and the
  // response if it succeeded.
  auto upload = [&](const std::string& id, const std::vector<std::vector<std::string>>& messages,
                    v1::UploadResponse* response) {
    grpc::ClientContext context;
    grpc::ByteBuffer reply;
    auto writer = std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>>(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), kUpload,
                                                                      &context, &reply));
    v1::UploadRequest header;
    header.mutable_header()->set_checkpoint_id(id);
    std::vector<std::vector<std::string>> all = {{serialized(header)}};
    all.insert(all.end(), messages.begin(), messages.end());
    for (const std::vector<std::string>& parts : all) {
      std::vector<grpc::Slice> slices;
      for (const std::string& p : parts) slices.emplace_back(p);
      grpc::ByteBuffer buffer(slices.data(), slices.size());
      if (!writer->Write(buffer)) break;
    }
    writer->WritesDone();
    grpc::Status status = writer->Finish();
    if (status.ok()) {
      std::vector<grpc::Slice> slices;
      EXPECT_TRUE(reply.Dump(&slices).ok());
      std::string bytes;
      for (const grpc::Slice& sl : slices) {
        bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
      }
      EXPECT_TRUE(response->ParseFromString(bytes));
    }
    return status;
  };
  const Shape shape = {64, 48};
  const std::string bytes = SampleSlice("w", DType::kFloat32, shape, Box::Whole(shape), kSeed);
  v1::UploadRequest tensor;
  tensor.mutable_tensor()->set_name("w");
  tensor.mutable_tensor()->set_dtype("Float32");
  for (int64_t d : shape) tensor.mutable_tensor()->add_dims(d);
  tensor.mutable_tensor()->set_total_bytes(static_cast<int64_t>(bytes.size()));
  auto data = [&](size_t from, size_t n) {
    v1::UploadRequest m;
    m.set_data(bytes.substr(from, n));
    return m;
  };

  std::vector<std::vector<std::string>> messages = {{serialized(tensor)}};
  const std::string plain = serialized(data(0, 3000));  // tag, 2-byte length, bytes
  messages.push_back({plain});
  const std::string split = serialized(data(3000, 5000));
  messages.push_back(
      {split.substr(0, 1), split.substr(1, 1), split.substr(2, 700), split.substr(702)});
  v1::UploadRequest with_unknown = data(8000, 4000);
  with_unknown.GetReflection()->MutableUnknownFields(&with_unknown)->AddVarint(99, 7);
  messages.push_back({serialized(with_unknown)});
  messages.push_back({serialized(data(12000, 0))});
  messages.push_back({serialized(data(12000, bytes.size() - 12000))});
  v1::UploadResponse response;
  grpc::Status status = upload("raw", messages, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(response.committed());
  v1::FetchRequest merged;
  merged.set_checkpoint_id("raw");
  merged.set_merged(true);
  auto got = client_->FetchAll(merged);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 1u);
  EXPECT_TRUE(got->front().data == bytes) << "the stored tensor differs from what was sent";

  // Malformed and oversized messages: refused, nothing stored.
  status = upload("bad1", {{serialized(tensor)}, {std::string("\xff\xff\xff\xff")}}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("malformed upload message"));
  v1::UploadRequest big;
  big.set_data(std::string((size_t{1} << 20) + 1, 'x'));
  status = upload("bad2", {{serialized(tensor)}, {serialized(big)}}, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("data message of 1048577 bytes exceeds 1048576"));
  auto ls = client_->ListCheckpoints();
  ASSERT_TRUE(ls.ok()) << ls.status();
  ASSERT_EQ(ls->size(), 1u);
  EXPECT_EQ(ls->front().id(), "raw");
}

TEST_F(ServerTest, BadInputsGetClearErrorsAndChangeNothing) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  ASSERT_EQ(Ctl({"strategy", "put", "src", dir_ / "demo/src_strategy.ckpt"}).exit_code, 0);
  ASSERT_EQ(Ctl({"strategy", "put", "dst", dir_ / "demo/dst_strategy.json"}).exit_code, 0);
  ASSERT_EQ(
      Ctl({"upload", "demo", "--strategy", "src", "--dir", dir_ / "demo/checkpoint"}).exit_code, 0);
  const std::string ls_before = Ctl({"ls"}).stdout_text;
  const std::string strategies_before = Ctl({"strategy", "ls"}).stdout_text;

  auto expect_error = [&](std::vector<std::string> args, const std::string& needle) {
    auto r = Ctl(args);
    EXPECT_NE(r.exit_code, 0) << absl::StrJoin(args, " ");
    const auto lines = testing::SplitLines(r.stderr_text);
    EXPECT_EQ(lines.size(), 1u) << r.stderr_text;
    EXPECT_THAT(r.stderr_text, HasSubstr(needle)) << absl::StrJoin(args, " ");
  };
  // Corrupt .ckpt.
  { std::ofstream(dir_ / "garbage.ckpt") << "this is not a checkpoint at all"; }
  expect_error({"upload", "bad", "--file", dir_ / "garbage.ckpt"}, "garbage.ckpt");
  // Garbage strategy.
  expect_error({"strategy", "put", "junk", dir_ / "garbage.ckpt"}, "INVALID_ARGUMENT");
  // Unknown ids.
  expect_error({"fetch", "nope", "--dst-strategy", "dst", "--rank", "0", "--out", dir_ / "x.ckpt"},
               "NOT_FOUND");
  expect_error({"fetch", "demo", "--dst-strategy", "nope", "--rank", "0", "--out", dir_ / "x.ckpt"},
               "NOT_FOUND");
  expect_error({"describe", "nope"}, "NOT_FOUND");
  expect_error({"rm", "nope"}, "NOT_FOUND");
  // Rank out of range.
  expect_error({"fetch", "demo", "--dst-strategy", "dst", "--rank", "3", "--out", dir_ / "x.ckpt"},
               "OUT_OF_RANGE");
  expect_error({"deps", "demo", "--dst-strategy", "dst", "--rank", "99"}, "OUT_OF_RANGE");
  EXPECT_FALSE(std::filesystem::exists(dir_ / "x.ckpt"));
  // Shape mismatch: rank 3's file holds a tensor of another shape than its replicas/peers.
  std::vector<SampleTensor> wrong = DemoTensors();
  wrong[0].global_shape = {48, 24};  // embedding should be [96, 24]
  ASSERT_TRUE(WriteShardedSample(DemoSourceStrategy(), DemoTensors(), dir_ / "bad", {}).ok());
  ASSERT_TRUE(WriteShardedSample(DemoSourceStrategy(), wrong, dir_ / "wrong", {}).ok());
  std::filesystem::copy_file(dir_ / "wrong/rank_3/sample-1_10.ckpt",
                             dir_ / "bad/rank_3/sample-1_10.ckpt",
                             std::filesystem::copy_options::overwrite_existing);
  expect_error({"upload", "bad", "--strategy", "src", "--dir", dir_ / "bad"}, "embedding");

  EXPECT_EQ(Ctl({"ls"}).stdout_text, ls_before);
  EXPECT_EQ(Ctl({"strategy", "ls"}).stdout_text, strategies_before);
}

// A second ckptd on a port that is taken fails with a clear error instead of sharing the port
// (gRPC's default SO_REUSEPORT), and the first one keeps serving.
TEST_F(ServerTest, SecondServerOnATakenPortFails) {
  const std::string port = server_->address().substr(server_->address().rfind(':') + 1);
  testing::SubprocessOptions options;
  options.timeout = std::chrono::seconds(30);
  auto second = testing::RunSubprocess(
      {CKPTD_PATH, "--listen", absl::StrCat("127.0.0.1:", port), "--data", dir_ / "other-data"},
      options);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->timed_out) << "the second ckptd started on a taken port";
  EXPECT_NE(second->exit_code, 0);
  EXPECT_THAT(second->stderr_text, HasSubstr(absl::StrCat("cannot listen on 127.0.0.1:", port)))
      << second->stderr_text;
  EXPECT_TRUE(client_->ListCheckpoints().ok());
}

TEST_F(ServerTest, HealthServiceReportsServing) {
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // SIGTERM: drains, flushes and exits 0; the log records the phases.
  client_.reset();
  EXPECT_EQ(server_->Stop(), 0);
  EXPECT_THAT(server_->Log(), HasSubstr("event=shutdown phase=drain"));
  EXPECT_THAT(server_->Log(), HasSubstr("event=shutdown phase=done"));
}

TEST_F(ServerTest, EveryRpcIsLoggedOnceWithStatusAndBytes) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  ASSERT_TRUE(client_->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", false).ok());
  ASSERT_TRUE(client_->UploadDirectory("demo", "src", dir_ / "demo/checkpoint").ok());
  v1::FetchRequest merged;
  merged.set_checkpoint_id("demo");
  merged.set_merged(true);
  ASSERT_TRUE(client_->FetchAll(merged).ok());
  EXPECT_FALSE(client_->DescribeCheckpoint("nope").ok());
  // A Fetch is logged once gRPC reports the call done, which may be after the client has its
  // status: stop ckptd (which ends every call and flushes the log) before reading the log.
  client_.reset();
  ASSERT_EQ(server_->Stop(), 0);
  const std::string log = server_->Log();
  EXPECT_THAT(log, HasSubstr("event=rpc method=PutStrategy"));
  EXPECT_THAT(log, HasSubstr("event=rpc method=Upload"));
  EXPECT_THAT(log, HasSubstr("committed=true"));
  EXPECT_THAT(log, ::testing::ContainsRegex("event=rpc method=Fetch .*status=OK bytes=[1-9]"));
  EXPECT_THAT(log, HasSubstr("method=DescribeCheckpoint"));
  EXPECT_THAT(log, HasSubstr("status=NOT_FOUND"));
}

TEST_F(ServerTest, FetchPastItsDeadlineIsCancelledAndTheServerCarriesOn) {
  ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
  ASSERT_TRUE(client_->PutStrategyFile("src", dir_ / "demo/src_strategy.ckpt", false).ok());
  ASSERT_TRUE(client_->UploadDirectory("demo", "src", dir_ / "demo/checkpoint").ok());
  // A reader that never finishes in time: the deadline cancels the stream on both sides.
  ClientOptions slow;
  slow.stream_timeout = absl::Milliseconds(200);
  auto c = CkptClient::Connect(server_->address(), slow);
  ASSERT_TRUE(c.ok());
  SleepyVisitor sleepy;
  v1::FetchRequest merged;
  merged.set_checkpoint_id("demo");
  merged.set_merged(true);
  const absl::Status s = (*c)->Fetch(merged, sleepy);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  // The server is fine, and its byte budget was returned: many fetches still succeed.
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client_->FetchAll(merged).ok());
}

// GetStats.fetch_streams, by which streams share --stream-inflight-mib: a stream is counted while
// it is open on the server, and counted out when it ends, is cancelled or is refused.
TEST_F(ServerTest, OpenFetchStreamsAreCountedUntilTheyEndOrAreCancelled) {
  UploadLargeDemo(*client_, dir_.path());
  ASSERT_FALSE(HasFailure());
  auto stub = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  auto stats = [&] {
    grpc::ClientContext context;
    v1::ServerStats s;
    const grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &s);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return s;
  };
  // Polls GetStats for up to 10 s until `holds(stats)`.
  auto eventually = [&](auto holds) {
    for (int i = 0; i < 1000; ++i) {
      if (holds(stats())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  };
  auto none_open = [](const v1::ServerStats& s) {
    return s.fetch_streams() == 0 && s.fetch_bytes_in_flight() == 0;
  };
  EXPECT_TRUE(none_open(stats()));

  // Two readers that stop after the first message: without BDP probing their flow-control
  // windows stay at 64 KiB, far less than the checkpoint, so both streams stay open.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto held_stub = v1::CheckpointService::NewStub(
      grpc::CreateCustomChannel(server_->address(), grpc::InsecureChannelCredentials(), args));
  v1::FetchRequest merged;
  merged.set_checkpoint_id("big");
  merged.set_merged(true);
  grpc::ClientContext contexts[2];
  std::unique_ptr<grpc::ClientReader<v1::FetchResponse>> readers[2];
  v1::FetchResponse m;
  for (int i = 0; i < 2; ++i) {
    readers[i] = held_stub->Fetch(&contexts[i], merged);
    ASSERT_TRUE(readers[i]->Read(&m));
    EXPECT_TRUE(m.has_summary());
  }
  EXPECT_TRUE(eventually([](const v1::ServerStats& s) { return s.fetch_streams() == 2; }))
      << "two open fetches, stats say " << stats().fetch_streams();
  // One read to its end, the other cancelled.
  int64_t messages = 1;
  while (readers[0]->Read(&m)) ++messages;
  EXPECT_TRUE(readers[0]->Finish().ok());
  EXPECT_GT(messages, 3);
  EXPECT_TRUE(eventually([](const v1::ServerStats& s) { return s.fetch_streams() == 1; }))
      << "after one finished fetch: " << stats().DebugString();
  contexts[1].TryCancel();
  while (readers[1]->Read(&m)) {
  }
  EXPECT_EQ(readers[1]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(eventually(none_open)) << "after a cancelled fetch: " << stats().DebugString();

  // A stream past its deadline, and a refused one, are counted out too.
  ClientOptions slow;
  slow.stream_timeout = absl::Milliseconds(200);
  auto impatient = CkptClient::Connect(server_->address(), slow);
  ASSERT_TRUE(impatient.ok());
  SleepyVisitor sleepy;
  EXPECT_EQ((*impatient)->Fetch(merged, sleepy).code(), absl::StatusCode::kDeadlineExceeded);
  v1::FetchRequest unknown;
  unknown.set_checkpoint_id("no-such-checkpoint");
  unknown.set_merged(true);
  EXPECT_EQ(client_->FetchAll(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(eventually(none_open))
      << "after a late and a refused fetch: " << stats().DebugString();
}

TEST(ServerDiskTest, WritesBelowTheDiskReserveAreResourceExhausted) {
  TempDir dir;
  // A store created with room; then a reserve larger than any disk: ckptd starts read-only,
  // every write is refused, and nothing becomes visible.
  {
    auto server = ServerProcess::Start(CKPTD_PATH, dir / "data");
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = *CkptClient::Connect((*server)->address());
    ASSERT_TRUE(client->PutStrategy("src", DemoSourceStrategy(), false).ok());
  }
  auto server =
      ServerProcess::Start(CKPTD_PATH, dir / "data", {"--min-free-disk-mib", "1000000000"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = *CkptClient::Connect((*server)->address());
  ASSERT_TRUE(WriteShardedSample(DemoSourceStrategy(), DemoTensors(), dir / "src", {}).ok());
  auto up = client->UploadDirectory("demo", "src", dir / "src");
  ASSERT_FALSE(up.ok());
  EXPECT_EQ(up.status().code(), absl::StatusCode::kResourceExhausted) << up.status();
  EXPECT_THAT(std::string(up.status().message()), HasSubstr("free"));
  auto put = client->PutStrategy("dst", DemoDestinationStrategy(), false);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kResourceExhausted) << put.status();
  EXPECT_TRUE(client->ListCheckpoints()->empty());
  ASSERT_TRUE(client->GetStrategy("src").ok());  // reads are served
  // No store can be created below the reserve: a clear start-up error.
  auto fresh =
      ServerProcess::Start(CKPTD_PATH, dir / "fresh", {"--min-free-disk-mib", "1000000000"});
  ASSERT_FALSE(fresh.ok());
  EXPECT_THAT(std::string(fresh.status().message()), HasSubstr("--min-free-disk-mib"));
}

}  // namespace
}  // namespace ckpt
