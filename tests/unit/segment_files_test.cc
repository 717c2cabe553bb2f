// SegmentFiles (storage/internal/segment_files.h): the files that hold the RocksDB store's chunk
// bytes. Small windows and budgets so that every path (shared windows, copies over the budget,
// chunks larger than a window) runs on little data.
#include "storage/internal/segment_files.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/random_layouts.h"

namespace ckpt::segment_internal {
namespace {

using ::testing::HasSubstr;

const int64_t kPage = ::sysconf(_SC_PAGESIZE);

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

class SegmentFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/segment_files_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    files_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Open(SegmentOptions options) {
    auto files = SegmentFiles::Open(dir_ + "/segments", options);
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *std::move(files);
  }
  // Small windows: 4 pages, a budget of 3 windows, 2 kept after use.
  static SegmentOptions Small() {
    SegmentOptions o;
    o.window_bytes = 4 * kPage;
    o.window_budget_bytes = 3 * o.window_bytes;
    o.recent_windows = 2;
    o.write_behind_bytes = 8 * kPage;
    return o;
  }
  // Appends `bytes` as the only piece of a call to `id`'s file; its offset.
  uint64_t AppendOne(uint64_t id, const std::string& bytes) {
    auto offsets = files_->Append(id, {bytes});
    EXPECT_TRUE(offsets.ok()) << offsets.status();
    return offsets.ok() && offsets->size() == 1 ? (*offsets)[0] : ~uint64_t{0};
  }
  std::unique_ptr<ChunkData> Read(uint64_t id, uint64_t offset, uint64_t length) {
    auto data = files_->Read(id, offset, length, "test chunk");
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? *std::move(data) : nullptr;
  }

  std::string dir_;
  std::unique_ptr<SegmentFiles> files_;
};

// Random pieces (empty, tiny, around a window, larger than one) appended by several threads at
// once: every piece reads back exactly, pieces never overlap, and none of at most a window
// straddles a window boundary.
TEST_F(SegmentFilesTest, ConcurrentAppendsReadBackExactlyWithoutStraddlingWindows) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  const int64_t w = Small().window_bytes;
  const uint64_t seed = testing::PropertySeed(17);
  constexpr int kThreads = 4;
  constexpr int kBatches = 30;
  std::vector<std::vector<std::pair<uint64_t, std::string>>> written(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(t));
      for (int b = 0; b < kBatches; ++b) {
        std::vector<std::string> pieces(1 + rng() % 5);
        for (std::string& p : pieces) {
          const int64_t sizes[] = {0, 1, 100, w - 1, w, w + 1, 3 * w + 7,
                                   static_cast<int64_t>(rng() % (2 * w))};
          p = RandomBytes(static_cast<size_t>(sizes[rng() % 8]), rng);
        }
        const std::vector<std::string_view> views(pieces.begin(), pieces.end());
        auto offsets = files_->Append(7, views);
        ASSERT_TRUE(offsets.ok()) << offsets.status();
        ASSERT_EQ(offsets->size(), pieces.size());
        for (size_t i = 0; i < pieces.size(); ++i) {
          written[t].push_back({(*offsets)[i], std::move(pieces[i])});
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& thread_pieces : written) {
    for (const auto& [offset, bytes] : thread_pieces) {
      const auto n = static_cast<int64_t>(bytes.size());
      if (n > 0 && n <= w) {
        EXPECT_EQ(static_cast<int64_t>(offset) / w, (static_cast<int64_t>(offset) + n - 1) / w)
            << "piece of " << n << " bytes at " << offset << " straddles a window";
      }
      if (n > 0) ranges.push_back({offset, offset + bytes.size()});
      std::unique_ptr<ChunkData> data = Read(7, offset, bytes.size());
      ASSERT_NE(data, nullptr);
      ASSERT_EQ(data->bytes(), bytes) << "piece of " << n << " bytes at " << offset;
    }
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    EXPECT_LE(ranges[i - 1].second, ranges[i].first) << "pieces overlap at " << ranges[i].first;
  }
  ASSERT_TRUE(files_->Sync(7).ok());
  EXPECT_TRUE(files_->Sync(8).ok());  // nothing appended: no file, nothing to sync
}

// Views share a window while it is within the budget; past the budget chunks come back as
// copies, still right; released, only the most recently used windows stay mapped.
TEST_F(SegmentFilesTest, WindowsAreSharedWithinTheBudgetAndCopiedBeyondIt) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  const int64_t w = Small().window_bytes;
  std::mt19937_64 rng(3);
  // One piece of half a window in each of 8 windows (a second would straddle: it starts the next).
  std::vector<std::string> pieces;
  for (int i = 0; i < 8; ++i) pieces.push_back(RandomBytes(static_cast<size_t>(w / 2 + 1), rng));
  const std::vector<std::string_view> views(pieces.begin(), pieces.end());
  auto offsets = files_->Append(1, views);
  ASSERT_TRUE(offsets.ok()) << offsets.status();
  for (size_t i = 0; i < pieces.size(); ++i) EXPECT_EQ((*offsets)[i], i * static_cast<uint64_t>(w));

  std::vector<std::unique_ptr<ChunkData>> held;
  for (size_t i = 0; i < pieces.size(); ++i) {
    held.push_back(Read(1, (*offsets)[i], pieces[i].size()));
    ASSERT_NE(held.back(), nullptr);
    EXPECT_EQ(held.back()->bytes(), pieces[i]);
  }
  EXPECT_EQ(files_->mapped_windows(), 3);  // the budget; the other 5 are copies
  // A second view of a mapped chunk shares its window: the same memory.
  std::unique_ptr<ChunkData> again = Read(1, (*offsets)[0], pieces[0].size());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->bytes().data(), held[0]->bytes().data());
  EXPECT_EQ(files_->mapped_windows(), 3);

  held.clear();
  again.reset();
  EXPECT_EQ(files_->mapped_windows(), 2);  // recent_windows
  // With the budget free again, a read maps its window, which joins the recent ones (pushing
  // the oldest out), and a second read shares it.
  std::unique_ptr<ChunkData> later = Read(1, (*offsets)[6], pieces[6].size());
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->bytes(), pieces[6]);
  EXPECT_EQ(files_->mapped_windows(), 2);
  std::unique_ptr<ChunkData> shared = Read(1, (*offsets)[6], pieces[6].size());
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->bytes().data(), later->bytes().data());

  // With the budget full of windows that chunks hold, a read is a copy; a recent window no chunk
  // holds any more gives way to a new one instead.
  const int64_t copied = files_->bytes_copied();
  std::unique_ptr<ChunkData> a = Read(1, (*offsets)[0], pieces[0].size());
  std::unique_ptr<ChunkData> b = Read(1, (*offsets)[1], pieces[1].size());
  EXPECT_EQ(files_->mapped_windows(), 3);  // 6 (held), 0 and 1
  std::unique_ptr<ChunkData> c = Read(1, (*offsets)[2], pieces[2].size());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->bytes(), pieces[2]);
  EXPECT_EQ(files_->bytes_copied(), copied + static_cast<int64_t>(pieces[2].size()));
  a.reset();  // window 0 stays mapped as a recent one
  EXPECT_EQ(files_->mapped_windows(), 3);
  std::unique_ptr<ChunkData> d = Read(1, (*offsets)[3], pieces[3].size());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->bytes(), pieces[3]);
  EXPECT_EQ(files_->bytes_copied(), copied + static_cast<int64_t>(pieces[2].size()))
      << "window 0, idle, should have made room for window 3";
  EXPECT_EQ(files_->mapped_windows(), 3);  // 6, 1 and 3
  EXPECT_EQ(b->bytes(), pieces[1]);
}

TEST_F(SegmentFilesTest, RemovedFilesKeepTheirViewsAndThenReadAsMissing) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  std::mt19937_64 rng(5);
  const std::string bytes = RandomBytes(5000, rng);
  const uint64_t offset = AppendOne(42, bytes);
  std::unique_ptr<ChunkData> view = Read(42, offset, bytes.size());
  ASSERT_NE(view, nullptr);
  std::ofstream(dir_ + "/segments/notes.txt") << "not a segment";
  std::ofstream(dir_ + "/segments/00000000000000zz.seg") << "not hex";
  auto ids = files_->List();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, std::vector<uint64_t>{42});

  ASSERT_TRUE(files_->Remove(42).ok());
  EXPECT_FALSE(std::filesystem::exists(files_->PathOf(42)));
  EXPECT_EQ(view->bytes(), bytes);  // the mapping outlives the name
  ids = files_->List();
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_TRUE(ids->empty());
  auto gone = files_->Read(42, offset, bytes.size(), "chunk x");
  ASSERT_EQ(gone.status().code(), absl::StatusCode::kDataLoss) << gone.status();
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr("chunk x: segment file "));
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr("missing"));
  EXPECT_TRUE(files_->Remove(42).ok());  // again: nothing to remove
}

TEST_F(SegmentFilesTest, ViewsOutliveTheSegmentFiles) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  std::mt19937_64 rng(9);
  const std::string bytes = RandomBytes(3000, rng);
  const uint64_t offset = AppendOne(5, bytes);
  std::unique_ptr<ChunkData> view = Read(5, offset, bytes.size());
  ASSERT_NE(view, nullptr);
  files_.reset();
  EXPECT_EQ(view->bytes(), bytes);
  view.reset();  // unmaps and gives its bytes back to the (shared) window budget
}

TEST_F(SegmentFilesTest, LocationsPastTheFileAreDataLoss) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  ASSERT_EQ(AppendOne(3, std::string(100, 'a')), 0u);
  for (const auto& [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {0, 101}, {100, 1}, {~uint64_t{0} - 5, 10}, {5, ~uint64_t{0}}}) {
    auto data = files_->Read(3, offset, length, "chunk y");
    ASSERT_EQ(data.status().code(), absl::StatusCode::kDataLoss)
        << offset << "+" << length << ": " << data.status();
    EXPECT_THAT(std::string(data.status().message()), HasSubstr("chunk y"));
  }
  auto empty = files_->Read(3, 100, 0, "chunk z");  // an empty chunk needs no bytes
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE((*empty)->bytes().empty());
}

TEST_F(SegmentFilesTest, WindowSizeMustBeWholePages) {
  SegmentOptions options;
  options.window_bytes = kPage + 1;
  auto files = SegmentFiles::Open(dir_ + "/segments", options);
  ASSERT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << files.status();
  EXPECT_THAT(std::string(files.status().message()), HasSubstr("page size"));
  options.window_bytes = 0;
  EXPECT_FALSE(SegmentFiles::Open(dir_ + "/segments", options).ok());
}

}  // namespace
}  // namespace ckpt::segment_internal
