// Reads of many small chunks through the shared layer (SharedChunks::GetMany over the segment
// store's ReadChunksUnverified, locations from the data id's packs): chunks stored together come
// back as the bytes stored, each verified on its own (a damaged chunk in the middle of them is
// DATA_LOSS for that chunk only, a truncated file for the chunks it lost).
#include <algorithm>
#include <cstdint>
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
#include "tests/testing/scratch_store.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

std::string Bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class SmallChunkReadsTest : public testing::ScratchStoreTest {
 protected:
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

  // Every chunk asked of `chunks` with one GetMany, in a shuffled order (`order[k]` is request
  // k's chunk): the requests with their results.
  std::vector<SharedChunks::Request> GetAll(SharedChunks& chunks,
                                            std::vector<uint32_t>* order) const {
    order->resize(addresses_.size());
    for (uint32_t i = 0; i < order->size(); ++i) (*order)[i] = i;
    std::shuffle(order->begin(), order->end(), std::mt19937_64(7));
    std::vector<SharedChunks::Request> requests;
    for (uint32_t i : *order)
      requests.push_back(
          {addresses_[i], Checksum(bytes_[i]), absl::StatusOr<std::shared_ptr<StreamChunk>>()});
    chunks.GetMany(std::span<SharedChunks::Request>(requests));
    return requests;
  }

  // The offset of chunk `i`'s bytes in the (closed) store's segment file, found by content.
  int64_t OffsetInFile(uint32_t i) const {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root_)) {
      if (!entry.is_regular_file()) continue;
      std::ifstream in(entry.path(), std::ios::binary);
      const std::string file((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
      const size_t at = file.find(bytes_[i]);
      if (at != std::string::npos) {
        segment_ = entry.path().string();
        return static_cast<int64_t>(at);
      }
    }
    return -1;
  }

  uint64_t id_ = 0;
  std::vector<std::string> bytes_;
  std::vector<ChunkAddress> addresses_;
  mutable std::string segment_;
};

TEST_F(SmallChunkReadsTest, ChunksStoredTogetherComeBackAsStoredAndAreVerifiedOneByOne) {
  constexpr uint32_t kChunks = 400;
  ASSERT_NO_FATAL_FAILURE(Write(kChunks));
  {
    SharedChunks chunks(store_.get(), 0);
    // The first read of the data id loads its packed locations; the next finds every chunk's.
    ASSERT_TRUE(chunks.Get(addresses_[0], Checksum(bytes_[0])).ok());
    const int64_t reads_before = store_->stats().chunks_read;
    std::vector<uint32_t> order;
    std::vector<SharedChunks::Request> requests = GetAll(chunks, &order);
    EXPECT_EQ(store_->stats().chunks_read - reads_before, kChunks);
    for (size_t k = 0; k < requests.size(); ++k) {
      const uint32_t i = order[k];
      ASSERT_TRUE(requests[k].result.ok()) << i << ": " << requests[k].result.status();
      StreamChunk& c = **requests[k].result;
      EXPECT_TRUE(c.data->bytes() == bytes_[i]) << i;
      EXPECT_TRUE(c.Verify().ok()) << i;
    }
  }
  const int64_t damaged_at = OffsetInFile(kChunks / 2);
  ASSERT_GE(damaged_at, 0);
  const int64_t cut_at = OffsetInFile(kChunks - 50);
  ASSERT_GT(cut_at, damaged_at);
  store_.reset();
  {  // One bit of a chunk in the middle, behind the store's back.
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
    std::vector<SharedChunks::Request> requests = GetAll(chunks, &order);
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
    std::vector<SharedChunks::Request> requests = GetAll(chunks, &order);
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

}  // namespace
}  // namespace ckpt
