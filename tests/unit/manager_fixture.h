// The fixture of the manager tests (manager_test.cc: uploads and the store; manager_fetch_test.cc:
// fetches): the service's data path in process, without gRPC. Ranks are uploaded through
// RankUpload and fetched through FetchStream over a memory store that can corrupt reads and fail
// writes, and every byte is compared with slices generated independently.
#ifndef CKPT_TESTS_UNIT_MANAGER_FIXTURE_H_
#define CKPT_TESTS_UNIT_MANAGER_FIXTURE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt_records.pb.h"
#include "client/ckptctl/sample.h"
#include "core/checksum.h"
#include "core/tile_band.h"
#include "gtest/gtest.h"
#include "service/engine/manager.h"
#include "storage/checkpoint_store.h"
#include "tests/testing/forwarding_store.h"
#include "tests/testing/manager_uploads.h"

namespace ckpt::manager_test {

inline constexpr uint64_t kSeed = 5;

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

inline v1::UploadHeader Header(const std::string& id, const std::string& strategy, int64_t rank) {
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

}  // namespace ckpt::manager_test

#endif  // CKPT_TESTS_UNIT_MANAGER_FIXTURE_H_
