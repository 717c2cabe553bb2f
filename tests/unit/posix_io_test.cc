#include "storage/posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class PosixIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeUniqueDirectory(::testing::TempDir(), "posix_io_test_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(PosixIoTest, ErrnoMapsToCodesAndNamesThePath) {
  EXPECT_EQ(ErrnoToStatus(ENOENT, "open", "/x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoToStatus(EACCES, "open", "/x").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "write", "/x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EEXIST, "rename", "/x").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(ErrnoToStatus(ENOENT, "open", "/some/path").message(), HasSubstr("open /some/path"));
}

TEST_F(PosixIoTest, PwriteThenPreadRoundTripsAndShortFileIsDataLoss) {
  const std::string path = dir_ + "/f";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0644);
  ASSERT_GE(fd, 0);
  std::string data(3 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(PwriteFully(fd, data.data(), data.size(), 4096, path).ok());
  std::string back(data.size(), '\0');
  ASSERT_TRUE(PreadFully(fd, back.data(), back.size(), 4096, path).ok());
  EXPECT_EQ(back, data);
  const absl::Status short_read = PreadFully(fd, back.data(), 100, 4096 + data.size() - 10, path);
  EXPECT_EQ(short_read.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(short_read.message(), HasSubstr(path));
  ::close(fd);
  const absl::Status bad_fd = PwriteFully(-1, data.data(), 1, 0, path);
  EXPECT_FALSE(bad_fd.ok());
  EXPECT_THAT(bad_fd.message(), HasSubstr("write " + path));
}

TEST_F(PosixIoTest, RenameNoReplaceRefusesAnExistingTarget) {
  const std::string a = dir_ + "/a", b = dir_ + "/b", c = dir_ + "/c";
  std::ofstream(a) << "a";
  std::ofstream(b) << "b";
  const absl::Status refused = RenameNoReplace(a, b);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
  std::string content;
  std::ifstream(b) >> content;
  EXPECT_EQ(content, "b");
  ASSERT_TRUE(RenameNoReplace(a, c).ok());
  EXPECT_FALSE(fs::exists(a));
  EXPECT_TRUE(fs::exists(c));
  EXPECT_EQ(RenameNoReplace(a, dir_ + "/d").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(SyncDirectory(dir_).ok());
  EXPECT_EQ(SyncDirectory(dir_ + "/missing").code(), absl::StatusCode::kNotFound);
}

TEST_F(PosixIoTest, TempDirectoryIsRemovedUnlessReleased) {
  std::string removed_path, kept_path;
  {
    auto temp = TempDirectory::Create(dir_, "t_");
    ASSERT_TRUE(temp.ok()) << temp.status();
    removed_path = temp->path();
    EXPECT_THAT(removed_path, HasSubstr("/t_"));
    std::ofstream(removed_path + "/file") << "x";
    TempDirectory moved = *std::move(temp);
    EXPECT_EQ(moved.path(), removed_path);
  }
  EXPECT_FALSE(fs::exists(removed_path));
  {
    auto temp = TempDirectory::Create(dir_, "t_");
    ASSERT_TRUE(temp.ok());
    kept_path = temp->path();
    temp->Release();
  }
  EXPECT_TRUE(fs::is_directory(kept_path));
  EXPECT_EQ(TempDirectory::Create(dir_ + "/missing", "t_").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckpt
