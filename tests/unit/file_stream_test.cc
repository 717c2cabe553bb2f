#include "storage/file_stream.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/ckpt_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/file_size_limit.h"
#include "tests/testing/fixtures.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

std::string RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

class FileStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt_file_stream_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << "mkdtemp: " << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (dir_.empty()) return;
    std::error_code ec;
    // Restore permissions changed by a test so that cleanup can proceed.
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(dir_, ec);
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  void WriteFile(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out << bytes;
    ASSERT_TRUE(out.good()) << path;
  }

  std::vector<std::string> ListDir() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  std::string dir_;
};

TEST_F(FileStreamTest, OpenMissingFileIsNotFound) {
  const std::string path = Path("missing.ckpt");
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  ASSERT_EQ(source.status().code(), absl::StatusCode::kNotFound) << source.status();
  EXPECT_THAT(Msg(source.status()), HasSubstr(path));
  EXPECT_THAT(Msg(source.status()), HasSubstr("No such file"));
}

TEST_F(FileStreamTest, OpenDirectoryIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(dir_);
  ASSERT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
  EXPECT_THAT(Msg(source.status()), HasSubstr(dir_));
  EXPECT_THAT(Msg(source.status()), HasSubstr("directory"));
}

TEST_F(FileStreamTest, OpenUnreadableFileIsPermissionDenied) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permission bits are not enforced";
  const std::string path = Path("secret.ckpt");
  WriteFile(path, "x");
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  ASSERT_EQ(source.status().code(), absl::StatusCode::kPermissionDenied) << source.status();
  EXPECT_THAT(Msg(source.status()), HasSubstr(path));
}

TEST_F(FileStreamTest, ReadsWholeFileThroughBufferAndDirectReads) {
  const std::string path = Path("data.bin");
  const std::string bytes = RandomBytes((3 << 20) + 12345, 1);
  WriteFile(path, bytes);
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), static_cast<int64_t>(bytes.size()));
  EXPECT_EQ((*source)->Describe(), path);

  // Mix small buffered reads with reads larger than the 1 MiB buffer.
  const size_t kPieces[] = {1, 7, 4096, 2 << 20, 333, 1 << 20};
  std::string got;
  std::vector<char> buf(2 << 20);
  for (size_t i = 0;; ++i) {
    const size_t want = kPieces[i % std::size(kPieces)];
    absl::StatusOr<size_t> n = (*source)->Read(buf.data(), want);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_LE(*n, want);
    if (*n == 0) break;
    got.append(buf.data(), *n);
  }
  EXPECT_TRUE(got == bytes) << "read " << got.size() << " of " << bytes.size() << " bytes";
  // End of stream is sticky.
  absl::StatusOr<size_t> again = (*source)->Read(buf.data(), 10);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0u);
}

TEST_F(FileStreamTest, TailShowsTheLastBytesWithoutConsumingAnything) {
  const std::string path = Path("tail.bin");
  const std::string bytes = RandomBytes(100000, 9);
  WriteFile(path, bytes);
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->Tail(17), bytes.substr(bytes.size() - 17));
  EXPECT_EQ((*source)->Tail(1 << 20), bytes);  // a file shorter than asked: all of it
  std::string read(bytes.size(), '\0');
  size_t got = 0;
  while (got < read.size()) {
    absl::StatusOr<size_t> n = (*source)->Read(read.data() + got, read.size() - got);
    ASSERT_TRUE(n.ok()) << n.status();
    ASSERT_GT(*n, 0u);
    got += *n;
  }
  EXPECT_TRUE(read == bytes);  // reading still starts at the beginning
  // Not a regular file: no tail.
  absl::StatusOr<std::unique_ptr<FileByteSource>> device = FileByteSource::Open("/dev/null");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->Tail(17), std::nullopt);
}

TEST_F(FileStreamTest, EmptyFileReadsNothing) {
  const std::string path = Path("empty");
  WriteFile(path, "");
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ((*source)->size(), 0);
  char c;
  absl::StatusOr<size_t> n = (*source)->Read(&c, 1);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
}

TEST_F(FileStreamTest, AtomicSinkCommitPublishesFile) {
  const std::string path = Path("out.ckpt");
  absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
  ASSERT_TRUE(sink.ok()) << sink.status();
  EXPECT_THAT((*sink)->temp_path(), StartsWith(path + ".tmp."));

  // Small pieces, a 1.5 MiB piece, then small again.
  const std::string bytes = RandomBytes((2 << 20) + 777, 2);
  ASSERT_TRUE((*sink)->Write(std::string_view(bytes).substr(0, 100)).ok());
  ASSERT_TRUE((*sink)->Write(std::string_view(bytes).substr(100, (3 << 19))).ok());
  ASSERT_TRUE((*sink)->Write(std::string_view(bytes).substr(100 + (3 << 19))).ok());
  EXPECT_EQ((*sink)->bytes_written(), static_cast<int64_t>(bytes.size()));

  // Nothing is visible under the final name before Commit.
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_TRUE(std::filesystem::exists((*sink)->temp_path()));

  ASSERT_TRUE((*sink)->Commit().ok());
  EXPECT_EQ(ListDir(), std::vector<std::string>{"out.ckpt"});
  EXPECT_TRUE(testing::ReadFileOrDie(path) == bytes);

  EXPECT_EQ((*sink)->Write("late").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*sink)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  sink->reset();  // destroying a committed sink keeps the file
  EXPECT_TRUE(testing::ReadFileOrDie(path) == bytes);
}

// A device or a pipe is written in place: a file renamed over it would replace it (as
// `ckptctl fetch --out /dev/null` once replaced /dev/null). Tested on a named pipe of the test's
// own, which takes the same path as a character device.
TEST_F(FileStreamTest, AtomicSinkWritesDevicesAndPipesInPlace) {
  const std::string fifo = Path("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  struct stat st;
  for (bool commit : {true, false}) {
    SCOPED_TRACE(commit ? "committed" : "abandoned");
    const std::string bytes = RandomBytes((6 << 20) + 11, 5);
    std::string received;
    std::thread reader([&] { received = testing::ReadFileOrDie(fifo); });
    {
      absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(fifo);
      if (!sink.ok() || !(*sink)->in_place()) {
        // The reader waits for a writer to open the pipe: be that writer, then fail.
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd >= 0) ::close(fd);
        reader.join();
        FAIL() << "the pipe is not written in place: "
               << (sink.ok() ? (*sink)->temp_path() : sink.status().ToString());
      }
      EXPECT_EQ((*sink)->temp_path(), fifo);
      EXPECT_TRUE((*sink)->Write(std::string_view(bytes).substr(0, 1000)).ok());
      EXPECT_TRUE((*sink)->Write(std::string_view(bytes).substr(1000)).ok());
      if (commit) {
        EXPECT_TRUE((*sink)->Commit().ok());
      }
    }  // an abandoned sink closes the pipe, and must not unlink it
    reader.join();
    // Committed: every byte. Abandoned: what had been written through, not the buffered rest.
    if (commit) {
      EXPECT_TRUE(received == bytes);
    } else {
      EXPECT_TRUE(bytes.compare(0, received.size(), received) == 0);
    }
    ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode));
    EXPECT_EQ(ListDir(), std::vector<std::string>{"pipe"});  // no temporary file beside it
  }
}

// Direct I/O writes whole blocks from an aligned buffer and truncates the padding of the last
// one; buffered I/O bypasses the buffer for large pieces: files of every size, written in pieces
// of every size, must come out byte-exact either way. Runs in the test directory and, where
// present, on tmpfs (/dev/shm), whichever of direct or buffered I/O each file system takes.
TEST_F(FileStreamTest, AtomicSinkWritesExactBytesWhateverThePieceSizes) {
  std::vector<std::string> dirs = {dir_};
  char shm[] = "/dev/shm/ckpt_file_stream_test.XXXXXX";
  if (::mkdtemp(shm) != nullptr) {
    dirs.push_back(shm);
  } else {
    std::cout << "[ NOTE ] /dev/shm unavailable (" << std::strerror(errno)
              << "): only the test directory's file system is covered\n";
  }
  constexpr size_t kMiB = size_t{1} << 20;
  const std::vector<size_t> sizes = {0,           1,           4095,        4096,
                                     4097,        4 * kMiB - 1, 4 * kMiB,   4 * kMiB + 1,
                                     9 * kMiB + 12345, 21 * kMiB + 777};
  std::mt19937_64 rng(7);
  for (const std::string& dir : dirs) {
    for (bool try_direct : {true, false}) {
      for (size_t size : sizes) {
        SCOPED_TRACE(absl::StrCat(dir, ", ", size, " bytes, try direct I/O: ", try_direct));
        const std::string path = absl::StrCat(dir, "/exact_", size, "_", try_direct);
        const std::string bytes = RandomBytes(size, size + 1);
        absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink =
            AtomicFileSink::Create(path, try_direct);
        ASSERT_TRUE(sink.ok()) << sink.status();
        size_t at = 0;
        while (at < size) {
          // Pieces from 1 byte to 6 MiB, mostly small.
          const size_t limit = (rng() % 4 == 0) ? 6 * kMiB : 5000;
          const size_t n = std::min<size_t>(size - at, 1 + rng() % limit);
          ASSERT_TRUE((*sink)->Write(std::string_view(bytes).substr(at, n)).ok());
          at += n;
        }
        ASSERT_TRUE((*sink)->Commit().ok());
        if (size == sizes.back()) {
          std::cout << "[ NOTE ] " << dir << ": written with "
                    << ((*sink)->direct_io() ? "direct" : "buffered") << " I/O\n";
        }
        if (!try_direct) {
          EXPECT_FALSE((*sink)->direct_io());
        }
        EXPECT_EQ(std::filesystem::file_size(path), size);
        EXPECT_TRUE(testing::ReadFileOrDie(path) == bytes);
      }
    }
  }
  if (dirs.size() > 1) {
    std::error_code ec;
    std::filesystem::remove_all(dirs[1], ec);
  }
}

TEST_F(FileStreamTest, DirectIoCanBeSwitchedOffByEnvironment) {
  const std::string bytes = RandomBytes(5 << 20, 4);
  for (const char* off : {"0", "OFF", "false", "no"}) {
    ASSERT_EQ(::setenv("CKPT_DIRECT_IO", off, 1), 0);
    const std::string path = Path(absl::StrCat("env_", off));
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
    ASSERT_TRUE(sink.ok()) << sink.status();
    EXPECT_FALSE((*sink)->direct_io()) << "CKPT_DIRECT_IO=" << off;
    ASSERT_TRUE((*sink)->Write(bytes).ok());
    ASSERT_TRUE((*sink)->Commit().ok());
    EXPECT_TRUE(testing::ReadFileOrDie(path) == bytes);
  }
  ASSERT_EQ(::unsetenv("CKPT_DIRECT_IO"), 0);
}

TEST_F(FileStreamTest, AtomicSinkReplacesExistingFile) {
  const std::string path = Path("out.ckpt");
  WriteFile(path, "old contents");
  absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
  ASSERT_TRUE(sink.ok()) << sink.status();
  ASSERT_TRUE((*sink)->Write("new").ok());
  EXPECT_EQ(testing::ReadFileOrDie(path), "old contents");
  ASSERT_TRUE((*sink)->Commit().ok());
  EXPECT_EQ(testing::ReadFileOrDie(path), "new");
  EXPECT_EQ(ListDir(), std::vector<std::string>{"out.ckpt"});
}

TEST_F(FileStreamTest, AbandonedSinkLeavesNoTraces) {
  const std::string path = Path("never.ckpt");
  {
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
    ASSERT_TRUE(sink.ok()) << sink.status();
    ASSERT_TRUE((*sink)->Write(RandomBytes(3 << 20, 3)).ok());
    EXPECT_EQ(ListDir().size(), 1u);  // the temporary file
  }
  EXPECT_THAT(ListDir(), IsEmpty());
  EXPECT_FALSE(std::filesystem::exists(path));

  // An abandoned replacement leaves the existing file untouched.
  WriteFile(path, "keep");
  {
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
    ASSERT_TRUE(sink.ok()) << sink.status();
    ASSERT_TRUE((*sink)->Write("discard").ok());
  }
  EXPECT_EQ(ListDir(), std::vector<std::string>{"never.ckpt"});
  EXPECT_EQ(testing::ReadFileOrDie(path), "keep");

  // Abandoned while a full buffer is being written in the background (direct I/O).
  {
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
    ASSERT_TRUE(sink.ok()) << sink.status();
    ASSERT_TRUE((*sink)->Write(RandomBytes(9 << 20, 5)).ok());
  }
  EXPECT_EQ(ListDir(), std::vector<std::string>{"never.ckpt"});
  EXPECT_EQ(testing::ReadFileOrDie(path), "keep");
}

// A write that fails in the background (here: past the file size limit) is returned by a later
// Write or by Commit, names the file, and leaves the existing file and no temporary behind.
TEST_F(FileStreamTest, AtomicSinkReportsAFailedBackgroundWrite) {
  const std::string path = Path("limited.ckpt");
  WriteFile(path, "keep");
  absl::Status failed;
  bool direct = false;
  {
    testing::ScopedFileSizeLimit limit(6 << 20);  // inside the second 4 MiB buffer
    ASSERT_TRUE(limit.ok());
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
    ASSERT_TRUE(sink.ok()) << sink.status();
    direct = (*sink)->direct_io();
    const std::string mib = RandomBytes(1 << 20, 6);
    for (int i = 0; i < 16 && failed.ok(); ++i) failed = (*sink)->Write(mib);
    if (failed.ok()) failed = (*sink)->Commit();
    // Sticky: a later Write returns the same error.
    EXPECT_EQ((*sink)->Write("x"), failed);
  }
  std::cout << "[ NOTE ] written with " << (direct ? "direct (background)" : "buffered")
            << " I/O: " << failed << "\n";
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted) << failed;
  EXPECT_THAT(Msg(failed), HasSubstr(Path("limited.ckpt.tmp.")));
  EXPECT_EQ(ListDir(), std::vector<std::string>{"limited.ckpt"});
  EXPECT_EQ(testing::ReadFileOrDie(path), "keep");
}

TEST_F(FileStreamTest, AtomicSinkCreateErrors) {
  absl::StatusOr<std::unique_ptr<AtomicFileSink>> no_dir =
      AtomicFileSink::Create(Path("no/such/dir/out.ckpt"));
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound) << no_dir.status();
  EXPECT_THAT(Msg(no_dir.status()), HasSubstr("no/such/dir/out.ckpt.tmp."));

  absl::StatusOr<std::unique_ptr<AtomicFileSink>> onto_dir = AtomicFileSink::Create(dir_);
  EXPECT_EQ(onto_dir.status().code(), absl::StatusCode::kInvalidArgument) << onto_dir.status();

  absl::StatusOr<std::unique_ptr<AtomicFileSink>> empty = AtomicFileSink::Create("");
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);

  if (::geteuid() != 0) {
    ASSERT_EQ(::chmod(dir_.c_str(), 0500), 0);
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> read_only =
        AtomicFileSink::Create(Path("out.ckpt"));
    EXPECT_EQ(read_only.status().code(), absl::StatusCode::kPermissionDenied) << read_only.status();
  }
}

TEST_F(FileStreamTest, CheckpointRoundTripThroughFiles) {
  // The codec over real files, with chunking and a CRC trailer, streamed in pieces.
  const std::string path = Path("rank_0.ckpt");
  const std::string weight = RandomBytes(64 * 1024 * 4, 4);
  {
    absl::StatusOr<std::unique_ptr<AtomicFileSink>> sink = AtomicFileSink::Create(path);
    ASSERT_TRUE(sink.ok()) << sink.status();
    CkptWriter writer(sink->get(), {.crc_trailer = true, .slice_bytes = 100000});
    ASSERT_TRUE(writer.BeginTensor("w", DType::kFloat32, {1024, 64}, weight.size()).ok());
    for (size_t pos = 0; pos < weight.size(); pos += 4093) {
      ASSERT_TRUE(writer.Append(std::string_view(weight).substr(pos, 4093)).ok());
    }
    ASSERT_TRUE(writer.WriteTensor("global_step", DType::kInt64, {}, std::string(8, '\2')).ok());
    ASSERT_TRUE(writer.Finish().ok());
    ASSERT_TRUE((*sink)->Commit().ok());
  }
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  ASSERT_TRUE(source.ok()) << source.status();
  CkptReader reader(source->get());
  absl::StatusOr<std::optional<CkptTensor>> w = reader.NextTensor();
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(w->has_value());
  EXPECT_EQ((*w)->dims, (std::vector<int64_t>{1024, 64}));
  EXPECT_TRUE((*w)->data == weight);
  absl::StatusOr<std::optional<CkptTensor>> step = reader.NextTensor();
  ASSERT_TRUE(step.ok() && step->has_value());
  EXPECT_EQ((*step)->name, "global_step");
  absl::StatusOr<std::optional<CkptTensor>> end = reader.NextTensor();
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_FALSE(end->has_value());
  EXPECT_TRUE(reader.had_crc_trailer());
  EXPECT_EQ(reader.offset(), (*source)->size());
}

TEST_F(FileStreamTest, ReadWholeFileEnforcesLimit) {
  const std::string path = Path("strategy.ckpt");
  WriteFile(path, "0123456789");
  absl::StatusOr<std::string> ok = ReadWholeFile(path, 10);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, "0123456789");

  absl::StatusOr<std::string> too_big = ReadWholeFile(path, 9);
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(too_big.status()), HasSubstr(path));
  EXPECT_THAT(Msg(too_big.status()), HasSubstr("limit of 9"));

  EXPECT_EQ(ReadWholeFile(Path("missing"), 100).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ReadWholeFile(dir_, 100).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileStreamTest, ReadWholeFileReadsFixtureInPlace) {
  CKPT_REQUIRE_FIXTURE(expected, "golden_router.ckpt");
  absl::StatusOr<std::string> bytes =
      ReadWholeFile(*testing::FixturePath("golden_router.ckpt"), 1 << 20);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, expected);
}

TEST_F(FileStreamTest, FreeDiskBytes) {
  absl::StatusOr<int64_t> free_bytes = FreeDiskBytes(dir_);
  ASSERT_TRUE(free_bytes.ok()) << free_bytes.status();
  EXPECT_GT(*free_bytes, 0);
  absl::StatusOr<int64_t> missing = FreeDiskBytes(Path("no/such/dir"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  EXPECT_THAT(Msg(missing.status()), HasSubstr("no/such/dir"));
}

TEST(FileStreamErrnoTest, MapsErrnoToCodesWithPath) {
  struct Case {
    int error_number;
    absl::StatusCode code;
  } cases[] = {
      {ENOENT, absl::StatusCode::kNotFound},
      {ENOTDIR, absl::StatusCode::kNotFound},
      {EACCES, absl::StatusCode::kPermissionDenied},
      {EPERM, absl::StatusCode::kPermissionDenied},
      {EISDIR, absl::StatusCode::kInvalidArgument},
      {ENOSPC, absl::StatusCode::kResourceExhausted},
      {EDQUOT, absl::StatusCode::kResourceExhausted},
      {EEXIST, absl::StatusCode::kAlreadyExists},
  };
  for (const Case& c : cases) {
    absl::Status s = ErrnoToStatus(c.error_number, "open", "/data/x.ckpt");
    EXPECT_EQ(s.code(), c.code) << c.error_number;
    EXPECT_THAT(Msg(s), StartsWith("open /data/x.ckpt: ")) << s;
    EXPECT_THAT(Msg(s), HasSubstr(std::strerror(c.error_number)));
  }
}

}  // namespace
}  // namespace ckpt
