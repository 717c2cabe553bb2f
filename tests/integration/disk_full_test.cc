// The disk-full loop: a real ckptd whose store lives on a small tmpfs that the test
// mounts and fills with a ballast file. While the free-space reserve is breached every write path
// (strategies, uploads, commits, deletes, jobs, the flush at shutdown) must fail with
// RESOURCE_EXHAUSTED naming the reserve, ckptd must never abort, a restart on the full disk must
// come up read-only, and committed data must stay fetchable byte for byte; with space freed,
// writes work again. Needs root (mount); skipped, visibly, where mounting is not permitted.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using testing::ServerProcess;
using testing::TempDir;

constexpr char kReserve[] = "--min-free-disk-mib";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int64_t FreeBytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.f_bavail) * static_cast<int64_t>(st.f_frsize);
}

class DiskFullTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mnt_ = dir_ / "mnt";
    std::filesystem::create_directories(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=64m") != 0) {
      GTEST_SKIP() << "cannot mount a 64 MiB tmpfs at " << mnt_ << " (" << std::strerror(errno)
                   << "): the disk-full test needs root (CI runs it as root)";
    }
    mounted_ = true;
  }

  void TearDown() override {
    server_.reset();
    if (mounted_ && ::umount2(mnt_.c_str(), MNT_DETACH) != 0) {
      ADD_FAILURE() << "umount " << mnt_ << ": " << std::strerror(errno);
    }
  }

  void StartServer() {
    // The store is the mount itself, so that the server's port and log files (beside the data
    // directory) stay on the roomy disk.
    auto s = ServerProcess::Start(CKPTD_PATH, mnt_, {kReserve, "8"});
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  // SIGTERM: a clean exit, whatever the disk.
  void StopServer() {
    client_.reset();
    const int code = server_->Stop();
    EXPECT_EQ(code, 0) << "ckptd exited with " << code << "\n" << server_->Log();
    server_.reset();
  }

  // Fills the file system up to its last byte with a ballast file.
  void Fill() {
    const std::string path = ballast();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const std::string block(1 << 20, 'b');
    for (size_t n = block.size(); n > 0;) {
      const ssize_t w = ::write(fd, block.data(), n);
      if (w < 0 && errno == ENOSPC) {
        n /= 2;  // the last few pages
        continue;
      }
      ASSERT_GE(w, 0) << std::strerror(errno);
    }
    ::close(fd);
    ASSERT_LT(FreeBytes(mnt_), 64 << 10) << "the ballast did not fill " << mnt_;
  }
  void Unfill() { std::filesystem::remove(ballast()); }
  std::string ballast() const { return mnt_ + "/ballast"; }

  static void ExpectFull(const absl::Status& s, std::string_view what) {
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << what << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(kReserve)) << what;
  }

  // Fetches rank 1 of c1 under dst and compares it with the bytes fetched before the disk filled.
  void ExpectFetchUnchanged(const std::string& reference) {
    v1::FetchRequest request;
    request.set_checkpoint_id("c1");
    request.set_destination_strategy("dst");
    request.set_rank(1);
    const std::string out = dir_ / absl::StrCat("fetched", fetches_++, ".ckpt");
    auto fetched = client_->FetchToFile(request, out);
    ASSERT_TRUE(fetched.ok()) << fetched.status() << "\n" << server_->Log();
    EXPECT_TRUE(ReadFile(out) == reference) << "fetched bytes differ from before";
    // The job's output, a checkpoint of its own.
    v1::FetchRequest merged;
    merged.set_checkpoint_id("c1dst");
    merged.set_merged(true);
    auto all = client_->FetchAll(merged);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_FALSE(all->empty());
  }

  TempDir dir_;
  std::string mnt_;
  bool mounted_ = false;
  int fetches_ = 0;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
};

TEST_F(DiskFullTest, WritesAreRefusedReadsWorkAndNothingAborts) {
  ASSERT_NO_FATAL_FAILURE(StartServer());
  // Committed data, a job's output, and strategies.
  ASSERT_TRUE(client_->PutStrategy("src", DemoSourceStrategy(), false).ok());
  ASSERT_TRUE(client_->PutStrategy("dst", DemoDestinationStrategy(), false).ok());
  ASSERT_TRUE(client_->PutStrategy("spare", DemoDestinationStrategy(), false).ok());
  const std::string sample = dir_ / "sample";
  ASSERT_TRUE(WriteShardedSample(DemoSourceStrategy(), DemoTensors(), sample, {}).ok());
  // c0 feeds the job; c1 is not read until the disk is full (its first reads then map segment
  // pages that were never touched, holes included).
  for (const char* id : {"c0", "c1"}) {
    auto uploaded = client_->UploadDirectory(id, "src", sample);
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  }
  v1::SubmitTransformRequest transform;
  transform.set_job_id("to-dst");
  transform.set_checkpoint_id("c0");
  transform.set_destination_strategy("dst");
  transform.mutable_target()->set_new_checkpoint_id("c1dst");
  ASSERT_TRUE(client_->SubmitTransform(transform).ok());
  auto job = client_->WatchJob("to-dst");
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString();

  // Full: the first fetch of c1 succeeds (every byte checksum-verified by the client) and is
  // the reference the later fetches must equal; every write is refused.
  ASSERT_NO_FATAL_FAILURE(Fill());
  v1::FetchRequest request;
  request.set_checkpoint_id("c1");
  request.set_destination_strategy("dst");
  request.set_rank(1);
  const std::string reference_path = dir_ / "reference.ckpt";
  auto first = client_->FetchToFile(request, reference_path);
  ASSERT_TRUE(first.ok()) << first.status() << "\n" << server_->Log();
  const std::string reference = ReadFile(reference_path);
  ASSERT_FALSE(reference.empty());
  auto expect_writes_refused = [&] {
    // A new name each time: existence is checked before the disk.
    ExpectFull(
        client_->PutStrategy(absl::StrCat("refused", fetches_), DemoDestinationStrategy(), false)
            .status(),
        "PutStrategy");
    ExpectFull(client_->DeleteStrategy("spare"), "DeleteStrategy");
    ExpectFull(client_->UploadDirectory("c2", "src", sample).status(), "Upload");
    ExpectFull(client_->DeleteCheckpoint("c1dst"), "DeleteCheckpoint");
    v1::SubmitTransformRequest again = transform;
    again.set_job_id("to-dst-2");
    again.mutable_target()->set_new_checkpoint_id("c1dst2");
    ExpectFull(client_->SubmitTransform(again).status(), "SubmitTransform");
    ASSERT_NO_FATAL_FAILURE(ExpectFetchUnchanged(reference));
    auto listed = client_->ListCheckpoints();
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->size(), 3u);
  };
  expect_writes_refused();

  // Space back: the running server writes again.
  Unfill();
  ASSERT_TRUE(client_->PutStrategy("more", DemoDestinationStrategy(), false).ok());

  // Full again, then a shutdown (its flush is refused) and a restart on the full disk: read-only.
  ASSERT_NO_FATAL_FAILURE(Fill());
  ASSERT_NO_FATAL_FAILURE(StopServer());
  ASSERT_NO_FATAL_FAILURE(Fill());  // what closing the store released, taken again: 0 bytes free
  ASSERT_NO_FATAL_FAILURE(StartServer());
  expect_writes_refused();
  absl::Status read_only = client_->PutStrategy("more2", DemoDestinationStrategy(), false).status();
  EXPECT_THAT(std::string(read_only.message()), HasSubstr("read-only"));
  ASSERT_NO_FATAL_FAILURE(StopServer());

  // Space back and a restart: everything writes again, and nothing was lost.
  Unfill();
  ASSERT_NO_FATAL_FAILURE(StartServer());
  ASSERT_TRUE(client_->PutStrategy("more2", DemoDestinationStrategy(), false).ok());
  auto second = client_->UploadDirectory("c2", "src", sample);
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(client_->DeleteCheckpoint("c2").ok());
  ASSERT_TRUE(client_->DeleteStrategy("spare").ok());
  ASSERT_NO_FATAL_FAILURE(ExpectFetchUnchanged(reference));
  ASSERT_NO_FATAL_FAILURE(StopServer());
}

}  // namespace
}  // namespace ckpt
