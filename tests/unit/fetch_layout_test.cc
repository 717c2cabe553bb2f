// Batches of direct tensors (service/engine/fetch_layout.h): a fetch of many small tensors made
// from the plan's layout delivers, tensor for tensor and byte for byte, what the band path
// delivers, with parts that verify; tensors that are not direct mix in; and damaged chunks are
// still DATA_LOSS naming the tensor, for a lone stream and for every stream sharing the chunk.
#include <cstdint>
#include <map>
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
#include "gtest/gtest.h"
#include "service/engine/fetch_stream.h"
#include "service/engine/manager.h"
#include "storage/checkpoint_store.h"
#include "tests/testing/forwarding_store.h"
#include "tests/testing/manager_uploads.h"

namespace ckpt {
namespace {

constexpr uint64_t kLayoutSeed = 5;
constexpr int kSourceRanks = 8;
constexpr int kDestinationRanks = 6;

using testing::OwnedChunk;

// Around a memory store: reads of one chosen chunk come back with a byte flipped.
class DamagingStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;

  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override {
    auto data = base().ReadChunkUnverified(address);
    std::lock_guard<std::mutex> lock(mu_);
    if (!data.ok() || !damaged_ || !(*damaged_ == address)) return data;
    std::string bytes((*data)->bytes());
    bytes[bytes.size() / 2] ^= 0x10;
    return std::unique_ptr<ChunkData>(new OwnedChunk(std::move(bytes)));
  }
  void Damage(std::optional<ChunkAddress> address) {
    std::lock_guard<std::mutex> lock(mu_);
    damaged_ = address;
  }

 private:
  std::mutex mu_;
  std::optional<ChunkAddress> damaged_;
};

// Small tensors of 24 rows, row-split 8 ways at the source; at the destination split 6 ways by
// rows (each rank's slice straddles two stored slices: a whole chunk and part of another, or two
// parts), except every 7th, split by columns (not direct), and one large one.
std::vector<SampleTensor> LayoutTensors() {
  std::vector<SampleTensor> out;
  for (int i = 0; i < 60; ++i) {
    const DType dtype =
        i % 3 == 0 ? DType::kFloat32 : (i % 3 == 1 ? DType::kFloat16 : DType::kInt8);
    if (i % 7 == 3) {
      out.push_back({absl::StrCat("col.", i), dtype, {24, 48}});
    } else {
      out.push_back({absl::StrCat("row.", i), dtype, {24, 8 + 8 * (i % 4)}});
    }
  }
  out.push_back({"row.large", DType::kFloat32, {96, 2048}});
  return out;
}

Strategy MakeStrategy(int64_t ranks, bool destination) {
  std::map<std::string, StrategyParam> params;
  for (const SampleTensor& t : LayoutTensors()) {
    Layout l;
    l.dev_matrix = {ranks};
    const bool columns = destination && t.name.starts_with("col.");
    l.tensor_map = columns ? std::vector<std::vector<int32_t>>{{}, {0}}
                           : std::vector<std::vector<int32_t>>{{0}, {}};
    params[t.name] = StrategyParam{l, std::nullopt};
  }
  return *Strategy::Create(std::move(params), 1);
}

// A stream's delivery as the client sees it: per tensor its header and bytes (whatever messages
// carried them), or the status the stream ended with.
struct Delivery {
  absl::Status status;
  bool parts_ok = true;              // every part's checksum matched its bytes
  std::vector<std::string> tensors;  // header, "|", bytes
  int64_t batches = 0;
  int64_t direct_tensors = 0;
};

class FetchLayoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = std::make_unique<DamagingStore>(NewMemoryStore());
    damaging_ = store.get();
    store_ = std::move(store);
    Restart(true);
  }

  void Restart(bool direct_batches) {
    manager_.reset();
    ManagerOptions options;
    options.fetch.direct_batches = direct_batches;
    options.fetch.batch_first_tensors = 4;
    options.fetch.batch_max_tensors = 32;
    manager_ = std::make_unique<CheckpointManager>(store_.get(), options);
    if (uploaded_) return;
    const Strategy src = MakeStrategy(kSourceRanks, false);
    const Strategy dst = MakeStrategy(kDestinationRanks, true);
    for (const auto& [name, s] : {std::pair{"src", &src}, std::pair{"dst", &dst}}) {
      auto info = manager_->PutStrategy(name, SerializeStrategy(*s, StrategyFormat::kJson),
                                        v1::STRATEGY_FORMAT_JSON, false);
      ASSERT_TRUE(info.ok()) << info.status();
    }
    const absl::Status uploaded =
        testing::UploadSampleRanks(*manager_, "ck", "src", src, LayoutTensors(), kLayoutSeed);
    ASSERT_TRUE(uploaded.ok()) << uploaded;
    uploaded_ = true;
  }

  absl::StatusOr<std::unique_ptr<FetchStream>> Open(int64_t rank) {
    v1::FetchRequest req;
    req.set_checkpoint_id("ck");
    req.set_destination_strategy("dst");
    req.set_rank(rank);
    req.set_accept_batches(true);
    return manager_->OpenFetch(req);
  }

  // One message of `stream` into `out`; false at the end or on an error (in out->status).
  static bool Step(FetchStream& stream, Delivery* out) {
    FetchPiece piece;
    auto more = stream.NextPiece(&piece, FetchReader::kClient);
    out->direct_tensors = stream.direct_tensors();
    if (!more.ok()) {
      out->status = more.status();
      return false;
    }
    if (!*more) return false;
    std::string data;
    for (const DataSegment& s : piece.segments) data += s.bytes;
    size_t offset = 0;
    for (const ChecksumPart& p : piece.parts) {
      if (Checksum(std::string_view(data).substr(offset, static_cast<size_t>(p.bytes))) !=
          p.checksum) {
        out->parts_ok = false;
      }
      offset += static_cast<size_t>(p.bytes);
    }
    if (!piece.parts.empty() && offset != data.size()) out->parts_ok = false;
    if (piece.message.has_batch()) {
      ++out->batches;
      v1::FetchTensorBatch batch;
      EXPECT_TRUE(batch.ParseFromString(piece.batch_headers));
      size_t at = 0;
      for (const v1::FetchTensorHeader& h : batch.tensors()) {
        const auto n = static_cast<size_t>(h.total_bytes());
        out->tensors.push_back(absl::StrCat(h.SerializeAsString(), "|", data.substr(at, n)));
        at += n;
      }
      EXPECT_EQ(at, data.size());
    } else if (piece.message.has_tensor()) {
      out->tensors.push_back(absl::StrCat(piece.message.tensor().SerializeAsString(), "|"));
    } else if (!piece.segments.empty() && !out->tensors.empty()) {
      out->tensors.back() += data;
    }
    return true;
  }

  Delivery Fetch(int64_t rank) {
    Delivery out;
    auto stream = Open(rank);
    if (!stream.ok()) {
      out.status = stream.status();
      return out;
    }
    while (Step(**stream, &out)) {
    }
    return out;
  }

  // The first chunk of `tensor`'s stored slice that starts at row `slice` x 3 (source rank
  // `slice`'s), from the manifest.
  ChunkAddress ChunkOf(const std::string& tensor, int64_t slice) {
    auto encoded = store_->GetManifest("ck");
    EXPECT_TRUE(encoded.ok()) << encoded.status();
    records::CheckpointManifest m;
    EXPECT_TRUE(encoded.ok() && m.ParseFromString(*encoded));
    for (const records::TensorRecord& t : m.tensors()) {
      if (t.name() != tensor) continue;
      for (const records::BlobRecord& b : t.blobs()) {
        if (b.box_lo_size() > 0 && b.box_lo(0) == 3 * slice) {
          return ChunkAddress{m.data_id(), t.tensor_index(), b.blob_index(), 0};
        }
      }
    }
    ADD_FAILURE() << "no stored slice " << slice << " of " << tensor;
    return ChunkAddress{};
  }

  std::unique_ptr<CheckpointStore> store_;
  DamagingStore* damaging_ = nullptr;
  std::unique_ptr<CheckpointManager> manager_;
  bool uploaded_ = false;
};

TEST_F(FetchLayoutTest, DirectBatchesDeliverWhatTheBandPathDelivers) {
  std::vector<Delivery> banded(kDestinationRanks);
  Restart(false);
  for (int r = 0; r < kDestinationRanks; ++r) {
    banded[r] = Fetch(r);
    ASSERT_TRUE(banded[r].status.ok()) << r << ": " << banded[r].status;
    EXPECT_TRUE(banded[r].parts_ok);
    EXPECT_EQ(banded[r].direct_tensors, 0);
    EXPECT_EQ(banded[r].tensors.size(), LayoutTensors().size());
  }
  Restart(true);
  for (int r = 0; r < kDestinationRanks; ++r) {
    const Delivery direct = Fetch(r);
    ASSERT_TRUE(direct.status.ok()) << r << ": " << direct.status;
    EXPECT_TRUE(direct.parts_ok) << r;
    EXPECT_GT(direct.batches, 1) << r;
    // Every small row-split tensor is direct; the column-split ones and the large one are not.
    EXPECT_GE(direct.direct_tensors, 45) << r;
    EXPECT_LT(direct.direct_tensors, static_cast<int64_t>(LayoutTensors().size()) - 1) << r;
    ASSERT_EQ(direct.tensors.size(), banded[r].tensors.size()) << r;
    for (size_t i = 0; i < direct.tensors.size(); ++i) {
      EXPECT_EQ(direct.tensors[i], banded[r].tensors[i]) << "rank " << r << " tensor " << i;
    }
  }
}

TEST_F(FetchLayoutTest, DamagedChunkOfADirectTensorIsDataLossNamingIt) {
  // row.4 (24 rows): destination rank 1 holds rows 4..8 of it, rows 4..6 of stored slice 1
  // and rows 6..8 of slice 2: parts of chunks, verified on the server.
  for (int64_t slice : {1, 2}) {
    damaging_->Damage(ChunkOf("row.4", slice));
    manager_->shared_chunks()->Clear();
    const Delivery d = Fetch(1);
    EXPECT_TRUE(absl::IsDataLoss(d.status)) << slice << ": " << d.status;
    EXPECT_NE(d.status.message().find("row.4"), std::string::npos) << d.status;
    EXPECT_GT(d.direct_tensors, 0);
  }
  // The same tensor on rank 0: rows 0..3 are stored slice 0 whole (smaller than min_part_bytes,
  // so verified on the server too).
  damaging_->Damage(ChunkOf("row.4", 0));
  manager_->shared_chunks()->Clear();
  Delivery d = Fetch(0);
  EXPECT_TRUE(absl::IsDataLoss(d.status)) << d.status;
  EXPECT_NE(d.status.message().find("row.4"), std::string::npos) << d.status;
  // Mended: delivered again.
  damaging_->Damage(std::nullopt);
  manager_->shared_chunks()->Clear();
  d = Fetch(0);
  EXPECT_TRUE(d.status.ok()) << d.status;
  EXPECT_TRUE(d.parts_ok);
}

TEST_F(FetchLayoutTest, DamagedSharedChunkIsDataLossForEveryStreamOfTheRank) {
  // Two replicas of rank 1, message by message in turns: the second shares the first's chunks
  // (verified for it), and both fail on the damaged one.
  damaging_->Damage(ChunkOf("row.4", 2));
  manager_->shared_chunks()->Clear();
  auto a = Open(1);
  auto b = Open(1);
  ASSERT_TRUE(a.ok() && b.ok());
  Delivery da, db;
  bool more_a = true, more_b = true;
  while (more_a || more_b) {
    if (more_a) more_a = Step(**a, &da);
    if (more_b) more_b = Step(**b, &db);
  }
  EXPECT_TRUE(absl::IsDataLoss(da.status)) << da.status;
  EXPECT_TRUE(absl::IsDataLoss(db.status)) << db.status;
  EXPECT_GT(da.direct_tensors + db.direct_tensors, 0);
  damaging_->Damage(std::nullopt);
}

}  // namespace
}  // namespace ckpt
