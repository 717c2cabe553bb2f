// Client library parts that need no server: choosing rank files, validating rank directories,
// progress formatting, and errors raised before any RPC. Real-server behaviour is covered by the
// integration tests.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/progress.h"
#include "client/server_commands.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kMiB = int64_t{1} << 20;

// Debian's absl::string_view is not std::string_view; gmock prints it character by character.
std::string Msg(const absl::Status& status) { return std::string(status.message()); }

// A fresh directory under TMPDIR, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "client_test.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) ADD_FAILURE() << "mkdtemp failed";
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Creates `path` (and its parents) holding `content`, with modification time now + `age_offset`.
void Touch(const fs::path& path, std::chrono::seconds age_offset = std::chrono::seconds(0),
           const std::string& content = "x") {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << content;
  fs::last_write_time(path, fs::file_time_type::clock::now() + age_offset);
}

// ---------------------------------------------------------------- ParseEpochStep

TEST(ParseEpochStepTest, ParsesMindSporeNames) {
  EXPECT_EQ(ParseEpochStep("x-9_10.ckpt"), std::make_pair(int64_t{9}, int64_t{10}));
  EXPECT_EQ(ParseEpochStep("CKP-120_3000.ckpt"), std::make_pair(int64_t{120}, int64_t{3000}));
  // The prefix may itself contain '-': the numbers follow the last one.
  EXPECT_EQ(ParseEpochStep("my-net-rank-2-7_15.ckpt"), std::make_pair(int64_t{7}, int64_t{15}));
}

TEST(ParseEpochStepTest, RejectsOtherNames) {
  EXPECT_EQ(ParseEpochStep("final.ckpt"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-9_10.ckpt.tmp"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-9.ckpt"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-9_.ckpt"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-_10.ckpt"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-9_10_breakpoint.ckpt"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-+9_10.ckpt"), std::nullopt);
  EXPECT_EQ(ParseEpochStep("x-99999999999999999999_1.ckpt"), std::nullopt);
}

// ---------------------------------------------------------------- SelectRankCheckpointFile

TEST(SelectRankCheckpointFileTest, EpochComparedNumerically) {
  TempDir dir;
  // MindSpore sorts names, so it would pick x-9_10 (spec §5 item 7); epoch 10 is newer. The
  // older epoch is even given the later mtime so that only the numbers can decide.
  Touch(dir.path() / "x-10_10.ckpt", std::chrono::seconds(-100));
  Touch(dir.path() / "x-9_10.ckpt");
  auto file = SelectRankCheckpointFile(dir.path().string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(fs::path(*file).filename(), "x-10_10.ckpt");
}

TEST(SelectRankCheckpointFileTest, StepBreaksEpochTies) {
  TempDir dir;
  Touch(dir.path() / "x-3_20.ckpt", std::chrono::seconds(-100));
  Touch(dir.path() / "x-3_5.ckpt");
  Touch(dir.path() / "x-2_900.ckpt");
  auto file = SelectRankCheckpointFile(dir.path().string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(fs::path(*file).filename(), "x-3_20.ckpt");
}

TEST(SelectRankCheckpointFileTest, IgnoresNonCkptEntries) {
  TempDir dir;
  Touch(dir.path() / "x-1_1.ckpt", std::chrono::seconds(-100));
  Touch(dir.path() / "x-99_99.ckpt.tmp.1234");
  Touch(dir.path() / "notes.txt");
  Touch(dir.path() / "x-50_1.safetensors");
  fs::create_directories(dir.path() / "x-98_1.ckpt");  // a directory, not a file
  auto file = SelectRankCheckpointFile(dir.path().string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(fs::path(*file).filename(), "x-1_1.ckpt");
}

TEST(SelectRankCheckpointFileTest, UnnumberedNamesFallBackToModificationTime) {
  TempDir dir;
  Touch(dir.path() / "z-5_5.ckpt", std::chrono::seconds(-100));
  Touch(dir.path() / "final.ckpt");
  auto file = SelectRankCheckpointFile(dir.path().string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(fs::path(*file).filename(), "final.ckpt");
}

TEST(SelectRankCheckpointFileTest, EqualTimesFallBackToName) {
  TempDir dir;
  const auto when = fs::file_time_type::clock::now();
  for (const char* name : {"b.ckpt", "c.ckpt", "a.ckpt"}) {
    Touch(dir.path() / name);
    fs::last_write_time(dir.path() / name, when);
  }
  auto file = SelectRankCheckpointFile(dir.path().string());
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(fs::path(*file).filename(), "c.ckpt");
}

TEST(SelectRankCheckpointFileTest, NoCkptIsNotFound) {
  TempDir dir;
  Touch(dir.path() / "readme.txt");
  auto file = SelectRankCheckpointFile(dir.path().string());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(file.status()), HasSubstr("no .ckpt"));
}

// ---------------------------------------------------------------- ResolveRankFiles

TEST(ResolveRankFilesTest, ReturnsOneFilePerRankInRankOrder) {
  TempDir dir;
  for (int r = 0; r < 12; ++r) {
    Touch(dir.path() / ("rank_" + std::to_string(r)) / "net-1_8.ckpt");
  }
  Touch(dir.path() / "rank_3" / "net-2_8.ckpt");  // newer epoch for rank 3
  fs::create_directories(dir.path() / "rank_backup");  // not rank_<digits>: ignored
  Touch(dir.path() / "strategy.ckpt");
  auto files = ResolveRankFiles(dir.path().string(), 12);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 12u);
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(fs::path((*files)[r]).parent_path().filename(), "rank_" + std::to_string(r));
  }
  EXPECT_EQ(fs::path((*files)[3]).filename(), "net-2_8.ckpt");
}

TEST(ResolveRankFilesTest, MissingRankIsNamed) {
  TempDir dir;
  for (int r : {0, 1, 3}) Touch(dir.path() / ("rank_" + std::to_string(r)) / "a-1_1.ckpt");
  auto files = ResolveRankFiles(dir.path().string(), 4);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(files.status()),
              AllOf(HasSubstr("missing rank_2"), HasSubstr("4 ranks"),
                    Not(HasSubstr("rank_1,")), Not(HasSubstr("unexpected"))));
}

TEST(ResolveRankFilesTest, RankBeyondWorldIsNamed) {
  TempDir dir;
  for (int r : {0, 1, 2, 3, 9}) Touch(dir.path() / ("rank_" + std::to_string(r)) / "a-1_1.ckpt");
  auto files = ResolveRankFiles(dir.path().string(), 4);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(files.status()),
              AllOf(HasSubstr("unexpected rank_9"), Not(HasSubstr("missing"))));
}

TEST(ResolveRankFilesTest, LongMissingListIsShortened) {
  TempDir dir;
  Touch(dir.path() / "rank_0" / "a-1_1.ckpt");
  auto files = ResolveRankFiles(dir.path().string(), 64);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(files.status()),
              AllOf(HasSubstr("missing rank_1, rank_2, "), HasSubstr("rank_10 and 53 more"),
                    Not(HasSubstr("rank_11,"))));
}

TEST(ResolveRankFilesTest, LeadingZerosAreRejected) {
  TempDir dir;
  Touch(dir.path() / "rank_0" / "a-1_1.ckpt");
  Touch(dir.path() / "rank_01" / "a-1_1.ckpt");
  auto files = ResolveRankFiles(dir.path().string(), 2);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(files.status()), HasSubstr("rank_01"));
}

TEST(ResolveRankFilesTest, RankWithoutCkptIsNotFound) {
  TempDir dir;
  Touch(dir.path() / "rank_0" / "a-1_1.ckpt");
  fs::create_directories(dir.path() / "rank_1");
  auto files = ResolveRankFiles(dir.path().string(), 2);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(files.status()), HasSubstr("rank_1"));
}

TEST(ResolveRankFilesTest, MissingDirectoryIsNotFound) {
  TempDir dir;
  auto files = ResolveRankFiles((dir.path() / "nope").string(), 2);
  EXPECT_EQ(files.status().code(), absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------- progress

TEST(FormatProgressLineTest, MatchesDocumentedLayout) {
  const int64_t done = static_cast<int64_t>(12.3 * kMiB);
  EXPECT_EQ(FormatProgressLine(done, 27 * kMiB, 8.1 * kMiB),
            "[#####.....] 45%  12.3/27.0 MiB  8.1 MiB/s  ETA 2s");
}

TEST(FormatProgressLineTest, StartAndEnd) {
  EXPECT_EQ(FormatProgressLine(0, 4 * kMiB, 0), "[..........] 0%  0.0/4.0 MiB  ETA --");
  EXPECT_EQ(FormatProgressLine(4 * kMiB, 4 * kMiB, 2.0 * kMiB),
            "[##########] 100%  4.0/4.0 MiB  2.0 MiB/s  ETA 0s");
  // Overshoot (a rank reporting late) is clamped.
  EXPECT_EQ(FormatProgressLine(5 * kMiB, 4 * kMiB, 2.0 * kMiB),
            "[##########] 100%  4.0/4.0 MiB  2.0 MiB/s  ETA 0s");
}

TEST(FormatProgressLineTest, UnitsFollowTheTotal) {
  EXPECT_EQ(FormatProgressLine(512, 2048, 1024.0), "[###.......] 25%  0.5/2.0 KiB  1.0 KiB/s  ETA 2s");
  EXPECT_EQ(FormatProgressLine(int64_t{3} << 30, int64_t{6} << 30, 100.0 * kMiB),
            "[#####.....] 50%  3.0/6.0 GiB  100.0 MiB/s  ETA 31s");
  EXPECT_EQ(FormatProgressLine(10, 100, 0), "[#.........] 10%  10/100 B  ETA --");
}

TEST(FormatProgressLineTest, LongEtas) {
  EXPECT_THAT(FormatProgressLine(0, 65 * kMiB, 1.0 * kMiB), HasSubstr("ETA 1m05s"));
  EXPECT_THAT(FormatProgressLine(0, 7300 * kMiB, 1.0 * kMiB), HasSubstr("ETA 2h01m"));
  EXPECT_THAT(FormatProgressLine(0, int64_t{1} << 50, 1.0), HasSubstr("ETA >99h"));
}

TEST(FormatProgressLineTest, UnknownTotal) {
  EXPECT_EQ(FormatProgressLine(3 * kMiB, 0, 1.5 * kMiB), "3.0 MiB  1.5 MiB/s");
  EXPECT_EQ(FormatProgressLine(0, 0, 0), "0 B");
}

TEST(FormatBytesTest, PicksLargestUnit) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(kMiB), "1.0 MiB");
  EXPECT_EQ(FormatBytes(int64_t{5} << 40), "5.0 TiB");
}

TEST(ProgressReporterTest, DisabledWritesNothing) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.enabled = false;
  {
    ProgressReporter reporter(options);
    reporter.Update(1, 2);
    reporter.Done();
  }
  EXPECT_EQ(out.str(), "");
}

TEST(ProgressReporterTest, RedrawsOneLineAndEndsIt) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.enabled = true;
  options.min_interval = absl::ZeroDuration();
  ProgressReporter reporter(options);
  reporter.Update(0, 100);
  reporter.Update(50, 100);
  reporter.Done();
  reporter.Update(60, 100);  // ignored after Done
  const std::string s = out.str();
  EXPECT_EQ(s.front(), '\r');
  EXPECT_EQ(s.back(), '\n');
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1);
  EXPECT_THAT(s, HasSubstr("50%"));
  EXPECT_THAT(s, Not(HasSubstr("60%")));
}

TEST(ProgressReporterTest, ClearErasesTheLine) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.enabled = true;
  options.min_interval = absl::ZeroDuration();
  ProgressReporter reporter(options);
  reporter.Update(10, 100);
  reporter.Clear();
  const std::string s = out.str();
  EXPECT_EQ(s.back(), '\r');
  EXPECT_EQ(s.find('\n'), std::string::npos);
}

TEST(ProgressReporterTest, ConcurrentUpdates) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.enabled = true;
  options.min_interval = absl::ZeroDuration();
  ProgressReporter reporter(options);
  ProgressFn callback = reporter.Callback();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&callback] {
      for (int i = 0; i <= 1000; ++i) callback(i, 1000);
    });
  }
  for (std::thread& t : threads) t.join();
  reporter.Done();
  EXPECT_THAT(out.str(), HasSubstr("100%"));
}

// ---------------------------------------------------------------- errors before any RPC

// An address nothing listens on (port 1 is privileged and unused on test machines).
constexpr char kDeadAddress[] = "127.0.0.1:1";

std::unique_ptr<CkptClient> DeadClient() {
  ClientOptions options;
  options.unary_timeout = absl::Seconds(5);
  auto client = CkptClient::Connect(kDeadAddress, options);
  EXPECT_TRUE(client.ok()) << client.status();
  return std::move(*client);
}

TEST(CkptClientTest, ConnectValidatesArguments) {
  EXPECT_EQ(CkptClient::Connect("").status().code(), absl::StatusCode::kInvalidArgument);
  ClientOptions options;
  options.max_receive_message_bytes = 0;
  EXPECT_EQ(CkptClient::Connect(kDeadAddress, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CkptClientTest, ConnectTimeoutReportsUnavailable) {
  ClientOptions options;
  options.connect_timeout = absl::Milliseconds(200);
  auto client = CkptClient::Connect(kDeadAddress, options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Msg(client.status()), HasSubstr(kDeadAddress));
}

TEST(CkptClientTest, UnreachableServerNamesTheAddress) {
  auto client = DeadClient();
  auto list = client->ListCheckpoints();
  EXPECT_THAT(list.status().code(), ::testing::AnyOf(absl::StatusCode::kUnavailable,
                                                     absl::StatusCode::kDeadlineExceeded));
  EXPECT_THAT(Msg(list.status()), HasSubstr(kDeadAddress));
}

TEST(CkptClientTest, UploadOfMissingFileFailsLocally) {
  TempDir dir;
  auto client = DeadClient();
  auto response = client->UploadRank("c1", "s", 0, (dir.path() / "none.ckpt").string());
  EXPECT_EQ(response.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(response.status()), HasSubstr("none.ckpt"));
}

TEST(CkptClientTest, UploadDirectoryValidatesParallelism) {
  auto client = DeadClient();
  auto summary = client->UploadDirectory("c1", "s", "/nonexistent", {.parallelism = 0});
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CkptClientTest, FailedFetchLeavesNoFile) {
  TempDir dir;
  auto client = DeadClient();
  v1::FetchRequest request;
  request.set_checkpoint_id("c1");
  request.set_merged(true);
  const fs::path out = dir.path() / "out.ckpt";
  EXPECT_FALSE(client->FetchToFile(request, out.string()).ok());
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(ServerCommandsTest, FetchArgumentCombinations) {
  auto client = DeadClient();
  std::ostringstream out, err;
  FetchCommand both;
  both.checkpoint_id = "c1";
  both.strategy = "dst";
  both.rank = 0;
  both.merged = true;
  both.out_path = "x.ckpt";
  EXPECT_EQ(RunFetch(*client, both, out, err).code(), absl::StatusCode::kInvalidArgument);
  FetchCommand no_rank = both;
  no_rank.merged = false;
  no_rank.rank.reset();
  EXPECT_EQ(RunFetch(*client, no_rank, out, err).code(), absl::StatusCode::kInvalidArgument);
  FetchCommand neither = no_rank;
  neither.strategy.clear();
  EXPECT_EQ(RunFetch(*client, neither, out, err).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.str(), "");
}

TEST(ServerCommandsTest, UploadArgumentCombinations) {
  auto client = DeadClient();
  std::ostringstream out, err;
  UploadCommand both;
  both.checkpoint_id = "c1";
  both.strategy = "s";
  both.dir = "d";
  both.file = "f.ckpt";
  EXPECT_EQ(RunUpload(*client, both, out, err).code(), absl::StatusCode::kInvalidArgument);
  UploadCommand dir_without_strategy;
  dir_without_strategy.checkpoint_id = "c1";
  dir_without_strategy.dir = "d";
  EXPECT_EQ(RunUpload(*client, dir_without_strategy, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  UploadCommand file_with_strategy;
  file_with_strategy.checkpoint_id = "c1";
  file_with_strategy.file = "f.ckpt";
  file_with_strategy.strategy = "s";
  EXPECT_EQ(RunUpload(*client, file_with_strategy, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.str(), "");
}

}  // namespace
}  // namespace ckpt
