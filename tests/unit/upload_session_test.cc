// The upload session's own records (service/engine/upload_session.h): the manifest it writes at
// commit, checked field by field against what the layouts imply and byte for byte against
// protobuf's own encoding; the strategy's stored forms in it; cells of large grids; and the
// header and slice checks that refuse a rank's upload.
#include "service/engine/upload_session.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt_records.pb.h"
#include "client/ckptctl/sample.h"
#include "core/checksum.h"
#include "core/chunk_grid.h"
#include "core/reshard.h"
#include "core/sanitizers.h"
#include "core/status_macros.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/engine/manager.h"
#include "storage/checkpoint_store.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 11;

class UploadSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.upload.chunk_grid.target_chunk_bytes = 256;
    options_.upload.chunk_grid.min_column_bytes = 16;
    options_.upload.verbatim_dedupe_bytes = 1024;
    store_ = NewMemoryStore();
    manager_ = std::make_unique<CheckpointManager>(store_.get(), options_);
  }

  void PutStrategy(const std::string& name, const Strategy& s, bool overwrite = false) {
    auto info = manager_->PutStrategy(name, SerializeStrategy(s, StrategyFormat::kJson),
                                      v1::STRATEGY_FORMAT_JSON, overwrite);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  absl::StatusOr<std::unique_ptr<RankUpload>> Begin(const std::string& id,
                                                    const std::string& strategy, int64_t rank) {
    v1::UploadHeader h;
    h.set_checkpoint_id(id);
    h.set_source_strategy(strategy);
    h.set_rank(rank);
    h.set_source_file(absl::StrCat("rank_", rank, ".ckpt"));
    return manager_->BeginUpload(h);
  }

  // The slice of `t` that `rank` of `s` holds (the whole tensor when it has no layout), or
  // nullopt when the rank's stage does not hold it.
  static std::optional<Box> SliceOf(const Strategy& s, const SampleTensor& t, int64_t rank) {
    const Layout* l = ResolveLayout(s, t.name, true);
    if (!l) return Box::Whole(t.global_shape);
    const auto stage = static_cast<int32_t>(rank / s.devices_per_stage());
    if (!std::count(l->stages.begin(), l->stages.end(), stage)) return std::nullopt;
    return *l->SliceBox(t.global_shape, rank % s.devices_per_stage());
  }

  static v1::UploadTensorHeader HeaderOf(const SampleTensor& t, const Box& box,
                                         int64_t total_bytes) {
    v1::UploadTensorHeader th;
    th.set_name(t.name);
    th.set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t d : box.shape()) th.add_dims(d);
    th.set_total_bytes(total_bytes);
    return th;
  }

  // Uploads every rank of `s`: odd ranks send their tensors as one batch, even ranks a tensor at
  // a time (in pieces of 37 bytes).
  absl::Status UploadAll(const std::string& id, const std::string& name, const Strategy& s,
                         const std::vector<SampleTensor>& tensors) {
    for (int64_t r = s.world_size() - 1; r >= 0; --r) {
      CKPT_ASSIGN_OR_RETURN(auto upload, Begin(id, name, r));
      std::vector<v1::UploadTensorHeader> headers;
      std::vector<std::string> bytes;
      for (const SampleTensor& t : tensors) {
        const std::optional<Box> box = SliceOf(s, t, r);
        if (!box) continue;
        bytes.push_back(SampleSlice(t.name, t.dtype, t.global_shape, *box, kSeed));
        headers.push_back(HeaderOf(t, *box, static_cast<int64_t>(bytes.back().size())));
      }
      if (r % 2 == 1) {
        std::vector<BatchTensor> batch;
        for (size_t i = 0; i < headers.size(); ++i) batch.push_back({&headers[i], bytes[i]});
        CKPT_RETURN_IF_ERROR(upload->AddBatch(batch));
      } else {
        for (size_t i = 0; i < headers.size(); ++i) {
          CKPT_RETURN_IF_ERROR(upload->StartTensor(headers[i]));
          for (size_t pos = 0; pos < bytes[i].size(); pos += 37) {
            CKPT_RETURN_IF_ERROR(upload->Append(std::string_view(bytes[i]).substr(pos, 37)));
          }
        }
      }
      CKPT_RETURN_IF_ERROR(upload->Finish().status());
      manager_->OnUploadFinished(id);
    }
    return absl::OkStatus();
  }

  // The stored manifest of `id`, which must be exactly protobuf's own encoding of itself.
  records::CheckpointManifest Manifest(const std::string& id) {
    auto bytes = store_->GetManifest(id);
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    records::CheckpointManifest m;
    EXPECT_TRUE(bytes.ok() && m.ParseFromString(*bytes));
    EXPECT_TRUE(bytes.ok() && m.SerializeAsString() == *bytes)
        << "the manifest's bytes differ from protobuf's encoding of the same record";
    return m;
  }

  ManagerOptions options_;
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<CheckpointManager> manager_;
};

// The demo tensors (row, column, 2-D, optimizer-sharded, replicated and inherited layouts over two
// pipeline stages) and verbatim values: a scalar, a chunked table and an empty tensor.
std::vector<SampleTensor> Tensors() {
  std::vector<SampleTensor> tensors = DemoTensors();
  tensors.push_back({"step", DType::kFloat32, {}});
  tensors.push_back({"table", DType::kFloat16, {24, 20}});
  tensors.push_back({"empty", DType::kFloat16, {3, 0}});
  return tensors;
}

TEST_F(UploadSessionTest, ManifestRecordsEverySliceAsTheLayoutsImply) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  const std::vector<SampleTensor> tensors = Tensors();
  ASSERT_TRUE(UploadAll("ck", "src", src, tensors).ok());
  const records::CheckpointManifest m = Manifest("ck");
  EXPECT_EQ(m.id(), "ck");
  EXPECT_EQ(m.strategy_name(), "src");
  EXPECT_EQ(m.world_size(), src.world_size());
  EXPECT_EQ(m.chunk_checksum(), records::CHUNK_CHECKSUM_XXH3_64);
  ASSERT_EQ(m.source_files_size(), src.world_size());
  for (int64_t r = 0; r < src.world_size(); ++r) {
    EXPECT_EQ(m.source_files(static_cast<int>(r)), absl::StrCat("rank_", r, ".ckpt"));
  }
  // In rank 0's order, then the tensors rank 0 does not hold (stage 1's), in rank 4's order.
  std::vector<std::string> order;
  for (const records::TensorRecord& t : m.tensors()) order.push_back(t.name());
  std::vector<std::string> expected_order;
  for (int64_t r : {0, 4}) {
    for (const SampleTensor& t : tensors) {
      if (SliceOf(src, t, r) &&
          std::find(expected_order.begin(), expected_order.end(), t.name) == expected_order.end()) {
        expected_order.push_back(t.name);
      }
    }
  }
  EXPECT_EQ(order, expected_order);

  std::set<uint32_t> tensor_indexes;
  for (const records::TensorRecord& rec : m.tensors()) {
    SCOPED_TRACE(rec.name());
    auto t = std::find_if(tensors.begin(), tensors.end(),
                          [&](const SampleTensor& x) { return x.name == rec.name(); });
    ASSERT_NE(t, tensors.end());
    EXPECT_TRUE(tensor_indexes.insert(rec.tensor_index()).second);
    EXPECT_EQ(rec.dtype(), DTypeName(t->dtype));
    EXPECT_EQ(Shape(rec.global_shape().begin(), rec.global_shape().end()), t->global_shape);
    const Layout* layout = ResolveLayout(src, t->name, true);
    EXPECT_EQ(rec.sharded(), layout != nullptr);
    // Every distinct slice once, by cell; its holders are the ranks whose slice it is.
    std::map<Box, std::vector<int64_t>> holders;
    for (int64_t r = 0; r < src.world_size(); ++r) {
      if (auto box = SliceOf(src, *t, r)) holders[*box].push_back(r);
    }
    ASSERT_EQ(static_cast<size_t>(rec.blobs_size()), holders.size());
    int64_t previous_cell = -1;
    for (const records::BlobRecord& b : rec.blobs()) {
      const Box box{{b.box_lo().begin(), b.box_lo().end()}, {b.box_hi().begin(), b.box_hi().end()}};
      SCOPED_TRACE(box.ToString());
      ASSERT_TRUE(holders.contains(box));
      EXPECT_EQ(std::vector<int64_t>(b.holders().begin(), b.holders().end()), holders[box]);
      EXPECT_GT(b.cell(), previous_cell);
      previous_cell = b.cell();
      EXPECT_EQ(b.blob_index(), static_cast<uint32_t>(b.cell()));
      const std::string bytes = SampleSlice(t->name, t->dtype, t->global_shape, box, kSeed);
      EXPECT_EQ(b.total_bytes(), static_cast<int64_t>(bytes.size()));
      if (bytes.empty()) {
        EXPECT_TRUE(b.tile().empty());
        EXPECT_TRUE(b.chunk_checksums().empty());
        continue;
      }
      auto grid = ChunkGrid::Make(box.shape(), ElementBits(t->dtype), options_.upload.chunk_grid);
      ASSERT_TRUE(grid.ok()) << grid.status();
      EXPECT_EQ(Shape(b.tile().begin(), b.tile().end()), grid->tile());
      ASSERT_EQ(b.chunk_checksums_size(), grid->chunk_count());
      if (grid->chunk_count() == 1) {
        EXPECT_EQ(b.chunk_checksums(0), Checksum(bytes));
      }
    }
  }
  EXPECT_EQ(tensor_indexes.size(), tensors.size());
}

TEST_F(UploadSessionTest, ManifestsCarryTheStrategysStoredForm) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  const std::vector<SampleTensor> tensors = DemoTensors();
  for (const std::string id : {"a", "b"}) {
    ASSERT_TRUE(UploadAll(id, "src", src, tensors).ok()) << id;
    const records::CheckpointManifest m = Manifest(id);
    EXPECT_TRUE(m.strategy_json().empty()) << id;
    EXPECT_EQ(m.strategy_binary(), SerializeStrategy(src, StrategyFormat::kBinary)) << id;
  }
  // The same name registered again with another layout: the next checkpoint carries the new one.
  std::map<std::string, StrategyParam> params = src.params();
  params["layers.0.norm.gamma"].layout.tensor_map = {{0}};
  const Strategy changed = *Strategy::Create(std::move(params), src.stage_count());
  PutStrategy("src", changed, /*overwrite=*/true);
  ASSERT_TRUE(UploadAll("c", "src", changed, tensors).ok());
  const records::CheckpointManifest m = Manifest("c");
  EXPECT_TRUE(m.strategy_json().empty());
  EXPECT_EQ(m.strategy_binary(), SerializeStrategy(changed, StrategyFormat::kBinary));
}

TEST_F(UploadSessionTest, CellsOfALargeGridAreFoundReleasedAndClaimedAgain) {
  // 300 cells: more than PendingCheckpoint's dense table takes (256), so cells are found
  // through its map.
  constexpr int64_t kRanks = 300;
  Layout l;
  l.dev_matrix = {kRanks};
  l.tensor_map = {{0}, {}};
  std::map<std::string, StrategyParam> params;
  params["w"].layout = l;
  const Strategy s = *Strategy::Create(params, 1);
  PutStrategy("wide", s);
  const SampleTensor w{"w", DType::kFloat32, {2 * kRanks, 3}};
  // Rank 7 claims its cell and drops before its bytes are complete: the claim goes with it.
  {
    auto upload = Begin("ck", "wide", 7);
    ASSERT_TRUE(upload.ok()) << upload.status();
    const Box box = *SliceOf(s, w, 7);
    ASSERT_TRUE((*upload)->StartTensor(HeaderOf(w, box, 24)).ok());
    ASSERT_TRUE((*upload)->Append("partial").ok());
  }
  ASSERT_TRUE(UploadAll("ck", "wide", s, {w}).ok());
  const records::CheckpointManifest m = Manifest("ck");
  ASSERT_EQ(m.tensors_size(), 1);
  ASSERT_EQ(m.tensors(0).blobs_size(), kRanks);
  for (int64_t r = 0; r < kRanks; ++r) {
    const records::BlobRecord& b = m.tensors(0).blobs(static_cast<int>(r));
    EXPECT_EQ(b.cell(), r);
    EXPECT_THAT(b.box_lo(), ::testing::ElementsAre(2 * r, 0));
    EXPECT_THAT(b.holders(), ::testing::ElementsAre(r));
  }
}

// A checkpoint of many slices leaves the heap memory its records used marked for release, and it
// is released once no upload is in progress (ckptd's maintenance calls ReleaseFreedUploadMemory),
// not while another upload may reuse it.
TEST_F(UploadSessionTest, FreedRecordsOfManySlicesAreReleasedOnceNoUploadIsInProgress) {
#ifdef CKPT_SANITIZED
  GTEST_SKIP() << "glibc's malloc is replaced by the sanitizer's allocator in this build";
#endif
  options_.upload_idle_timeout = absl::ZeroDuration();  // ExpireIdleUploads drops idle uploads
  manager_ = std::make_unique<CheckpointManager>(store_.get(), options_);
  constexpr int64_t kRanks = 8;
  Layout l;
  l.dev_matrix = {kRanks};
  l.tensor_map = {{0}, {}};
  std::map<std::string, StrategyParam> params;
  std::vector<SampleTensor> tensors;
  for (int64_t i = 0; i <= PendingCheckpoint::kTrimAfterSlices / kRanks; ++i) {
    tensors.push_back({absl::StrCat("t", i), DType::kFloat32, {kRanks, 4}});
    params[tensors.back().name].layout = l;
  }
  const Strategy s = *Strategy::Create(params, 1);
  PutStrategy("many", s);
  (void)manager_->ReleaseFreedUploadMemory();  // a mark left by an earlier test
  EXPECT_FALSE(manager_->ReleaseFreedUploadMemory()) << "released with nothing marked";

  auto other = Begin("other", "many", 0);  // in progress while "ck" is uploaded and committed
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(UploadAll("ck", "many", s, tensors).ok());
  EXPECT_EQ(Manifest("ck").tensors_size(), static_cast<int>(tensors.size()));
  EXPECT_FALSE(manager_->ReleaseFreedUploadMemory()) << "released while an upload was in progress";
  other->reset();
  EXPECT_EQ(manager_->ExpireIdleUploads(), 1);
  EXPECT_TRUE(manager_->ReleaseFreedUploadMemory()) << "the freed records were not released";
  EXPECT_FALSE(manager_->ReleaseFreedUploadMemory()) << "released twice for one mark";
}

TEST_F(UploadSessionTest, RefusedHeadersAndSlicesGetClearErrors) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  const SampleTensor emb = DemoTensors()[0];
  const Box box = *SliceOf(src, emb, 0);
  const std::string bytes = SampleSlice(emb.name, emb.dtype, emb.global_shape, box, kSeed);
  const v1::UploadTensorHeader h = HeaderOf(emb, box, static_cast<int64_t>(bytes.size()));
  auto expect_refused = [&](const absl::Status& s, const std::string& text) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text));
  };
  {
    // The same tensor twice in a rank's stream.
    auto u = Begin("ck", "src", 0);
    ASSERT_TRUE(u.ok());
    ASSERT_TRUE((*u)->StartTensor(h).ok());
    ASSERT_TRUE((*u)->Append(bytes).ok());
    expect_refused((*u)->StartTensor(h), "checkpoint ck rank 0: tensor " + emb.name +
                                             " appears twice in the rank's file");
  }
  {
    // ... and twice in one batch.
    auto u = Begin("ck", "src", 0);
    ASSERT_TRUE(u.ok());
    expect_refused((*u)->AddBatch({{&h, bytes}, {&h, bytes}}), "appears twice in the rank's file");
  }
  {
    // A str value under a layout.
    auto u = Begin("ck", "src", 0);
    ASSERT_TRUE(u.ok());
    v1::UploadTensorHeader str;
    str.set_name(emb.name);
    str.set_dtype("str");
    str.set_total_bytes(8);
    expect_refused((*u)->StartTensor(str),
                   "str tensor " + emb.name + " cannot have a layout in the strategy");
  }
  {
    // A name that is not printable UTF-8 is refused before anything else is looked at (each on
    // an upload of its own: a refused message fails its upload).
    v1::UploadTensorHeader bad = h;
    bad.set_dtype("NoSuchType");
    for (const auto& [name, text] :
         {std::pair<std::string, std::string>{"w\x01", "the control character U+0001"},
          {"w\xff", "not valid UTF-8"},
          // printable UTF-8 beyond ASCII: the dtype is what is refused
          {"caf\xc3\xa9", "unknown tensor_type \"NoSuchType\""}}) {
      auto u = Begin("ck", "src", 0);
      ASSERT_TRUE(u.ok());
      bad.set_name(name);
      expect_refused((*u)->StartTensor(bad), text);
    }
  }
}

}  // namespace
}  // namespace ckpt
