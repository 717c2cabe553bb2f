// Client library parts that need no ckptd: choosing rank files, validating rank directories,
// progress formatting, errors raised before any RPC, and the checks of fetched data against an
// in-process peer that sends crafted messages. Real-server behaviour is covered by the
// integration tests.
#include "client/client.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/ckptctl/exit_codes.h"
#include "client/ckptctl/job_commands.h"
#include "client/ckptctl/output.h"
#include "client/ckptctl/progress.h"
#include "client/ckptctl/rank_list.h"
#include "client/ckptctl/retry.h"
#include "client/ckptctl/server_commands.h"
#include "client/rank_directory.h"
#include "core/checksum.h"
#include "core/duration_text.h"
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
  // MindSpore sorts names, so it would pick x-9_10; epoch 10 is newer. The
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
  Touch(dir.path() / "rank_3" / "net-2_8.ckpt");       // newer epoch for rank 3
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
  EXPECT_THAT(Msg(files.status()), AllOf(HasSubstr("missing rank_2"), HasSubstr("4 ranks"),
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
  EXPECT_EQ(FormatProgressLine(512, 2048, 1024.0),
            "[###.......] 25%  0.5/2.0 KiB  1.0 KiB/s  ETA 2s");
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

// Every status code has its class; PERMISSION_DENIED and UNAUTHENTICATED are produced for real
// only once ckptd checks credentials, so their row is checked here.
TEST(ExitCodeTest, EveryStatusCodeMapsToItsClass) {
  const std::vector<std::pair<absl::StatusCode, ExitCode>> table = {
      {absl::StatusCode::kOk, ExitCode::kOk},
      {absl::StatusCode::kCancelled, ExitCode::kOther},
      {absl::StatusCode::kUnknown, ExitCode::kOther},
      {absl::StatusCode::kInvalidArgument, ExitCode::kInvalidArgument},
      {absl::StatusCode::kDeadlineExceeded, ExitCode::kUnavailable},
      {absl::StatusCode::kNotFound, ExitCode::kNotFound},
      {absl::StatusCode::kAlreadyExists, ExitCode::kAlreadyExists},
      {absl::StatusCode::kPermissionDenied, ExitCode::kPermissionDenied},
      {absl::StatusCode::kResourceExhausted, ExitCode::kUnavailable},
      {absl::StatusCode::kFailedPrecondition, ExitCode::kInvalidArgument},
      {absl::StatusCode::kAborted, ExitCode::kOther},
      {absl::StatusCode::kOutOfRange, ExitCode::kInvalidArgument},
      {absl::StatusCode::kUnimplemented, ExitCode::kOther},
      {absl::StatusCode::kInternal, ExitCode::kOther},
      {absl::StatusCode::kUnavailable, ExitCode::kUnavailable},
      {absl::StatusCode::kDataLoss, ExitCode::kDataLoss},
      {absl::StatusCode::kUnauthenticated, ExitCode::kPermissionDenied},
  };
  EXPECT_EQ(table.size(), 17u);  // every code of absl::StatusCode
  for (const auto& [code, expected] : table) {
    EXPECT_EQ(ExitCodeFor(code), expected) << absl::StatusCodeToString(code);
    EXPECT_EQ(ExitStatusFor(absl::Status(code, code == absl::StatusCode::kOk ? "" : "x")),
              static_cast<int>(expected));
  }
  // Each class has its own number and name.
  std::set<int> numbers;
  std::set<std::string_view> names;
  for (ExitCode c : {ExitCode::kOk, ExitCode::kOther, ExitCode::kUsage, ExitCode::kNotFound,
                     ExitCode::kAlreadyExists, ExitCode::kInvalidArgument, ExitCode::kUnavailable,
                     ExitCode::kPermissionDenied, ExitCode::kDataLoss}) {
    numbers.insert(static_cast<int>(c));
    names.insert(ExitCodeName(c));
  }
  EXPECT_EQ(numbers.size(), 9u);
  EXPECT_EQ(names.size(), 9u);
}

TEST(DurationTextTest, ParsesOperatorDurations) {
  EXPECT_EQ(*ParseDurationText("90s"), absl::Seconds(90));
  EXPECT_EQ(*ParseDurationText("5m"), absl::Minutes(5));
  EXPECT_EQ(*ParseDurationText("1h30m"), absl::Minutes(90));
  EXPECT_EQ(*ParseDurationText("500ms"), absl::Milliseconds(500));
  EXPECT_EQ(*ParseDurationText("7d"), absl::Hours(24 * 7));
  EXPECT_EQ(*ParseDurationText("1.5d"), absl::Hours(36));
  EXPECT_EQ(*ParseDurationText("0"), absl::ZeroDuration());
  for (const char* bad : {"", "5", "-1s", "inf", "soon", "d", "3dd", "1s junk"}) {
    EXPECT_EQ(ParseDurationText(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(FormatDurationText(absl::Hours(24 * 7)), "7d");
  EXPECT_EQ(FormatDurationText(absl::Minutes(90)), "1h30m");
  EXPECT_EQ(FormatDurationText(absl::Seconds(30)), "30s");
  EXPECT_EQ(FormatDurationText(absl::ZeroDuration()), "0");
}

TEST(RetryTest, BackoffGrowsExponentiallyWithJitterUpToTheCap) {
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(100);
  options.max_backoff = absl::Seconds(1);
  EXPECT_EQ(RetryBackoff(options, 1, 0.5), absl::Milliseconds(100));
  EXPECT_EQ(RetryBackoff(options, 2, 0.5), absl::Milliseconds(200));
  EXPECT_EQ(RetryBackoff(options, 3, 0.5), absl::Milliseconds(400));
  EXPECT_EQ(RetryBackoff(options, 10, 0.5), absl::Seconds(1));
  EXPECT_EQ(RetryBackoff(options, 1, 0.0), absl::Milliseconds(50));
  EXPECT_LT(RetryBackoff(options, 1, 0.999), absl::Milliseconds(150));
}

TEST(RetryTest, RetriesUnavailableOnlyWhenIdempotentAndBounded) {
  RetryOptions options;
  options.initial_backoff = absl::Milliseconds(1);
  options.attempts_without_wait = 3;
  int connects = 0;
  auto connect = [&](absl::Duration) -> absl::StatusOr<std::unique_ptr<CkptClient>> {
    ++connects;
    return CkptClient::Connect("127.0.0.1:1");
  };
  std::ostringstream err;
  int attempts = 0;
  auto unavailable = [&](CkptClient&) {
    ++attempts;
    return absl::UnavailableError("down");
  };
  EXPECT_EQ(RunWithRetries(options, true, connect, unavailable, nullptr, err).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(connects, 3);
  attempts = 0;
  EXPECT_EQ(RunWithRetries(options, false, connect, unavailable, nullptr, err).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(attempts, 1);
  // Other failures are never retried; success ends at once; before_retry runs between.
  attempts = 0;
  int resets = 0;
  auto flaky = [&](CkptClient&) {
    return ++attempts < 2 ? absl::UnavailableError("down") : absl::NotFoundError("gone");
  };
  EXPECT_EQ(RunWithRetries(
                options, true, connect, flaky, [&] { ++resets; }, err)
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(attempts, 2);
  EXPECT_EQ(resets, 1);
  EXPECT_EQ(err.str(), "");  // nothing said without --wait-for-server
}

TEST(RetryTest, WaitForServerRetriesUntilTheDeadlineAndSaysSo) {
  RetryOptions options;
  options.wait_for_server = absl::Milliseconds(300);
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(40);
  auto connect = [](absl::Duration) { return CkptClient::Connect("127.0.0.1:1"); };
  int attempts = 0;
  std::ostringstream err;
  const absl::Time start = absl::Now();
  absl::Status s = RunWithRetries(
      options, true, connect,
      [&](CkptClient&) {
        ++attempts;
        return absl::UnavailableError("down");
      },
      nullptr, err);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gave up after waiting"));
  EXPECT_GT(attempts, 3);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_THAT(err.str(), HasSubstr("--wait-for-server"));
}

TEST(OutputDescriptorTest, NamesTheDescriptorsThatAreNeverReplaced) {
  EXPECT_EQ(OutputDescriptor("-"), 1);
  EXPECT_EQ(OutputDescriptor("/dev/stdout"), 1);
  EXPECT_EQ(OutputDescriptor("/dev/stderr"), 2);
  EXPECT_EQ(OutputDescriptor("/dev/fd/7"), 7);
  EXPECT_EQ(OutputDescriptor("/proc/self/fd/1"), 1);
  EXPECT_EQ(OutputDescriptor("/dev/fd/x"), -1);
  EXPECT_EQ(OutputDescriptor("/dev/fd/"), -1);
  EXPECT_EQ(OutputDescriptor("out.ckpt"), -1);
  EXPECT_EQ(OutputDescriptor("./-"), -1);
}

TEST(JsonOutputTest, JobsAndCheckpointsUseExactIntegersAndSnakeCase) {
  v1::Job job;
  job.set_id("j");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_request()->set_checkpoint_id("ck");
  job.mutable_request()->mutable_target()->set_export_dir("/x");
  job.mutable_progress()->set_bytes_done(int64_t{3} << 40);
  job.mutable_progress()->set_bytes_total(int64_t{4} << 40);
  const nlohmann::json j = JobJson(job);
  EXPECT_EQ(j["state"], "RUNNING");
  EXPECT_EQ(j["target"]["kind"], "export");
  EXPECT_EQ(j["progress"]["bytes_done"].get<int64_t>(), int64_t{3} << 40);
  EXPECT_EQ(j["percent"], 75);
  v1::CheckpointInfo info;
  info.set_id("c");
  info.set_stored_bytes((int64_t{1} << 53) + 1);  // beyond a double's exact integers
  std::ostringstream out;
  PrintJsonLine(CheckpointInfoJson(info), out);
  const std::string line = out.str();
  EXPECT_THAT(line, HasSubstr("\"stored_bytes\":9007199254740993"));
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1);
}

TEST(ProgressReporterTest, DisabledWritesNothing) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.mode = ProgressMode::kNone;
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
  options.mode = ProgressMode::kBar;
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

TEST(ProgressReporterTest, PlainModePrintsWholeLinesAfterEachIntervalOnly) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.mode = ProgressMode::kPlain;
  options.plain_interval = absl::Milliseconds(50);
  ProgressReporter reporter(options);
  reporter.Update(10, 100);  // within the first interval: nothing
  EXPECT_EQ(out.str(), "");
  absl::SleepFor(absl::Milliseconds(80));
  reporter.Update(40, 100);
  reporter.Update(41, 100);  // same interval: nothing more
  reporter.Done();
  const std::string s = out.str();
  EXPECT_EQ(s.find('\r'), std::string::npos) << s;
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), 1) << s;
  EXPECT_THAT(s, HasSubstr("progress: "));
  EXPECT_THAT(s, HasSubstr("40%"));
}

TEST(ProgressModeTest, ParsesTheFourModesAndRefusesOthers) {
  EXPECT_EQ(*ParseProgressMode("auto"), ProgressMode::kAuto);
  EXPECT_EQ(*ParseProgressMode("bar"), ProgressMode::kBar);
  EXPECT_EQ(*ParseProgressMode("plain"), ProgressMode::kPlain);
  EXPECT_EQ(*ParseProgressMode("none"), ProgressMode::kNone);
  EXPECT_EQ(ParseProgressMode("fancy").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveProgressMode(ProgressMode::kPlain), ProgressMode::kPlain);
  EXPECT_NE(ResolveProgressMode(ProgressMode::kAuto), ProgressMode::kAuto);
}

TEST(ProgressReporterTest, ClearErasesTheLine) {
  std::ostringstream out;
  ProgressOptions options;
  options.out = &out;
  options.mode = ProgressMode::kBar;
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
  options.mode = ProgressMode::kBar;
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

// An in-process peer whose Fetch sends a plan summary, one tensor header and the given data
// messages: checks the client's verification of what a faulty server or network could send.
class ScriptedFetchService final : public v1::CheckpointService::Service {
 public:
  // One UInt8 tensor "w" of shape `local` (default: [the data's bytes]).
  explicit ScriptedFetchService(std::vector<v1::FetchData> data, Shape local = {})
      : data_(std::move(data)), local_(std::move(local)) {}

  grpc::Status Fetch(grpc::ServerContext*, const v1::FetchRequest*,
                     grpc::ServerWriter<v1::FetchResponse>* writer) override {
    int64_t total = 0;
    for (const v1::FetchData& d : data_) total += static_cast<int64_t>(d.data().size());
    if (!local_.empty()) total = *NumElements(local_);
    v1::FetchResponse m;
    m.mutable_summary()->set_tensor_count(1);
    m.mutable_summary()->set_total_bytes(total);
    writer->Write(m);
    m.Clear();
    m.mutable_tensor()->set_name("w");
    m.mutable_tensor()->set_dtype("UInt8");
    if (local_.empty()) {
      m.mutable_tensor()->add_local_shape(total);
    } else {
      for (int64_t d : local_) m.mutable_tensor()->add_local_shape(d);
    }
    m.mutable_tensor()->set_total_bytes(total);
    writer->Write(m);
    for (const v1::FetchData& d : data_) {
      *m.mutable_data() = d;
      writer->Write(m);
    }
    return grpc::Status::OK;
  }

 private:
  std::vector<v1::FetchData> data_;
  const Shape local_;
};

// Fetches `data` from a ScriptedFetchService; the bytes delivered, or the client's error.
absl::StatusOr<std::string> FetchScripted(std::vector<v1::FetchData> data, Shape local = {}) {
  ScriptedFetchService service(std::move(data), std::move(local));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return absl::InternalError("could not start the scripted server");
  auto client = CkptClient::Connect(absl::StrCat("127.0.0.1:", port));
  if (!client.ok()) return client.status();
  v1::FetchRequest request;
  request.set_checkpoint_id("c1");
  request.set_merged(true);
  auto got = (*client)->FetchAll(request);
  server->Shutdown();
  if (!got.ok()) return got.status();
  std::string bytes;
  for (const FetchedTensor& t : *got) bytes += t.data;
  return bytes;
}

// `bytes` in parts of `sizes`, each with its own checksum.
v1::FetchData InParts(const std::string& bytes, const std::vector<uint64_t>& sizes) {
  v1::FetchData d;
  d.set_data(bytes);
  size_t offset = 0;
  for (uint64_t n : sizes) {
    d.add_part_bytes(n);
    const std::string part = bytes.substr(std::min(offset, bytes.size()), n);
    d.add_part_checksums(Checksum(part));
    offset += n;
  }
  return d;
}

// `bytes` as one part.
v1::FetchData OnePart(const std::string& bytes) { return InParts(bytes, {bytes.size()}); }

TEST(CkptClientTest, DataMessagesOfOneOrSeveralPartsAreVerified) {
  auto got = FetchScripted({OnePart("abcdef"), InParts("ghijklmnop", {3, 1, 6})});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "abcdefghijklmnop");
}

// Tiles `boxes` of the row-major UInt8 array `array` of shape `local`, one part each, in a band
// of `band_rows` rows.
v1::FetchData Tiles(const std::string& array, const Shape& local, const std::vector<Box>& boxes,
                    int64_t band_rows) {
  v1::FetchData d;
  for (const Box& box : boxes) {
    std::string tile;
    std::vector<int64_t> index = box.lo;
    do {
      int64_t offset = 0;
      for (size_t k = 0; k < local.size(); ++k) offset = offset * local[k] + index[k];
      tile.push_back(array[static_cast<size_t>(offset)]);
    } while (NextIndex(index, box.lo, box.hi));
    *d.mutable_data() += tile;
    d.add_part_bytes(tile.size());
    d.add_part_checksums(Checksum(tile));
    for (int64_t v : box.lo) d.add_tile_box(v);
    for (int64_t v : box.hi) d.add_tile_box(v);
  }
  d.set_band_rows(band_rows);
  return d;
}

// A [4, 6] tensor: row 0 row-major, rows 1-2 as a band of two tiles sent right tile first (in
// one message, then in two), row 3 row-major again.
TEST(CkptClientTest, BandsOfTilesAreAssembledInPlace) {
  const Shape local = {4, 6};
  std::string array;
  for (int i = 0; i < 24; ++i) array.push_back(static_cast<char>('a' + i));
  const Box left{{1, 0}, {3, 4}}, right{{1, 4}, {3, 6}};
  for (bool one_message : {true, false}) {
    SCOPED_TRACE(one_message ? "one message" : "two messages");
    std::vector<v1::FetchData> script = {OnePart(array.substr(0, 6))};
    if (one_message) {
      script.push_back(Tiles(array, local, {right, left}, 2));
    } else {
      script.push_back(Tiles(array, local, {right}, 2));
      script.push_back(Tiles(array, local, {left}, 2));
    }
    script.push_back(OnePart(array.substr(18)));
    auto got = FetchScripted(script, local);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, array);
  }
}

TEST(CkptClientTest, BadBandsOfTilesAreDataLoss) {
  const Shape local = {4, 6};
  const std::string array(24, 'x');
  const Box left{{1, 0}, {3, 4}}, right{{1, 4}, {3, 6}};
  struct Case {
    const char* what;
    std::vector<v1::FetchData> after_row_0;
    const char* error;
  };
  std::vector<Case> cases;
  cases.push_back({"overlapping tiles",
                   {Tiles(array, local, {left, Box{{1, 3}, {3, 6}}}, 2)},
                   "overlaps tile [1:3, 0:4]"});
  cases.push_back({"a tile outside its band",
                   {Tiles(array, local, {Box{{0, 0}, {2, 6}}}, 2)},
                   "is not inside band [1:3, 0:6]"});
  cases.push_back(
      {"a band beyond the slice", {Tiles(array, local, {left}, 4)}, "outside a slice of 4 rows"});
  {
    v1::FetchData d = Tiles(array, local, {left, right}, 2);
    d.mutable_tile_box()->RemoveLast();
    cases.push_back({"tile coordinates short of the parts", {d}, "lists 7 tile coordinates"});
  }
  cases.push_back({"a band changing its rows",
                   {Tiles(array, local, {left}, 2), Tiles(array, local, {right}, 1)},
                   "a band of 2 rows continues as one of 1"});
  cases.push_back({"row-major data inside a band",
                   {Tiles(array, local, {left}, 2), OnePart(array.substr(0, 4))},
                   "row-major data inside a band of tiles"});
  cases.push_back({"a tensor ending inside a band",
                   {Tiles(array, local, {left}, 2)},
                   "a band of tiles [1:3, 0:6] was incomplete"});
  {
    v1::FetchData d = Tiles(array, local, {left, right}, 2);
    (*d.mutable_data())[9] = 'y';
    cases.push_back({"a corrupted tile", {d}, "bytes [14, 18) failed their XXH3-64 checksum"});
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    std::vector<v1::FetchData> script = {OnePart(array.substr(0, 6))};
    script.insert(script.end(), c.after_row_0.begin(), c.after_row_0.end());
    auto got = FetchScripted(script, local);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_THAT(Msg(got.status()), AllOf(HasSubstr("tensor w"), HasSubstr(c.error)));
  }
}

TEST(CkptClientTest, CorruptOrMalformedDataMessagesAreDataLoss) {
  struct Case {
    const char* what;
    v1::FetchData data;
    const char* error;
  };
  std::vector<Case> cases;
  {
    v1::FetchData d = OnePart("abcdef");
    d.set_data("abcdeF");
    cases.push_back({"flipped byte", d, "bytes [4, 10) failed their XXH3-64 checksum"});
  }
  {
    v1::FetchData d = InParts("abcdefghij", {4, 6});
    d.set_data("abcdefghiJ");
    cases.push_back({"flipped byte in the second part", d, "bytes [8, 14) failed their XXH3-64"});
  }
  {
    v1::FetchData d = InParts("abcdefghij", {4, 6});
    d.add_part_bytes(1);
    cases.push_back({"more sizes than checksums", d, "lists 3 part sizes and 2 part checksums"});
  }
  {
    v1::FetchData d;
    d.set_data("abcdefghij");
    cases.push_back({"no parts", d, "lists 0 part sizes and 0 part checksums"});
  }
  cases.push_back({"an empty part", InParts("abcdefghij", {4, 0, 6}), "part 1 of 0 bytes"});
  cases.push_back({"parts beyond the data", InParts("abcdefghij", {4, 7}),
                   "a data message of 10 bytes lists part 1 of 7 bytes at offset 4"});
  cases.push_back(
      {"parts short of the data", InParts("abcdefghij", {4, 5}), "cover 9 of its 10 bytes"});
  cases.push_back({"a huge part size", InParts("abcdefghij", {4, ~uint64_t{0}}),
                   "lists part 1 of 18446744073709551615 bytes"});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // After 4 good bytes: positions in errors count from the start of the tensor.
    auto got = FetchScripted({OnePart("0123"), c.data});
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_THAT(Msg(got.status()), AllOf(HasSubstr("tensor w"), HasSubstr(c.error)));
  }
}

TEST(ServerCommandsTest, FetchArgumentCombinations) {
  auto client = DeadClient();
  std::ostringstream out, err;
  FetchCommand both;
  both.checkpoint_id = "c1";
  both.destination_strategy = "dst";
  both.rank = 0;
  both.merged = true;
  both.out_path = "x.ckpt";
  EXPECT_EQ(RunFetch(*client, both, out, err).code(), absl::StatusCode::kInvalidArgument);
  FetchCommand no_rank = both;
  no_rank.merged = false;
  no_rank.rank.reset();
  EXPECT_EQ(RunFetch(*client, no_rank, out, err).code(), absl::StatusCode::kInvalidArgument);
  FetchCommand neither = no_rank;
  neither.destination_strategy.clear();
  EXPECT_EQ(RunFetch(*client, neither, out, err).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.str(), "");
}

TEST(ServerCommandsTest, UploadArgumentCombinations) {
  auto client = DeadClient();
  std::ostringstream out, err;
  UploadCommand both;
  both.checkpoint_id = "c1";
  both.source_strategy = "s";
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
  file_with_strategy.source_strategy = "s";
  EXPECT_EQ(RunUpload(*client, file_with_strategy, out, err).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.str(), "");
}

TEST(ServerCommandsTest, TransformArgumentCombinations) {
  auto client = DeadClient();
  std::ostringstream out;
  auto run = [&](TransformCommand command) { return RunTransform(*client, command, out); };
  TransformCommand base;
  base.checkpoint_id = "c1";
  base.destination_strategy = "dst";

  TransformCommand none = base;
  EXPECT_EQ(run(none).code(), absl::StatusCode::kInvalidArgument);
  TransformCommand two = base;
  two.new_checkpoint_id = "c2";
  two.export_dir = "/srv/out";
  EXPECT_EQ(run(two).code(), absl::StatusCode::kInvalidArgument);

  // Output paths are the server's to judge (relative to its --export-root): a relative one
  // passes the client's checks and reaches the (here unreachable) server.
  TransformCommand relative = base;
  relative.export_dir = "out";
  const absl::Status relative_status = run(relative);
  EXPECT_THAT(relative_status.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << relative_status;

  TransformCommand relative_file;
  relative_file.checkpoint_id = "c1";
  relative_file.merged_file = "merged.ckpt";
  const absl::Status relative_file_status = run(relative_file);
  EXPECT_THAT(relative_file_status.code(),
              ::testing::AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kDeadlineExceeded))
      << relative_file_status;

  TransformCommand merged_with_strategy = base;
  merged_with_strategy.merged_file = "/srv/merged.ckpt";
  EXPECT_THAT(Msg(run(merged_with_strategy)), HasSubstr("takes no --dst-strategy"));

  TransformCommand as_without_strategy;
  as_without_strategy.checkpoint_id = "c1";
  as_without_strategy.new_checkpoint_id = "c2";
  EXPECT_THAT(Msg(run(as_without_strategy)), HasSubstr("needs --dst-strategy"));

  TransformCommand ranks_with_as = base;
  ranks_with_as.new_checkpoint_id = "c2";
  ranks_with_as.ranks = "0";
  EXPECT_THAT(Msg(run(ranks_with_as)), HasSubstr("--export-dir only"));

  TransformCommand bad_ranks = base;
  bad_ranks.export_dir = "/srv/out";
  bad_ranks.ranks = "0,x";
  const absl::Status bad_ranks_status = run(bad_ranks);
  EXPECT_EQ(bad_ranks_status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(bad_ranks_status), AllOf(HasSubstr("--ranks"), HasSubstr("\"x\"")));
  EXPECT_EQ(out.str(), "");
}

TEST(ServerCommandsTest, ExportChecksArgumentsAndTargetBeforeAnyRpc) {
  TempDir dir;
  auto client = DeadClient();
  std::ostringstream out, err;
  ExportCommand base;
  base.checkpoint_id = "c1";
  base.destination_strategy = "dst";
  base.dir = (dir.path() / "export").string();

  ExportCommand bad_prefix = base;
  bad_prefix.prefix = "a/b";
  EXPECT_EQ(RunExport(*client, bad_prefix, out, err).code(), absl::StatusCode::kInvalidArgument);
  ExportCommand no_parallel = base;
  no_parallel.parallel = 0;
  EXPECT_EQ(RunExport(*client, no_parallel, out, err).code(), absl::StatusCode::kInvalidArgument);
  ExportCommand bad_ranks = base;
  bad_ranks.ranks = "3-1";
  EXPECT_THAT(Msg(RunExport(*client, bad_ranks, out, err)), HasSubstr("reversed"));

  // A non-empty target is refused before the server is asked anything (it is unreachable).
  Touch(dir.path() / "export" / "old.txt");
  const absl::Status taken = RunExport(*client, base, out, err);
  EXPECT_EQ(taken.code(), absl::StatusCode::kAlreadyExists) << taken;
  EXPECT_THAT(Msg(taken), HasSubstr("not empty"));
  ExportCommand file_target = base;
  file_target.dir = (dir.path() / "export" / "old.txt").string();
  EXPECT_EQ(RunExport(*client, file_target, out, err).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(out.str(), "");
}

TEST(CkptClientTest, FailedExportLeavesNothingBehind) {
  TempDir dir;
  auto client = DeadClient();
  auto summary = client->ExportRanks("c1", "dst", (dir.path() / "sub" / "export").string(), {});
  EXPECT_FALSE(summary.ok());
  EXPECT_FALSE(fs::exists(dir.path() / "sub" / "export"));
  // No temporary sibling is left either.
  if (fs::exists(dir.path() / "sub")) {
    EXPECT_TRUE(fs::is_empty(dir.path() / "sub"));
  }
}

TEST(CkptClientTest, ExportRefusesABadPrefixBeforeAnyCall) {
  TempDir dir;
  auto client = DeadClient();
  for (const std::string& prefix : {std::string(""), std::string("a/b"), std::string(201, 'a')}) {
    auto summary = client->ExportRanks("c1", "dst", (dir.path() / "export").string(), {}, prefix);
    EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument) << prefix;
    EXPECT_THAT(Msg(summary.status()), HasSubstr("invalid file name prefix")) << prefix;
  }
  EXPECT_FALSE(fs::exists(dir.path() / "export"));
}

// ---------------------------------------------------------------- rank lists

TEST(ParseRankListTest, SingleRanksAndRanges) {
  EXPECT_EQ(*ParseRankList("0"), (std::vector<int64_t>{0}));
  EXPECT_EQ(*ParseRankList("0,2,5-7"), (std::vector<int64_t>{0, 2, 5, 6, 7}));
  EXPECT_EQ(*ParseRankList("3-3"), (std::vector<int64_t>{3}));
  EXPECT_EQ(*ParseRankList("10-12,1"), (std::vector<int64_t>{1, 10, 11, 12}));  // sorted
  EXPECT_EQ(*ParseRankList(" 0 , 2 "), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(ParseRankList(absl::StrCat(kMaxListedRank))->back(), kMaxListedRank);
}

TEST(ParseRankListTest, DuplicatesAreRefused) {
  auto twice = ParseRankList("1,1");
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(twice.status()), HasSubstr("rank 1 is listed more than once"));
  auto overlap = ParseRankList("0-3,2");
  EXPECT_THAT(Msg(overlap.status()), HasSubstr("rank 2 is listed more than once"));
  EXPECT_FALSE(ParseRankList("0-4,3-6").ok());
}

TEST(ParseRankListTest, GarbageIsRefusedNamingTheItem) {
  for (const char* bad : {"", " ", ",", "0,", ",1", "0,,1", "a", "1a", "1.5", "0x3", "+1", "1-2-3",
                          "1-", "-", "1 2", "１"}) {
    auto parsed = ParseRankList(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << "\"" << bad << "\"";
    EXPECT_THAT(Msg(parsed.status()), HasSubstr("e.g. 0,2,5-7")) << bad;
  }
  EXPECT_THAT(Msg(ParseRankList("0,abc").status()), HasSubstr("\"abc\" is not a rank"));
  EXPECT_THAT(Msg(ParseRankList("99999999999999999999").status()), HasSubstr("too large"));
  EXPECT_THAT(Msg(ParseRankList(absl::StrCat(kMaxListedRank + 1)).status()),
              HasSubstr("too large"));
}

TEST(ParseRankListTest, NegativeRanksAreRefused) {
  EXPECT_THAT(Msg(ParseRankList("-1").status()), HasSubstr("cannot be negative"));
  EXPECT_THAT(Msg(ParseRankList("0,-2").status()), HasSubstr("cannot be negative"));
  EXPECT_THAT(Msg(ParseRankList("-3-5").status()), HasSubstr("cannot be negative"));
  EXPECT_FALSE(ParseRankList("2--1").ok());
}

TEST(ParseRankListTest, ReversedRangeIsRefused) {
  auto reversed = ParseRankList("7-5");
  EXPECT_EQ(reversed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(reversed.status()), HasSubstr("range 7-5 is reversed (write 5-7)"));
}

TEST(FormatRankListTest, CompressesRuns) {
  EXPECT_EQ(FormatRankList({}), "");
  EXPECT_EQ(FormatRankList({4}), "4");
  EXPECT_EQ(FormatRankList({0, 2, 5, 6, 7}), "0,2,5-7");
  EXPECT_EQ(FormatRankList({0, 1}), "0-1");
  for (const char* list : {"0", "0,2,5-7", "1-3,5,9-12"}) {
    EXPECT_EQ(FormatRankList(*ParseRankList(list)), list);
  }
}

// ---------------------------------------------------------------- job lines

TEST(FormatJobLineTest, ShowsStateTargetProgressAndReason) {
  v1::Job job;
  job.set_id("j1");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.mutable_request()->set_checkpoint_id("demo");
  job.mutable_request()->set_destination_strategy("dst");
  job.mutable_request()->mutable_target()->set_export_dir("/srv/out");
  job.mutable_request()->mutable_target()->add_ranks(2);
  job.mutable_request()->mutable_target()->add_ranks(0);
  job.mutable_progress()->set_bytes_done(999);
  job.mutable_progress()->set_bytes_total(4000);
  EXPECT_EQ(FormatJobLine(job),
            "j1  RUNNING  demo -> export /srv/out (destination strategy dst, ranks 0,2)  24%");

  job.set_state(v1::JOB_STATE_FAILED);
  job.set_reason("disk full\nwhile writing");
  job.set_attempts(2);
  EXPECT_EQ(FormatJobLine(job),
            "j1  FAILED  demo -> export /srv/out (destination strategy dst, ranks 0,2)  24%  "
            "attempts=2  reason: disk full while writing");

  v1::Job merged;
  merged.set_id("m");
  merged.set_state(v1::JOB_STATE_QUEUED);
  merged.mutable_request()->set_checkpoint_id("demo");
  merged.mutable_request()->mutable_target()->set_merged_file("/srv/all.ckpt");
  EXPECT_EQ(FormatJobLine(merged), "m  QUEUED  demo -> merged file /srv/all.ckpt  -");

  v1::Job stored = merged;
  stored.set_state(v1::JOB_STATE_SUCCEEDED);
  stored.mutable_request()->set_destination_strategy("dst");
  stored.mutable_request()->mutable_target()->set_new_checkpoint_id("demo3");
  EXPECT_EQ(FormatJobLine(stored),
            "m  SUCCEEDED  demo -> checkpoint demo3 (destination strategy dst)  100%");
}

TEST(JobStateTest, NamesAndTerminalStates) {
  EXPECT_EQ(JobStateName(v1::JOB_STATE_RUNNING), "RUNNING");
  EXPECT_EQ(JobStateName(static_cast<v1::JobState>(42)), "STATE_42");
  EXPECT_FALSE(IsTerminalJobState(v1::JOB_STATE_QUEUED));
  EXPECT_FALSE(IsTerminalJobState(v1::JOB_STATE_RUNNING));
  EXPECT_TRUE(IsTerminalJobState(v1::JOB_STATE_SUCCEEDED));
  EXPECT_TRUE(IsTerminalJobState(v1::JOB_STATE_FAILED));
  EXPECT_TRUE(IsTerminalJobState(v1::JOB_STATE_CANCELLED));
}

}  // namespace
}  // namespace ckpt
