// The service's data path in process (no gRPC): upload ranks through RankUpload, commit, fetch
// through FetchStream, and compare every byte with slices generated independently.
#include "service/engine/manager.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "ckpt_records.pb.h"
#include "client/ckptctl/sample.h"
#include "core/checksum.h"
#include "core/tile_band.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_store.h"
#include "tests/testing/forwarding_store.h"
#include "tests/testing/manager_uploads.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSeed = 5;

using testing::OwnedChunk;

// Counts the bytes of the chunks it wraps while they live (LiveBytes below).
struct LiveBytes {
  std::mutex mu;
  int64_t now = 0;
  int64_t peak = 0;
  void Add(int64_t n) {
    std::lock_guard<std::mutex> lock(mu);
    now += n;
    peak = std::max(peak, now);
  }
};

class CountedChunk final : public ChunkData {
 public:
  CountedChunk(std::unique_ptr<ChunkData> data, LiveBytes* live)
      : data_(std::move(data)), live_(live) {
    live_->Add(static_cast<int64_t>(data_->bytes().size()));
  }
  ~CountedChunk() override { live_->Add(-static_cast<int64_t>(data_->bytes().size())); }
  std::string_view bytes() const override { return data_->bytes(); }

 private:
  std::unique_ptr<ChunkData> data_;
  LiveBytes* live_;
};

// Reads of one chosen chunk come back with their middle byte flipped (the stored copy is
// untouched, so the same checkpoint can be read both ways); records the chunks read and counts
// the bytes of those still held by the reader.
class CorruptingStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override {
    auto data = base().ReadChunkUnverified(address);
    std::lock_guard<std::mutex> lock(mu_);
    reads_.push_back(address);
    if (!data.ok()) return data;
    if (address != corrupt_)
      return std::unique_ptr<ChunkData>(new CountedChunk(*std::move(data), &live_));
    std::string bytes((*data)->bytes());
    if (!bytes.empty()) bytes[bytes.size() / 2] ^= 0x20;
    return std::unique_ptr<ChunkData>(new OwnedChunk(std::move(bytes)));
  }
  // The most bytes of chunks held at once since the last call.
  int64_t TakePeakLiveBytes() {
    std::lock_guard<std::mutex> lock(live_.mu);
    return std::exchange(live_.peak, live_.now);
  }

  // Calls `hook` with every PutChunks's writes before they are stored (null: none).
  void OnPutChunks(std::function<void(const std::vector<ChunkWrite>&)> hook) {
    std::lock_guard<std::mutex> lock(mu_);
    on_put_ = std::move(hook);
  }
  absl::Status PutChunks(const std::vector<ChunkWrite>& chunks) override {
    std::function<void(const std::vector<ChunkWrite>&)> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = on_put_;
    }
    if (hook) hook(chunks);
    if (fail_puts_) return absl::ResourceExhaustedError("injected: disk full");
    return base().PutChunks(chunks);
  }
  // Every PutChunks fails from now on (until called with false).
  void FailPuts(bool fail) { fail_puts_ = fail; }

  // Corrupts reads of `address` from now on (none: an address no chunk has).
  void Corrupt(std::optional<ChunkAddress> address) {
    std::lock_guard<std::mutex> lock(mu_);
    corrupt_ = address ? *address : ChunkAddress{~uint64_t{0}, 0, 0, 0};
  }
  // The chunks read since the last call, in order.
  std::vector<ChunkAddress> TakeReads() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(reads_, {});
  }

 private:
  std::mutex mu_;
  std::atomic<bool> fail_puts_{false};
  ChunkAddress corrupt_{~uint64_t{0}, 0, 0, 0};
  std::vector<ChunkAddress> reads_;
  std::function<void(const std::vector<ChunkWrite>&)> on_put_;
  LiveBytes live_;
};

v1::UploadHeader Header(const std::string& id, const std::string& strategy, int64_t rank) {
  v1::UploadHeader h;
  h.set_checkpoint_id(id);
  h.set_source_strategy(strategy);
  h.set_rank(rank);
  return h;
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override { Restart(SmallOptions()); }

  // Small chunks and bands so that tiles, bands and caches are all exercised.
  static ManagerOptions SmallOptions() {
    ManagerOptions options;
    options.upload.chunk_grid.target_chunk_bytes = 256;
    options.upload.chunk_grid.min_column_bytes = 16;
    options.upload.verbatim_dedupe_bytes = 1024;
    options.fetch.band_bytes = 300;
    options.fetch.max_message_bytes = 100;
    options.fetch.chunk_cache_bytes = 1024;
    // No chunk is kept across fetches, so that tests counting or corrupting reads see every
    // fetch read the store (sharing between streams: shared_reads_test.cc).
    options.shared_chunk_cache_bytes = 0;
    return options;
  }

  // A new, empty store and a manager with `options`.
  void Restart(const ManagerOptions& options) {
    manager_.reset();
    auto store = std::make_unique<CorruptingStore>(NewMemoryStore());
    corrupting_ = store.get();
    store_ = std::move(store);
    max_message_bytes_ = options.fetch.max_message_bytes;
    manager_ = std::make_unique<CheckpointManager>(store_.get(), options);
  }

  void PutStrategy(const std::string& name, const Strategy& s) {
    auto info = manager_->PutStrategy(name, SerializeStrategy(s, StrategyFormat::kJson),
                                      v1::STRATEGY_FORMAT_JSON, false);
    ASSERT_TRUE(info.ok()) << info.status();
  }

  // Uploads one rank of the demo tensors laid out by `strategy` (empty name: whole file).
  // Records the rank's UploadResponse in `response`, or in last_response_ when it is null.
  absl::Status UploadRank(const std::string& id, const std::string& strategy_name,
                          const Strategy* strategy, int64_t rank,
                          const std::vector<SampleTensor>& tensors, size_t piece = 37,
                          uint64_t verbatim_seed = kSeed, v1::UploadResponse* response = nullptr) {
    const v1::UploadHeader h = Header(id, strategy_name, rank);
    auto upload = manager_->BeginUpload(h);
    if (!upload.ok()) return upload.status();
    if (batched_) (*upload)->BeginBatch();
    for (const SampleTensor& t : tensors) {
      Box box = Box::Whole(t.global_shape);
      if (strategy) {
        const Layout* l = ResolveLayout(*strategy, t.name, true);
        if (l) {
          const int32_t stage = static_cast<int32_t>(rank / strategy->devices_per_stage());
          if (!std::count(l->stages.begin(), l->stages.end(), stage)) continue;
          box = *l->SliceBox(t.global_shape, rank % strategy->devices_per_stage());
        }
      }
      const bool verbatim = !strategy || !ResolveLayout(*strategy, t.name, true);
      const std::string bytes =
          SampleSlice(t.name, t.dtype, t.global_shape, box, verbatim ? verbatim_seed : kSeed);
      v1::UploadTensorHeader th;
      th.set_name(t.name);
      th.set_dtype(std::string(DTypeName(t.dtype)));
      for (int64_t d : box.shape()) th.add_dims(d);
      th.set_total_bytes(static_cast<int64_t>(bytes.size()));
      if (auto s = (*upload)->StartTensor(th); !s.ok()) return s;
      for (size_t pos = 0; pos < bytes.size(); pos += piece) {
        if (auto s = (*upload)->Append(std::string_view(bytes).substr(pos, piece)); !s.ok()) {
          return s;
        }
      }
    }
    if (batched_) {
      if (auto s = (*upload)->EndBatch(); !s.ok()) return s;
    }
    auto r = (*upload)->Finish();
    if (!r.ok()) return r.status();
    *(response ? response : &last_response_) = *r;
    manager_->OnUploadFinished(id);
    return absl::OkStatus();
  }

  void UploadAll(const std::string& id, const std::string& name, const Strategy& s,
                 const std::vector<SampleTensor>& tensors) {
    for (int64_t r = s.world_size() - 1; r >= 0; --r) {  // any order works
      ASSERT_TRUE(UploadRank(id, name, &s, r, tensors).ok()) << "rank " << r;
    }
  }

  struct Fetched {
    v1::FetchPlanSummary summary;
    std::vector<std::pair<v1::FetchTensorHeader, std::string>> tensors;
  };
  // Fetches through NextPiece for reader_, as the service (kClient) or a transform job
  // (kInProcess) does, checking each message's parts; bands of tiles are assembled with TileBand
  // as the client library does.
  absl::StatusOr<Fetched> Fetch(v1::FetchRequest req) {
    if (batches_) req.set_accept_batches(true);
    auto stream = manager_->OpenFetch(req);
    if (!stream.ok()) return stream.status();
    Fetched out;
    v1::FetchResponse msg;
    FetchPiece piece;
    std::unique_ptr<TileBand> band;
    while (true) {
      std::string data;
      auto more = (*stream)->NextPiece(&piece, reader_);
      if (!more.ok()) return more.status();
      if (!*more) break;
      msg = piece.message;
      if (!piece.batch_headers.empty()) {
        // A batch's headers, serialised (FetchPiece::batch_headers), ahead of any in the message.
        EXPECT_TRUE(msg.has_batch());
        v1::FetchTensorBatch headers;
        EXPECT_TRUE(headers.ParseFromString(piece.batch_headers));
        headers.MergeFrom(msg.batch());
        *msg.mutable_batch() = std::move(headers);
      }
      for (const DataSegment& s : piece.segments) data += s.bytes;
      EXPECT_EQ(static_cast<int64_t>(data.size()), piece.data_bytes);
      if (!piece.segments.empty()) CheckPieceChecksums(piece, data);
      if (msg.has_batch()) {
        // Whole tensors, their bytes end to end.
        EXPECT_TRUE(batches_ && reader_ == FetchReader::kClient);
        EXPECT_EQ(band, nullptr) << "a batch inside a band of tiles";
        EXPECT_GT(msg.batch().tensors_size(), 0);
        EXPECT_LE(static_cast<int64_t>(data.size()), max_message_bytes_);
        ++batch_messages_;
        size_t offset = 0;
        for (const v1::FetchTensorHeader& h : msg.batch().tensors()) {
          EXPECT_LE(offset + static_cast<size_t>(h.total_bytes()), data.size());
          out.tensors.push_back({h, data.substr(offset, static_cast<size_t>(h.total_bytes()))});
          offset += static_cast<size_t>(h.total_bytes());
        }
        EXPECT_EQ(offset, data.size());
        continue;
      }
      if (!piece.tile_box.empty()) {
        EXPECT_EQ(reader_, FetchReader::kClient);
        ++tile_messages_;
        // Tiles of a band: assemble it; its bytes count once it is complete.
        const v1::FetchTensorHeader& h = out.tensors.back().first;
        const Shape local(h.local_shape().begin(), h.local_shape().end());
        const size_t rank = local.size();
        if (!band) {
          const int64_t row_bytes = static_cast<int64_t>(h.total_bytes()) / local[0];
          auto started = TileBand::Start(*ParseDType(h.dtype()), local,
                                         out.tensors.back().second.size() / row_bytes,
                                         piece.band_rows, int64_t{1} << 30);
          if (!started.ok()) return started.status();
          band = std::move(*started);
        }
        EXPECT_EQ(piece.band_rows, band->box().extent(0));
        EXPECT_EQ(piece.tile_box.size(), 2 * rank * piece.parts.size());
        size_t offset = 0;
        for (size_t i = 0; i < piece.parts.size(); ++i) {
          const auto at = piece.tile_box.begin() + static_cast<std::ptrdiff_t>(2 * rank * i);
          const Box tile{
              {at, at + static_cast<std::ptrdiff_t>(rank)},
              {at + static_cast<std::ptrdiff_t>(rank), at + static_cast<std::ptrdiff_t>(2 * rank)}};
          const auto n = static_cast<size_t>(piece.parts[i].bytes);
          if (auto s = band->Add(tile, {std::string_view(data).substr(offset, n)}); !s.ok()) {
            return s;
          }
          offset += n;
        }
        data.clear();
        if (band->complete()) {
          out.tensors.back().second += band->bytes();
          band.reset();
        }
      }
      if (msg.has_summary()) out.summary = msg.summary();
      if (msg.has_tensor()) {
        EXPECT_EQ(band, nullptr) << "a tensor began inside a band of tiles";
        out.tensors.push_back({msg.tensor(), ""});
      }
      if (!data.empty()) {
        EXPECT_EQ(band, nullptr) << "row-major data inside a band of tiles";
        EXPECT_LE(static_cast<int64_t>(data.size()), max_message_bytes_);
        out.tensors.back().second += data;
      }
    }
    return out;
  }

  // kClient: the parts (at least one) cover the message and their checksums match its bytes.
  // kInProcess: no parts.
  void CheckPieceChecksums(const FetchPiece& piece, const std::string& data) {
    if (reader_ == FetchReader::kInProcess) {
      EXPECT_TRUE(piece.parts.empty());
      return;
    }
    ASSERT_FALSE(piece.parts.empty());
    if (piece.parts.size() > 1 && piece.tile_box.empty()) ++part_messages_;
    size_t offset = 0;
    for (const ChecksumPart& p : piece.parts) {
      ASSERT_GT(p.bytes, 0);
      ASSERT_LE(offset + static_cast<size_t>(p.bytes), data.size());
      EXPECT_EQ(p.checksum, Checksum(std::string_view(data).substr(offset, p.bytes)))
          << "part at " << offset;
      offset += static_cast<size_t>(p.bytes);
    }
    EXPECT_EQ(offset, data.size());
  }

  // Every tensor delivered to `rank` of `dst` equals the independently generated slice.
  void ExpectRankMatches(const std::string& id, const std::string& dst_name, const Strategy& dst,
                         int64_t rank, const std::vector<SampleTensor>& tensors) {
    v1::FetchRequest req;
    req.set_checkpoint_id(id);
    req.set_destination_strategy(dst_name);
    req.set_rank(rank);
    auto got = Fetch(req);
    ASSERT_TRUE(got.ok()) << got.status();
    const int32_t stage = static_cast<int32_t>(rank / dst.devices_per_stage());
    size_t expected_count = 0;
    for (const SampleTensor& t : tensors) {
      const Layout* l = ResolveLayout(dst, t.name, true);
      if (l && !std::count(l->stages.begin(), l->stages.end(), stage)) continue;
      ++expected_count;
      const Box box = l ? *l->SliceBox(t.global_shape, rank % dst.devices_per_stage())
                        : Box::Whole(t.global_shape);
      auto it = std::find_if(got->tensors.begin(), got->tensors.end(),
                             [&](const auto& p) { return p.first.name() == t.name; });
      ASSERT_NE(it, got->tensors.end()) << t.name << " missing from rank " << rank;
      EXPECT_EQ(Shape(it->first.box_lo().begin(), it->first.box_lo().end()), box.lo) << t.name;
      EXPECT_EQ(Shape(it->first.local_shape().begin(), it->first.local_shape().end()), box.shape());
      ASSERT_EQ(it->second, SampleSlice(t.name, t.dtype, t.global_shape, box, kSeed))
          << t.name << " rank " << rank;
    }
    // Plus the two verbatim scalars? The demo upload here sends none.
    EXPECT_EQ(got->tensors.size(), expected_count);
  }

  // Uploads the demo as checkpoint "ck" of strategy "src", then checks every rank of the demo
  // destination "dst" and of the source layout, and a merged fetch.
  void UploadDemoAndExpectEveryReSplit() {
    const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
    PutStrategy("src", src);
    PutStrategy("dst", dst);
    UploadAll("ck", "src", src, DemoTensors());
    for (int64_t r = 0; r < dst.world_size(); ++r) {
      SCOPED_TRACE(r);
      ExpectRankMatches("ck", "dst", dst, r, DemoTensors());
    }
    for (int64_t r = 0; r < src.world_size(); ++r) {
      SCOPED_TRACE(r);
      ExpectRankMatches("ck", "src", src, r, DemoTensors());
    }
    v1::FetchRequest req;
    req.set_checkpoint_id("ck");
    req.set_merged(true);
    auto got = Fetch(req);
    ASSERT_TRUE(got.ok()) << got.status();
    for (const SampleTensor& t : DemoTensors()) {
      auto it = std::find_if(got->tensors.begin(), got->tensors.end(),
                             [&](const auto& p) { return p.first.name() == t.name; });
      ASSERT_NE(it, got->tensors.end()) << t.name;
      EXPECT_EQ(it->second,
                SampleSlice(t.name, t.dtype, t.global_shape, Box::Whole(t.global_shape), kSeed))
          << t.name;
    }
  }

  // Stores checkpoint `from` again as `to`, through the store's API: its chunks copied to a new
  // data id, and its manifest recording chunk checksum algorithm `algorithm`.
  void StoreCopy(const std::string& from, const std::string& to, records::ChunkChecksum algorithm) {
    StoreCopy(from, to,
              [algorithm](records::CheckpointManifest* m) { m->set_chunk_checksum(algorithm); });
  }

  // Stores a copy of checkpoint `from` as `to` (its chunks under a new data id), with `edit`
  // applied to the copy's manifest.
  void StoreCopy(const std::string& from, const std::string& to,
                 const std::function<void(records::CheckpointManifest*)>& edit) {
    auto bytes = store_->GetManifest(from);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    records::CheckpointManifest m;
    ASSERT_TRUE(m.ParseFromString(*bytes));
    auto id = store_->BeginData();
    ASSERT_TRUE(id.ok()) << id.status();
    for (records::TensorRecord& t : *m.mutable_tensors()) {
      for (records::BlobRecord& b : *t.mutable_blobs()) {
        for (int c = 0; c < b.chunk_checksums_size(); ++c) {
          ChunkAddress address{m.data_id(), t.tensor_index(), b.blob_index(),
                               static_cast<uint32_t>(c)};
          auto data = store_->ReadChunk(address, b.chunk_checksums(c));
          ASSERT_TRUE(data.ok()) << data.status();
          const std::string chunk((*data)->bytes());
          address.data_id = *id;
          ASSERT_TRUE(store_->PutChunks({{address, chunk}}).ok());
        }
      }
    }
    m.set_id(to);
    m.set_data_id(*id);
    edit(&m);
    ASSERT_TRUE(store_->CommitCheckpoint(to, m.SerializeAsString(), *id).ok());
  }

  std::unique_ptr<CheckpointStore> store_;
  CorruptingStore* corrupting_ = nullptr;  // store_
  std::unique_ptr<CheckpointManager> manager_;
  int64_t max_message_bytes_ = 0;
  FetchReader reader_ = FetchReader::kClient;  // of Fetch's streams
  bool batches_ = false;                       // Fetch's requests accept batches
  int64_t batch_messages_ = 0;                 // batches Fetch received
  // UploadRank sends each rank's tensors as one batch (RankUpload::BeginBatch / EndBatch).
  bool batched_ = false;
  int64_t part_messages_ = 0;         // data messages of rows checked that had several parts
  int64_t tile_messages_ = 0;         // data messages of tiles
  v1::UploadResponse last_response_;  // of UploadRank's last successful rank
};

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

// Strategies are stored in MindSpore's JSON and binary forms, and loaded from the binary one. A
// record with the JSON form alone (as stores hold them from before the binary form) loads as ever;
// a damaged binary form is DATA_LOSS naming it.
TEST_F(ManagerTest, StoredStrategiesLoadFromEitherForm) {
  const Strategy src = DemoSourceStrategy(), dst = DemoDestinationStrategy();
  PutStrategy("src", src);
  PutStrategy("dst", dst);
  UploadAll("ck", "src", src, DemoTensors());
  auto record_bytes = store_->GetStrategy("dst");
  ASSERT_TRUE(record_bytes.ok()) << record_bytes.status();
  records::StrategyRecord record;
  ASSERT_TRUE(record.ParseFromString(*record_bytes));
  EXPECT_FALSE(record.strategy_json().empty());
  EXPECT_FALSE(record.strategy_binary().empty());
  auto manifest_bytes = store_->GetManifest("ck");
  ASSERT_TRUE(manifest_bytes.ok()) << manifest_bytes.status();
  records::CheckpointManifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(*manifest_bytes));
  EXPECT_FALSE(manifest.strategy_json().empty());
  EXPECT_FALSE(manifest.strategy_binary().empty());

  record.clear_strategy_binary();
  ASSERT_TRUE(store_->PutStrategy("dst", record.SerializeAsString(), /*overwrite=*/true).ok());
  ASSERT_NO_FATAL_FAILURE(StoreCopy(
      "ck", "json_only", [](records::CheckpointManifest* m) { m->clear_strategy_binary(); }));
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
  const Shape shape = {2400, 512};  // Float32, 4.7 MiB
  const Strategy rows8 = strategy(layout({8}, {{0}, {}}));
  const Strategy opt8 = strategy(layout({2, 4}, {{1}, {}}, 4));  // rows by 2, opt shard 4
  struct Case {
    std::string name;
    const Strategy* src;
    Strategy dst;
    double bound;
  };
  std::vector<Case> cases = {
      {"rows 8 -> rows 3", &rows8, strategy(layout({3}, {{0}, {}})), 1.1},
      {"rows 8 -> columns 4", &rows8, strategy(layout({4}, {{}, {0}})), 1.25},
      {"opt-sharded 8 -> rows 2", &opt8, strategy(layout({2}, {{0}, {}})), 1.25},
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
      const Box box = *c.src->Find("w")->layout.SliceBox(shape, r);
      const std::string bytes = SampleSlice("w", DType::kFloat32, shape, box, kSeed);
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
      const Box box = *c.dst.Find("w")->layout.SliceBox(shape, r);
      ASSERT_EQ(got, SampleSlice("w", DType::kFloat32, shape, box, kSeed)) << c.name;
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

}  // namespace
}  // namespace ckpt
