// CheckpointManager's fetches (fixture: manager_fixture.h): every re-split's bytes, the message
// forms (parts, tiles, batches), corrupt chunks, memory held, errors, dependencies, and how much
// is read for what is delivered.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/engine/manager.h"
#include "tests/unit/manager_fixture.h"

namespace ckpt::manager_test {
namespace {

using ::testing::HasSubstr;

TEST_F(ManagerTest, EightRanksToThreeEveryByte) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  }
  // Back to the source layout (optimizer shard, 2 stages) from the stored 8-rank copy.
  for (int64_t r = 0; r < src.world_size(); ++r) {
    ExpectRankMatches("ck", "src", src, r, DemoTensors());
  }
}

// A planned rank is kept for the next fetch of it (one entry per rank, reused), within its byte
// budget; a deleted checkpoint's are dropped; a budget of 0 keeps none. Every byte is the same
// either way.
TEST_F(ManagerTest, PlannedRanksAreReusedWithinTheirBudget) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  EXPECT_EQ(manager_->rank_plans_kept().first, 0u);
  ExpectRankMatches("ck", "dst", dst, 1, DemoTensors());
  const auto [kept, bytes] = manager_->rank_plans_kept();
  EXPECT_EQ(kept, 1u);
  EXPECT_GT(bytes, 0);
  ExpectRankMatches("ck", "dst", dst, 1, DemoTensors());  // from the kept plan
  EXPECT_EQ(manager_->rank_plans_kept(), std::make_pair(size_t{1}, bytes));
  ExpectRankMatches("ck", "dst", dst, 2, DemoTensors());
  EXPECT_EQ(manager_->rank_plans_kept().first, 2u);
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
  EXPECT_EQ(manager_->rank_plans_kept().first, 0u);

  // Room for one rank's plan only: the least recent goes.
  ManagerOptions options = SmallOptions();
  options.rank_plan_cache_bytes = bytes + bytes / 2;
  Restart(options);
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  for (int64_t r = 0; r < dst.world_size(); ++r)
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  EXPECT_EQ(manager_->rank_plans_kept().first, 1u);
  EXPECT_LE(manager_->rank_plans_kept().second, options.rank_plan_cache_bytes);

  options.rank_plan_cache_bytes = 0;
  Restart(options);
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  ExpectRankMatches("ck", "dst", dst, 1, DemoTensors());
  ExpectRankMatches("ck", "dst", dst, 1, DemoTensors());
  EXPECT_EQ(manager_->rank_plans_kept().first, 0u);
}

// Messages may be whole stored chunks sent with their stored checksum, and bands then end at
// chunk boundaries: every byte and every message checksum must still be right, for every
// re-split of the demo.
TEST_F(ManagerTest, WholeChunkMessagesKeepEveryByteAndChecksum) {
  ManagerOptions options = SmallOptions();
  options.fetch.max_message_bytes = 512;
  options.fetch.whole_chunk_message_bytes = 32;
  Restart(options);
  UploadDemoAndExpectEveryReSplit();
}

// To a client, messages that combine whole stored chunks carry the chunks' stored checksums as
// parts: they must cover the message exactly and match its bytes, for every re-split and for
// merged fetches, whether messages hold whole bands (512) or cut bands and chunks (100). Bands
// that would be assembled from several stored chunks come as the chunks' regions instead,
// assembled here as the client does. In process, nothing is hashed and no tiles are sent.
TEST_F(ManagerTest, PartChecksumsAndTilesMatchEveryByteOfEveryMessage) {
  for (int64_t max_message_bytes : {512, 100}) {
    for (FetchReader reader : {FetchReader::kClient, FetchReader::kInProcess}) {
      SCOPED_TRACE(absl::StrCat("max_message_bytes ", max_message_bytes, " reader ",
                                static_cast<int>(reader)));
      ManagerOptions options = SmallOptions();
      options.fetch.max_message_bytes = max_message_bytes;
      options.fetch.min_part_bytes = 16;
      Restart(options);
      reader_ = reader;
      part_messages_ = 0;
      tile_messages_ = 0;
      UploadDemoAndExpectEveryReSplit();
      if (reader == FetchReader::kClient) {
        EXPECT_GT(part_messages_, 0);
        EXPECT_GT(tile_messages_, 0);
      } else {
        EXPECT_EQ(tile_messages_, 0);
      }
    }
  }
}

// A client that accepts batches gets runs of small tensors whole in FetchTensorBatch messages,
// and the rest (larger than batch_tensor_bytes, or than a message) as header and data messages,
// tiles included: every byte of every re-split and of a merged fetch is the same, and every
// message's parts match its bytes, whether batches hold a few tensors (100-byte messages) or many.
TEST_F(ManagerTest, BatchesCarryEveryByteOfSmallTensors) {
  for (int64_t max_message_bytes : {int64_t{100}, int64_t{512}, int64_t{1} << 20}) {
    for (int64_t batch_tensor_bytes : {int64_t{64}, int64_t{64} << 10}) {
      SCOPED_TRACE(absl::StrCat("max_message_bytes ", max_message_bytes, " batch_tensor_bytes ",
                                batch_tensor_bytes));
      ManagerOptions options = SmallOptions();
      options.fetch.max_message_bytes = max_message_bytes;
      options.fetch.min_part_bytes = 16;
      options.fetch.batch_tensor_bytes = batch_tensor_bytes;
      options.fetch.batch_first_tensors = 2;
      options.fetch.batch_max_tensors = 5;
      Restart(options);
      batches_ = true;
      batch_messages_ = 0;
      tile_messages_ = 0;
      UploadDemoAndExpectEveryReSplit();
      EXPECT_GT(batch_messages_, 0);
      if (max_message_bytes == 512) {
        EXPECT_GT(tile_messages_, 0);
      }
    }
  }
}

// A stream verifies every stored byte before it leaves, except whole chunks that go to a client
// (kClient) with their stored checksums, which the server sends without hashing them. With any
// one chunk corrupted, no message may therefore carry wrong bytes under checksums that match
// them: the client catches each one, and in process none leaves at all (the stream ends with
// DATA_LOSS naming the chunk first).
TEST_F(ManagerTest, CorruptedChunksNeverLeaveUnderMatchingChecksums) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  std::vector<v1::FetchRequest> requests;
  for (const auto& [name, strategy] : {std::pair{"src", &src}, std::pair{"dst", &dst}}) {
    for (int64_t r = 0; r < strategy->world_size(); ++r) {
      v1::FetchRequest& req = requests.emplace_back();
      req.set_checkpoint_id("ck");
      req.set_destination_strategy(name);
      req.set_rank(r);
    }
  }
  requests.emplace_back().set_checkpoint_id("ck");
  requests.back().set_merged(true);

  struct Message {
    std::string bytes;
    bool checksums_match = true;
  };
  // The data messages of `req` until the stream ends or fails (its status).
  bool batches = false;  // run's requests accept batches
  auto run = [&](v1::FetchRequest req, FetchReader reader,
                 std::vector<Message>* out) -> absl::Status {
    req.set_accept_batches(batches);
    auto stream = manager_->OpenFetch(req);
    if (!stream.ok()) return stream.status();
    FetchPiece piece;
    while (true) {
      auto more = (*stream)->NextPiece(&piece, reader);
      if (!more.ok()) return more.status();
      if (!*more) return absl::OkStatus();
      if (piece.segments.empty()) continue;
      Message& m = out->emplace_back();
      for (const DataSegment& seg : piece.segments) m.bytes += seg.bytes;
      size_t offset = 0;
      for (const ChecksumPart& p : piece.parts) {
        const std::string_view part = std::string_view(m.bytes).substr(offset, p.bytes);
        m.checksums_match = m.checksums_match && p.checksum == Checksum(part);
        offset += static_cast<size_t>(p.bytes);
      }
    }
  };

  for (int64_t max_message_bytes : {512, 100}) {
    for (int mode : {0, 1, 2}) {  // a client; a client accepting batches; in process
      const FetchReader reader = mode == 2 ? FetchReader::kInProcess : FetchReader::kClient;
      batches = mode == 1;
      const bool stored_on_wire = reader == FetchReader::kClient;
      SCOPED_TRACE(absl::StrCat("max_message_bytes ", max_message_bytes, " mode ", mode));
      ManagerOptions options = SmallOptions();
      options.fetch.max_message_bytes = max_message_bytes;
      options.fetch.whole_chunk_message_bytes = 32;
      options.fetch.min_part_bytes = 16;
      Restart(options);
      PutStrategy("src", src);
      PutStrategy("dst", dst);
      UploadAll("ck", "src", src, DemoTensors());
      int64_t runs = 0, caught_by_client = 0, failed_streams = 0;
      for (const v1::FetchRequest& req : requests) {
        SCOPED_TRACE(req.ShortDebugString());
        std::vector<Message> truth;
        corrupting_->Corrupt(std::nullopt);
        corrupting_->TakeReads();
        ASSERT_TRUE(run(req, reader, &truth).ok());
        const std::vector<ChunkAddress> read = corrupting_->TakeReads();
        ASSERT_FALSE(read.empty());
        // Up to 12 of the chunks the stream reads, spread over it.
        for (size_t k = 0; k < read.size(); k += std::max<size_t>(1, read.size() / 12)) {
          SCOPED_TRACE(read[k].ToString());
          ++runs;
          std::vector<Message> got;
          corrupting_->Corrupt(read[k]);
          const absl::Status status = run(req, reader, &got);
          bool caught = false;
          ASSERT_LE(got.size(), truth.size());
          for (size_t i = 0; i < got.size(); ++i) {
            if (got[i].bytes == truth[i].bytes) continue;
            ASSERT_FALSE(got[i].checksums_match) << "message " << i << " has wrong bytes";
            caught = true;
          }
          caught_by_client += caught;
          if (status.ok()) {
            EXPECT_TRUE(caught) << "the corrupted chunk went unnoticed";
          } else {
            ++failed_streams;
            EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
            EXPECT_THAT(std::string(status.message()),
                        HasSubstr(absl::StrCat("checkpoint ck tensor ")));
            EXPECT_THAT(
                std::string(status.message()),
                HasSubstr(absl::StrCat(read[k].ToString(), " failed its XXH3-64 checksum")));
          }
        }
      }
      if (stored_on_wire) {
        // With 100-byte messages the demo's chunks (up to 256 bytes) are mostly cut.
        if (max_message_bytes == 512) {
          EXPECT_GT(caught_by_client, 0) << "whole chunks were hashed on the server";
        }
        EXPECT_GT(failed_streams, 0) << "assembled chunks were not verified on the server";
      } else {
        EXPECT_EQ(caught_by_client, 0);
        EXPECT_EQ(failed_streams, runs);
      }
    }
  }
}

// A fetch releases the chunks it can no longer use (those of earlier tensors, and those ending
// before the band it builds) instead of keeping them until its chunk cache is full: with a cache
// that could hold the whole checkpoint, a stream still holds at most one tensor's chunks at a
// time, and never reads a chunk twice (which a chunk released too early would cause).
TEST_F(ManagerTest, FetchReleasesChunksItHasNoFurtherUseFor) {
  ManagerOptions options = SmallOptions();
  options.fetch.chunk_cache_bytes = int64_t{1} << 30;
  Restart(options);
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  auto manifest = store_->GetManifest("ck");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  for (const auto& [name, layout] :
       {std::pair<std::string, const Strategy*>{"dst", &dst}, {"src", &src}}) {
    for (int64_t r = 0; r < layout->world_size(); ++r) {
      corrupting_->TakeReads();
      corrupting_->TakePeakLiveBytes();
      ExpectRankMatches("ck", name, *layout, r, DemoTensors());
      const std::vector<ChunkAddress> reads = corrupting_->TakeReads();
      const int64_t peak = corrupting_->TakePeakLiveBytes();
      // Bytes read per tensor, and no chunk twice.
      std::map<uint32_t, int64_t> tensor_bytes;
      std::set<std::tuple<uint32_t, uint32_t, uint32_t>> seen;
      for (const ChunkAddress& a : reads) {
        EXPECT_TRUE(seen.insert({a.tensor, a.blob, a.chunk}).second)
            << name << " rank " << r << " read " << a.ToString() << " twice";
        auto chunk = store_->ReadChunkUnverified(a);
        ASSERT_TRUE(chunk.ok()) << chunk.status();
        tensor_bytes[a.tensor] += static_cast<int64_t>((*chunk)->bytes().size());
      }
      corrupting_->TakeReads();
      corrupting_->TakePeakLiveBytes();
      int64_t largest = 0, total = 0;
      for (const auto& [tensor, bytes] : tensor_bytes) {
        largest = std::max(largest, bytes);
        total += bytes;
      }
      EXPECT_LE(peak, largest) << name << " rank " << r << " held " << peak << " of " << total
                               << " bytes read at once";
    }
  }
}

TEST_F(ManagerTest, MergedFetchDeliversWholeTensors) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  UploadAll("ck", "src", src, DemoTensors());
  v1::FetchRequest req;
  req.set_checkpoint_id("ck");
  req.set_merged(true);
  auto got = Fetch(req);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->tensors.size(), DemoTensors().size());
  for (const SampleTensor& t : DemoTensors()) {
    auto it = std::find_if(got->tensors.begin(), got->tensors.end(),
                           [&](const auto& p) { return p.first.name() == t.name; });
    ASSERT_NE(it, got->tensors.end());
    EXPECT_EQ(it->second,
              SampleSlice(t.name, t.dtype, t.global_shape, Box::Whole(t.global_shape), kSeed));
  }
}

TEST_F(ManagerTest, WholeFileSourceServedSharded) {
  const Strategy src = DemoSourceStrategy();
  PutStrategy("src", src);
  ASSERT_TRUE(UploadRank("whole", "", nullptr, 0, DemoTensors()).ok());
  for (int64_t r = 0; r < src.world_size(); ++r) {
    ExpectRankMatches("whole", "src", src, r, DemoTensors());
  }
  auto info = manager_->DescribeCheckpoint("whole");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->info().ranks(), 1);
}

TEST_F(ManagerTest, FetchErrors) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  v1::FetchRequest req;
  req.set_checkpoint_id("ck");
  req.set_destination_strategy("dst");
  req.set_rank(3);
  EXPECT_EQ(manager_->OpenFetch(req).status().code(), absl::StatusCode::kOutOfRange);
  req.set_checkpoint_id("nope");
  req.set_rank(0);
  EXPECT_EQ(manager_->OpenFetch(req).status().code(), absl::StatusCode::kNotFound);
  req.set_checkpoint_id("ck");
  req.set_destination_strategy("missing");
  EXPECT_EQ(manager_->OpenFetch(req).status().code(), absl::StatusCode::kNotFound);
  // Include/exclude globs.
  req.set_destination_strategy("dst");
  req.add_include("layers.0.*");
  req.add_exclude("*.bias");
  auto got = Fetch(req);
  ASSERT_TRUE(got.ok()) << got.status();
  for (const auto& [h, bytes] : got->tensors) {
    EXPECT_THAT(h.name(), HasSubstr("layers.0."));
    EXPECT_THAT(h.name(), ::testing::Not(HasSubstr(".bias")));
  }
  EXPECT_EQ(got->tensors.size(), 3u);  // dense.weight, output.weight, norm.gamma
}

TEST_F(ManagerTest, DependenciesFromCheckpointAndStrategies) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  v1::RankDependenciesRequest req;
  req.set_checkpoint_id("ck");
  req.set_destination_strategy("dst");
  req.set_all(true);
  auto by_ckpt = manager_->RankDependencies(req);
  ASSERT_TRUE(by_ckpt.ok()) << by_ckpt.status();
  ASSERT_EQ(by_ckpt->ranks_size(), 3);
  req.set_source_strategy("src");
  auto by_layout = manager_->RankDependencies(req);
  ASSERT_TRUE(by_layout.ok());
  for (int r = 0; r < 3; ++r) {
    EXPECT_FALSE(by_ckpt->ranks(r).source_ranks().empty());
    EXPECT_EQ(by_ckpt->ranks(r).source_ranks_size(), by_layout->ranks(r).source_ranks_size());
  }
  req.set_rank(7);
  EXPECT_EQ(manager_->RankDependencies(req).status().code(), absl::StatusCode::kOutOfRange);
}

// Chunk geometry: bytes read from the store over bytes delivered, for every rank of a row,
// column and optimizer-shard re-split, with the production chunk sizes.
TEST(ReadAmplificationTest, ReSplitsReadLittleMoreThanTheyDeliver) {
  auto store = NewMemoryStore();
  // Each fetch's own reads: nothing kept for the next rank's fetch.
  ManagerOptions options;
  options.shared_chunk_cache_bytes = 0;
  CheckpointManager manager(store.get(), options);
  auto layout = [](std::vector<int64_t> dm, std::vector<std::vector<int32_t>> map,
                   int64_t opt = 0) {
    Layout l;
    l.dev_matrix = std::move(dm);
    l.tensor_map = std::move(map);
    if (opt) {
      l.opt_shard_size = opt;
      l.opt_shard_step = 1;
    }
    return l;
  };
  auto strategy = [](const Layout& l) {
    std::map<std::string, StrategyParam> params;
    params["w"].layout = l;
    return *Strategy::Create(params, 1);
  };
  // Float32, 9.4 MiB: source slices of 1.2 MiB, beyond one target chunk (cut into column bands).
  const Shape large = {4800, 512};
  // Float32, 4.7 MiB: source slices of 600 KiB, within one target chunk (rows only).
  const Shape small = {2400, 512};
  const Strategy rows8 = strategy(layout({8}, {{0}, {}}));
  const Strategy opt8 = strategy(layout({2, 4}, {{1}, {}}, 4));  // rows by 2, opt shard 4
  struct Case {
    std::string name;
    const Strategy* src;
    Strategy dst;
    Shape shape;
    double bound;
  };
  std::vector<Case> cases = {
      {"rows 8 -> rows 3", &rows8, strategy(layout({3}, {{0}, {}})), large, 1.1},
      {"rows 8 -> columns 4", &rows8, strategy(layout({4}, {{}, {0}})), large, 1.25},
      {"opt-sharded 8 -> rows 2", &opt8, strategy(layout({2}, {{0}, {}})), large, 1.25},
      {"rows 8 -> rows 3, small slices", &rows8, strategy(layout({3}, {{0}, {}})), small, 1.1},
      // Each of the 4 column ranks reads the source rows whole: at most one target chunk per
      // slice and rank.
      {"rows 8 -> columns 4, small slices", &rows8, strategy(layout({4}, {{}, {0}})), small, 4.0},
  };
  int id = 0;
  for (Case& c : cases) {
    const std::string ck = absl::StrCat("ck", id++);
    for (const auto& [name, s] :
         {std::pair<std::string, const Strategy*>{ck + "src", c.src}, {ck + "dst", &c.dst}}) {
      ASSERT_TRUE(manager
                      .PutStrategy(name, SerializeStrategy(*s, StrategyFormat::kJson),
                                   v1::STRATEGY_FORMAT_JSON, false)
                      .ok());
    }
    for (int64_t r = 0; r < c.src->world_size(); ++r) {
      const v1::UploadHeader h = Header(ck, ck + "src", r);
      auto u = manager.BeginUpload(h);
      ASSERT_TRUE(u.ok()) << u.status();
      const Box box = *c.src->Find("w")->layout.SliceBox(c.shape, r);
      const std::string bytes = SampleSlice("w", DType::kFloat32, c.shape, box, kSeed);
      v1::UploadTensorHeader th;
      th.set_name("w");
      th.set_dtype("Float32");
      for (int64_t d : box.shape()) th.add_dims(d);
      th.set_total_bytes(static_cast<int64_t>(bytes.size()));
      ASSERT_TRUE((*u)->StartTensor(th).ok());
      for (size_t pos = 0; pos < bytes.size(); pos += 1 << 20) {
        ASSERT_TRUE((*u)->Append(std::string_view(bytes).substr(pos, 1 << 20)).ok());
      }
      ASSERT_TRUE((*u)->Finish().ok());
    }
    const int64_t read_before = store->stats().chunk_bytes_read;
    int64_t delivered = 0;
    for (int64_t r = 0; r < c.dst.world_size(); ++r) {
      v1::FetchRequest req;
      req.set_checkpoint_id(ck);
      req.set_destination_strategy(ck + "dst");
      req.set_rank(r);
      auto stream = manager.OpenFetch(req);
      ASSERT_TRUE(stream.ok()) << stream.status();
      v1::FetchResponse msg;
      std::string got;
      while (*(*stream)->Next(&msg)) {
        if (msg.has_data()) got += msg.data().data();
      }
      const Box box = *c.dst.Find("w")->layout.SliceBox(c.shape, r);
      ASSERT_EQ(got, SampleSlice("w", DType::kFloat32, c.shape, box, kSeed)) << c.name;
      delivered += static_cast<int64_t>(got.size());
    }
    const double amplification =
        static_cast<double>(store->stats().chunk_bytes_read - read_before) / delivered;
    std::cout << "read amplification, " << c.name << ": " << amplification << " ("
              << store->stats().chunk_bytes_read - read_before << " bytes read for " << delivered
              << " delivered)\n";
    EXPECT_LE(amplification, c.bound) << c.name;
    EXPECT_GE(amplification, 1.0) << c.name;
  }
}

// A store whose manifest and strategy reads are counted (by name) and take a moment, as a large
// manifest's read does, so that requests arriving together overlap; optionally the first
// manifest read, once it has the bytes, waits until the test lets it go on.
class SlowLoadStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  absl::StatusOr<std::string> GetManifest(const std::string& id) override {
    Count("manifest " + id);
    absl::StatusOr<std::string> manifest = ForwardingStore::GetManifest(id);
    if (gate_first_manifest && !gated_.exchange(true)) {
      manifest_entered.Notify();  // read; its caller has yet to decode it
      manifest_release.WaitForNotification();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return manifest;
  }
  absl::StatusOr<std::string> GetStrategy(const std::string& name) override {
    Count("strategy " + name);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return ForwardingStore::GetStrategy(name);
  }
  std::map<std::string, int> reads() {
    std::lock_guard<std::mutex> lock(mu_);
    return reads_;
  }
  void ClearReads() {
    std::lock_guard<std::mutex> lock(mu_);
    reads_.clear();
  }

  bool gate_first_manifest = false;
  absl::Notification manifest_entered, manifest_release;

 private:
  void Count(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    ++reads_[what];
  }
  std::mutex mu_;
  std::map<std::string, int> reads_;
  std::atomic<bool> gated_{false};
};

class ColdManagerTest : public ManagerTest {
 protected:
  // `store` becomes the fixture's store; the demo checkpoint "ck" (strategy "src") and the "dst"
  // strategy are uploaded through a manager over it, then a new manager is started over it, as
  // after a restart: nothing loaded or planned yet.
  void UploadThenRestart(std::unique_ptr<CheckpointStore> store, const Strategy& src,
                         const Strategy& dst) {
    manager_.reset();
    store_ = std::move(store);
    manager_ = std::make_unique<CheckpointManager>(store_.get(), SmallOptions());
    PutStrategy("src", src);
    PutStrategy("dst", dst);
    UploadAll("ck", "src", src, DemoTensors());
    manager_ = std::make_unique<CheckpointManager>(store_.get(), SmallOptions());
  }
};

// The workers of a job starting together against a ckptd that has just started: the manifest
// and the destination strategy are read (and decoded) once for all of them, not once each, and
// every replica of a rank gets the same bytes, those of the rank.
TEST_F(ColdManagerTest, ConcurrentFirstFetchesLoadTheCheckpointOnce) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  auto slow = std::make_unique<SlowLoadStore>(NewMemoryStore());
  SlowLoadStore* counted = slow.get();
  UploadThenRestart(std::move(slow), src, dst);
  counted->ClearReads();
  constexpr int kWorkers = 12;  // 4 replicas of each of the 3 destination ranks
  std::vector<absl::StatusOr<std::string>> got(kWorkers, std::string());
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w) {
    workers.emplace_back([&, w] {
      v1::FetchRequest req;
      req.set_checkpoint_id("ck");
      req.set_destination_strategy("dst");
      req.set_rank(w % dst.world_size());
      auto stream = manager_->OpenFetch(req);
      if (!stream.ok()) {
        got[w] = stream.status();
        return;
      }
      v1::FetchResponse msg;
      while (true) {
        auto more = (*stream)->Next(&msg);
        if (!more.ok()) {
          got[w] = more.status();
          return;
        }
        if (!*more) return;
        got[w]->append(msg.SerializeAsString());
      }
    });
  }
  for (std::thread& t : workers) t.join();
  const std::map<std::string, int> reads = counted->reads();
  EXPECT_EQ(reads, (std::map<std::string, int>{{"manifest ck", 1}, {"strategy dst", 1}}));
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_TRUE(got[w].ok()) << "worker " << w << ": " << got[w].status();
    EXPECT_FALSE(got[w]->empty());
    EXPECT_EQ(*got[w], *got[w % dst.world_size()]) << "worker " << w;
  }
  for (int64_t r = 0; r < dst.world_size(); ++r) {
    ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
  }
}

// A checkpoint deleted while a fetch was loading its manifest is not kept once that load ends:
// the next fetch of it is NOT_FOUND rather than served from the manifest of a deleted checkpoint.
TEST_F(ColdManagerTest, CheckpointDeletedWhileItLoadsIsNotKept) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  auto slow = std::make_unique<SlowLoadStore>(NewMemoryStore());
  SlowLoadStore* gated = slow.get();
  UploadThenRestart(std::move(slow), src, dst);
  gated->gate_first_manifest = true;
  v1::FetchRequest req;
  req.set_checkpoint_id("ck");
  req.set_destination_strategy("dst");
  req.set_rank(0);
  std::thread loading([&] { (void)manager_->OpenFetch(req); });  // read before the delete
  gated->manifest_entered.WaitForNotification();
  ASSERT_TRUE(manager_->DeleteCheckpoint("ck").ok());
  gated->manifest_release.Notify();
  loading.join();
  EXPECT_EQ(manager_->OpenFetch(req).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt::manager_test
