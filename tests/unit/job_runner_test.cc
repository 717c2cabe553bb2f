// Transform jobs in process (no gRPC): every output kind is compared byte for byte with what
// Fetch serves for the same rank and with slices generated independently (client/sample.h);
// exported files are also decoded by a small Python program (numpy + protobuf). Also covered:
// idempotent submission, validation, cancellation without leftovers, failure reasons, watches,
// shutdown and restart (memory and RocksDB stores), and a fetch completing while a job runs.
#include "service/engine/job_runner.h"

#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/ckptctl/sample.h"
#include "core/ckpt_format.h"
#include "core/reshard.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/checkpoint_store.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/forwarding_store.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 11;

// Verbatim values every source rank carries (identical on every rank, as MindSpore saves them):
// two scalars (empty dims) and a str value (dims [0], UTF-32LE).
struct Extra {
  std::string name;
  DType dtype;
  std::vector<int64_t> dims;
  std::string bytes;
};

std::vector<Extra> Extras() {
  const int32_t step = 1234;
  const float lr = 0.125f;
  std::string s(reinterpret_cast<const char*>(&step), 4);
  std::string f(reinterpret_cast<const char*>(&lr), 4);
  return {{"global_step", DType::kInt32, {}, s},
          {"learning_rate", DType::kFloat32, {}, f},
          {"note", DType::kStr, {0}, std::string("h\0\0\0i\0\0\0", 8)}};
}

const SampleTensor* FindDemo(const std::string& name) {
  static const std::vector<SampleTensor> tensors = DemoTensors();
  for (const SampleTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const Extra* FindExtra(const std::string& name) {
  static const std::vector<Extra> extras = Extras();
  for (const Extra& e : extras) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppend(&hex, absl::Hex(md[i], absl::kZeroPad2));
  return hex;
}

// Polls `pred` every 5 ms until it holds or `timeout` passes.
bool WaitUntil(const std::function<bool()>& pred,
               std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

struct Fetched {
  v1::FetchPlanSummary summary;
  std::vector<std::pair<v1::FetchTensorHeader, std::string>> tensors;
};

// What a MindSpore file of this fetch holds: dims = local shape (str: [0]), Fetch's order.
std::vector<CkptTensor> AsCkptTensors(const Fetched& f) {
  std::vector<CkptTensor> out;
  for (const auto& [h, bytes] : f.tensors) {
    CkptTensor t;
    t.name = h.name();
    t.dtype = *ParseDType(h.dtype());
    t.dims.assign(h.local_shape().begin(), h.local_shape().end());
    if (t.dtype == DType::kStr) t.dims = {0};
    t.data = bytes;
    out.push_back(std::move(t));
  }
  return out;
}

// A memory store whose reads fail (DATA_LOSS) once, at a chosen read: a fault injected
// into one rank of a job that writes several ranks at once.
class FaultyReadStore final : public testing::ForwardingStore {
 public:
  explicit FaultyReadStore(std::unique_ptr<CheckpointStore> base)
      : ForwardingStore(std::move(base)) {}

  // Read number `n` (0-based) from now on fails.
  void FailRead(int64_t n) {
    reads_ = 0;
    fail_at_ = n;
  }

  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override {
    if (reads_.fetch_add(1) == fail_at_.load()) {
      return absl::DataLossError(absl::StrCat("injected fault reading ", address.ToString()));
    }
    return base().ReadChunkUnverified(address);
  }

 private:
  std::atomic<int64_t> reads_{0};
  std::atomic<int64_t> fail_at_{-1};
};

class JobRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "job_runner_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    tmp_ = tmpl;
    auto faulty = std::make_unique<FaultyReadStore>(NewMemoryStore());
    faulty_ = faulty.get();
    store_ = std::move(faulty);
    MakeManager();
    PopulateStore();
  }

  void TearDown() override {
    runner_.reset();  // before the manager and store it uses
    manager_.reset();
    store_.reset();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  static ManagerOptions SmallOptions() {
    ManagerOptions options;
    // Small chunks, bands and messages so that jobs run through many of each.
    options.upload.chunk_grid.target_chunk_bytes = 256;
    options.upload.chunk_grid.min_column_bytes = 16;
    options.upload.verbatim_dedupe_bytes = 1024;
    options.fetch.band_bytes = 300;
    options.fetch.max_message_bytes = 100;
    options.fetch.chunk_cache_bytes = 1024;
    return options;
  }

  void MakeManager() {
    manager_ = std::make_unique<CheckpointManager>(store_.get(), SmallOptions());
  }

  // Strategies "src" (8 ranks, 2 stages) and "dst" (3 ranks), checkpoint "ck" under "src".
  void PopulateStore() {
    PutStrategy("src", DemoSourceStrategy());
    PutStrategy("dst", DemoDestinationStrategy());
    const Strategy src = DemoSourceStrategy();
    for (int64_t r = 0; r < src.world_size(); ++r) {
      ASSERT_TRUE(UploadRank("ck", "src", &src, r).ok()) << "rank " << r;
    }
  }

  // The export root is the test's temporary directory unless `options` names another or
  // no_export_root_ is set.
  JobRunner* StartRunner(JobRunnerOptions options = {}) {
    options.upload = SmallOptions().upload;
    if (options.export_root.empty() && !no_export_root_) options.export_root = tmp_;
    runner_ = std::make_unique<JobRunner>(manager_.get(), options);
    absl::Status s = runner_->Start();
    EXPECT_TRUE(s.ok()) << s;
    return runner_.get();
  }

  JobRunner* StartCappedRunner(int64_t bytes_per_second) {
    JobRunnerOptions options;
    options.max_bytes_per_second = bytes_per_second;
    return StartRunner(options);
  }

  void PutStrategy(const std::string& name, const Strategy& s) {
    auto info = manager_->PutStrategy(name, SerializeStrategy(s, StrategyFormat::kJson),
                                      v1::STRATEGY_FORMAT_JSON, false);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  // One source rank of the demo tensors laid out by `strategy` (null: whole tensors), plus the
  // verbatim extras.
  absl::Status UploadRank(const std::string& id, const std::string& strategy_name,
                          const Strategy* strategy, int64_t rank) {
    v1::UploadHeader h;
    h.set_checkpoint_id(id);
    h.set_source_strategy(strategy_name);
    h.set_rank(rank);
    auto upload = manager_->BeginUpload(h);
    if (!upload.ok()) return upload.status();
    auto send = [&](const std::string& name, DType dtype, const std::vector<int64_t>& dims,
                    const std::string& bytes) -> absl::Status {
      v1::UploadTensorHeader th;
      th.set_name(name);
      th.set_dtype(std::string(DTypeName(dtype)));
      for (int64_t d : dims) th.add_dims(d);
      th.set_total_bytes(static_cast<int64_t>(bytes.size()));
      if (auto s = (*upload)->StartTensor(th); !s.ok()) return s;
      for (size_t pos = 0; pos < bytes.size(); pos += 97) {
        if (auto s = (*upload)->Append(std::string_view(bytes).substr(pos, 97)); !s.ok()) return s;
      }
      return absl::OkStatus();
    };
    for (const SampleTensor& t : DemoTensors()) {
      Box box = Box::Whole(t.global_shape);
      if (strategy) {
        const Layout* l = ResolveLayout(*strategy, t.name, true);
        if (l) {
          const int32_t stage = static_cast<int32_t>(rank / strategy->devices_per_stage());
          if (!std::count(l->stages.begin(), l->stages.end(), stage)) continue;
          box = *l->SliceBox(t.global_shape, rank % strategy->devices_per_stage());
        }
      }
      if (auto s = send(t.name, t.dtype, box.shape(),
                        SampleSlice(t.name, t.dtype, t.global_shape, box, kSeed));
          !s.ok()) {
        return s;
      }
    }
    for (const Extra& e : Extras()) {
      if (auto s = send(e.name, e.dtype, e.dims, e.bytes); !s.ok()) return s;
    }
    auto r = (*upload)->Finish();
    if (!r.ok()) return r.status();
    manager_->OnUploadFinished(id);
    return absl::OkStatus();
  }

  Fetched FetchAll(const v1::FetchRequest& req) {
    Fetched out;
    auto stream = manager_->OpenFetch(req);
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return out;
    v1::FetchResponse msg;
    while (true) {
      auto more = (*stream)->Next(&msg);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      if (msg.has_summary()) out.summary = msg.summary();
      if (msg.has_tensor()) out.tensors.push_back({msg.tensor(), ""});
      if (msg.has_data()) out.tensors.back().second += msg.data().data();
    }
    return out;
  }

  Fetched FetchRank(const std::string& ckpt, const std::string& strategy, int64_t rank) {
    v1::FetchRequest req;
    req.set_checkpoint_id(ckpt);
    req.set_destination_strategy(strategy);
    req.set_rank(rank);
    return FetchAll(req);
  }

  Fetched FetchMerged(const std::string& ckpt) {
    v1::FetchRequest req;
    req.set_checkpoint_id(ckpt);
    req.set_merged(true);
    return FetchAll(req);
  }

  static v1::SubmitTransformRequest ExportRequest(const std::string& job_id, const std::string& dir,
                                                  std::vector<int64_t> ranks = {},
                                                  const std::string& prefix = "") {
    v1::SubmitTransformRequest req;
    req.set_job_id(job_id);
    req.set_checkpoint_id("ck");
    req.set_destination_strategy("dst");
    req.mutable_target()->set_export_dir(dir);
    for (int64_t r : ranks) req.mutable_target()->add_ranks(r);
    req.mutable_target()->set_prefix(prefix);
    return req;
  }

  static v1::SubmitTransformRequest MergedRequest(const std::string& job_id,
                                                  const std::string& ckpt,
                                                  const std::string& file) {
    v1::SubmitTransformRequest req;
    req.set_job_id(job_id);
    req.set_checkpoint_id(ckpt);
    req.mutable_target()->set_merged_file(file);
    return req;
  }

  static v1::SubmitTransformRequest NewCheckpointRequest(const std::string& job_id,
                                                         const std::string& new_id) {
    v1::SubmitTransformRequest req;
    req.set_job_id(job_id);
    req.set_checkpoint_id("ck");
    req.set_destination_strategy("dst");
    req.mutable_target()->set_new_checkpoint_id(new_id);
    return req;
  }

  v1::Job Submit(const v1::SubmitTransformRequest& req) {
    auto r = runner_->Submit(req);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_TRUE(r->created);
    return r->job;
  }

  v1::Job WaitDone(const std::string& id) {
    v1::Job job;
    const bool done = WaitUntil([&] {
      job = *runner_->Get(id);
      return JobRunner::IsTerminal(job.state());
    });
    EXPECT_TRUE(done) << "job " << id << " still " << job.ShortDebugString();
    return job;
  }

  // Waits until the job is RUNNING and has moved some bytes.
  void WaitRunning(const std::string& id) {
    v1::Job job;
    ASSERT_TRUE(WaitUntil([&] {
      job = *runner_->Get(id);
      return job.state() == v1::JOB_STATE_RUNNING && job.progress().bytes_done() > 0;
    })) << job.ShortDebugString();
  }

  v1::Job StoredJob(const std::string& id) {
    auto bytes = store_->GetJob(id);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    v1::Job job;
    if (bytes.ok()) {
      EXPECT_TRUE(job.ParseFromString(*bytes));
    }
    return job;
  }

  // The file equals, byte for byte, a MindSpore file of Fetch's output for the same rank, and
  // every tensor in it equals the independently generated slice (see ExpectTensorsMatch).
  void ExpectFileMatches(const std::string& path, const Fetched& fetched, const Strategy* dst,
                         int64_t rank) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(Exists(path));
    const std::string file = testing::ReadFileOrDie(path);
    auto expected = EncodeCkpt(AsCkptTensors(fetched));
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_TRUE(file == *expected) << "file differs from the Fetch output";
    auto decoded = DecodeCkpt(file);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    ExpectTensorsMatch(*decoded, dst, rank);
  }

  // `tensors` are the demo tensors as `dst` rank `rank` holds them (whole when `dst` is null),
  // compared with slices generated independently, then the verbatim extras, in that order.
  static void ExpectTensorsMatch(const std::vector<CkptTensor>& tensors, const Strategy* dst,
                                 int64_t rank) {
    ASSERT_EQ(tensors.size(), DemoTensors().size() + Extras().size());
    bool verbatim_seen = false;
    for (const CkptTensor& t : tensors) {
      SCOPED_TRACE(t.name);
      if (const Extra* e = FindExtra(t.name)) {
        verbatim_seen = true;  // verbatim values come last, as MindSpore writes them
        EXPECT_EQ(t.dtype, e->dtype);
        EXPECT_EQ(t.dims, e->dims);
        EXPECT_EQ(t.data, e->bytes);
        continue;
      }
      EXPECT_FALSE(verbatim_seen) << "a transformed tensor after a verbatim one";
      const SampleTensor* s = FindDemo(t.name);
      ASSERT_NE(s, nullptr);
      Box box = Box::Whole(s->global_shape);
      if (dst) {
        if (const Layout* l = ResolveLayout(*dst, s->name, true)) {
          box = *l->SliceBox(s->global_shape, rank % dst->devices_per_stage());
        }
      }
      EXPECT_EQ(t.dtype, s->dtype);
      EXPECT_EQ(t.dims, box.shape());
      EXPECT_TRUE(t.data == SampleSlice(s->name, s->dtype, s->global_shape, box, kSeed))
          << "bytes differ from the independently generated slice " << box.ToString();
    }
  }

  std::string tmp_;
  FaultyReadStore* faulty_ = nullptr;  // the store of SetUp (tests that reopen one replace it)
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<CheckpointManager> manager_;
  std::unique_ptr<JobRunner> runner_;
  bool no_export_root_ = false;  // StartRunner without an export root
};

TEST_F(JobRunnerTest, ExportWritesEveryRankLikeFetch) {
  StartRunner();
  const std::string dir = tmp_ + "/out";
  Submit(ExportRequest("exp", dir));
  const v1::Job job = WaitDone("exp");
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const Strategy dst = DemoDestinationStrategy();
  int64_t tensors = 0, bytes = 0;
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    const Fetched fetched = FetchRank("ck", "dst", r);
    tensors += fetched.summary.tensor_count();
    bytes += fetched.summary.total_bytes();
    ExpectFileMatches(absl::StrCat(dir, "/rank_", r, "/checkpoint_", r, ".ckpt"), fetched, &dst, r);
  }
  // Nothing else in DIR, and no temporary left.
  int entries = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    ++entries;
    EXPECT_THAT(entry.path().filename().string(), ::testing::StartsWith("rank_"));
  }
  EXPECT_EQ(entries, 3);
  EXPECT_FALSE(Exists(JobRunner::PartialPath(dir, "exp")));
  EXPECT_EQ(job.progress().tensors_done(), tensors);
  EXPECT_EQ(job.progress().tensors_total(), tensors);
  EXPECT_EQ(job.progress().bytes_done(), bytes);
  EXPECT_EQ(job.progress().bytes_total(), bytes);
  EXPECT_EQ(job.progress().ranks_done(), 3);
  EXPECT_EQ(job.progress().ranks_total(), 3);
  EXPECT_EQ(job.progress().eta_seconds(), 0);
  EXPECT_EQ(job.attempts(), 1);
  EXPECT_GT(job.started_unix(), 0);
  EXPECT_GE(job.finished_unix(), job.started_unix());
  // The final state is durable.
  EXPECT_EQ(StoredJob("exp").state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobRunnerTest, ExportSubsetOfRanksWithPrefixRelativeToTheRoot) {
  JobRunnerOptions options;
  options.rank_workers = 1;  // one rank after another (the default writes several at once)
  StartRunner(options);
  const std::string dir = tmp_ + "/out";
  // Even an empty existing directory is never merged into.
  ASSERT_TRUE(fs::create_directory(dir));
  auto taken = runner_->Submit(ExportRequest("sub", "out/", {2, 0}, "transformed"));
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kAlreadyExists) << taken.status();
  EXPECT_THAT(std::string(taken.status().message()),
              HasSubstr("export_dir \"out/\" already exists"));
  ASSERT_TRUE(fs::remove(dir));
  Submit(ExportRequest("sub", "./out/", {2, 0}, "transformed"));
  const v1::Job job = WaitDone("sub");
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  const Strategy dst = DemoDestinationStrategy();
  for (int64_t r : {0, 2}) {
    ExpectFileMatches(absl::StrCat(dir, "/rank_", r, "/transformed", r, ".ckpt"),
                      FetchRank("ck", "dst", r), &dst, r);
  }
  EXPECT_FALSE(Exists(dir + "/rank_1"));
  EXPECT_EQ(job.progress().ranks_total(), 2);
}

// Ranks are written at the same time; one failing rank fails the job with its error, and the
// other ranks' output goes too.
TEST_F(JobRunnerTest, OneFailingRankFailsTheJobAndLeavesNoOutput) {
  JobRunnerOptions options;
  options.rank_workers = 3;  // every destination rank at once
  StartRunner(options);
  const std::string dir = tmp_ + "/out";
  faulty_->FailRead(20);
  Submit(ExportRequest("bad-export", dir));
  const v1::Job failed = WaitDone("bad-export");
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("DATA_LOSS"));
  EXPECT_THAT(failed.reason(), HasSubstr("injected fault reading"));
  EXPECT_FALSE(Exists(dir));
  EXPECT_FALSE(Exists(JobRunner::PartialPath(dir, "bad-export")));

  faulty_->FailRead(20);
  Submit(NewCheckpointRequest("bad-new", "ck5"));
  const v1::Job failed_new = WaitDone("bad-new");
  EXPECT_EQ(failed_new.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed_new.reason(), HasSubstr("injected fault reading"));
  EXPECT_EQ(manager_->DescribeCheckpoint("ck5").status().code(), absl::StatusCode::kNotFound);

  // Nothing was left in the way: the same outputs succeed once reads work.
  Submit(ExportRequest("good-export", dir));
  ASSERT_EQ(WaitDone("good-export").state(), v1::JOB_STATE_SUCCEEDED);
  const Strategy dst = DemoDestinationStrategy();
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    ExpectFileMatches(absl::StrCat(dir, "/rank_", r, "/checkpoint_", r, ".ckpt"),
                      FetchRank("ck", "dst", r), &dst, r);
  }
  Submit(NewCheckpointRequest("good-new", "ck5"));
  ASSERT_EQ(WaitDone("good-new").state(), v1::JOB_STATE_SUCCEEDED);
  ExpectTensorsMatch(AsCkptTensors(FetchMerged("ck5")), nullptr, 0);
}

TEST_F(JobRunnerTest, MergedFileHoldsWholeTensors) {
  StartRunner();
  const std::string file = tmp_ + "/merged.ckpt";
  Submit(MergedRequest("m", "ck", file));
  const v1::Job job = WaitDone("m");
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  ExpectFileMatches(file, FetchMerged("ck"), nullptr, 0);
  EXPECT_FALSE(Exists(JobRunner::PartialPath(file, "m")));
  EXPECT_EQ(job.progress().ranks_done(), 1);
}

TEST_F(JobRunnerTest, NewCheckpointServesTheSameBytes) {
  StartRunner();
  Submit(NewCheckpointRequest("n", "ck3"));
  const v1::Job job = WaitDone("n");
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  auto described = manager_->DescribeCheckpoint("ck3");
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_EQ(described->info().source_strategy(), "dst");
  EXPECT_EQ(described->info().ranks(), 3);
  const Strategy dst = DemoDestinationStrategy();
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const Fetched original = FetchRank("ck", "dst", r);
    const Fetched copy = FetchRank("ck3", "dst", r);
    ASSERT_EQ(copy.tensors.size(), original.tensors.size());
    for (size_t i = 0; i < copy.tensors.size(); ++i) {
      EXPECT_TRUE(MessageDifferencer::Equals(copy.tensors[i].first, original.tensors[i].first))
          << copy.tensors[i].first.ShortDebugString() << " vs "
          << original.tensors[i].first.ShortDebugString();
      EXPECT_TRUE(copy.tensors[i].second == original.tensors[i].second)
          << copy.tensors[i].first.name();
    }
  }
  // Whole tensors agree too (checked independently against the generator).
  ExpectTensorsMatch(AsCkptTensors(FetchMerged("ck3")), nullptr, 0);
}

TEST_F(JobRunnerTest, PythonDecodesExportedFileLikeTheCodec) {
  StartRunner();
  const std::string dir = tmp_ + "/out";
  Submit(ExportRequest("py", dir, {1}));
  ASSERT_EQ(WaitDone("py").state(), v1::JOB_STATE_SUCCEEDED);
  const std::string file = dir + "/rank_1/checkpoint_1.ckpt";
  if (!Exists("/usr/bin/python3")) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  auto run = testing::RunSubprocess(
      {"/usr/bin/python3", CKPT_CHECK_CKPT_PY, "--proto-dir", CKPT_PY_PROTO_DIR, file});
  ASSERT_TRUE(run.ok()) << run.status();
  const auto out = nlohmann::json::parse(run->stdout_text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(out.is_discarded()) << run->stdout_text << run->stderr_text;
  if (run->exit_code == 3 && out.contains("skip")) {
    GTEST_SKIP() << out["skip"].get<std::string>() << " (install python3-numpy python3-protobuf)";
  }
  ASSERT_EQ(run->exit_code, 0) << run->stdout_text << run->stderr_text;
  auto decoded = DecodeCkpt(testing::ReadFileOrDie(file));
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const auto& tensors = out["tensors"];
  ASSERT_EQ(tensors.size(), decoded->size());
  for (size_t i = 0; i < decoded->size(); ++i) {
    const CkptTensor& t = (*decoded)[i];
    const auto& p = tensors[i];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(p["name"].get<std::string>(), t.name);
    EXPECT_EQ(p["dtype"].get<std::string>(), std::string(DTypeName(t.dtype)));
    EXPECT_EQ(p["shape"].get<std::vector<int64_t>>(), t.shape());
    EXPECT_EQ(p["elements"].get<int64_t>(), *NumElements(t.shape()));
    EXPECT_EQ(p["sha256"].get<std::string>(), Sha256Hex(t.data));
    if (t.dtype == DType::kStr) {
      EXPECT_EQ(p["value"].get<std::string>(), *t.StringValue());
    } else {
      EXPECT_TRUE(p.contains("sum"));
    }
  }
  // The scalars read back with their values through numpy.
  for (const auto& p : tensors) {
    if (p["name"] == "global_step") {
      EXPECT_EQ(p["sum"].get<double>(), 1234.0);
    } else if (p["name"] == "learning_rate") {
      EXPECT_EQ(p["sum"].get<double>(), 0.125);
    }
  }
}

TEST_F(JobRunnerTest, ResubmissionIsIdempotent) {
  StartRunner();
  const auto req = ExportRequest("same", tmp_ + "/out");
  const v1::Job first = Submit(req);
  auto again = runner_->Submit(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.id(), "same");
  EXPECT_EQ(again->job.submitted_unix(), first.submitted_unix());
  WaitDone("same");
  // Still the same job once it ran (and its output exists now).
  again = runner_->Submit(req);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.state(), v1::JOB_STATE_SUCCEEDED);
  // Same id, another request.
  auto other = ExportRequest("same", tmp_ + "/out", {}, "other_");
  EXPECT_EQ(runner_->Submit(other).status().code(), absl::StatusCode::kAlreadyExists);
  // No id: the server picks one.
  auto picked = runner_->Submit(MergedRequest("", "ck", tmp_ + "/m.ckpt"));
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_TRUE(picked->created);
  EXPECT_THAT(picked->job.id(), ::testing::StartsWith("job-"));
  EXPECT_EQ(picked->job.request().job_id(), picked->job.id());
  EXPECT_EQ(runner_->List().size(), 2u);
  EXPECT_EQ(runner_->Get("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobRunnerTest, SubmissionIsValidated) {
  StartRunner();
  auto code = [&](const v1::SubmitTransformRequest& r) {
    return runner_->Submit(r).status().code();
  };
  using C = absl::StatusCode;
  EXPECT_EQ(code(ExportRequest("a", "relative/out")), C::kFailedPrecondition);  // no "relative"
  EXPECT_EQ(code(ExportRequest("a", tmp_ + "/../out")), C::kPermissionDenied);
  EXPECT_EQ(code(ExportRequest("a", "")), C::kInvalidArgument);
  EXPECT_EQ(code(ExportRequest("a", tmp_)), C::kInvalidArgument);  // the root itself
  EXPECT_EQ(code(ExportRequest("a", tmp_ + "/out", {3})), C::kOutOfRange);
  EXPECT_EQ(code(ExportRequest("a", tmp_ + "/out", {1, 1})), C::kInvalidArgument);
  EXPECT_EQ(code(ExportRequest("a", tmp_ + "/out", {}, "a/b")), C::kInvalidArgument);
  // The file name prefix follows the one rank-file rule (core/rank_files.h), as on the client:
  // 1-200 characters of [A-Za-z0-9._-]; empty means the default.
  for (const std::string& prefix :
       {std::string("net "), std::string("net:"), std::string(201, 'p')}) {
    auto bad = runner_->Submit(ExportRequest("a", tmp_ + "/out", {}, prefix));
    EXPECT_EQ(bad.status().code(), C::kInvalidArgument) << prefix;
    EXPECT_THAT(std::string(bad.status().message()), HasSubstr("A-Z a-z 0-9 . _ -")) << prefix;
  }
  EXPECT_EQ(code(ExportRequest("a", tmp_ + "/missing/out")), C::kFailedPrecondition);
  ASSERT_TRUE(fs::create_directories(tmp_ + "/full/x"));
  auto s = runner_->Submit(ExportRequest("a", tmp_ + "/full"));
  EXPECT_EQ(s.status().code(), C::kAlreadyExists);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("already exists"));
  auto no_strategy = ExportRequest("a", tmp_ + "/out");
  no_strategy.set_destination_strategy("");
  EXPECT_EQ(code(no_strategy), C::kInvalidArgument);
  no_strategy.set_destination_strategy("unknown");
  EXPECT_EQ(code(no_strategy), C::kNotFound);
  EXPECT_EQ(code(MergedRequest("a", "unknown", tmp_ + "/m.ckpt")), C::kNotFound);
  std::ofstream(tmp_ + "/exists.ckpt") << "x";
  EXPECT_EQ(code(MergedRequest("a", "ck", tmp_ + "/exists.ckpt")), C::kAlreadyExists);
  EXPECT_EQ(code(NewCheckpointRequest("a", "ck")), C::kAlreadyExists);
  EXPECT_EQ(code(NewCheckpointRequest("a", "bad/id")), C::kInvalidArgument);
  v1::SubmitTransformRequest no_target;
  no_target.set_job_id("a");
  no_target.set_checkpoint_id("ck");
  EXPECT_EQ(code(no_target), C::kInvalidArgument);
  auto ranks_on_merged = MergedRequest("a", "ck", tmp_ + "/m.ckpt");
  ranks_on_merged.mutable_target()->add_ranks(0);
  EXPECT_EQ(code(ranks_on_merged), C::kInvalidArgument);
  EXPECT_EQ(code(MergedRequest("bad id", "ck", tmp_ + "/m.ckpt")), C::kInvalidArgument);
  EXPECT_TRUE(runner_->List().empty());  // nothing was recorded
  EXPECT_TRUE(store_->ListJobs()->empty());
}

TEST_F(JobRunnerTest, CancelMidJobLeavesNoPartialOutput) {
  StartCappedRunner(4000);  // ~30 KB of output: several seconds
  const std::string dir = tmp_ + "/out";
  const std::string partial = JobRunner::PartialPath(dir, "c");
  Submit(ExportRequest("c", dir));
  WaitRunning("c");
  ASSERT_TRUE(Exists(partial));
  // The output is taken while the job is active.
  auto clash = runner_->Submit(ExportRequest("c2", dir + "/"));
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kFailedPrecondition) << clash.status();
  const auto start = std::chrono::steady_clock::now();
  auto cancelled = runner_->Cancel("c");
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_LT(took, std::chrono::seconds(2)) << "cancellation must stop the job promptly";
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->reason(), "cancelled by request");
  EXPECT_LT(cancelled->progress().bytes_done(), cancelled->progress().bytes_total());
  EXPECT_FALSE(Exists(partial));
  EXPECT_FALSE(Exists(dir));
  EXPECT_EQ(StoredJob("c").state(), v1::JOB_STATE_CANCELLED);
  // Cancelling again changes nothing.
  auto again = runner_->Cancel("c");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(again->finished_unix(), cancelled->finished_unix());
}

TEST_F(JobRunnerTest, CancelledNewCheckpointLeavesNothingAndCanBeRedone) {
  StartCappedRunner(8000);
  Submit(NewCheckpointRequest("n1", "ck4"));
  // Into the second rank, so that one rank was already received by the pending upload.
  v1::Job job;
  ASSERT_TRUE(WaitUntil([&] {
    job = *runner_->Get("n1");
    return job.progress().ranks_done() >= 1;
  })) << job.ShortDebugString();
  auto cancelled = runner_->Cancel("n1");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(manager_->DescribeCheckpoint("ck4").status().code(), absl::StatusCode::kNotFound);
  runner_.reset();
  StartRunner();  // uncapped
  Submit(NewCheckpointRequest("n2", "ck4"));
  const v1::Job redone = WaitDone("n2");
  ASSERT_EQ(redone.state(), v1::JOB_STATE_SUCCEEDED) << redone.reason();
  EXPECT_EQ(runner_->Get("n1")->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(JobRunnerTest, QueuedJobWhoseCheckpointVanishesFails) {
  StartCappedRunner(4000);  // one worker, busy with the first job
  ASSERT_TRUE(UploadRank("ck2", "", nullptr, 0).ok());
  Submit(ExportRequest("slow", tmp_ + "/out"));
  WaitRunning("slow");
  const std::string file = tmp_ + "/m.ckpt";
  Submit(MergedRequest("doomed", "ck2", file));
  EXPECT_EQ(runner_->Get("doomed")->state(), v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck2").ok());
  ASSERT_TRUE(runner_->Cancel("slow").ok());
  const v1::Job job = WaitDone("doomed");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("NOT_FOUND"));
  EXPECT_THAT(job.reason(), HasSubstr("ck2"));
  EXPECT_FALSE(Exists(file));
  EXPECT_FALSE(Exists(JobRunner::PartialPath(file, "doomed")));
  EXPECT_EQ(StoredJob("doomed").reason(), job.reason());
}

TEST_F(JobRunnerTest, CancelQueuedJob) {
  StartCappedRunner(4000);
  Submit(ExportRequest("slow", tmp_ + "/out"));
  WaitRunning("slow");
  Submit(MergedRequest("waiting", "ck", tmp_ + "/m.ckpt"));
  auto c = runner_->Cancel("waiting");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(c->attempts(), 0);
  EXPECT_EQ(runner_->Get("slow")->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(runner_->Cancel("slow").ok());
  EXPECT_EQ(runner_->Cancel("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(JobRunnerTest, DeleteRemovesOnlyFinishedJobs) {
  StartCappedRunner(4000);
  Submit(ExportRequest("slow", tmp_ + "/out"));
  WaitRunning("slow");
  EXPECT_EQ(runner_->Delete("slow").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(runner_->Delete("nope").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(runner_->Cancel("slow").ok());
  ASSERT_TRUE(runner_->Delete("slow").ok());
  EXPECT_EQ(runner_->Get("slow").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetJob("slow").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(runner_->List().empty());
}

TEST_F(JobRunnerTest, RemoveExpiredDropsOnlyFinishedJobsPastTheRetention) {
  JobRunnerOptions options;
  options.retention = absl::Hours(1);
  options.max_bytes_per_second = 4000;
  StartRunner(options);
  Submit(ExportRequest("slow", tmp_ + "/out"));
  WaitRunning("slow");
  Submit(MergedRequest("done", "ck", tmp_ + "/m.ckpt"));
  ASSERT_TRUE(runner_->Cancel("done").ok());  // queued behind "slow": cancelled at once
  // Not old enough yet; the running job never expires.
  EXPECT_EQ(runner_->RemoveExpired(absl::Now()), 0);
  EXPECT_EQ(runner_->RemoveExpired(absl::Now() + absl::Hours(2)), 1);
  EXPECT_EQ(runner_->Get("done").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->GetJob("done").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(runner_->Get("slow")->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(runner_->Cancel("slow").ok());
}

TEST_F(JobRunnerTest, FetchCompletesWhileAJobRuns) {
  StartCappedRunner(2000);
  Submit(ExportRequest("big", tmp_ + "/out"));
  WaitRunning("big");
  const auto start = std::chrono::steady_clock::now();
  const Fetched fetched = FetchRank("ck", "dst", 1);
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(static_cast<int64_t>(fetched.tensors.size()), fetched.summary.tensor_count());
  EXPECT_GT(fetched.summary.total_bytes(), 0);
  // Far faster than the job's share of bandwidth would allow for the same bytes.
  EXPECT_LT(took, std::chrono::seconds(2));
  EXPECT_EQ(runner_->Get("big")->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(runner_->Cancel("big").ok());
}

TEST_F(JobRunnerTest, WatchSeesEveryStateUntilTheEnd) {
  JobRunnerOptions options;
  options.max_bytes_per_second = 25000;  // about a second
  StartRunner(options);
  Submit(ExportRequest("w", tmp_ + "/out"));
  std::mutex mu;
  std::vector<v1::Job> seen;
  bool closed = false;
  auto record = [&](const v1::Job* job) {
    std::lock_guard<std::mutex> lock(mu);
    if (job) {
      seen.push_back(*job);
    } else {
      closed = true;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  auto watch = runner_->Watch("w", record);
  ASSERT_TRUE(watch.ok()) << watch.status();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen.size(), 1u) << "the current state is delivered at once";
  }
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !seen.empty() && JobRunner::IsTerminal(seen.back().state());
  }));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(seen.back().state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_GT(seen.size(), 2u);
    // Progress at most ~4 times a second, plus the state changes (running, totals, end).
    EXPECT_LE(seen.size(), static_cast<size_t>(seconds * 4) + 6);
    for (size_t i = 1; i < seen.size(); ++i) {
      EXPECT_GE(seen[i].progress().bytes_done(), seen[i - 1].progress().bytes_done());
    }
    const bool saw_rate = std::any_of(seen.begin(), seen.end(), [](const v1::Job& j) {
      return j.state() == v1::JOB_STATE_RUNNING && j.progress().bytes_per_second() > 0 &&
             j.progress().eta_seconds() > 0;
    });
    EXPECT_TRUE(saw_rate) << "rate and ETA are reported while running";
  }
  watch->reset();  // unregisters: no further calls
  // A watch of an ended job gets its final state; shutdown ends the watch.
  std::vector<v1::Job> late;
  bool late_closed = false;
  auto late_watch = runner_->Watch("w", [&](const v1::Job* job) {
    if (job) {
      late.push_back(*job);
    } else {
      late_closed = true;
    }
  });
  ASSERT_TRUE(late_watch.ok());
  ASSERT_EQ(late.size(), 1u);
  EXPECT_EQ(late[0].state(), v1::JOB_STATE_SUCCEEDED);
  runner_->Shutdown();
  EXPECT_TRUE(late_closed);
  EXPECT_FALSE(closed);
  EXPECT_EQ(runner_->Watch("w", record).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(runner_->Watch("nope", record).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(JobRunnerTest, ShutdownKeepsRunningJobForTheNextStart) {
  StartCappedRunner(4000);
  const std::string dir = tmp_ + "/out";
  Submit(ExportRequest("s", dir));
  WaitRunning("s");
  runner_->Shutdown();
  const v1::Job stored = StoredJob("s");
  EXPECT_EQ(stored.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(stored.attempts(), 1);
  EXPECT_FALSE(Exists(JobRunner::PartialPath(dir, "s")));
  EXPECT_FALSE(Exists(dir));
  EXPECT_EQ(runner_->Submit(ExportRequest("t", tmp_ + "/t")).status().code(),
            absl::StatusCode::kUnavailable);
  runner_.reset();
  StartRunner();
  const v1::Job job = WaitDone("s");
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempts(), 2);
  const Strategy dst = DemoDestinationStrategy();
  ExpectFileMatches(dir + "/rank_2/checkpoint_2.ckpt", FetchRank("ck", "dst", 2), &dst, 2);
}

TEST_F(JobRunnerTest, RestartAfterCrashRemovesPartialOutputAndReruns) {
  // A RocksDB store, closed and reopened as a crashed server's would be.
  const std::string db = tmp_ + "/db";
  StoreOptions store_options;
  store_options.min_free_disk_bytes = 0;
  auto opened = OpenSegmentStore(db, store_options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  store_ = std::move(*opened);
  MakeManager();
  PopulateStore();
  const std::string dir = tmp_ + "/out";
  const std::string partial = JobRunner::PartialPath(dir, "crash");
  // What the crashed server left: a RUNNING record and half an export.
  v1::Job job;
  job.set_id("crash");
  *job.mutable_request() = ExportRequest("crash", dir);
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempts(1);
  job.set_submitted_unix(absl::ToUnixSeconds(absl::Now()));
  job.set_started_unix(job.submitted_unix());
  ASSERT_TRUE(store_->PutJob("crash", job.SerializeAsString()).ok());
  ASSERT_TRUE(fs::create_directories(partial + "/rank_0"));
  std::ofstream(partial + "/rank_0/checkpoint_0.ckpt.tmp.123") << "half";
  manager_.reset();
  store_.reset();

  opened = OpenSegmentStore(db, store_options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  store_ = std::move(*opened);
  MakeManager();
  StartRunner();
  EXPECT_FALSE(Exists(partial + "/rank_0/checkpoint_0.ckpt.tmp.123"));
  const v1::Job done = WaitDone("crash");
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.reason();
  EXPECT_EQ(done.attempts(), 2);
  EXPECT_FALSE(Exists(partial));
  const Strategy dst = DemoDestinationStrategy();
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    ExpectFileMatches(absl::StrCat(dir, "/rank_", r, "/checkpoint_", r, ".ckpt"),
                      FetchRank("ck", "dst", r), &dst, r);
  }
  // The outcome is durable across another restart.
  runner_.reset();
  manager_.reset();
  store_.reset();
  opened = OpenSegmentStore(db, store_options);
  ASSERT_TRUE(opened.ok()) << opened.status();
  store_ = std::move(*opened);
  const v1::Job stored = StoredJob("crash");
  EXPECT_EQ(stored.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(stored.attempts(), 2);
}

TEST_F(JobRunnerTest, OutputPublishedBeforeACrashCountsAsDone) {
  StartRunner();
  Submit(NewCheckpointRequest("n", "ck5"));
  Submit(ExportRequest("e", tmp_ + "/out"));
  Submit(MergedRequest("m", "ck", tmp_ + "/m.ckpt"));
  for (const char* id : {"n", "e", "m"}) {
    ASSERT_EQ(WaitDone(id).state(), v1::JOB_STATE_SUCCEEDED) << id;
  }
  const std::string merged_before = testing::ReadFileOrDie(tmp_ + "/m.ckpt");
  runner_.reset();
  // The process died after publishing the outputs but before recording SUCCEEDED.
  for (const char* id : {"n", "e", "m"}) {
    v1::Job job = StoredJob(id);
    job.set_state(v1::JOB_STATE_RUNNING);
    job.set_finished_unix(0);
    ASSERT_TRUE(store_->PutJob(id, job.SerializeAsString()).ok());
  }
  StartRunner();
  for (const char* id : {"n", "e", "m"}) {
    const v1::Job job = WaitDone(id);
    EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << id << ": " << job.reason();
    EXPECT_EQ(job.attempts(), 2) << id;
  }
  EXPECT_EQ(testing::ReadFileOrDie(tmp_ + "/m.ckpt"), merged_before);
  // A checkpoint of that id that is not this job's output is not taken for it.
  runner_.reset();
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck5").ok());
  ASSERT_TRUE(UploadRank("ck5", "", nullptr, 0).ok());
  v1::Job job = StoredJob("n");
  job.set_state(v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(store_->PutJob("n", job.SerializeAsString()).ok());
  StartRunner();
  const v1::Job failed = WaitDone("n");
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.reason(), HasSubstr("checkpoint ck5 already exists"));
}

// ------------------------------------------------------------------------------- export root

// Every entry under `dir`, recursively (empty when it holds nothing).
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) out.push_back(e.path().string());
  return out;
}

TEST_F(JobRunnerTest, WithoutAnExportRootFileOutputsAreRefused) {
  no_export_root_ = true;
  StartRunner();
  for (const auto& req : {ExportRequest("e", tmp_ + "/out"), MergedRequest("m", "ck", "m.ckpt")}) {
    const absl::Status s = runner_->Submit(req).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--export-root")) << s;
  }
  EXPECT_TRUE(Entries(tmp_).empty());
  Submit(NewCheckpointRequest("n", "ck2"));  // store-internal output still works
  EXPECT_EQ(WaitDone("n").state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(JobRunnerTest, FileOutputsStayBeneathTheExportRoot) {
  const std::string root = tmp_ + "/root";
  const std::string outside = tmp_ + "/outside";
  ASSERT_TRUE(fs::create_directories(root + "/sub"));
  ASSERT_TRUE(fs::create_directories(outside));
  fs::create_directory_symlink(outside, root + "/abs-link");
  fs::create_directory_symlink("../../outside", root + "/sub/rel-link");
  std::ofstream(root + "/taken.ckpt") << "keep";
  ASSERT_TRUE(fs::create_directory(root + "/taken-dir"));
  JobRunnerOptions options;
  options.export_root = root;
  StartRunner(options);
  using C = absl::StatusCode;
  struct Case {
    std::string path;
    C code;
  };
  const std::vector<Case> cases = {
      {"../x", C::kPermissionDenied},
      {"sub/../../x", C::kPermissionDenied},
      {"/etc/x", C::kPermissionDenied},
      {outside + "/x", C::kPermissionDenied},
      {"abs-link/x", C::kPermissionDenied},
      {"sub/rel-link/x", C::kPermissionDenied},
      {"abs-link/missing/x", C::kPermissionDenied},  // same answer whatever lies outside
      {"taken.ckpt", C::kAlreadyExists},
      {"taken-dir", C::kAlreadyExists},
      {"abs-link", C::kAlreadyExists},  // the symlink itself exists; it is never followed
      {"missing/x", C::kFailedPrecondition},
  };
  for (const Case& c : cases) {
    for (const auto& req : {ExportRequest("e", c.path), MergedRequest("m", "ck", c.path)}) {
      const absl::Status s = runner_->Submit(req).status();
      EXPECT_EQ(s.code(), c.code) << c.path << ": " << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("\"" + c.path + "\"")) << s;
      // The root's location is never named, nor anything outside it the caller did not name.
      if (c.path.find(tmp_) == std::string::npos) {
        EXPECT_THAT(std::string(s.message()), ::testing::Not(HasSubstr(tmp_))) << s;
      }
    }
  }
  // A merged file spelled as a directory, or naming an existing one, never becomes a file.
  for (const std::string& p : {std::string("sub/"), std::string("newdir/"), std::string("sub/.")}) {
    EXPECT_EQ(runner_->Submit(MergedRequest("m", "ck", p)).status().code(), C::kInvalidArgument)
        << p;
  }
  const absl::Status dir_target = runner_->Submit(MergedRequest("m", "ck", "sub")).status();
  EXPECT_EQ(dir_target.code(), C::kAlreadyExists);
  EXPECT_THAT(std::string(dir_target.message()), HasSubstr("as a directory"));
  EXPECT_TRUE(runner_->List().empty());

  // Relative paths and absolute ones beneath the root are written there.
  Submit(ExportRequest("rel", "sub/export"));
  Submit(MergedRequest("abs", "ck", root + "/sub/merged.ckpt"));
  ASSERT_EQ(WaitDone("rel").state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(WaitDone("abs").state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(fs::is_regular_file(root + "/sub/export/rank_1/checkpoint_1.ckpt"));
  EXPECT_TRUE(fs::is_regular_file(root + "/sub/merged.ckpt"));
  EXPECT_EQ(testing::ReadFileOrDie(root + "/taken.ckpt"), "keep");
  EXPECT_TRUE(fs::is_empty(root + "/taken-dir"));
  EXPECT_TRUE(Entries(outside).empty());
}

// The output's parent directory is replaced by a symlink leading out of the root while the job
// runs: the job keeps writing through the descriptor it opened, into the directory as moved.
TEST_F(JobRunnerTest, ParentSwappedForASymlinkDuringTheJobIsNeverFollowed) {
  const std::string root = tmp_ + "/root";
  const std::string outside = tmp_ + "/outside";
  ASSERT_TRUE(fs::create_directories(root + "/sub"));
  ASSERT_TRUE(fs::create_directories(outside));
  JobRunnerOptions options;
  options.export_root = root;
  options.max_bytes_per_second = 4000;  // several seconds
  StartRunner(options);
  Submit(ExportRequest("swap", "sub/out"));
  WaitRunning("swap");
  ASSERT_TRUE(WaitUntil([&] { return Exists(root + "/sub/out.ckptd-partial-swap"); }));
  fs::rename(root + "/sub", root + "/moved");
  fs::create_directory_symlink(outside, root + "/sub");
  const v1::Job job = WaitDone("swap");
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  EXPECT_TRUE(Entries(outside).empty());
  const Strategy dst = DemoDestinationStrategy();
  ExpectFileMatches(root + "/moved/out/rank_2/checkpoint_2.ckpt", FetchRank("ck", "dst", 2), &dst,
                    2);
  // A new job on that path is refused now.
  EXPECT_EQ(runner_->Submit(ExportRequest("again", "sub/out")).status().code(),
            absl::StatusCode::kPermissionDenied);
}

// A symlink planted at the output's own name while the job runs is neither followed nor
// replaced: the job fails, leaving it and its target alone and no partial output.
TEST_F(JobRunnerTest, SymlinkPlantedAtTheOutputDuringTheJobIsNotReplaced) {
  const std::string root = tmp_ + "/root";
  const std::string outside = tmp_ + "/outside";
  ASSERT_TRUE(fs::create_directories(root));
  ASSERT_TRUE(fs::create_directories(outside));
  JobRunnerOptions options;
  options.export_root = root;
  options.max_bytes_per_second = 8000;
  StartRunner(options);
  Submit(MergedRequest("plant", "ck", "merged.ckpt"));
  WaitRunning("plant");
  fs::create_symlink(outside + "/victim.ckpt", root + "/merged.ckpt");
  const v1::Job job = WaitDone("plant");
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(),
              HasSubstr("ALREADY_EXISTS: merged_file \"merged.ckpt\" already exists"));
  EXPECT_THAT(job.reason(), ::testing::Not(HasSubstr(tmp_)));
  EXPECT_TRUE(fs::is_symlink(root + "/merged.ckpt"));
  EXPECT_TRUE(Entries(outside).empty());
  EXPECT_EQ(Entries(root).size(), 1u) << "only the planted symlink";
}

// Outputs are created with the process's umask (not a fixed mode).
TEST_F(JobRunnerTest, FileOutputsFollowTheUmask) {
  const mode_t old_mask = ::umask(027);
  StartRunner();
  Submit(ExportRequest("e", "out"));
  Submit(MergedRequest("m", "ck", "m.ckpt"));
  const v1::Job e = WaitDone("e");
  const v1::Job m = WaitDone("m");
  ::umask(old_mask);
  ASSERT_EQ(e.state(), v1::JOB_STATE_SUCCEEDED) << e.reason();
  ASSERT_EQ(m.state(), v1::JOB_STATE_SUCCEEDED) << m.reason();
  auto mode = [](const std::string& path) {
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  };
  EXPECT_EQ(mode(tmp_ + "/out"), 0750u);
  EXPECT_EQ(mode(tmp_ + "/out/rank_0"), 0750u);
  EXPECT_EQ(mode(tmp_ + "/out/rank_0/checkpoint_0.ckpt"), 0640u);
  EXPECT_EQ(mode(tmp_ + "/m.ckpt"), 0640u);
}

}  // namespace
}  // namespace ckpt
