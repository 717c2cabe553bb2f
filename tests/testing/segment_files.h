// Test helpers for the segment files of the segment store (storage/internal/segment_*.h): the
// directory with its writer and reader, composed as the store composes them, and a fixture with
// small windows and write blocks so that every path (shared windows, copies over the budget,
// chunks larger than a window, blocks not yet written) runs on little data.
#ifndef CKPT_TESTS_TESTING_SEGMENT_FILES_H_
#define CKPT_TESTS_TESTING_SEGMENT_FILES_H_

#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "storage/checkpoint_store.h"
#include "storage/internal/segment_directory.h"
#include "storage/internal/segment_reader.h"
#include "storage/internal/segment_writer.h"

namespace ckpt::segment_internal {

// A segment directory with its writer and reader; Remove does what the store does (the reader's
// windows, then the file).
class SegmentFilesForTest {
 public:
  static absl::StatusOr<std::unique_ptr<SegmentFilesForTest>> Open(std::string dir,
                                                                   SegmentOptions options = {}) {
    absl::StatusOr<std::unique_ptr<SegmentDirectory>> directory =
        SegmentDirectory::Open(std::move(dir), options);
    if (!directory.ok()) return directory.status();
    return std::unique_ptr<SegmentFilesForTest>(new SegmentFilesForTest(*std::move(directory)));
  }

  absl::StatusOr<std::vector<uint64_t>> Append(uint64_t data_id,
                                               const std::vector<std::string_view>& pieces,
                                               uint32_t lane = 0) {
    return writer_.Append(data_id, pieces, lane);
  }
  absl::StatusOr<SegmentWriter::Reservation> Reserve(uint64_t data_id,
                                                     const std::vector<int64_t>& sizes,
                                                     uint32_t lane = 0) {
    return writer_.Reserve(data_id, sizes, lane);
  }
  absl::Status Finish(SegmentWriter::Reservation* reservation) {
    return writer_.Finish(reservation);
  }
  absl::Status Sync(uint64_t data_id) { return writer_.Sync(data_id); }
  absl::StatusOr<std::unique_ptr<ChunkData>> Read(uint64_t data_id, uint64_t offset,
                                                  uint64_t length, std::string_view what) {
    return reader_.Read(data_id, offset, length, what);
  }
  absl::StatusOr<std::unique_ptr<ChunkData>> Read(uint64_t data_id, uint64_t offset,
                                                  uint64_t length, std::string_view what,
                                                  ReadCursor& cursor) {
    return reader_.Read(data_id, offset, length, what, cursor);
  }
  absl::Status Remove(uint64_t data_id) {
    reader_.Forget(data_id);
    return directory_->Remove(data_id);
  }
  absl::StatusOr<std::vector<uint64_t>> List() const { return directory_->List(); }
  std::string PathOf(uint64_t data_id) const { return directory_->PathOf(data_id); }
  int64_t mapped_windows() const { return reader_.mapped_windows(); }
  int64_t mapped_bytes() const { return reader_.mapped_bytes(); }
  int64_t bytes_copied() const { return reader_.bytes_copied(); }

 private:
  explicit SegmentFilesForTest(std::unique_ptr<SegmentDirectory> directory)
      : directory_(std::move(directory)), writer_(directory_.get()), reader_(directory_.get()) {}

  const std::unique_ptr<SegmentDirectory> directory_;
  SegmentWriter writer_;
  SegmentReader reader_;
};

inline const int64_t kPage = ::sysconf(_SC_PAGESIZE);

inline std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// Owns a temporary directory and the segment files under test in it.
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
    auto files = SegmentFilesForTest::Open(dir_ + "/segments", options);
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
  std::unique_ptr<SegmentFilesForTest> files_;
};

}  // namespace ckpt::segment_internal

#endif  // CKPT_TESTS_TESTING_SEGMENT_FILES_H_
