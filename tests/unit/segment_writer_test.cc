// SegmentFiles (storage/internal/segment_writer.h): the files that hold the RocksDB store's chunk
// bytes. Small windows and budgets so that every path (shared windows, copies over the budget,
// chunks larger than a window) runs on little data.
#include "storage/internal/segment_writer.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/file_size_limit.h"
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
  // Small windows: 4 pages, a budget of 3 windows, 2 kept after use; write blocks of 2 pages.
  static SegmentOptions Small() {
    SegmentOptions o;
    o.window_bytes = 4 * kPage;
    o.window_budget_bytes = 3 * o.window_bytes;
    o.recent_windows = 2;
    o.write_behind_bytes = 8 * kPage;
    o.write_block_bytes = 2 * kPage;
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

  // The bytes of `id`'s file on disk.
  std::string FileBytes(uint64_t id) {
    std::ifstream in(files_->PathOf(id), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  void ConcurrentAppendsReadBackExactly(SegmentOptions options);
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

  // Appended pieces: offset, bytes.
  using Pieces = std::vector<std::pair<uint64_t, std::string>>;
  // Every piece reads back at its offset.
  void ExpectReadBack(uint64_t id, const Pieces& pieces) {
    for (const auto& [offset, bytes] : pieces) {
      std::unique_ptr<ChunkData> data = Read(id, offset, bytes.size());
      ASSERT_NE(data, nullptr);
      EXPECT_EQ(data->bytes(), bytes) << "piece of " << bytes.size() << " bytes at " << offset;
    }
  }
  // The file holds every piece at its offset and zeros between.
  void ExpectFileHolds(uint64_t id, const Pieces& pieces) {
    const std::string image = FileBytes(id);
    std::string expected(image.size(), '\0');
    for (const auto& [offset, bytes] : pieces) {
      ASSERT_LE(offset + bytes.size(), image.size()) << "piece at " << offset;
      expected.replace(offset, bytes.size(), bytes);
    }
    EXPECT_TRUE(image == expected) << "the file differs from the pieces and zeros between";
  }

  std::string dir_;
  std::unique_ptr<SegmentFiles> files_;
};

// Random pieces (empty, tiny, around a window, larger than one) appended by several threads at
// once, into three lanes (two threads share one): every piece reads back exactly, before and
// after Sync, pieces never overlap, none of at most a window straddles a window boundary, and
// no write block holds pieces of two lanes. After Sync the file holds every piece at its offset and
// zeros in between.
void SegmentFilesTest::ConcurrentAppendsReadBackExactly(SegmentOptions options) {
  ASSERT_NO_FATAL_FAILURE(Open(options));
  const int64_t w = options.window_bytes;
  const uint64_t seed = testing::PropertySeed(17);
  constexpr int kThreads = 4;
  constexpr int kBatches = 30;
  const int64_t block = options.write_block_bytes;
  auto lane_of = [](int t) { return static_cast<uint32_t>(t % 3); };
  std::vector<Pieces> written(kThreads);
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
        auto offsets = files_->Append(7, views, lane_of(t));
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
  std::map<int64_t, uint32_t> block_lane;  // blocks holding pieces of at most an extent
  for (int t = 0; t < kThreads; ++t) {
    for (const auto& [offset, bytes] : written[t]) {
      const auto n = static_cast<int64_t>(bytes.size());
      if (n > 0 && n <= w) {
        EXPECT_EQ(static_cast<int64_t>(offset) / w, (static_cast<int64_t>(offset) + n - 1) / w)
            << "piece of " << n << " bytes at " << offset << " straddles a window";
      }
      // A lane's extents are whole write blocks: no block holds two lanes' pieces (pieces
      // larger than an extent have regions of their own).
      if (n > 0 && n <= std::max(w, block)) {
        for (int64_t k = static_cast<int64_t>(offset) / block;
             k <= (static_cast<int64_t>(offset) + n - 1) / block; ++k) {
          const auto [it, added] = block_lane.emplace(k, lane_of(t));
          EXPECT_EQ(it->second, lane_of(t)) << "block " << k << " holds two lanes' pieces";
        }
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

  Pieces all;
  for (const Pieces& thread_pieces : written) {
    all.insert(all.end(), thread_pieces.begin(), thread_pieces.end());
  }
  ExpectReadBack(7, all);  // after Sync, from the file
  ExpectFileHolds(7, all);
}

TEST_F(SegmentFilesTest, ConcurrentAppendsReadBackExactlyWithoutStraddlingWindows) {
  ConcurrentAppendsReadBackExactly(Small());
}

TEST_F(SegmentFilesTest, ConcurrentAppendsThroughThePageCacheOnly) {
  SegmentOptions options = Small();
  options.direct_writes = false;
  ConcurrentAppendsReadBackExactly(options);
}

// Blocks larger than windows: several windows per block, holes inside blocks.
TEST_F(SegmentFilesTest, ConcurrentAppendsWithBlocksLargerThanWindows) {
  SegmentOptions options = Small();
  options.write_block_bytes = 3 * options.window_bytes;
  ConcurrentAppendsReadBackExactly(options);
}

// Each lane fills extents of its own, its pieces back to back, whatever the order of appends;
// a lane's extents grow from a block to a window and never straddle one; a piece larger than
// that gets a region of its own, and the lane goes on where it was.
TEST_F(SegmentFilesTest, LanesFillExtentsOfTheirOwn) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));  // windows of 4 pages, blocks of 2
  const int64_t p = kPage;
  const int64_t h = p / 2;
  std::mt19937_64 rng(21);
  Pieces appended;
  auto append = [&](uint32_t lane, int64_t n) {
    const std::string bytes = RandomBytes(static_cast<size_t>(n), rng);
    auto offsets = files_->Append(5, {bytes}, lane);
    EXPECT_TRUE(offsets.ok()) << offsets.status();
    appended.push_back({offsets.ok() ? (*offsets)[0] : 0, bytes});
    return offsets.ok() ? static_cast<int64_t>((*offsets)[0]) : -1;
  };
  // Interleaved appends: lane 1 gets [0, 2p) then [4p, 8p), lane 2 [2p, 4p) then [8p, 12p).
  for (int64_t k = 0; k < 8; ++k) {
    EXPECT_EQ(append(1, h), k < 4 ? k * h : 4 * p + (k - 4) * h) << "lane 1 piece " << k;
    EXPECT_EQ(append(2, h), k < 4 ? 2 * p + k * h : 8 * p + (k - 4) * h) << "lane 2 piece " << k;
  }
  for (int64_t k = 0; k < 4; ++k) EXPECT_EQ(append(2, h), 10 * p + k * h);
  EXPECT_EQ(append(2, h), 12 * p);               // lane 2's extent is full: a window's worth
  EXPECT_EQ(append(1, 8 * p + 1), 16 * p);       // larger than a window: a region of its own
  EXPECT_EQ(append(1, h), 6 * p);                // lane 1 goes on in its extent
  EXPECT_EQ(append(2, h), 12 * p + h);
  EXPECT_EQ(append(3, 0), 0);                    // nothing placed, no extent taken
  EXPECT_EQ(append(3, h), 26 * p);               // after the large piece's last block
  // A window's worth does not fit lane 3's first extent (a block): it moves on to a window,
  // and the old extent's partly filled block is written then, not at Sync.
  EXPECT_EQ(append(3, 4 * p), 28 * p);
  EXPECT_EQ(FileBytes(5).substr(static_cast<size_t>(26 * p), static_cast<size_t>(h)),
            appended[appended.size() - 2].second);
  ExpectReadBack(5, appended);
  ASSERT_TRUE(files_->Sync(5).ok());
  ExpectFileHolds(5, appended);
  // A location past what its lane appended is DATA_LOSS while its block is buffered.
  const int64_t at = append(2, 10);
  EXPECT_EQ(at, 13 * p);
  auto past = files_->Read(5, static_cast<uint64_t>(at), 11, "chunk q");
  ASSERT_EQ(past.status().code(), absl::StatusCode::kDataLoss) << past.status();
  EXPECT_THAT(std::string(past.status().message()), HasSubstr("chunk q: segment file "));
}

// A lane's last block stays open until the lane appends past it, which the lane of a finished
// upload stream never does: with many lanes, the least recently appended-to blocks beyond 16 are
// written as far as they are filled, and a lane that comes back goes on where it was.
TEST_F(SegmentFilesTest, IdleLanesBlocksAreWrittenBeyondSixteen) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  const int64_t b = Small().write_block_bytes;
  std::mt19937_64 rng(31);
  Pieces appended;
  constexpr uint32_t kLanes = 40;
  for (uint32_t lane = 0; lane < kLanes; ++lane) {
    const std::string bytes = RandomBytes(100, rng);
    auto offsets = files_->Append(8, {bytes}, lane);
    ASSERT_TRUE(offsets.ok()) << offsets.status();
    ASSERT_EQ((*offsets)[0], lane * static_cast<uint64_t>(b));  // an extent (a block) each
    appended.push_back({(*offsets)[0], bytes});
  }
  // 40 open blocks, none full: the 23 oldest were written when they passed the bound.
  const std::string image = FileBytes(8);
  for (uint32_t lane = 0; lane < kLanes; ++lane) {
    const auto& [offset, bytes] = appended[lane];
    const bool written = image.size() >= offset + bytes.size() &&
                         image.compare(offset, bytes.size(), bytes) == 0;
    EXPECT_EQ(written, lane < kLanes - 16 - 1) << "lane " << lane;  // the 40th append flushed 23
  }
  // Lane 0, written already, goes on after its bytes; everything reads back, then from the file.
  const std::string more = RandomBytes(300, rng);
  auto offsets = files_->Append(8, {more}, 0);
  ASSERT_TRUE(offsets.ok()) << offsets.status();
  EXPECT_EQ((*offsets)[0], 100u);
  appended.push_back({(*offsets)[0], more});
  ExpectReadBack(8, appended);
  ASSERT_TRUE(files_->Sync(8).ok());
  ExpectFileHolds(8, appended);
}

// Windows and write blocks: one must be a multiple of the other (extents hold whole ones).
TEST_F(SegmentFilesTest, WindowAndBlockSizesMustNest) {
  SegmentOptions options = Small();
  options.write_block_bytes = 3 * kPage;  // windows are 4 pages
  auto files = SegmentFiles::Open(dir_ + "/segments", options);
  ASSERT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << files.status();
  EXPECT_THAT(std::string(files.status().message()), HasSubstr("one must be a multiple"));
}

// Appended bytes are readable at once, from the buffer of their block until it is written (the
// file does not have them yet), and from the file after.
TEST_F(SegmentFilesTest, BytesOfBlocksNotYetWrittenReadFromTheirBuffers) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));  // windows of 4 pages, blocks of 2
  const int64_t p = kPage;
  std::mt19937_64 rng(11);
  const std::string first = RandomBytes(100, rng);
  ASSERT_EQ(AppendOne(4, first), 0u);  // the lane's first extent: one block
  EXPECT_EQ(FileBytes(4).size(), 0u) << "the block is written before it is full";
  const int64_t copied = files_->bytes_copied();
  std::unique_ptr<ChunkData> early = Read(4, 0, first.size());
  ASSERT_NE(early, nullptr);
  EXPECT_EQ(early->bytes(), first);
  EXPECT_EQ(files_->bytes_copied(), copied + 100);  // a copy out of the buffer
  auto past = files_->Read(4, 0, 101, "chunk p");
  ASSERT_EQ(past.status().code(), absl::StatusCode::kDataLoss) << past.status();
  EXPECT_THAT(std::string(past.status().message()), HasSubstr("chunk p: segment file "));

  // Filling the block writes it.
  const std::string filler = RandomBytes(static_cast<size_t>(2 * p - 100), rng);
  ASSERT_EQ(AppendOne(4, filler), 100u);
  EXPECT_EQ(FileBytes(4), first + filler);
  // The lane's next extent is a window, [4p, 8p): a piece that fills its first block and spills
  // into the second reads from the file, then from the second block's buffer.
  const std::string third = RandomBytes(static_cast<size_t>(p), rng);
  ASSERT_EQ(AppendOne(4, third), static_cast<uint64_t>(4 * p));
  const std::string fourth = RandomBytes(static_cast<size_t>(2 * p), rng);
  ASSERT_EQ(AppendOne(4, fourth), static_cast<uint64_t>(5 * p));
  EXPECT_EQ(static_cast<int64_t>(FileBytes(4).size()), 6 * p);
  std::unique_ptr<ChunkData> spanning = Read(4, 5 * p, fourth.size());  // file, then buffer
  ASSERT_NE(spanning, nullptr);
  EXPECT_EQ(spanning->bytes(), fourth);
  EXPECT_EQ(early->bytes(), first);

  ASSERT_TRUE(files_->Sync(4).ok());
  const std::string synced = first + filler + std::string(static_cast<size_t>(2 * p), '\0') +
                             third + fourth;
  EXPECT_EQ(FileBytes(4), synced);
  std::unique_ptr<ChunkData> mapped = Read(4, 0, first.size());
  ASSERT_NE(mapped, nullptr);
  EXPECT_EQ(mapped->bytes(), first);
  EXPECT_EQ(files_->mapped_windows(), 1);
  // Appends after a Sync continue the lane (into the block Sync wrote in part); the bytes Sync
  // wrote there come from the file, the new ones from the block's buffer.
  const std::string fifth = RandomBytes(50, rng);
  EXPECT_EQ(AppendOne(4, fifth), static_cast<uint64_t>(7 * p));
  std::unique_ptr<ChunkData> before_sync = Read(4, 5 * p, fourth.size() + fifth.size());
  ASSERT_NE(before_sync, nullptr);
  EXPECT_EQ(before_sync->bytes(), fourth + fifth);
  ASSERT_TRUE(files_->Sync(4).ok());
  EXPECT_EQ(FileBytes(4), synced + fifth);
}

// A write that fails (here: past the file size limit) fails every later append, sync and read of
// that data id, naming the file: its block held bytes of appends that had already returned.
TEST_F(SegmentFilesTest, AFailedWriteFailsTheDataIdFromThenOn) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));
  const int64_t b = Small().write_block_bytes;
  std::vector<absl::Status> appends;
  absl::Status later, synced;
  absl::StatusOr<std::unique_ptr<ChunkData>> read = absl::UnknownError("not read");
  {
    // Whole blocks, each written by its own append: at [0, b) (the lane's first extent, one
    // block), then [2b, 3b) and [3b, 4b) (its second, a window at 2b): the third passes the
    // limit.
    testing::ScopedFileSizeLimit limit(static_cast<uint64_t>(3 * b));
    ASSERT_TRUE(limit.ok());
    for (int i = 0; i < 3; ++i) {
      appends.push_back(
          files_->Append(9, {std::string(static_cast<size_t>(b), static_cast<char>('a' + i))})
              .status());
    }
    later = files_->Append(9, {std::string("x")}).status();
    synced = files_->Sync(9);
    read = files_->Read(9, 0, static_cast<uint64_t>(b), "chunk r");
  }

  EXPECT_TRUE(appends[0].ok()) << appends[0];
  EXPECT_TRUE(appends[1].ok()) << appends[1];
  ASSERT_FALSE(appends[2].ok());
  EXPECT_THAT(std::string(appends[2].message()), HasSubstr(files_->PathOf(9)));
  EXPECT_EQ(later, appends[2]);
  EXPECT_EQ(synced, appends[2]);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("chunk r: write "));
  // Other data ids are unaffected.
  EXPECT_EQ(AppendOne(10, "fine"), 0u);
  EXPECT_TRUE(files_->Sync(10).ok());
}

// A hole that a block spans is zeros in the file, like the hole past a block.
TEST_F(SegmentFilesTest, HolesInsideABlockAreZeros) {
  SegmentOptions options = Small();
  options.write_block_bytes = 2 * options.window_bytes;
  ASSERT_NO_FATAL_FAILURE(Open(options));
  const int64_t w = options.window_bytes;
  std::mt19937_64 rng(13);
  const std::string a = RandomBytes(static_cast<size_t>(w - 100), rng);
  const std::string b = RandomBytes(200, rng);  // does not fit the rest of window 0
  ASSERT_EQ(AppendOne(6, a), 0u);
  ASSERT_EQ(AppendOne(6, b), static_cast<uint64_t>(w));
  ASSERT_TRUE(files_->Sync(6).ok());
  EXPECT_EQ(FileBytes(6), a + std::string(100, '\0') + b);
}

// Which pages of the file at `path` are in the page cache, one flag per page (mincore of a
// mapping).
std::vector<bool> ResidentPages(const std::string& path) {
  std::vector<bool> resident;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return resident;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  void* addr = size > 0 ? ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0)
                        : MAP_FAILED;
  if (addr != MAP_FAILED) {
    std::vector<unsigned char> vec(static_cast<size_t>((size + kPage - 1) / kPage));
    if (::mincore(addr, static_cast<size_t>(size), vec.data()) == 0) {
      for (unsigned char v : vec) resident.push_back((v & 1) != 0);
    }
    ::munmap(addr, static_cast<size_t>(size));
  }
  ::close(fd);
  return resident;
}

// A block closed short (its lane moved on to a new extent, leaving the rest a hole) is written
// like a whole one, with direct I/O, up to the next page boundary: nothing of it stays in the
// page cache, where its pages would be small folios that windows map page by page. Its bytes
// read back, and the file has zeros after them.
TEST_F(SegmentFilesTest, BlocksClosedShortAreWrittenPastThePageCache) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));  // windows of 4 pages, blocks of 2
  const int64_t p = kPage;
  std::mt19937_64 rng(41);
  Pieces appended;
  auto append = [&](int64_t n) {
    const std::string bytes = RandomBytes(static_cast<size_t>(n), rng);
    auto offsets = files_->Append(9, {bytes}, 0);
    EXPECT_TRUE(offsets.ok()) << offsets.status();
    appended.push_back({offsets.ok() ? (*offsets)[0] : 0, bytes});
    return offsets.ok() ? static_cast<int64_t>((*offsets)[0]) : -1;
  };
  ASSERT_EQ(append(p + p / 2 + 10), 0);  // the lane's first extent, one block: [0, 2p)
  ASSERT_EQ(append(p), 4 * p);           // does not fit: a new extent, the next window
  ASSERT_EQ(append(p), 5 * p);           // fills [4p, 6p): a whole block
  const std::vector<bool> resident = ResidentPages(files_->PathOf(9));
  ASSERT_GE(resident.size(), 6u);
  if (resident[4] || resident[5]) {
    GTEST_SKIP() << "a whole block written with O_DIRECT is in the page cache: this file system "
                    "(" << dir_ << ") serves direct I/O through the page cache";
  }
  EXPECT_FALSE(resident[0]) << "the block closed short went through the page cache";
  EXPECT_FALSE(resident[1]) << "the block closed short went through the page cache";
  EXPECT_GE(static_cast<int64_t>(FileBytes(9).size()), 2 * p);  // written to its page boundary
  ExpectReadBack(9, appended);
  ASSERT_TRUE(files_->Sync(9).ok());
  ExpectFileHolds(9, appended);
}

// Views share a window while it is within the budget; past the budget chunks come back as
// copies, still right; released, only the most recently used windows stay mapped.
TEST_F(SegmentFilesTest, WindowsAreSharedWithinTheBudgetAndCopiedBeyondIt) {
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
TEST_F(SegmentFilesTest, WindowsCountTheUnitsTheyMapAgainstTheBudget) {
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
    EXPECT_EQ(held.back()->bytes(), pieces[window].substr(static_cast<size_t>(at),
                                                          static_cast<size_t>(n)));
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
TEST_F(SegmentFilesTest, ConcurrentReadersShareWindowsWithinTheBudget) {
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
