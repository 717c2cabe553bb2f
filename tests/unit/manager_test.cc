// CheckpointManager's uploads and what it stores (fixture: manager_fixture.h): batches, retries,
// refused and divergent uploads, verbatim values, stored manifests and strategies, summaries.
#include "service/engine/manager.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt_records.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/unit/manager_fixture.h"

namespace ckpt::manager_test {
namespace {

using ::testing::HasSubstr;

// Ranks sent as batches of whole tensors: the slices a rank writes are stored in one PutChunks at
// the batch's end (verbatim values at once), and every byte comes back.
TEST_F(ManagerTest, BatchedRanksStoreTheirSlicesTogetherAndEveryByteComesBack) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  batched_ = true;
  int puts = 0;
  size_t largest = 0;
  corrupting_->OnPutChunks([&](const std::vector<ChunkWrite>& writes) {
    ++puts;
    largest = std::max(largest, writes.size());
  });
  ASSERT_TRUE(UploadRank("ck", "src", &src, 0, DemoTensors()).ok());
  // Rank 0's sharded slices in one put, and one put per verbatim value.
  int verbatim = 0;
  for (const SampleTensor& t : DemoTensors()) {
    if (ResolveLayout(src, t.name, true) == nullptr) ++verbatim;
  }
  EXPECT_EQ(puts, 1 + verbatim);
  EXPECT_GT(largest, 1u);
  corrupting_->OnPutChunks(nullptr);
  for (int64_t r = 1; r < src.world_size(); ++r) {
    ASSERT_TRUE(UploadRank("ck", "src", &src, r, DemoTensors()).ok()) << "rank " << r;
  }
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  }
}

// A slice cut into several column tiles per band of rows is written a group of bands at a time,
// column tile by column tile (at most UploadOptions::column_group_bytes of bands in a group, a
// band larger than that alone; 0: band by band), so that the tiles of one column band lie
// together in the segment file; every chunk is written once, and every rank of row and column
// re-splits gets its bytes. (The recording store below puts reserved chunks with PutChunks at
// their commit, in the order reserved.)
TEST_F(ManagerTest, ColumnTilesOfASliceAreWrittenTogether) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  for (const int64_t group_bytes : {int64_t{8} << 20, int64_t{700}, int64_t{0}}) {
    SCOPED_TRACE(absl::StrCat("group bytes ", group_bytes));
    ManagerOptions options = SmallOptions();
    options.upload.column_group_bytes = group_bytes;
    Restart(options);
    PutStrategy("src", src);
    PutStrategy("dst", dst);
    struct Put {
      std::vector<uint32_t> chunks;
      int64_t bytes = 0;
    };
    std::map<std::pair<uint32_t, uint32_t>, std::vector<Put>> puts;  // by (tensor, blob)
    std::mutex mu;
    corrupting_->OnPutChunks([&](const std::vector<ChunkWrite>& writes) {
      std::lock_guard<std::mutex> lock(mu);
      std::map<std::pair<uint32_t, uint32_t>, Put> of_call;
      for (const ChunkWrite& w : writes) {
        Put& p = of_call[{w.address.tensor, w.address.blob}];
        p.chunks.push_back(w.address.chunk);
        p.bytes += static_cast<int64_t>(w.bytes.size());
      }
      for (auto& [blob, p] : of_call) puts[blob].push_back(std::move(p));
    });
    UploadAll("ck", "src", src, DemoTensors());
    corrupting_->OnPutChunks(nullptr);
    auto bytes = store_->GetManifest("ck");
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    records::CheckpointManifest m;
    ASSERT_TRUE(m.ParseFromString(*bytes));
    int grouped = 0;  // slices of several bands of several column tiles
    int split = 0;    // of them, written in more than one group
    for (const records::TensorRecord& t : m.tensors()) {
      for (const records::BlobRecord& b : t.blobs()) {
        if (b.tile_size() < 2) continue;
        const int64_t rows = b.box_hi(0) - b.box_lo(0);
        const int64_t cols = b.box_hi(b.box_hi_size() - 1) - b.box_lo(b.box_lo_size() - 1);
        const int64_t bands = (rows + b.tile(0) - 1) / b.tile(0);
        const int64_t per_band = (cols + b.tile(b.tile_size() - 1) - 1) / b.tile(b.tile_size() - 1);
        if (bands < 2 || per_band < 2) continue;
        SCOPED_TRACE(absl::StrCat(t.name(), " blob ", b.blob_index()));
        ++grouped;
        const std::vector<Put>& written = puts[{t.tensor_index(), b.blob_index()}];
        ASSERT_FALSE(written.empty());
        if (written.size() > 1) ++split;
        int64_t next_band = 0;
        for (const Put& p : written) {
          // Bands [first, first + n), column tile by column tile.
          const auto n = static_cast<int64_t>(p.chunks.size()) / per_band;
          ASSERT_EQ(n * per_band, static_cast<int64_t>(p.chunks.size()));
          std::vector<uint32_t> expected;
          for (int64_t k = 0; k < per_band; ++k) {
            for (int64_t band = next_band; band < next_band + n; ++band) {
              expected.push_back(static_cast<uint32_t>(band * per_band + k));
            }
          }
          EXPECT_EQ(p.chunks, expected);
          EXPECT_TRUE(n == 1 || p.bytes <= group_bytes) << p.bytes << " bytes in " << n << " bands";
          if (group_bytes == 0) {
            EXPECT_EQ(n, 1) << "band by band";
          }
          next_band += n;
        }
        EXPECT_EQ(next_band, bands);
      }
    }
    EXPECT_GT(grouped, 0);
    if (group_bytes > (int64_t{1} << 20)) {
      EXPECT_EQ(split, 0) << "a slice of a few KiB is one group";
    } else {
      EXPECT_GT(split, 0) << "no slice exceeded " << group_bytes << " bytes";
    }
    for (int64_t r = 0; r < dst.world_size(); ++r) {
      ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
    }
    for (int64_t r = 0; r < src.world_size(); ++r) {
      ExpectRankMatches("ck", "src", src, r, DemoTensors());
    }
  }
}

// A batch whose store write fails leaves its slices unclaimed: the rank's retry writes them (a
// slice marked complete without its bytes would make the retry only verify it).
TEST_F(ManagerTest, FailedBatchWriteLeavesItsSlicesToTheRetry) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  batched_ = true;
  corrupting_->FailPuts(true);
  const absl::Status failed = UploadRank("ck", "src", &src, 0, DemoTensors());
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  corrupting_->FailPuts(false);
  for (int64_t r = 0; r < src.world_size(); ++r) {
    ASSERT_TRUE(UploadRank("ck", "src", &src, r, DemoTensors()).ok()) << "rank " << r;
  }
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  }
}

TEST_F(ManagerTest, BatchEndingInsideATensorIsRefused) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  auto u = manager_->BeginUpload(Header("ck", "src", 7));
  ASSERT_TRUE(u.ok());
  (*u)->BeginBatch();
  v1::UploadTensorHeader th;
  th.set_name(DemoTensors()[0].name);
  th.set_dtype("Float32");
  th.add_dims(48);  // rank 7 holds rows 48-96 of the [96, 24] embedding
  th.add_dims(24);
  th.set_total_bytes(48 * 24 * 4);
  ASSERT_TRUE((*u)->StartTensor(th).ok());
  ASSERT_TRUE((*u)->Append(std::string(100, 'x')).ok());
  const absl::Status s = (*u)->EndBatch();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("incomplete at the end of a batch"));
}

// A refused message fails its upload: every later message and Finish are FAILED_PRECONDITION
// naming the first refusal (the refused batch's collected writes, views of its bytes, are dropped
// with it), nothing of it is stored, and the rank can be sent again once the upload is dropped.
TEST_F(ManagerTest, RefusedMessageFailsItsUpload) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  const SampleTensor embedding = DemoTensors()[0];
  v1::UploadTensorHeader th;
  th.set_name(embedding.name);
  th.set_dtype("Float32");
  th.add_dims(48);  // rank 7 holds rows 48-96 of the [96, 24] embedding
  th.add_dims(24);
  th.set_total_bytes(48 * 24 * 4);
  const std::string bytes = SampleSlice(
      embedding.name, embedding.dtype, embedding.global_shape,
      *ResolveLayout(src, embedding.name, true)->SliceBox(embedding.global_shape, 3), kSeed);
  ASSERT_EQ(bytes.size(), 48u * 24 * 4);
  {
    // A batch whose write fails (a full disk), then the same bytes again on the same upload.
    auto u = manager_->BeginUpload(Header("ck", "src", 7));
    ASSERT_TRUE(u.ok()) << u.status();
    corrupting_->FailPuts(true);
    const absl::Status failed = (*u)->AddBatch({{&th, bytes}});
    EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
    corrupting_->FailPuts(false);
    for (const absl::Status& s : {(*u)->AddBatch({{&th, bytes}}), (*u)->StartTensor(th),
                                  (*u)->Append(bytes), (*u)->EndBatch(), (*u)->Finish().status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr("checkpoint ck rank 7: the upload failed at an earlier message "
                            "(injected: disk full)"));
    }
  }
  {
    // More bytes than announced, then the rest of the stream.
    auto u = manager_->BeginUpload(Header("ck", "src", 7));
    ASSERT_TRUE(u.ok()) << u.status();
    ASSERT_TRUE((*u)->StartTensor(th).ok());
    EXPECT_EQ((*u)->Append(bytes + "x").code(), absl::StatusCode::kInvalidArgument);
    const absl::Status s = (*u)->Append(bytes);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("sends more than the announced 4608 bytes"));
    EXPECT_EQ((*u)->Finish().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_FALSE(store_->GetManifest("ck").ok());
  UploadAll("ck", "src", src, DemoTensors());
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    SCOPED_TRACE(r);
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  }
}

// New uploads record their chunk checksums as XXH3-64. A manifest recording anything else (no
// algorithm, as a manifest without the field reads, or one this version does not define) is
// refused with FAILED_PRECONDITION naming the checkpoint and the value, for fetches, describe and
// list alike, never served.
TEST_F(ManagerTest, CheckpointsRecordingAnotherChecksumAlgorithmAreRefused) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  {
    auto bytes = store_->GetManifest("ck");
    ASSERT_TRUE(bytes.ok());
    records::CheckpointManifest m;
    ASSERT_TRUE(m.ParseFromString(*bytes));
    EXPECT_EQ(m.chunk_checksum(), records::CHUNK_CHECKSUM_XXH3_64) << "new uploads record xxh3";
  }
  for (const auto& [id, value, text] :
       {std::tuple{"none", 0, "chunk checksum algorithm 0 (CHUNK_CHECKSUM_UNSPECIFIED)"},
        std::tuple{"other", 9, "chunk checksum algorithm 9 (unknown)"}}) {
    SCOPED_TRACE(id);
    ASSERT_NO_FATAL_FAILURE(StoreCopy("ck", id, static_cast<records::ChunkChecksum>(value)));
    v1::FetchRequest req;
    req.set_checkpoint_id(id);
    req.set_destination_strategy("dst");
    auto stream = manager_->OpenFetch(req);
    ASSERT_EQ(stream.status().code(), absl::StatusCode::kFailedPrecondition) << stream.status();
    EXPECT_THAT(std::string(stream.status().message()),
                AllOf(HasSubstr(absl::StrCat("checkpoint ", id, ": its manifest records ", text)),
                      HasSubstr("verifies chunks with XXH3-64 only (1)")));
    auto described = manager_->DescribeCheckpoint(id);
    EXPECT_EQ(described.status().code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(manager_->DeleteCheckpoint(id).ok());
  }
  // The original is served as ever.
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    SCOPED_TRACE(r);
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  }
}

// Strategies are stored in MindSpore's binary form alone. A record with the JSON form alone (as
// stores first written in format 1 may hold them) loads as ever; a damaged binary form is
// DATA_LOSS naming it.
TEST_F(ManagerTest, StoredStrategiesLoadFromEitherForm) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  auto record_bytes = store_->GetStrategy("dst");
  ASSERT_TRUE(record_bytes.ok()) << record_bytes.status();
  records::StrategyRecord record;
  ASSERT_TRUE(record.ParseFromString(*record_bytes));
  EXPECT_TRUE(record.strategy_json().empty());
  EXPECT_EQ(record.strategy_binary(), SerializeStrategy(dst, StrategyFormat::kBinary));
  auto manifest_bytes = store_->GetManifest("ck");
  ASSERT_TRUE(manifest_bytes.ok()) << manifest_bytes.status();
  records::CheckpointManifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(*manifest_bytes));
  EXPECT_TRUE(manifest.strategy_json().empty());
  EXPECT_EQ(manifest.strategy_binary(), SerializeStrategy(src, StrategyFormat::kBinary));

  record.set_strategy_json(SerializeStrategy(dst, StrategyFormat::kJson));
  record.clear_strategy_binary();
  ASSERT_TRUE(store_->PutStrategy("dst", record.SerializeAsString(), /*overwrite=*/true).ok());
  ASSERT_NO_FATAL_FAILURE(StoreCopy("ck", "json_only", [&src](records::CheckpointManifest* m) {
    m->set_strategy_json(SerializeStrategy(src, StrategyFormat::kJson));
    m->clear_strategy_binary();
  }));
  ASSERT_NO_FATAL_FAILURE(StoreCopy("ck", "damaged", [](records::CheckpointManifest* m) {
    m->set_strategy_binary(std::string("\xff\xff\xff", 3));
  }));
  // A new manager on the same store has nothing cached: every strategy comes from its record.
  manager_.reset();
  manager_ = std::make_unique<CheckpointManager>(store_.get(), SmallOptions());
  for (const char* id : {"ck", "json_only"}) {
    for (int64_t r = 0; r < dst.world_size(); ++r) {
      SCOPED_TRACE(absl::StrCat(id, " rank ", r));
      ExpectRankMatches(id, "dst", dst, r, DemoTensors());
    }
  }
  v1::FetchRequest req;
  req.set_checkpoint_id("damaged");
  req.set_destination_strategy("dst");
  auto stream = manager_->OpenFetch(req);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kDataLoss) << stream.status();
  EXPECT_THAT(std::string(stream.status().message()),
              HasSubstr("checkpoint damaged: its binary strategy does not parse"));
}

TEST_F(ManagerTest, IncompleteUploadIsInvisibleAndRetryable) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  for (int64_t r = 0; r < 7; ++r) ASSERT_TRUE(UploadRank("ck", "src", &src, r, DemoTensors()).ok());
  EXPECT_TRUE(manager_->ListCheckpoints()->empty());
  v1::FetchRequest req;
  req.set_checkpoint_id("ck");
  req.set_merged(true);
  EXPECT_EQ(manager_->OpenFetch(req).status().code(), absl::StatusCode::kNotFound);
  // Rank 7 dies mid-tensor: still invisible, and the rank can be sent again.
  {
    const v1::UploadHeader h = Header("ck", "src", 7);
    auto u = manager_->BeginUpload(h);
    ASSERT_TRUE(u.ok());
    v1::UploadTensorHeader th;
    th.set_name(DemoTensors()[0].name);
    th.set_dtype("Float32");
    th.add_dims(48);  // rank 7 holds rows 48-96 of the [96, 24] embedding
    th.add_dims(24);
    th.set_total_bytes(48 * 24 * 4);
    ASSERT_TRUE((*u)->StartTensor(th).ok());
    ASSERT_TRUE((*u)->Append(std::string(100, 'x')).ok());
  }  // destroyed unfinished
  EXPECT_TRUE(manager_->ListCheckpoints()->empty());
  ASSERT_TRUE(UploadRank("ck", "src", &src, 7, DemoTensors()).ok());
  EXPECT_EQ(manager_->ListCheckpoints()->size(), 1u);
  ExpectRankMatches("ck", "src", src, 5, DemoTensors());
}

// A client that retries at once after its connection dropped may send the rank's header before
// the server has finished dropping the old stream: the new stream waits for the old one to end.
TEST_F(ManagerTest, RankHeldByAnEndingStreamIsReleasedToTheRetry) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  ASSERT_TRUE(UploadRank("ck", "src", &src, 0, DemoTensors()).ok());  // creates the pending upload
  const v1::UploadHeader h = Header("ck", "src", 1);
  auto first = manager_->BeginUpload(h);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::Status other_rank;
  std::thread dropper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // The waiting retry must not hold up the rest of the manager: another rank uploads meanwhile.
    other_rank = UploadRank("ck", "src", &src, 2, DemoTensors());
    first->reset();  // the dropped stream's clean-up
  });
  auto retry = manager_->BeginUpload(h);
  dropper.join();
  ASSERT_TRUE(other_rank.ok()) << other_rank;
  ASSERT_TRUE(retry.ok()) << retry.status();
  retry->reset();
  ASSERT_TRUE(UploadRank("ck", "src", &src, 1, DemoTensors()).ok());
}

TEST_F(ManagerTest, RankStillUploadingElsewhereIsRefusedAfterAWait) {
  ManagerOptions options = SmallOptions();
  options.upload.rank_release_wait = absl::Milliseconds(50);
  Restart(options);
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  const v1::UploadHeader h = Header("ck", "src", 3);
  auto first = manager_->BeginUpload(h);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = manager_->BeginUpload(h);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("rank 3 of checkpoint ck is being uploaded by another stream"));
  // The first stream is unaffected and the rank is free once it ends.
  first->reset();
  EXPECT_TRUE(UploadRank("ck", "src", &src, 3, DemoTensors()).ok());
}

TEST_F(ManagerTest, BadUploadsGetClearErrors) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  auto tensors = DemoTensors();
  // Rank out of range.
  auto s = UploadRank("ck", "src", &src, 8, tensors);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  // Unknown strategy.
  s = UploadRank("ck2", "nope", &src, 0, tensors);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  // A rank that misses a parameter of its stage.
  std::vector<SampleTensor> fewer(tensors.begin() + 1, tensors.end());
  s = UploadRank("ck", "src", &src, 0, fewer);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("did not send parameter"));
  ASSERT_TRUE(UploadRank("ck", "src", &src, 0, tensors).ok());
  // A local shape implying another global shape than rank 0's.
  auto wrong = tensors;
  wrong[1].global_shape = {44, 24};
  s = UploadRank("ck", "src", &src, 1, wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("earlier ranks imply global shape [48, 24]"));
  // A dtype differing from rank 0's.
  wrong = tensors;
  wrong[1].dtype = DType::kFloat32;
  s = UploadRank("ck", "src", &src, 1, wrong);
  EXPECT_THAT(std::string(s.message()), HasSubstr("dtype Float32 but earlier ranks sent BFloat16"));
  // A rank sending a parameter of another pipeline stage.
  std::vector<SampleTensor> other_stage = tensors;
  s = UploadRank("ck", "src", &src, 1, other_stage);  // rank 1 is fine: stage 0
  ASSERT_TRUE(s.ok()) << s;
  const v1::UploadHeader h = Header("ck", "src", 0);
  EXPECT_EQ(manager_->BeginUpload(h).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(manager_->ListCheckpoints()->empty());
}

TEST_F(ManagerTest, DivergentReplicasAreRejected) {
  // dev [2,2], map [0,-1]: ranks 0 and 2 hold the same rows.
  Layout l;
  l.dev_matrix = {2, 2};
  l.tensor_map = {{0}, {}};
  std::map<std::string, StrategyParam> params;
  params["w"].layout = l;
  const Strategy s = *Strategy::Create(params, 1);
  PutStrategy("s", s);
  std::vector<SampleTensor> t = {{"w", DType::kFloat32, {4, 4}}};
  ASSERT_TRUE(UploadRank("ck", "s", &s, 0, t).ok());
  // Rank 2 uploads a different tensor under the same name: its slice differs from rank 0's.
  const v1::UploadHeader h = Header("ck", "s", 2);
  auto u = manager_->BeginUpload(h);
  ASSERT_TRUE(u.ok());
  v1::UploadTensorHeader th;
  th.set_name("w");
  th.set_dtype("Float32");
  th.add_dims(2);
  th.add_dims(4);
  th.set_total_bytes(32);
  ASSERT_TRUE((*u)->StartTensor(th).ok());
  ASSERT_TRUE((*u)->Append(std::string(32, '\x7')).ok());
  auto r = (*u)->Finish();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("differs from rank 0"));
}

TEST_F(ManagerTest, ZeroElementVerbatimTensorsRoundTrip) {
  // A verbatim tensor without elements next to sharded ones (used to divide by zero).
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  auto tensors = DemoTensors();
  tensors.push_back({"empty", DType::kFloat16, {3, 0}});
  for (int64_t r = 0; r < src.world_size(); ++r) {
    ASSERT_TRUE(UploadRank("ck", "src", &src, r, tensors).ok()) << r;
  }
  v1::FetchRequest req;
  req.set_checkpoint_id("ck");
  req.set_destination_strategy("dst");
  req.set_rank(2);
  auto got = Fetch(req);
  ASSERT_TRUE(got.ok()) << got.status();
  auto it = std::find_if(got->tensors.begin(), got->tensors.end(),
                         [](const auto& p) { return p.first.name() == "empty"; });
  ASSERT_NE(it, got->tensors.end());
  EXPECT_TRUE(it->first.verbatim());
  EXPECT_EQ(it->first.total_bytes(), 0);
  EXPECT_THAT(it->first.local_shape(), ::testing::ElementsAre(3, 0));
  EXPECT_TRUE(it->second.empty());
  req.set_merged(true);
  EXPECT_TRUE(Fetch(req).ok());
}

TEST_F(ManagerTest, SmallVerbatimValuesAreStoredOncePerDistinctValue) {
  // Values of at most verbatim_dedupe_bytes (1024 here) that every rank sends are stored once;
  // a rank whose value differs gets a variant of its own. "table" spans several bands and column
  // tiles of its chunk grid (256-byte chunks), so the comparison covers chunked values.
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  std::vector<int64_t> demo_bytes;
  for (int64_t r = 0; r < src.world_size(); ++r) {
    ASSERT_TRUE(UploadRank("plain", "src", &src, r, DemoTensors()).ok()) << r;
    demo_bytes.push_back(last_response_.bytes_stored());
  }
  auto tensors = DemoTensors();
  tensors.push_back({"step", DType::kFloat32, {10}});       // 40 bytes, one chunk
  tensors.push_back({"table", DType::kFloat16, {24, 20}});  // 960 bytes, 4 chunks
  constexpr int64_t kDivergent = 5;
  for (int64_t r = 0; r < src.world_size(); ++r) {
    ASSERT_TRUE(
        UploadRank("ck", "src", &src, r, tensors, 37, r == kDivergent ? kSeed + 1 : kSeed).ok())
        << r;
    const int64_t extra = r == 0 || r == kDivergent ? 40 + 960 : 0;
    EXPECT_EQ(last_response_.bytes_stored(), demo_bytes[r] + extra) << "rank " << r;
  }
  ASSERT_NO_FATAL_FAILURE(ExpectRankMatches("ck", "src", src, 0, tensors));
}

TEST_F(ManagerTest, IdenticalVerbatimValuesFinishedTogetherAreStoredOnce) {
  // Rank 0's write of the small verbatim value "step" is held until rank 1 has finished its
  // upload (at most 2 s): rank 1 reaches the same value meanwhile, and must wait for rank 0's
  // copy and share it rather than store the value a second time.
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  std::vector<int64_t> demo_bytes;
  for (int64_t r = 0; r < 2; ++r) {
    ASSERT_TRUE(UploadRank("plain", "src", &src, r, DemoTensors()).ok()) << r;
    demo_bytes.push_back(last_response_.bytes_stored());
  }
  auto tensors = DemoTensors();
  tensors.push_back({"step", DType::kFloat32, {10}});  // 40 bytes, one chunk
  const std::string step = SampleSlice("step", DType::kFloat32, {10}, Box::Whole({10}), kSeed);
  std::mutex mu;
  std::condition_variable cv;
  bool holding = false;
  bool rank1_done = false;
  corrupting_->OnPutChunks([&](const std::vector<ChunkWrite>& writes) {
    std::unique_lock<std::mutex> lock(mu);
    if (holding || writes.empty() || writes[0].bytes != step) return;
    holding = true;
    cv.notify_all();
    cv.wait_for(lock, std::chrono::seconds(2), [&] { return rank1_done; });
  });
  v1::UploadResponse r0, r1;
  absl::Status s0;
  std::thread rank0([&] { s0 = UploadRank("ck", "src", &src, 0, tensors, 37, kSeed, &r0); });
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return holding; }));
  }
  const absl::Status s1 = UploadRank("ck", "src", &src, 1, tensors, 37, kSeed, &r1);
  {
    std::lock_guard<std::mutex> lock(mu);
    rank1_done = true;
  }
  cv.notify_all();
  rank0.join();
  corrupting_->OnPutChunks(nullptr);
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(r0.bytes_stored(), demo_bytes[0] + 40);
  EXPECT_EQ(r1.bytes_stored(), demo_bytes[1]) << "rank 1 stored its copy of step again";
}

TEST_F(ManagerTest, DeletingAPendingUploadDiscardsItForARetry) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  for (int64_t r = 0; r < 3; ++r) ASSERT_TRUE(UploadRank("ck", "src", &src, r, DemoTensors()).ok());
  // Re-sending a received rank is refused while the upload is pending...
  EXPECT_EQ(UploadRank("ck", "src", &src, 0, DemoTensors()).code(),
            absl::StatusCode::kAlreadyExists);
  // ... until the pending upload is deleted; then everything can be sent again.
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
  EXPECT_EQ(manager_->DeleteCheckpoint("ck").code(), absl::StatusCode::kNotFound);
  UploadAll("ck", "src", src, DemoTensors());
  EXPECT_EQ(manager_->ListCheckpoints()->size(), 1u);
}

// Summarize (GetStats, metrics): pending uploads, then the committed checkpoint and its stored
// bytes; a deleted checkpoint is forgotten, and one re-created under its id is sized anew.
TEST_F(ManagerTest, SummarizeCountsCheckpointsPendingUploadsAndStoredBytes) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  auto empty = manager_->Summarize();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->checkpoints, 0);
  EXPECT_EQ(empty->stored_bytes, 0);
  ASSERT_TRUE(UploadRank("ck", "src", &src, 0, DemoTensors()).ok());
  EXPECT_EQ(manager_->Summarize()->pending_uploads, 1);
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
  EXPECT_EQ(manager_->Summarize()->pending_uploads, 0);

  UploadAll("ck", "src", src, DemoTensors());
  auto one = manager_->Summarize();
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->checkpoints, 1);
  EXPECT_EQ(one->pending_uploads, 0);
  const int64_t sharded_bytes = (*manager_->ListCheckpoints())[0].stored_bytes();
  EXPECT_EQ(one->stored_bytes, sharded_bytes);

  ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
  EXPECT_EQ(manager_->Summarize()->checkpoints, 0);
  EXPECT_EQ(manager_->Summarize()->stored_bytes, 0);

  // The same id again, as a whole-tensor file of a subset of the tensors: another size.
  std::vector<SampleTensor> fewer = DemoTensors();
  fewer.pop_back();
  ASSERT_TRUE(UploadRank("ck", "", nullptr, 0, fewer).ok());
  const int64_t whole_bytes = (*manager_->ListCheckpoints())[0].stored_bytes();
  ASSERT_NE(whole_bytes, sharded_bytes);
  EXPECT_EQ(manager_->Summarize()->checkpoints, 1);
  EXPECT_EQ(manager_->Summarize()->stored_bytes, whole_bytes);
}

}  // namespace
}  // namespace ckpt::manager_test
