// Checkpoints of many tiny tensors through a real ckptd: every byte of 20,000 sharded tensors
// (4 source ranks -> 3 destination ranks and merged) and of 100,000 whole tiny tensors comes back
// as uploaded. Correctness only; docs/performance.md (many_tensors) has the timings.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "core/reshard.h"
#include "core/sanitizers.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace ckpt {
namespace {

using testing::ServerProcess;
using testing::TempDir;

constexpr uint64_t kSeed = 1;  // SampleOptions default

// In a sanitizer build (CKPT_SANITIZED) the models hold a tenth of the tensors: the same paths
// run (many batches per stream, every kind of layout), each tensor several times slower; the
// Release build's run covers the counts themselves.
#ifdef CKPT_SANITIZED
constexpr int64_t kCountDivisor = 10;
#else
constexpr int64_t kCountDivisor = 1;
#endif

Layout MakeLayout(int64_t devices, std::vector<std::vector<int32_t>> map) {
  Layout l;
  l.dev_matrix = {devices};
  l.tensor_map = std::move(map);
  return l;
}

// `count` tiny parameters over `devices` devices: row-split [12, 2], column-split [2, 12] and
// replicated [3] Float32 / Float16 / Int32 tensors (12 divides 3, 4 and 6 ways).
struct TinyModel {
  std::vector<SampleTensor> tensors;
  std::map<std::string, size_t> index;
};

TinyModel MakeTinyModel(int64_t count) {
  static constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kInt32};
  TinyModel m;
  for (int64_t i = 0; i < count; ++i) {
    SampleTensor t;
    t.name = absl::StrFormat("layers.%06d.w", i);
    t.dtype = kDTypes[(i / 3) % 3];
    switch (i % 3) {
      case 0:
        t.global_shape = {12, 2};
        break;
      case 1:
        t.global_shape = {2, 12};
        break;
      default:
        t.global_shape = {3};
        break;
    }
    m.index[t.name] = m.tensors.size();
    m.tensors.push_back(std::move(t));
  }
  return m;
}

Strategy TinyStrategy(const TinyModel& m, int64_t devices) {
  std::map<std::string, StrategyParam> params;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    StrategyParam& p = params[m.tensors[i].name];
    switch (i % 3) {
      case 0:
        p.layout = MakeLayout(devices, {{0}, {}});
        break;
      case 1:
        p.layout = MakeLayout(devices, {{}, {0}});
        break;
      default:
        p.layout = MakeLayout(devices, {{}});
        break;
    }
    p.tensor_shape = m.tensors[i].global_shape;
  }
  return *Strategy::Create(std::move(params), 1);
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class ManyTensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data");
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  // Every tensor of `model` arrived exactly once in `got` with the bytes of its slice (the one
  // `dst` gives `rank`, whole when `dst` is null), and nothing else but the sample's two verbatim
  // scalars.
  void ExpectExactly(const std::vector<FetchedTensor>& got, const TinyModel& model,
                     const Strategy* dst, int64_t rank, bool verbatim_scalars) {
    std::vector<bool> seen(model.tensors.size(), false);
    size_t scalars = 0;
    for (const FetchedTensor& f : got) {
      auto it = model.index.find(f.header.name());
      if (it == model.index.end()) {
        ASSERT_TRUE(f.header.verbatim()) << "unexpected tensor " << f.header.name();
        ++scalars;
        continue;
      }
      ASSERT_FALSE(seen[it->second]) << f.header.name() << " delivered twice";
      seen[it->second] = true;
      const SampleTensor& t = model.tensors[it->second];
      const Layout* l = dst ? ResolveLayout(*dst, t.name, true) : nullptr;
      const Box box = l ? *l->SliceBox(t.global_shape, rank % dst->devices_per_stage())
                        : Box::Whole(t.global_shape);
      ASSERT_EQ(f.data, SampleSlice(t.name, t.dtype, t.global_shape, box, kSeed))
          << t.name << " rank " << rank;
    }
    for (size_t i = 0; i < seen.size(); ++i) {
      ASSERT_TRUE(seen[i]) << model.tensors[i].name << " not delivered to rank " << rank;
    }
    EXPECT_EQ(scalars, verbatim_scalars ? 2u : 0u);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
};

TEST_F(ManyTensorsTest, TwentyThousandShardedTinyTensorsRoundTripByteIdentically) {
  const TinyModel model = MakeTinyModel(20000 / kCountDivisor);
  const Strategy src = TinyStrategy(model, 4);
  const Strategy dst = TinyStrategy(model, 3);
  ASSERT_TRUE(WriteShardedSample(src, model.tensors, dir_ / "src", {}).ok());
  ASSERT_TRUE(client_->PutStrategy("src4", src, false).ok());
  ASSERT_TRUE(client_->PutStrategy("dst3", dst, false).ok());

  auto start = std::chrono::steady_clock::now();
  auto up = client_->UploadDirectory("tiny", "src4", dir_ / "src");
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(up->committed);
  std::printf("upload of %zu tensors x 4 ranks: %.2f s\n", model.tensors.size(),
              SecondsSince(start));

  for (int64_t r = 0; r < dst.world_size(); ++r) {
    v1::FetchRequest request;
    request.set_checkpoint_id("tiny");
    request.set_destination_strategy("dst3");
    request.set_rank(r);
    start = std::chrono::steady_clock::now();
    auto got = client_->FetchAll(request);
    ASSERT_TRUE(got.ok()) << got.status();
    std::printf("fetch of rank %lld: %.3f s\n", static_cast<long long>(r), SecondsSince(start));
    ExpectExactly(*got, model, &dst, r, /*verbatim_scalars=*/true);
  }
  v1::FetchRequest merged;
  merged.set_checkpoint_id("tiny");
  merged.set_merged(true);
  auto whole = client_->FetchAll(merged);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ExpectExactly(*whole, model, nullptr, 0, /*verbatim_scalars=*/true);
}

TEST_F(ManyTensorsTest, HundredThousandWholeTinyTensorsRoundTripByteIdentically) {
  const TinyModel model = MakeTinyModel(100000 / kCountDivisor);
  SampleOptions options;
  options.verbatim_scalars = false;
  ASSERT_TRUE(WriteWholeSample(model.tensors, dir_ / "whole.ckpt", options).ok());

  auto start = std::chrono::steady_clock::now();
  auto up = client_->UploadWholeFile("whole", dir_ / "whole.ckpt");
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(up->committed());
  std::printf("upload of %zu whole tensors: %.2f s\n", model.tensors.size(), SecondsSince(start));

  v1::FetchRequest merged;
  merged.set_checkpoint_id("whole");
  merged.set_merged(true);
  start = std::chrono::steady_clock::now();
  auto got = client_->FetchAll(merged);
  ASSERT_TRUE(got.ok()) << got.status();
  std::printf("merged fetch: %.2f s\n", SecondsSince(start));
  ExpectExactly(*got, model, nullptr, 0, /*verbatim_scalars=*/false);
}

}  // namespace
}  // namespace ckpt
