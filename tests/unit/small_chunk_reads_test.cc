// Reads of many small chunks through the shared layer (SharedChunks::GetMany over the segment
// store's ReadChunksUnverified): runs of chunks stored together come back as the bytes stored,
// each verified on its own (a damaged chunk in the middle of a run is DATA_LOSS for that chunk
// only, a truncated file for the chunks it lost), and the shared cache keeps small spare chunks
// before bulk ones.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/checksum.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/engine/shared_chunks.h"
#include "storage/checkpoint_store.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::string Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class SmallChunkReadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.min_free_disk_bytes = 0;
    char tmpl[] = "/tmp/ckpt_small_reads_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    root_ = tmpl;
    Open();
  }
  void TearDown() override {
    store_.reset();
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  void Open() {
    absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
        OpenSegmentStore(root_ + "/db", options_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  // `count` sole chunks (tensor i, blob 0, chunk 0) of 100 to 899 bytes, written by one stream
  // with one PutChunks (so stored one after the other), committed.
  void Write(uint32_t count) {
    absl::StatusOr<uint64_t> id = store_->BeginData();
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
    std::vector<ChunkWrite> writes;
    for (uint32_t i = 0; i < count; ++i) {
      bytes_.push_back(Bytes(100 + (i * 389) % 800, 1000 + i));
      addresses_.push_back({id_, i, 0, 0});
    }
    for (uint32_t i = 0; i < count; ++i) writes.push_back({addresses_[i], bytes_[i], 0, true});
    ASSERT_TRUE(store_->PutChunks(writes).ok());
    ASSERT_TRUE(store_->CommitCheckpoint("ck", "m", id_).ok());
  }

  // The requests for every chunk, in a shuffled order (`order[k]` is request k's chunk).
  std::vector<SharedChunks::Request> Requests(std::vector<uint32_t>* order) const {
    order->resize(addresses_.size());
    for (uint32_t i = 0; i < order->size(); ++i) (*order)[i] = i;
    std::shuffle(order->begin(), order->end(), std::mt19937_64(7));
    std::vector<SharedChunks::Request> requests;
    for (uint32_t i : *order) requests.push_back({addresses_[i], Checksum(bytes_[i]),
                                                        absl::StatusOr<std::shared_ptr<StreamChunk>>()});
    return requests;
  }

  // The offset of chunk `i`'s bytes in the (closed) store's segment file, found by content.
  int64_t OffsetInFile(uint32_t i) const {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root_)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const size_t at = file.find(bytes_[i]);
      if (at != std::string::npos) {
        segment_ = entry.path().string();
        return static_cast<int64_t>(at);
      }
    }
    return -1;
  }

  StoreOptions options_;
  std::string root_;
  std::unique_ptr<CheckpointStore> store_;
  uint64_t id_ = 0;
  std::vector<std::string> bytes_;
  std::vector<ChunkAddress> addresses_;
  mutable std::string segment_;
};

TEST_F(SmallChunkReadsTest, RunsOfStoredChunksComeBackAsStoredAndAreVerifiedOneByOne) {
  constexpr uint32_t kChunks = 400;
  ASSERT_NO_FATAL_FAILURE(Write(kChunks));
  {
    SharedChunks chunks(store_.get(), 0);
    // The first read of the data id loads its packed locations; the next finds every chunk's.
    ASSERT_TRUE(chunks.Get(addresses_[0], Checksum(bytes_[0])).ok());
    std::vector<uint32_t> order;
    std::vector<SharedChunks::Request> requests = Requests(&order);
    int64_t stored = 0;
    for (const std::string& b : bytes_) stored += static_cast<int64_t>(b.size());
    const int64_t reads_before = store_->stats().chunks_read;
    chunks.GetMany(std::span<SharedChunks::Request>(requests));
    EXPECT_EQ(store_->stats().chunks_read - reads_before, kChunks);
    for (size_t k = 0; k < requests.size(); ++k) {
      const uint32_t i = order[k];
      ASSERT_TRUE(requests[k].result.ok()) << i << ": " << requests[k].result.status();
      StreamChunk& c = **requests[k].result;
      EXPECT_TRUE(c.data->bytes() == bytes_[i]) << i;
      EXPECT_TRUE(c.Verify().ok()) << i;
      // A view of its run (one read for many chunks), not of a mapped window of the file (which
      // would span the whole file, all the chunks): what it keeps resident is its run.
      EXPECT_GE(c.data->pin().bytes, static_cast<int64_t>(bytes_[i].size())) << i;
      EXPECT_LT(c.data->pin().bytes, stored) << i;
    }
  }
  const int64_t damaged_at = OffsetInFile(kChunks / 2);
  ASSERT_GE(damaged_at, 0);
  const int64_t cut_at = OffsetInFile(kChunks - 50);
  ASSERT_GT(cut_at, damaged_at);
  store_.reset();
  {  // One bit of a chunk in the middle of the run, behind the store's back.
    std::fstream file(segment_, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(damaged_at + 50);
    file.put(static_cast<char>(bytes_[kChunks / 2][50] ^ 0x10));
    ASSERT_TRUE(file.good());
  }
  ASSERT_NO_FATAL_FAILURE(Open());
  {
    SharedChunks chunks(store_.get(), int64_t{1} << 20);
    ASSERT_TRUE(chunks.Get(addresses_[0], Checksum(bytes_[0])).ok());
    std::vector<uint32_t> order;
    std::vector<SharedChunks::Request> requests = Requests(&order);
    chunks.GetMany(std::span<SharedChunks::Request>(requests));
    for (size_t k = 0; k < requests.size(); ++k) {
      const uint32_t i = order[k];
      ASSERT_TRUE(requests[k].result.ok()) << i << ": " << requests[k].result.status();
      const absl::Status verified = (*requests[k].result)->Verify();
      if (i == kChunks / 2) {
        ASSERT_EQ(verified.code(), absl::StatusCode::kDataLoss) << verified;
        EXPECT_THAT(std::string(verified.message()), HasSubstr(addresses_[i].ToString()));
      } else {
        EXPECT_TRUE(verified.ok()) << i << ": " << verified;
      }
    }
    // Found damaged, it is not handed out again: asked for once more, it is read from the store
    // again (and is damaged there too).
    const int64_t reads = chunks.stats().store_reads;
    absl::StatusOr<std::shared_ptr<StreamChunk>> again =
        chunks.Get(addresses_[kChunks / 2], Checksum(bytes_[kChunks / 2]));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(chunks.stats().store_reads, reads + 1);
    EXPECT_EQ((*again)->Verify().code(), absl::StatusCode::kDataLoss);
  }
  store_.reset();
  std::filesystem::resize_file(segment_, static_cast<uintmax_t>(cut_at + 3));
  ASSERT_NO_FATAL_FAILURE(Open());
  {
    SharedChunks chunks(store_.get(), 0);
    ASSERT_TRUE(chunks.Get(addresses_[0], Checksum(bytes_[0])).ok());
    std::vector<uint32_t> order;
    std::vector<SharedChunks::Request> requests = Requests(&order);
    chunks.GetMany(std::span<SharedChunks::Request>(requests));
    for (size_t k = 0; k < requests.size(); ++k) {
      const uint32_t i = order[k];
      if (i >= kChunks - 50) {  // lost its tail, or all of it
        ASSERT_EQ(requests[k].result.status().code(), absl::StatusCode::kDataLoss)
            << i << ": " << requests[k].result.status();
        EXPECT_THAT(std::string(requests[k].result.status().message()),
                    HasSubstr(addresses_[i].ToString()));
        EXPECT_THAT(std::string(requests[k].result.status().message()), HasSubstr("truncated"));
        continue;
      }
      ASSERT_TRUE(requests[k].result.ok()) << i << ": " << requests[k].result.status();
      if (i != kChunks / 2) {
        EXPECT_TRUE((*requests[k].result)->data->bytes() == bytes_[i]) << i;
      }
    }
  }
}

// Spare chunks of kBulkChunkBytes and more go before small ones, and never displace them: small
// chunks a lone stream read stay kept through a stream of large ones.
TEST(SharedChunksPolicyTest, BulkSpareChunksDoNotDisplaceSmallOnes) {
  std::unique_ptr<CheckpointStore> store = NewMemoryStore();
  absl::StatusOr<uint64_t> id = store->BeginData();
  ASSERT_TRUE(id.ok()) << id.status();
  constexpr int kSmall = 120;
  constexpr size_t kSmallBytes = 1024;
  constexpr int kBulk = 6;
  constexpr size_t kBulkBytes = 100 << 10;
  std::vector<std::string> bytes;
  std::vector<ChunkWrite> writes;
  for (int i = 0; i < kSmall + kBulk; ++i) {
    bytes.push_back(Bytes(i < kSmall ? kSmallBytes : kBulkBytes, 50 + i));
  }
  for (int i = 0; i < kSmall + kBulk; ++i) {
    writes.push_back({{*id, static_cast<uint32_t>(i), 0, 0}, bytes[i]});
  }
  ASSERT_TRUE(store->PutChunks(writes).ok());
  // Room for the small chunks and one bulk chunk, not two.
  SharedChunks chunks(store.get(), kSmall * kSmallBytes + kBulkBytes + kBulkBytes / 2);
  auto get = [&](int i) {
    absl::StatusOr<std::shared_ptr<StreamChunk>> got =
        chunks.Get({*id, static_cast<uint32_t>(i), 0, 0}, Checksum(bytes[i]));
    ASSERT_TRUE(got.ok()) << i << ": " << got.status();
    EXPECT_TRUE((*got)->data->bytes() == bytes[i]) << i;
  };
  for (int i = 0; i < kSmall; ++i) ASSERT_NO_FATAL_FAILURE(get(i));
  for (int i = kSmall; i < kSmall + kBulk; ++i) ASSERT_NO_FATAL_FAILURE(get(i));
  EXPECT_LE(chunks.stats().cached_bytes, chunks.cache_budget());
  const int64_t reads = chunks.stats().store_reads;
  for (int i = 0; i < kSmall; ++i) ASSERT_NO_FATAL_FAILURE(get(i));
  EXPECT_EQ(chunks.stats().store_reads, reads) << "small chunks were read again";
  EXPECT_EQ(chunks.stats().cache_hits, kSmall);
  // The last bulk chunk is kept (room for one), the ones before it are not.
  ASSERT_NO_FATAL_FAILURE(get(kSmall + kBulk - 1));
  EXPECT_EQ(chunks.stats().store_reads, reads);
  ASSERT_NO_FATAL_FAILURE(get(kSmall));
  EXPECT_EQ(chunks.stats().store_reads, reads + 1);
  // Small chunks past the budget displace the least recent small ones, as before.
  chunks.Clear();
  EXPECT_EQ(chunks.stats().cached_bytes, 0);
}

}  // namespace
}  // namespace ckpt
