#include "storage/confined_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/file_stream.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// Layout of every test: DIR/root (the confined root) and DIR/outside (a directory that must stay
// untouched), both created fresh.
class ConfinedDirTest : public ::testing::TestWithParam<BeneathResolver> {
 protected:
  void SetUp() override {
    auto dir = MakeUniqueDirectory(::testing::TempDir(), "confined_dir_test_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    root_ = dir_ + "/root";
    outside_ = dir_ + "/outside";
    fs::create_directories(root_ + "/a/b");
    fs::create_directories(outside_ + "/sub");
    root_fd_ = UniqueFd(::open(root_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(root_fd_.valid());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // OpenDirectoryBeneath with the parameter's resolver; the descriptor is closed, its inode
  // returned through `ino` when wanted.
  int Open(const std::string& rel, ino_t* ino = nullptr) {
    const int fd = OpenDirectoryBeneath(root_fd_.get(), rel, GetParam());
    if (fd >= 0) {
      struct stat st;
      EXPECT_EQ(::fstat(fd, &st), 0);
      if (ino) *ino = st.st_ino;
      ::close(fd);
      return 0;
    }
    return fd;
  }

  static ino_t Ino(const std::string& path) {
    struct stat st;
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
    return st.st_ino;
  }

  std::string dir_, root_, outside_;
  UniqueFd root_fd_;
};

TEST_P(ConfinedDirTest, OpensDirectoriesBeneathTheRoot) {
  ino_t ino = 0;
  ASSERT_EQ(Open("a/b", &ino), 0);
  EXPECT_EQ(ino, Ino(root_ + "/a/b"));
  ASSERT_EQ(Open("", &ino), 0);
  EXPECT_EQ(ino, Ino(root_));
  ASSERT_EQ(Open("./a//b/", &ino), 0);
  EXPECT_EQ(ino, Ino(root_ + "/a/b"));
  EXPECT_EQ(Open("a/missing"), -ENOENT);
  std::ofstream(root_ + "/a/file") << "x";
  EXPECT_EQ(Open("a/file"), -ENOTDIR);
}

TEST_P(ConfinedDirTest, DotDotAndAbsolutePathsCannotLeave) {
  EXPECT_EQ(Open(".."), -EXDEV);
  EXPECT_EQ(Open("../outside"), -EXDEV);
  EXPECT_EQ(Open("a/../../outside"), -EXDEV);
  EXPECT_EQ(Open(outside_), -EXDEV);
  EXPECT_EQ(Open("/"), -EXDEV);
  // ".." that stays inside is resolved (the kernel's rule; ConfinedRoot refuses it earlier).
  ino_t ino = 0;
  ASSERT_EQ(Open("a/b/..", &ino), 0);
  EXPECT_EQ(ino, Ino(root_ + "/a"));
}

TEST_P(ConfinedDirTest, SymlinksOutOfTheRootAreRefusedWhateverTheirTargetIs) {
  fs::create_directory_symlink(outside_, root_ + "/abs");           // absolute, to an existing dir
  fs::create_directory_symlink("../../outside", root_ + "/a/rel");  // relative, climbing out
  fs::create_directory_symlink("/nonexistent-xyz", root_ + "/dangling");
  fs::create_directory_symlink("/proc/self/cwd", root_ + "/magic");
  for (const char* rel :
       {"abs", "abs/sub", "a/rel", "a/rel/sub", "dangling", "dangling/x", "magic"}) {
    EXPECT_EQ(Open(rel), -EXDEV) << rel;
  }
}

TEST_P(ConfinedDirTest, SymlinksThatStayInsideAreFollowed) {
  fs::create_directory_symlink("a/b", root_ + "/latest");
  fs::create_directory_symlink("..", root_ + "/a/b/up");  // a/b/up -> a: still beneath
  ino_t ino = 0;
  ASSERT_EQ(Open("latest", &ino), 0);
  EXPECT_EQ(ino, Ino(root_ + "/a/b"));
  ASSERT_EQ(Open("latest/up/b", &ino), 0);
  EXPECT_EQ(ino, Ino(root_ + "/a/b"));
  fs::create_directory_symlink("loop", root_ + "/loop");
  EXPECT_EQ(Open("loop"), -ELOOP);
}

INSTANTIATE_TEST_SUITE_P(Resolvers, ConfinedDirTest,
                         ::testing::Values(BeneathResolver::kAuto, BeneathResolver::kOpenat2,
                                           BeneathResolver::kWalk),
                         [](const ::testing::TestParamInfo<BeneathResolver>& info) {
                           switch (info.param) {
                             case BeneathResolver::kAuto:
                               return std::string("Auto");
                             case BeneathResolver::kOpenat2:
                               return std::string("Openat2");
                             case BeneathResolver::kWalk:
                               return std::string("Walk");
                           }
                           return std::string("Unknown");
                         });

class ConfinedRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = MakeUniqueDirectory(::testing::TempDir(), "confined_root_test_");
    ASSERT_TRUE(dir.ok()) << dir.status();
    dir_ = *dir;
    fs::create_directories(dir_ + "/root/a");
    fs::create_directories(dir_ + "/outside");
    // The root is configured through a symlink, so that both spellings are exercised.
    fs::create_directory_symlink(dir_ + "/root", dir_ + "/root-link");
    auto root = ConfinedRoot::Open(dir_ + "/root-link/");
    ASSERT_TRUE(root.ok()) << root.status();
    root_ = *std::move(root);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string dir_;
  std::unique_ptr<ConfinedRoot> root_;
};

TEST_F(ConfinedRootTest, OpenRefusesAMissingRootOrAFile) {
  EXPECT_EQ(ConfinedRoot::Open(dir_ + "/nope").status().code(), absl::StatusCode::kNotFound);
  std::ofstream(dir_ + "/file") << "x";
  EXPECT_EQ(ConfinedRoot::Open(dir_ + "/file").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(root_->path(), dir_ + "/root-link");
  EXPECT_EQ(root_->canonical_path(), fs::canonical(dir_ + "/root").string());
}

TEST_F(ConfinedRootTest, NormalizeKeepsRelativePathsAndAbsoluteOnesBeneathTheRoot) {
  EXPECT_EQ(*root_->Normalize("export_dir", "a/b"), "a/b");
  EXPECT_EQ(*root_->Normalize("export_dir", "./a//b/"), "a/b");
  EXPECT_EQ(*root_->Normalize("export_dir", dir_ + "/root-link/a/b"), "a/b");
  EXPECT_EQ(*root_->Normalize("export_dir", fs::canonical(dir_ + "/root").string() + "/x"), "x");
}

TEST_F(ConfinedRootTest, NormalizeRefusesEscapesWithoutNamingTheRoot) {
  for (const std::string& p :
       std::vector<std::string>{"../x", "a/../../x", "a/../b", "/etc/x", dir_ + "/outside/x",
                                dir_ + "/root-linkx/y", dir_ + "/root-link/../outside"}) {
    const absl::Status s = root_->Normalize("export_dir", p).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << p << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr("export_dir \"" + p + "\"")) << s;
    if (p.find(dir_) == std::string::npos) {
      EXPECT_THAT(s.message(), Not(HasSubstr(dir_))) << s;
    }
  }
  for (const std::string& p :
       std::vector<std::string>{"", ".", "./", dir_ + "/root-link", dir_ + "/root-link/."}) {
    EXPECT_EQ(root_->Normalize("merged_file", p).status().code(),
              absl::StatusCode::kInvalidArgument)
        << p;
  }
  EXPECT_EQ(root_->Normalize("x", std::string("a\0b", 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ConfinedRootTest, OpenParentReportsEscapesAndMissingParentsByTheCallersSpelling) {
  fs::create_directory_symlink(dir_ + "/outside", dir_ + "/root/out");
  auto loc = root_->OpenParent("a/new", "export_dir", "a/new");
  ASSERT_TRUE(loc.ok()) << loc.status();
  EXPECT_EQ(loc->name, "new");
  auto top = root_->OpenParent("new", "export_dir", "new");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->name, "new");

  const absl::Status escape = root_->OpenParent("out/x", "export_dir", "out/x").status();
  EXPECT_EQ(escape.code(), absl::StatusCode::kPermissionDenied) << escape;
  EXPECT_THAT(escape.message(), HasSubstr("\"out/x\""));
  EXPECT_THAT(escape.message(), Not(HasSubstr(dir_)));
  // Whether the target behind the symlink exists makes no difference to the answer.
  const absl::Status missing_behind =
      root_->OpenParent("out/nope/x", "export_dir", "out/nope/x").status();
  EXPECT_EQ(missing_behind.code(), absl::StatusCode::kPermissionDenied) << missing_behind;

  const absl::Status missing = root_->OpenParent("nope/x", "export_dir", "nope/x").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kFailedPrecondition) << missing;
  EXPECT_THAT(missing.message(), Not(HasSubstr(dir_)));
}

TEST_F(ConfinedRootTest, RenameNoReplaceAtNeverReplaces) {
  UniqueFd a(::open((dir_ + "/root/a").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(a.valid());
  std::ofstream(dir_ + "/root/a/f1") << "one";
  std::ofstream(dir_ + "/root/a/f2") << "two";
  const absl::Status s = RenameNoReplaceAt(a.get(), "f1", a.get(), "f2", "a/f2");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  std::string text;
  std::ifstream(dir_ + "/root/a/f2") >> text;
  EXPECT_EQ(text, "two");
  // A symlink as the target counts as existing and is not followed.
  fs::create_symlink(dir_ + "/outside/victim", dir_ + "/root/a/link");
  EXPECT_EQ(RenameNoReplaceAt(a.get(), "f1", a.get(), "link", "a/link").code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(fs::exists(dir_ + "/outside/victim"));
  ASSERT_TRUE(RenameNoReplaceAt(a.get(), "f1", a.get(), "f3", "a/f3").ok());
  EXPECT_TRUE(fs::exists(dir_ + "/root/a/f3"));
  EXPECT_FALSE(fs::exists(dir_ + "/root/a/f1"));
}

TEST_F(ConfinedRootTest, RemoveTreeAtRemovesEverythingButNeverFollowsSymlinks) {
  fs::create_directories(dir_ + "/root/a/t/x/y");
  std::ofstream(dir_ + "/root/a/t/x/y/f") << "x";
  std::ofstream(dir_ + "/outside/keep") << "x";
  fs::create_directory_symlink(dir_ + "/outside", dir_ + "/root/a/t/x/escape");
  UniqueFd a(::open((dir_ + "/root/a").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  auto removed = RemoveTreeAt(a.get(), "t", "a/t");
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ(*removed, 5);  // t, x, y, f, escape
  EXPECT_FALSE(fs::exists(dir_ + "/root/a/t"));
  EXPECT_TRUE(fs::exists(dir_ + "/outside/keep"));
  EXPECT_EQ(*RemoveTreeAt(a.get(), "t", "a/t"), 0);  // already gone
  // A symlink as the entry itself is removed, not its target.
  fs::create_directory_symlink(dir_ + "/outside", dir_ + "/root/a/s");
  EXPECT_EQ(*RemoveTreeAt(a.get(), "s", "a/s"), 1);
  EXPECT_TRUE(fs::exists(dir_ + "/outside/keep"));
}

TEST_F(ConfinedRootTest, AtomicFileSinkCreateAtPublishesWithoutReplacing) {
  UniqueFd a(::open((dir_ + "/root/a").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(a.valid());
  auto sink = AtomicFileSink::CreateAt(a.get(), "out.ckpt", "a/out.ckpt");
  ASSERT_TRUE(sink.ok()) << sink.status();
  EXPECT_THAT((*sink)->temp_path(), HasSubstr("a/out.ckpt.tmp."));
  ASSERT_TRUE((*sink)->Write("hello").ok());
  // A symlink planted at the target while the file is written is neither followed nor replaced.
  fs::create_symlink(dir_ + "/outside/victim", dir_ + "/root/a/out.ckpt");
  const absl::Status s = (*sink)->Commit();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(s.message(), Not(HasSubstr(dir_)));
  EXPECT_FALSE(fs::exists(dir_ + "/outside/victim"));
  EXPECT_TRUE(fs::is_symlink(dir_ + "/root/a/out.ckpt"));
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/root/a")) {
    leftovers += e.path().filename().string().find(".tmp.") != std::string::npos;
  }
  EXPECT_EQ(leftovers, 0);

  fs::remove(dir_ + "/root/a/out.ckpt");
  auto ok = AtomicFileSink::CreateAt(a.get(), "out.ckpt", "a/out.ckpt");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_TRUE((*ok)->Write("hello").ok());
  ASSERT_TRUE((*ok)->Commit().ok());
  std::string text;
  std::ifstream(dir_ + "/root/a/out.ckpt") >> text;
  EXPECT_EQ(text, "hello");
  EXPECT_EQ(AtomicFileSink::CreateAt(a.get(), "../x", "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
