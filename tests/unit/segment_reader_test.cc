// The segment reader (storage/internal/segment_reader.h): windows shared within the map budget,
// copies beyond it, removed files, views that outlive the reader. Small windows and budgets
// (tests/testing/segment_files.h) so that every path runs on little data.
#include "storage/internal/segment_reader.h"

#include <cstdint>
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
#include "tests/testing/segment_files.h"

namespace ckpt::segment_internal {
namespace {

using ::testing::HasSubstr;

class SegmentReaderTest : public SegmentFilesTest {
 protected:
  // Opens with Small() and appends one piece of half a window and a byte to each of data id 1's
  // first 8 windows, in one call (a second piece would straddle a window boundary, so each starts
  // the next window); with `synced`, Syncs it, so that reads come from the file.
  void OpenWithOnePiecePerWindow(uint64_t seed, bool synced, std::vector<std::string>* pieces) {
    ASSERT_NO_FATAL_FAILURE(Open(Small()));
    const uint64_t id = 1;
    const int64_t w = Small().window_bytes;
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 8; ++i) pieces->push_back(RandomBytes(static_cast<size_t>(w / 2 + 1), rng));
    const std::vector<std::string_view> views(pieces->begin(), pieces->end());
    auto offsets = files_->Append(id, views);
    ASSERT_TRUE(offsets.ok()) << offsets.status();
    for (size_t i = 0; i < pieces->size(); ++i) {
      ASSERT_EQ((*offsets)[i], i * static_cast<uint64_t>(w)) << "piece " << i;
    }
    if (synced) {
      ASSERT_TRUE(files_->Sync(id).ok());
    }
  }
};

// Views share a window while it is within the budget; past the budget chunks come back as
// copies, still right; released, only the most recently used windows stay mapped.
TEST_F(SegmentReaderTest, WindowsAreSharedWithinTheBudgetAndCopiedBeyondIt) {
  std::vector<std::string> pieces;
  ASSERT_NO_FATAL_FAILURE(OpenWithOnePiecePerWindow(3, /*synced=*/false, &pieces));
  const auto w = static_cast<uint64_t>(Small().window_bytes);  // piece i is at i * w

  std::vector<std::unique_ptr<ChunkData>> held;
  for (size_t i = 0; i < pieces.size(); ++i) {
    held.push_back(Read(1, i * w, pieces[i].size()));
    ASSERT_NE(held.back(), nullptr);
    EXPECT_EQ(held.back()->bytes(), pieces[i]);
  }
  EXPECT_EQ(files_->mapped_windows(), 3);  // the budget; the other 5 are copies
  // A second view of a mapped chunk shares its window: the same memory.
  std::unique_ptr<ChunkData> again = Read(1, 0, pieces[0].size());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->bytes().data(), held[0]->bytes().data());
  EXPECT_EQ(files_->mapped_windows(), 3);

  held.clear();
  again.reset();
  EXPECT_EQ(files_->mapped_windows(), 2);  // recent_windows
  // With the budget free again, a read maps its window, which joins the recent ones (pushing
  // the oldest out), and a second read shares it.
  std::unique_ptr<ChunkData> later = Read(1, 6 * w, pieces[6].size());
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->bytes(), pieces[6]);
  EXPECT_EQ(files_->mapped_windows(), 2);
  std::unique_ptr<ChunkData> shared = Read(1, 6 * w, pieces[6].size());
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->bytes().data(), later->bytes().data());

  // With the budget full of windows that chunks hold, a read is a copy; a recent window no chunk
  // holds any more gives way to a new one instead.
  const int64_t copied = files_->bytes_copied();
  std::unique_ptr<ChunkData> a = Read(1, 0, pieces[0].size());
  std::unique_ptr<ChunkData> b = Read(1, 1 * w, pieces[1].size());
  EXPECT_EQ(files_->mapped_windows(), 3);  // 6 (held), 0 and 1
  std::unique_ptr<ChunkData> c = Read(1, 2 * w, pieces[2].size());
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->bytes(), pieces[2]);
  EXPECT_EQ(files_->bytes_copied(), copied + static_cast<int64_t>(pieces[2].size()));
  a.reset();  // window 0 stays mapped as a recent one
  EXPECT_EQ(files_->mapped_windows(), 3);
  std::unique_ptr<ChunkData> d = Read(1, 3 * w, pieces[3].size());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->bytes(), pieces[3]);
  EXPECT_EQ(files_->bytes_copied(), copied + static_cast<int64_t>(pieces[2].size()))
      << "window 0, idle, should have made room for window 3";
  EXPECT_EQ(files_->mapped_windows(), 3);  // 6, 1 and 3
  EXPECT_EQ(b->bytes(), pieces[1]);
}

// The budget counts the pages a window mapped, in units of a write block, not the window's
// length: a reader of a little of many windows (a column band) holds them all mapped within a
// budget of fewer whole windows, and a unit mapped once costs nothing more.
TEST_F(SegmentReaderTest, WindowsCountTheUnitsTheyMapAgainstTheBudget) {
  // Windows of 4 pages, blocks (units) of 2, a budget of 12 pages.
  std::vector<std::string> pieces;
  ASSERT_NO_FATAL_FAILURE(OpenWithOnePiecePerWindow(5, /*synced=*/true, &pieces));
  const int64_t w = Small().window_bytes;
  const int64_t unit = Small().write_block_bytes;

  const int64_t copied = files_->bytes_copied();
  std::vector<std::unique_ptr<ChunkData>> held;
  auto read = [&](int window, int64_t at, int64_t n) {
    held.push_back(Read(1, static_cast<uint64_t>(window * w + at), static_cast<uint64_t>(n)));
    ASSERT_NE(held.back(), nullptr);
    EXPECT_EQ(held.back()->bytes(),
              pieces[window].substr(static_cast<size_t>(at), static_cast<size_t>(n)));
  };
  for (int i = 0; i < 6; ++i) read(i, 0, 100);  // the first unit of six windows
  EXPECT_EQ(files_->mapped_windows(), 6);       // whole windows, only 3 would fit
  EXPECT_EQ(files_->mapped_bytes(), 6 * unit);
  EXPECT_EQ(files_->bytes_copied(), copied);
  read(2, 200, 100);  // a unit mapped already
  EXPECT_EQ(files_->mapped_bytes(), 6 * unit);
  EXPECT_EQ(files_->bytes_copied(), copied);
  read(0, unit, 1);  // a unit not mapped, with the budget full of held windows: a copy
  EXPECT_EQ(files_->mapped_bytes(), 6 * unit);
  EXPECT_EQ(files_->bytes_copied(), copied + 1);
  // Released: the 2 most recent windows stay mapped, with their units.
  held.clear();
  EXPECT_EQ(files_->mapped_windows(), 2);
  EXPECT_EQ(files_->mapped_bytes(), 2 * unit);
  // A chunk across both units of a window maps (and counts) both; the window joins the recent
  // ones, pushing out the older of the two (whose unit goes with it).
  read(6, unit - 10, 11);
  EXPECT_EQ(files_->mapped_windows(), 2);
  EXPECT_EQ(files_->mapped_bytes(), 3 * unit);
  EXPECT_EQ(files_->bytes_copied(), copied + 1);
}

// Readers of random ranges of eight windows at once, each holding a few chunks at a time, with a
// budget of three windows' pages: every chunk reads right (a view or a copy), and once they are
// released, what stays mapped is within the budget and is the units of the windows kept.
TEST_F(SegmentReaderTest, ConcurrentReadersShareWindowsWithinTheBudget) {
  std::vector<std::string> pieces;
  ASSERT_NO_FATAL_FAILURE(OpenWithOnePiecePerWindow(7, /*synced=*/true, &pieces));
  const int64_t w = Small().window_bytes;
  const int64_t unit = Small().write_block_bytes;
  const uint64_t seed = testing::PropertySeed(23);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + static_cast<uint64_t>(t));
      std::vector<std::unique_ptr<ChunkData>> held;
      for (int k = 0; k < 400; ++k) {
        const size_t i = rng() % pieces.size();
        const size_t at = rng() % pieces[i].size();
        const size_t n = 1 + rng() % (pieces[i].size() - at);
        auto data = files_->Read(1, i * static_cast<uint64_t>(w) + at, n, "chunk");
        ASSERT_TRUE(data.ok()) << data.status();
        ASSERT_EQ((*data)->bytes(), std::string_view(pieces[i]).substr(at, n))
            << "window " << i << " bytes [" << at << ", " << at + n << ")";
        held.push_back(*std::move(data));
        if (held.size() > 3) held.erase(held.begin() + static_cast<std::ptrdiff_t>(rng() % 4));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(files_->bytes_copied(), 0) << "the budget never ran out: the test reads too little";
  EXPECT_LE(files_->mapped_windows(), 2);  // recent_windows
  EXPECT_LE(files_->mapped_bytes(), 2 * w);
  EXPECT_EQ(files_->mapped_bytes() % unit, 0);
  EXPECT_LE(files_->mapped_bytes(), Small().window_budget_bytes);
}

// A cursor (a run of reads by one caller) reads what single reads do: views of the same windows
// within the budget, units mapped when first needed (a unit of a window the cursor has seen
// before is still counted and mapped when it is new), copies beyond the budget, several files in
// turn, and a window mapped while a live file was shorter not reused past its end.
TEST_F(SegmentReaderTest, ACursorReadsWhatSingleReadsDo) {
  std::vector<std::string> pieces;
  ASSERT_NO_FATAL_FAILURE(OpenWithOnePiecePerWindow(11, /*synced=*/true, &pieces));
  const int64_t w = Small().window_bytes;
  const int64_t unit = Small().write_block_bytes;
  std::mt19937_64 rng(12);
  const std::string other = RandomBytes(3000, rng);
  const uint64_t other_at = AppendOne(2, other);
  ASSERT_TRUE(files_->Sync(2).ok());

  ReadCursor cursor;
  std::vector<std::unique_ptr<ChunkData>> held;
  auto read = [&](uint64_t id, uint64_t at, uint64_t n, std::string_view want) {
    auto data = files_->Read(id, at, n, "chunk", cursor);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ((*data)->bytes(), want) << "data id " << id << " at " << at;
    held.push_back(*std::move(data));
  };
  // The first unit of windows 0 and 1, in turn with the other file.
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 2; ++i) {
      read(1, static_cast<uint64_t>(i * w + 10 * round), 100,
           std::string_view(pieces[i]).substr(static_cast<size_t>(10 * round), 100));
      read(2, other_at + 7 * round, 50, std::string_view(other).substr(7 * round, 50));
    }
  }
  EXPECT_EQ(files_->mapped_windows(), 3);
  // Data id 2's window is as long as its file.
  const auto other_unit = static_cast<int64_t>(other.size());
  EXPECT_EQ(files_->mapped_bytes(), 2 * unit + other_unit);
  // Views of one window share its memory with a single read's.
  std::unique_ptr<ChunkData> single = Read(1, 0, 100);
  ASSERT_NE(single, nullptr);
  EXPECT_EQ(single->bytes().data(), held[0]->bytes().data());
  // The second unit of window 0 (its piece's last byte), right after a read of its first unit:
  // mapped and counted now, through the cursor.
  read(1, 20, 100, std::string_view(pieces[0]).substr(20, 100));
  read(1, static_cast<uint64_t>(unit), 1,
       std::string_view(pieces[0]).substr(static_cast<size_t>(unit), 1));
  EXPECT_EQ(files_->mapped_bytes(), 3 * unit + other_unit);
  // The budget (6 units) has no room for a unit more once 2 more windows' first units are
  // mapped; a unit beyond is a copy.
  read(1, static_cast<uint64_t>(2 * w), 100, std::string_view(pieces[2]).substr(0, 100));
  read(1, static_cast<uint64_t>(3 * w), 100, std::string_view(pieces[3]).substr(0, 100));
  const int64_t copied = files_->bytes_copied();
  read(1, static_cast<uint64_t>(w + unit), 1,
       std::string_view(pieces[1]).substr(static_cast<size_t>(unit), 1));
  EXPECT_EQ(files_->bytes_copied(), copied + 1);
  EXPECT_LE(files_->mapped_bytes(), Small().window_budget_bytes);

  // Data id 3 grows while the cursor holds the window it mapped when the file was shorter.
  held.clear();
  single.reset();
  ReadCursor growing;
  const std::string first = RandomBytes(200, rng);
  const std::string second = RandomBytes(static_cast<size_t>(kPage) + 300, rng);  // past a page
  const uint64_t first_at = AppendOne(3, first);
  ASSERT_TRUE(files_->Sync(3).ok());
  auto a = files_->Read(3, first_at, first.size(), "chunk", growing);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->bytes(), first);
  const uint64_t second_at = AppendOne(3, second);
  ASSERT_TRUE(files_->Sync(3).ok());
  ASSERT_LT(second_at + second.size(), static_cast<uint64_t>(w)) << "the same window";
  auto b = files_->Read(3, second_at, second.size(), "chunk", growing);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->bytes(), second);
}

TEST_F(SegmentReaderTest, RemovedFilesKeepTheirViewsAndThenReadAsMissing) {
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

TEST_F(SegmentReaderTest, ViewsOutliveTheSegmentFiles) {
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

TEST_F(SegmentReaderTest, LocationsPastTheFileAreDataLoss) {
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

TEST_F(SegmentReaderTest, WindowSizeMustBeWholePages) {
  SegmentOptions options;
  options.window_bytes = kPage + 1;
  auto files = SegmentFilesForTest::Open(dir_ + "/segments", options);
  ASSERT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << files.status();
  EXPECT_THAT(std::string(files.status().message()), HasSubstr("page size"));
  options.window_bytes = 0;
  EXPECT_FALSE(SegmentFilesForTest::Open(dir_ + "/segments", options).ok());
}

}  // namespace
}  // namespace ckpt::segment_internal
