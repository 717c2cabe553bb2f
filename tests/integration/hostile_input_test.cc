// What a hostile or careless client may send a real ckptd (127.0.0.1:0), through the generated
// stub so that nothing on the client side filters it: tensor headers declaring absurd sizes,
// names holding control characters, an upload without tensors, a strategy larger than gRPC's
// default 4 MiB message limit. The server must answer each with a status naming the problem and
// keep serving (a follow-up ListCheckpoints works and the process is alive).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckpt.grpc.pb.h"
#include "client/client.h"
#include "core/sanitizers.h"
#include "core/strategy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/wire_fields.h"

namespace ckpt {
namespace {

using ::testing::AnyOf;
using testing::Field;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ServerProcess;
using testing::TempDir;

// Resident memory of process `pid` (bytes), from /proc; -1 when unreadable.
int64_t ResidentBytes(pid_t pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream in(line.substr(6));
      int64_t kib = 0;
      in >> kib;
      return kib << 10;
    }
  }
  return -1;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void Start(const std::vector<std::string>& args = {}) {
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", args);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    channel_ = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
    stub_ = v1::CheckpointService::NewStub(channel_);
  }

  // One Upload stream: `messages` in order (a refused write ends the sending), then the status.
  grpc::Status Upload(const std::vector<v1::UploadRequest>& messages) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
        stub_->Upload(&context, &response);
    for (const v1::UploadRequest& m : messages) {
      if (!writer->Write(m)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  static v1::UploadRequest Header(const std::string& id, const std::string& strategy = "",
                                  int64_t rank = 0) {
    v1::UploadRequest m;
    m.mutable_header()->set_checkpoint_id(id);
    m.mutable_header()->set_source_strategy(strategy);
    m.mutable_header()->set_rank(rank);
    return m;
  }
  static v1::UploadRequest Tensor(const std::string& name, const std::string& dtype,
                                  const std::vector<int64_t>& dims, int64_t total_bytes) {
    v1::UploadRequest m;
    m.mutable_tensor()->set_name(name);
    m.mutable_tensor()->set_dtype(dtype);
    for (int64_t d : dims) m.mutable_tensor()->add_dims(d);
    m.mutable_tensor()->set_total_bytes(total_bytes);
    return m;
  }
  static v1::UploadRequest Data(size_t bytes) {
    v1::UploadRequest m;
    m.set_data(std::string(bytes, '\x01'));
    return m;
  }

  // The server still answers, and its process is alive.
  void ExpectServing() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::ListCheckpointsResponse response;
    const grpc::Status status =
        stub_->ListCheckpoints(&context, v1::ListCheckpointsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message()
                             << "\nserver log:\n"
                             << server_->Log();
    EXPECT_EQ(::kill(server_->pid(), 0), 0) << "ckptd is gone";
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::CheckpointService::Stub> stub_;
};

// Headers announcing hundreds of GiB (well past the default --max-upload-gib) are refused before
// anything is allocated for them; shapes whose byte counts overflow int64 are malformed.
TEST_F(HostileInputTest, HugeTensorHeadersAreRefusedAndTheServerStaysUp) {
  Start();
  struct Case {
    std::string dtype;
    std::vector<int64_t> dims;
    int64_t total;
    grpc::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"Float32",
       {1, int64_t{1} << 36},
       int64_t{1} << 38,
       grpc::RESOURCE_EXHAUSTED,
       "--max-upload-gib"},
      {"Int8",
       {1, 1, int64_t{1} << 38},
       int64_t{1} << 38,
       grpc::RESOURCE_EXHAUSTED,
       "--max-upload-gib"},
      {"Float64",
       {int64_t{1} << 31, int64_t{1} << 31},
       int64_t{1} << 62,
       grpc::INVALID_ARGUMENT,
       ""},
      {"Float16", {int64_t{1} << 40, int64_t{1} << 40}, 8, grpc::INVALID_ARGUMENT, ""},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.dtype, " case ", n));
    const grpc::Status status = Upload(
        {Header(absl::StrCat("huge", n++)), Tensor("w", c.dtype, c.dims, c.total), Data(1 << 20)});
    EXPECT_EQ(status.error_code(), c.code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.says));
    ExpectServing();
  }
}

// Within the limit, a declared size still allocates nothing by itself: memory follows the bytes
// that arrive, and a stream that ends early is refused.
TEST_F(HostileInputTest, DeclaredSizesWithinTheLimitCostOnlyWhatArrives) {
  Start({"--max-upload-gib", "4096"});
  const int64_t rss_before = ResidentBytes(server_->pid());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = {
      {"Float32", {1, int64_t{1} << 36}},
      {"Int8", {1, 1, int64_t{1} << 38}},
      {"Float32", {int64_t{1} << 12, int64_t{1} << 26}},
  };
  int n = 0;
  for (const auto& [dtype, dims] : shapes) {
    SCOPED_TRACE(absl::StrCat(dtype, " case ", n));
    const int64_t total =
        (dtype == "Int8" ? 1 : 4) * dims[0] * dims[1] * (dims.size() > 2 ? dims[2] : 1);
    std::vector<v1::UploadRequest> messages = {Header(absl::StrCat("big", n++)),
                                               Tensor("w", dtype, dims, total)};
    for (int i = 0; i < 8; ++i) messages.push_back(Data(1 << 20));
    const grpc::Status status = Upload(messages);
    EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr("stream ended after"));
    ExpectServing();
  }
  const int64_t rss_after = ResidentBytes(server_->pid());
  ASSERT_GT(rss_before, 0);
  EXPECT_LT(rss_after - rss_before, int64_t{512} << 20)
      << "ckptd grew from " << rss_before << " to " << rss_after << " bytes";
}

// ckptd reads a stream's next messages while it handles one. A stream refused in the middle,
// while its client keeps sending (reads outstanding, messages waiting), or cancelled by its
// client, gets its status, ends on the server (no open upload stream is left behind) and leaves
// nothing stored.
TEST_F(HostileInputTest, AStreamRefusedOrCancelledWhileItsNextMessagesArriveEndsCleanly) {
  Start();
  auto upload_streams = [&]() -> int64_t {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ServerStats stats;
    const grpc::Status s = stub_->GetStats(&context, v1::GetStatsRequest(), &stats);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return s.ok() ? stats.upload_streams() : -1;
  };
  auto expect_no_stream_left = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    int64_t open = upload_streams();
    while (open != 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      open = upload_streams();
    }
    EXPECT_EQ(open, 0) << "an upload stream is still open on the server\nserver log:\n"
                       << server_->Log();
  };

  // 16 bytes declared, then 64 data messages of 1 MiB: the first one is refused while the
  // others are on their way.
  std::vector<v1::UploadRequest> messages = {Header("refused"), Tensor("w", "Float32", {4}, 16)};
  for (int i = 0; i < 64; ++i) messages.push_back(Data(1 << 20));
  const grpc::Status refused = Upload(messages);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("w"));
  expect_no_stream_left();

  // A client that cancels after sending part of a tensor.
  {
    grpc::ClientContext context;
    v1::UploadResponse response;
    std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>> writer =
        stub_->Upload(&context, &response);
    ASSERT_TRUE(writer->Write(Header("cancelled")));
    ASSERT_TRUE(writer->Write(Tensor("w", "Float32", {1 << 22}, int64_t{16} << 20)));
    for (int i = 0; i < 8; ++i) ASSERT_TRUE(writer->Write(Data(1 << 20)));
    context.TryCancel();
    EXPECT_EQ(writer->Finish().error_code(), grpc::CANCELLED);
  }
  expect_no_stream_left();

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ListCheckpointsResponse listed;
  ASSERT_TRUE(stub_->ListCheckpoints(&context, v1::ListCheckpointsRequest(), &listed).ok());
  EXPECT_EQ(listed.checkpoints_size(), 0);
  ExpectServing();
}

// A strategy claiming more ranks than can be enumerated is refused when registered.
TEST_F(HostileInputTest, StrategyWithAnAbsurdWorldIsRefused) {
  Start();
  // 2^24 devices (one stage): a valid layout, but 16 Mi ranks to enumerate.
  const std::string json =
      R"({"parallel_layout_item": {"w": {"dev_matrix": [16777216], "tensor_map": [-1]}}})";
  grpc::ClientContext context;
  v1::PutStrategyRequest request;
  request.set_name("wide");
  request.set_content(json);
  request.set_format(v1::STRATEGY_FORMAT_JSON);
  v1::PutStrategyResponse response;
  const grpc::Status status = stub_->PutStrategy(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("ranks ckptd supports"));
  ExpectServing();
}

// Control characters in client-chosen names are refused at the boundary, and no log line can be
// forged through them.
TEST_F(HostileInputTest, NamesWithControlCharactersAreRefused) {
  Start();
  const std::string forged = "\n2026-01-01T00:00:00.000 info ckptd event=FORGED";
  // A checkpoint id and a tensor name.
  grpc::Status status = Upload({Header("ok" + forged), Tensor("w", "Int8", {4}, 4), Data(4)});
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), Not(HasSubstr("\n")));
  status = Upload({Header("ctl-tensor"), Tensor("w" + forged, "Int8", {4}, 4), Data(4)});
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("control character"));
  EXPECT_THAT(status.error_message(), Not(HasSubstr("\n")));
  status = Upload({Header("esc-tensor"), Tensor("w\x1b[31mred", "Int8", {4}, 4), Data(4)});
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
  // A strategy name, and a strategy's parameter name (JSON escapes decode to the characters).
  const std::vector<std::pair<std::string, std::string>> strategies = {
      {"s" + forged, "w"}, {"s", "w\\n2026-01-01T00:00:00.000 info ckptd event=FORGED"}};
  for (const auto& [name, param] : strategies) {
    grpc::ClientContext context;
    v1::PutStrategyRequest request;
    request.set_name(name);
    request.set_content(absl::StrCat(R"({"parallel_layout_item": {")", param,
                                     R"(": {"dev_matrix": [2], "tensor_map": [0]}}})"));
    request.set_format(v1::STRATEGY_FORMAT_JSON);
    v1::PutStrategyResponse response;
    status = stub_->PutStrategy(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), Not(HasSubstr("\n")));
  }
  ExpectServing();
  // Every forged text stayed inside the line that logged it: the rpc and the audit lines, all
  // written once the server has stopped.
  EXPECT_EQ(server_->Stop(), 0);
  const std::string log = server_->Log();
  EXPECT_THAT(log, HasSubstr("event=FORGED")) << "the refusals were not logged";
  const std::vector<std::string> lines = absl::StrSplit(log, '\n');
  for (const std::string& line : lines) {
    EXPECT_NE(line.rfind("2026-01-01T00:00:00.000", 0), 0u) << line;
  }
}

// An upload without tensors (what a 0-byte .ckpt gives) is refused by the server, and the client
// library refuses to send an empty file.
TEST_F(HostileInputTest, EmptyCheckpointsAreRefused) {
  Start();
  const grpc::Status status = Upload({Header("empty")});
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("no tensors"));

  const std::string path = dir_ / "empty.ckpt";
  std::ofstream(path).flush();
  auto client = CkptClient::Connect(server_->address());
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::StatusOr<v1::UploadResponse> uploaded = (*client)->UploadWholeFile("empty2", path);
  EXPECT_EQ(uploaded.status().code(), absl::StatusCode::kInvalidArgument) << uploaded.status();
  EXPECT_THAT(uploaded.status().message(), HasSubstr("holds no tensors"));
  auto listed = (*client)->ListCheckpoints();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty()) << "an empty checkpoint was committed";
  ExpectServing();
}

// A strategy of a model with many parameters exceeds gRPC's default 4 MiB message size in both
// forms: it registers (sent in binary form) and reads back (as JSON) whole.
TEST_F(HostileInputTest, StrategiesLargerThanFourMiBRegister) {
  Start();
  std::map<std::string, StrategyParam> params;
  for (int i = 0; i < 24000; ++i) {
    StrategyParam p;
    p.layout.dev_matrix = {2, 4};
    p.layout.tensor_map = {{1}, {0}};
    p.tensor_shape = Shape{64, 64};
    params[absl::StrCat("network.backbone.layers.", i, ".", std::string(160, 'x'), ".weight")] =
        std::move(p);
  }
  auto strategy = Strategy::Create(std::move(params), 1);
  ASSERT_TRUE(strategy.ok()) << strategy.status();
  const std::string binary = SerializeStrategy(*strategy, StrategyFormat::kBinary);
  const std::string json = SerializeStrategy(*strategy, StrategyFormat::kJson);
  ASSERT_GT(binary.size(), size_t{4} << 20);
  ASSERT_LT(json.size(), size_t{60} << 20);
  // Serializing, sending and parsing 24,000 parameters takes seconds in a Release build and
  // several times longer under AddressSanitizer or ThreadSanitizer (CKPT_SANITIZED): the deadline
  // of each call scales there, the assertions stay the same.
  ClientOptions options;
#ifdef CKPT_SANITIZED
  options.unary_timeout *= 5;
#endif
  auto client = CkptClient::Connect(server_->address(), options);
  ASSERT_TRUE(client.ok()) << client.status();
  auto put = (*client)->PutStrategy("large", *strategy, /*overwrite=*/false);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(put->parameter_count(), 24000);
  auto got = (*client)->GetStrategy("large");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->strategy.params(), strategy->params());
  ExpectServing();
}

// ckptd reads a plain tensor batch in place; any other wire form of one must still be read as
// protobuf reads it (a repeated header field merges), and a malformed header inside a batch is a
// clear error. The messages go as raw bytes, which the generated stub cannot send.
TEST_F(HostileInputTest, BatchesAreReadAsProtobufReadsThem) {
  Start();
  const auto upload = [&](const std::string& id, const std::string& tensor) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    static const grpc::internal::RpcMethod kUpload("/ckpt.v1.CheckpointService/Upload",
                                                   grpc::internal::RpcMethod::CLIENT_STREAMING);
    grpc::ByteBuffer response;
    auto writer = std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>>(
        grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel_.get(), kUpload,
                                                                      &context, &response));
    for (const std::string& bytes : {Header(id).SerializeAsString(), Field(4, Field(1, tensor))}) {
      grpc::Slice slice(bytes);
      grpc::ByteBuffer buffer(&slice, 1);
      if (!writer->Write(buffer)) break;
    }
    writer->WritesDone();
    const grpc::Status status = writer->Finish();
    v1::UploadResponse parsed;
    std::vector<grpc::Slice> slices;
    std::string bytes;
    if (status.ok() && response.Dump(&slices).ok()) {
      for (const grpc::Slice& sl : slices) bytes.append(sl.begin(), sl.end());
    }
    EXPECT_TRUE(!status.ok() || (parsed.ParseFromString(bytes) && parsed.committed()));
    return status;
  };
  v1::UploadTensorHeader name_part;
  name_part.set_name("w");
  name_part.set_dtype("Float32");
  v1::UploadTensorHeader shape_part;
  shape_part.add_dims(2);
  shape_part.set_total_bytes(8);
  const std::string data = Field(2, std::string(8, '\x02'));

  // The header in two fields, merged: the tensor is whole and the checkpoint commits.
  const grpc::Status merged = upload("merged", Field(1, name_part.SerializeAsString()) +
                                                   Field(1, shape_part.SerializeAsString()) + data);
  EXPECT_TRUE(merged.ok()) << merged.error_code() << " " << merged.error_message();
  // Only the first part alone announces 0 bytes for a Float32 [] scalar: refused, naming it.
  const grpc::Status first_only = upload("first", Field(1, name_part.SerializeAsString()) + data);
  EXPECT_EQ(first_only.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // A header that is not an UploadTensorHeader (a truncated varint) inside a plain batch.
  const grpc::Status malformed = upload("malformed", Field(1, std::string("\x20\xff", 2)) + data);
  EXPECT_EQ(malformed.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(malformed.error_message(), HasSubstr("malformed upload message"));
  ExpectServing();
}

}  // namespace
}  // namespace ckpt
