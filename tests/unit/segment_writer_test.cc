// The segment writer (storage/internal/segment_writer.h): extents per lane, write blocks, direct
// I/O, reads of bytes not yet written, failed writes. Small windows and blocks
// (tests/testing/segment_files.h) so that every path runs on little data.
#include "storage/internal/segment_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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
#include "tests/testing/segment_files.h"

namespace ckpt::segment_internal {
namespace {

using ::testing::HasSubstr;

class SegmentWriterTest : public SegmentFilesTest {
 protected:
  void ConcurrentAppendsReadBackExactly(SegmentOptions options);
};

// Random pieces (empty, tiny, around a window, larger than one) appended by several threads at
// once, into three lanes (two threads share one): every piece reads back exactly, before and
// after Sync, pieces never overlap, none of at most a window straddles a window boundary, and
// no write block holds pieces of two lanes. After Sync the file holds every piece at its offset and
// zeros in between.
void SegmentWriterTest::ConcurrentAppendsReadBackExactly(SegmentOptions options) {
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
          const int64_t random = static_cast<int64_t>(rng() % (2 * w));
          const int64_t sizes[] = {0, 1, 100, w - 1, w, w + 1, 3 * w + 7, random};
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

TEST_F(SegmentWriterTest, ConcurrentAppendsReadBackExactlyWithoutStraddlingWindows) {
  ConcurrentAppendsReadBackExactly(Small());
}

TEST_F(SegmentWriterTest, ConcurrentAppendsThroughThePageCacheOnly) {
  SegmentOptions options = Small();
  options.direct_writes = false;
  ConcurrentAppendsReadBackExactly(options);
}

// Blocks larger than windows: several windows per block, holes inside blocks.
TEST_F(SegmentWriterTest, ConcurrentAppendsWithBlocksLargerThanWindows) {
  SegmentOptions options = Small();
  options.write_block_bytes = 3 * options.window_bytes;
  ConcurrentAppendsReadBackExactly(options);
}

// Each lane fills extents of its own, its pieces back to back, whatever the order of appends;
// a lane's extents grow from a block to a window and never straddle one; a piece larger than
// that gets a region of its own, and the lane goes on where it was.
TEST_F(SegmentWriterTest, LanesFillExtentsOfTheirOwn) {
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
  EXPECT_EQ(append(2, h), 12 * p);          // lane 2's extent is full: a window's worth
  EXPECT_EQ(append(1, 8 * p + 1), 16 * p);  // larger than a window: a region of its own
  EXPECT_EQ(append(1, h), 6 * p);           // lane 1 goes on in its extent
  EXPECT_EQ(append(2, h), 12 * p + h);
  EXPECT_EQ(append(3, 0), 0);       // nothing placed, no extent taken
  EXPECT_EQ(append(3, h), 26 * p);  // after the large piece's last block
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
TEST_F(SegmentWriterTest, IdleLanesBlocksAreWrittenBeyondSixteen) {
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
    const bool written =
        image.size() >= offset + bytes.size() && image.compare(offset, bytes.size(), bytes) == 0;
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
TEST_F(SegmentWriterTest, WindowAndBlockSizesMustNest) {
  SegmentOptions options = Small();
  options.write_block_bytes = 3 * kPage;  // windows are 4 pages
  auto files = SegmentFilesForTest::Open(dir_ + "/segments", options);
  ASSERT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument) << files.status();
  EXPECT_THAT(std::string(files.status().message()), HasSubstr("one must be a multiple"));
}

// Appended bytes are readable at once, from the buffer of their block until it is written (the
// file does not have them yet), and from the file after.
TEST_F(SegmentWriterTest, BytesOfBlocksNotYetWrittenReadFromTheirBuffers) {
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
  const std::string synced =
      first + filler + std::string(static_cast<size_t>(2 * p), '\0') + third + fourth;
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

// Reserved pieces take the places Append would give them; their bytes, written in place (a
// piece crossing a write block boundary has a place in each block), read back once the
// reservation is finished, while other lanes append meanwhile, and the lane's next append comes
// after them. An abandoned reservation leaves the pieces around it intact; Finish twice is a
// no-op.
TEST_F(SegmentWriterTest, ReservedPiecesAreWrittenInPlace) {
  ASSERT_NO_FATAL_FAILURE(Open(Small()));  // windows of 4 pages, blocks of 2
  const int64_t p = kPage;
  const int64_t b = Small().write_block_bytes;
  std::mt19937_64 rng(23);
  const std::vector<int64_t> sizes = {100, b + 50, 0, 30};
  auto reserved = files_->Reserve(5, sizes, /*lane=*/1);
  ASSERT_TRUE(reserved.ok()) << reserved.status();
  SegmentWriter::Reservation& r = *reserved;
  ASSERT_EQ(r.offsets.size(), sizes.size());
  ASSERT_EQ(r.first.size(), sizes.size() + 1);
  EXPECT_EQ(r.offsets[0], 0u);
  EXPECT_GE(r.offsets[1], 100u);  // in the lane's next extent: the first is one block
  EXPECT_EQ(r.offsets[3], r.offsets[1] + static_cast<uint64_t>(b + 50));
  EXPECT_EQ(r.first[2] - r.first[1], 2u) << "the second piece crosses a block boundary";
  EXPECT_EQ(r.first[3], r.first[2]) << "an empty piece has no place";

  // Another lane appends while the reservation is open.
  const std::string other = RandomBytes(static_cast<size_t>(p), rng);
  const uint64_t other_at = files_->Append(5, {other}, /*lane=*/2)->at(0);

  Pieces expected;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string bytes = RandomBytes(static_cast<size_t>(sizes[i]), rng);
    size_t done = 0;
    for (size_t k = r.first[i]; k < r.first[i + 1]; ++k) {
      std::memcpy(r.places[k].data(), bytes.data() + done, r.places[k].size());
      done += r.places[k].size();
    }
    ASSERT_EQ(done, bytes.size()) << "piece " << i;
    expected.push_back({r.offsets[i], bytes});
  }
  ASSERT_TRUE(files_->Finish(&r).ok());
  EXPECT_TRUE(files_->Finish(&r).ok());
  expected.push_back({other_at, other});
  ASSERT_NO_FATAL_FAILURE(ExpectReadBack(5, expected));

  // The lane goes on after its reserved pieces.
  const std::string after = RandomBytes(40, rng);
  expected.push_back({AppendOne(5, after), after});  // lane 0: an extent of its own
  auto next = files_->Append(5, {after}, /*lane=*/1);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)[0], r.offsets[3] + 30);
  expected.push_back({(*next)[0], after});

  // Abandoned: nothing written into it, finished as it is; the lane's pieces on both sides stay.
  auto abandoned = files_->Reserve(5, {500}, /*lane=*/1);
  ASSERT_TRUE(abandoned.ok()) << abandoned.status();
  ASSERT_TRUE(files_->Finish(&*abandoned).ok());
  auto last = files_->Append(5, {after}, /*lane=*/1);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ((*last)[0], abandoned->offsets[0] + 500);
  expected.push_back({(*last)[0], after});
  ASSERT_NO_FATAL_FAILURE(ExpectReadBack(5, expected));
  ASSERT_TRUE(files_->Sync(5).ok());
  ASSERT_NO_FATAL_FAILURE(ExpectReadBack(5, expected));
  const std::string image = FileBytes(5);
  for (const auto& [offset, bytes] : expected) {
    ASSERT_LE(offset + bytes.size(), image.size());
    EXPECT_EQ(image.substr(offset, bytes.size()), bytes) << "piece at " << offset;
  }
}

// A write that fails (here: past the file size limit) fails every later append, sync and read of
// that data id, naming the file: its block held bytes of appends that had already returned.
TEST_F(SegmentWriterTest, AFailedWriteFailsTheDataIdFromThenOn) {
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
TEST_F(SegmentWriterTest, HolesInsideABlockAreZeros) {
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
TEST_F(SegmentWriterTest, BlocksClosedShortAreWrittenPastThePageCache) {
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
    GTEST_SKIP() << "a whole block written with O_DIRECT is in the page cache: this file system ("
                 << dir_ << ") serves direct I/O through the page cache";
  }
  EXPECT_FALSE(resident[0]) << "the block closed short went through the page cache";
  EXPECT_FALSE(resident[1]) << "the block closed short went through the page cache";
  EXPECT_GE(static_cast<int64_t>(FileBytes(9).size()), 2 * p);  // written to its page boundary
  ExpectReadBack(9, appended);
  ASSERT_TRUE(files_->Sync(9).ok());
  ExpectFileHolds(9, appended);
}

}  // namespace
}  // namespace ckpt::segment_internal
