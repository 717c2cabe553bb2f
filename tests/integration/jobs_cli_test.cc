// Transform jobs and exports end to end: a real ckptd on 127.0.0.1:0 (with --export-root
// DIR/export) driven through the ckptctl binary as an operator would. Every file a job or an
// export writes is compared byte for byte with what `ckptctl fetch` delivers for the same rank,
// which the server tests check against independently generated slices.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/fixtures.h"
#include "tests/testing/server_process.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ServerProcess;
using testing::TempDir;

// The demo destination strategy has 3 ranks.
constexpr int kDstRanks = 3;

// Every regular file under `dir`, as sorted paths relative to it.
std::set<std::string> FilesUnder(const std::string& dir) {
  std::set<std::string> files;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file()) files.insert(fs::relative(it->path(), dir).string());
  }
  return files;
}

// Entries of `dir` (names only).
std::set<std::string> EntriesOf(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    names.insert(it->path().filename().string());
  }
  return names;
}

// "rank_<r>/<prefix><r>.ckpt" for each rank.
std::set<std::string> ExportLayout(const std::vector<int>& ranks,
                                   const std::string& prefix = "checkpoint_") {
  std::set<std::string> files;
  for (int r : ranks) files.insert(absl::StrCat("rank_", r, "/", prefix, r, ".ckpt"));
  return files;
}

class JobsCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::create_directories(root_));
    StartServer();
  }

  // Starts ckptd with `extra_args` and, unless `export_root` is false, --export-root root_.
  void StartServer(const std::vector<std::string>& extra_args = {}, bool export_root = true) {
    extra_args_ = extra_args;
    if (export_root) extra_args_.insert(extra_args_.begin(), {"--export-root", root_});
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", extra_args_);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    auto c = CkptClient::Connect(server_->address());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }

  // kill -9, then a new server on the same data directory and flags.
  void CrashAndRestart() {
    client_.reset();
    server_->Kill();
    StartServer(extra_args_, /*export_root=*/false);  // extra_args_ has it already
  }

  // Where the server writes export path `relative`.
  std::string InRoot(const std::string& relative) const { return root_ + "/" + relative; }

  testing::SubprocessResult Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {CKPTCTL_PATH, "--server", server_->address()});
    auto r = testing::RunSubprocess(args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : testing::SubprocessResult{};
  }

  // Runs ckptctl and expects success.
  testing::SubprocessResult CtlOk(const std::vector<std::string>& args) {
    auto r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << absl::StrJoin(args, " ") << "\nstdout: " << r.stdout_text
                              << "\nstderr: " << r.stderr_text << "\nserver log:\n"
                              << server_->Log();
    return r;
  }

  // Runs ckptctl and expects a failure reported as one stderr line containing `needle`.
  void ExpectOneLineError(const std::vector<std::string>& args, const std::string& needle) {
    auto r = Ctl(args);
    EXPECT_NE(r.exit_code, 0) << absl::StrJoin(args, " ");
    EXPECT_EQ(testing::SplitLines(r.stderr_text).size(), 1u)
        << absl::StrJoin(args, " ") << ": " << r.stderr_text;
    EXPECT_THAT(r.stderr_text, HasSubstr(needle)) << absl::StrJoin(args, " ");
  }

  // The demo of `ckptctl sample`: strategies src (8 ranks) and dst (3 ranks), checkpoint demo.
  void UploadDemo() {
    CtlOk({"sample", dir_ / "demo"});
    CtlOk({"strategy", "put", "src", dir_ / "demo/src_strategy.ckpt"});
    CtlOk({"strategy", "put", "dst", dir_ / "demo/dst_strategy.json"});
    CtlOk({"upload", "demo", "--strategy", "src", "--dir", dir_ / "demo/checkpoint"});
  }

  // The bytes `ckptctl fetch` writes for one rank (or --merged when rank < 0).
  std::string Fetched(const std::string& ckpt, const std::string& strategy, int rank) {
    const std::string out = dir_ / absl::StrCat("fetched-", ckpt, "-", strategy, "-", rank, "-",
                                                fetch_counter_++, ".ckpt");
    if (rank < 0) {
      CtlOk({"fetch", ckpt, "--merged", "--out", out});
    } else {
      CtlOk(
          {"fetch", ckpt, "--dst-strategy", strategy, "--rank", absl::StrCat(rank), "--out", out});
    }
    return fs::exists(out) ? testing::ReadFileOrDie(out) : std::string("(fetch failed)");
  }

  // `dir` holds exactly the export layout of `ranks`, each file equal to what fetch serves.
  void ExpectExport(const std::string& dir, const std::string& ckpt, const std::string& strategy,
                    const std::vector<int>& ranks, const std::string& prefix = "checkpoint_") {
    ASSERT_EQ(FilesUnder(dir), ExportLayout(ranks, prefix)) << dir;
    for (int r : ranks) {
      EXPECT_TRUE(testing::ReadFileOrDie(absl::StrCat(dir, "/rank_", r, "/", prefix, r, ".ckpt")) ==
                  Fetched(ckpt, strategy, r))
          << dir << " rank " << r << " differs from ckptctl fetch";
    }
  }

  // The job id in "submitted job <id>: ..." (the first line of `transform`).
  static std::string SubmittedId(const std::string& stdout_text) {
    const std::string marker = "submitted job ";
    const size_t at = stdout_text.find(marker);
    if (at == std::string::npos) return "";
    const size_t begin = at + marker.size();
    return stdout_text.substr(begin, stdout_text.find(':', begin) - begin);
  }

  TempDir dir_;
  const std::string root_ = dir_ / "export";  // the server's --export-root
  std::vector<std::string> extra_args_;
  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<CkptClient> client_;
  int fetch_counter_ = 0;
};

TEST_F(JobsCliTest, ServerSideExportEqualsFetchByteForByte) {
  UploadDemo();
  const std::string out = InRoot("server-export");
  auto r = CtlOk(
      {"transform", "demo", "--dst-strategy", "dst", "--export-dir", "server-export", "--wait"});
  EXPECT_THAT(r.stdout_text, HasSubstr("submitted job "));
  EXPECT_THAT(r.stdout_text, HasSubstr(" SUCCEEDED: demo -> export server-export "));
  EXPECT_EQ(r.stderr_text, "");
  ExpectExport(out, "demo", "dst", {0, 1, 2});
  // Nothing else appeared next to the export (no partial or temporary directories).
  EXPECT_EQ(EntriesOf(root_), std::set<std::string>{"server-export"});

  // A subset of the ranks, with another file name prefix, in a subdirectory.
  fs::create_directories(InRoot("runs"));
  const std::string subset = InRoot("runs/server-subset");
  CtlOk({"transform", "demo", "--dst-strategy", "dst", "--export-dir", "runs/server-subset",
         "--ranks", "0,2", "--prefix", "net_", "--wait"});
  ExpectExport(subset, "demo", "dst", {0, 2}, "net_");

  // The client-side export writes the very same files.
  const std::string local = dir_ / "client-export";
  CtlOk({"export", "demo", "--dst-strategy", "dst", "--dir", local});
  ASSERT_EQ(FilesUnder(local), FilesUnder(out));
  for (const std::string& file : FilesUnder(local)) {
    EXPECT_TRUE(testing::ReadFileOrDie(local + "/" + file) ==
                testing::ReadFileOrDie(out + "/" + file))
        << file << " differs between the client-side and the server-side export";
  }
}

TEST_F(JobsCliTest, TransformAsNewCheckpointServesTheSameBytes) {
  UploadDemo();
  auto r = CtlOk({"transform", "demo", "--dst-strategy", "dst", "--as", "demo3", "--wait"});
  EXPECT_THAT(r.stdout_text,
              HasSubstr("SUCCEEDED: demo -> checkpoint demo3 (destination strategy dst)"));
  EXPECT_THAT(CtlOk({"ls"}).stdout_text, HasSubstr("demo3  source_strategy=dst  ranks=3"));
  for (int rank = 0; rank < kDstRanks; ++rank) {
    EXPECT_TRUE(Fetched("demo3", "dst", rank) == Fetched("demo", "dst", rank)) << "rank " << rank;
  }
  // The new checkpoint re-shards onward like any other.
  EXPECT_TRUE(Fetched("demo3", "src", 5) == Fetched("demo", "src", 5));
  // Its id is taken now.
  ExpectOneLineError({"transform", "demo", "--dst-strategy", "dst", "--as", "demo3"},
                     "ALREADY_EXISTS");
}

TEST_F(JobsCliTest, MergedFileEqualsFetchMerged) {
  UploadDemo();
  const std::string merged = InRoot("merged.ckpt");
  auto r = CtlOk({"transform", "demo", "--merged-file", "merged.ckpt", "--wait"});
  EXPECT_THAT(r.stdout_text, HasSubstr("SUCCEEDED: demo -> merged file merged.ckpt:"));
  ASSERT_TRUE(fs::exists(merged));
  EXPECT_TRUE(testing::ReadFileOrDie(merged) == Fetched("demo", "", -1));
}

// The client-side export needs no job support: it is plain fetches.
TEST_F(JobsCliTest, ClientExportWritesEveryFetchedRankAtomically) {
  UploadDemo();
  const std::string local = dir_ / "local/export";  // the parent is created
  auto r = CtlOk({"export", "demo", "--dst-strategy", "dst", "--dir", local, "--parallel", "2"});
  EXPECT_THAT(r.stdout_text,
              HasSubstr("exported demo to destination strategy dst: 3 ranks, 33 tensors"));
  EXPECT_THAT(r.stdout_text, HasSubstr("exported rank 1: 11 tensors"));
  ExpectExport(local, "demo", "dst", {0, 1, 2});
  EXPECT_EQ(EntriesOf(dir_ / "local"), std::set<std::string>{"export"});

  // Subset and prefix; an existing empty directory is fine.
  fs::create_directories(dir_ / "local/empty");
  CtlOk({"export", "demo", "--dst-strategy", "dst", "--dir", dir_ / "local/empty", "--ranks", "2,0",
         "--prefix", "p-"});
  ExpectExport(dir_ / "local/empty", "demo", "dst", {0, 2}, "p-");
  // Back to the source layout: one file per source rank, equal to the uploaded ranks' fetches.
  CtlOk({"export", "demo", "--dst-strategy", "src", "--dir", dir_ / "local/src", "--ranks", "4-7"});
  ExpectExport(dir_ / "local/src", "demo", "src", {4, 5, 6, 7});

  // Failures leave nothing that looks like an export, and touch nothing that exists.
  ExpectOneLineError({"export", "nope", "--dst-strategy", "dst", "--dir", dir_ / "local/nope"},
                     "NOT_FOUND");
  ExpectOneLineError({"export", "demo", "--dst-strategy", "nope", "--dir", dir_ / "local/nope"},
                     "NOT_FOUND");
  ExpectOneLineError(
      {"export", "demo", "--dst-strategy", "dst", "--dir", dir_ / "local/bad", "--ranks", "0,3"},
      "OUT_OF_RANGE");
  ExpectOneLineError({"export", "demo", "--dst-strategy", "dst", "--dir", local}, "ALREADY_EXISTS");
  ExpectOneLineError(
      {"export", "demo", "--dst-strategy", "dst", "--dir", dir_ / "local/x", "--ranks", "1,1"},
      "listed more than once");
  ExpectOneLineError(
      {"export", "demo", "--dst-strategy", "dst", "--dir", dir_ / "local/x", "--prefix", "a/b"},
      "prefix");
  EXPECT_EQ(EntriesOf(dir_ / "local"), (std::set<std::string>{"empty", "export", "src"}));
  ExpectExport(local, "demo", "dst", {0, 1, 2});
}

TEST_F(JobsCliTest, IdempotentSubmissionAndJobCommands) {
  UploadDemo();
  const std::string out = InRoot("idem");
  const std::vector<std::string> submit = {"transform",    "demo", "--dst-strategy", "dst",
                                           "--export-dir", "idem", "--id",           "J1"};
  auto first = CtlOk(submit);
  EXPECT_EQ(SubmittedId(first.stdout_text), "J1") << first.stdout_text;
  auto second = CtlOk(submit);
  EXPECT_THAT(second.stdout_text, HasSubstr("job J1 already exists with this request"));
  // The same id for another request is refused.
  ExpectOneLineError(
      {"transform", "demo", "--dst-strategy", "dst", "--export-dir", "other", "--id", "J1"},
      "ALREADY_EXISTS");

  auto watch = CtlOk({"jobs", "watch", "J1"});
  EXPECT_THAT(watch.stdout_text, HasSubstr("job J1 SUCCEEDED: demo -> export idem "));
  ExpectExport(out, "demo", "dst", {0, 1, 2});
  // Watching a finished job returns at once with its outcome.
  EXPECT_THAT(CtlOk({"jobs", "watch", "J1"}).stdout_text, HasSubstr("job J1 SUCCEEDED"));

  // A server-chosen id, then the list.
  auto auto_id = CtlOk({"transform", "demo", "--dst-strategy", "dst", "--as", "demo3", "--wait"});
  const std::string id2 = SubmittedId(auto_id.stdout_text);
  ASSERT_FALSE(id2.empty()) << auto_id.stdout_text;
  EXPECT_NE(id2, "J1");
  auto ls = CtlOk({"jobs", "ls"});
  const std::vector<std::string> lines = testing::SplitLines(ls.stdout_text);
  ASSERT_EQ(lines.size(), 2u) << ls.stdout_text;
  EXPECT_THAT(ls.stdout_text,
              HasSubstr("J1  SUCCEEDED  demo -> export idem (destination strategy dst)  100%"));
  EXPECT_THAT(
      ls.stdout_text,
      HasSubstr(id2 + "  SUCCEEDED  demo -> checkpoint demo3 (destination strategy dst)  100%"));

  auto get = CtlOk({"jobs", "get", "J1"});
  EXPECT_THAT(get.stdout_text, HasSubstr("job J1: SUCCEEDED\n"));
  EXPECT_THAT(get.stdout_text, HasSubstr("  source:    demo\n"));
  EXPECT_THAT(get.stdout_text, HasSubstr("  attempts:  1\n"));
  auto job = client_->GetJob("J1");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->progress().ranks_done(), kDstRanks);
  EXPECT_EQ(job->progress().bytes_done(), job->progress().bytes_total());

  // Cancelling a finished job changes nothing: the server answers with the job unchanged.
  auto cancel = Ctl({"jobs", "cancel", "J1"});
  if (cancel.exit_code == 0) {
    EXPECT_THAT(cancel.stdout_text, HasSubstr("job J1 had already ended (SUCCEEDED)"));
  } else {
    EXPECT_EQ(testing::SplitLines(cancel.stderr_text).size(), 1u) << cancel.stderr_text;
  }
  EXPECT_THAT(CtlOk({"jobs", "get", "J1"}).stdout_text, HasSubstr("job J1: SUCCEEDED"));
  ExpectExport(out, "demo", "dst", {0, 1, 2});

  ExpectOneLineError({"jobs", "get", "nope"}, "NOT_FOUND");
  ExpectOneLineError({"jobs", "watch", "nope"}, "NOT_FOUND");
  ExpectOneLineError({"jobs", "cancel", "nope"}, "NOT_FOUND");
}

TEST_F(JobsCliTest, BadInputsGetOneLineErrors) {
  UploadDemo();
  ExpectOneLineError({"transform", "demo", "--dst-strategy", "dst", "--export-dir", "relative/dir"},
                     "FAILED_PRECONDITION: the parent directory of export_dir \"relative/dir\" "
                     "does not exist in the export root");
  ExpectOneLineError({"transform", "nope", "--dst-strategy", "dst", "--export-dir", "x", "--wait"},
                     "nope");
  ExpectOneLineError({"transform", "demo", "--dst-strategy", "nope", "--export-dir", "x"}, "nope");
  for (const char* bad : {"", "a", "0,,1", "-1", "2-1", "0,0", "1-2-3"}) {
    ExpectOneLineError(
        {"transform", "demo", "--dst-strategy", "dst", "--export-dir", "x", "--ranks", bad},
        "--ranks");
  }
  ExpectOneLineError(
      {"transform", "demo", "--dst-strategy", "dst", "--export-dir", "x", "--ranks", "0,7"},
      "OUT_OF_RANGE");
  ExpectOneLineError({"transform", "demo", "--dst-strategy", "dst"}, "exactly one of");
  ExpectOneLineError({"transform", "demo", "--export-dir", "x"}, "needs --dst-strategy");
  ExpectOneLineError({"transform", "demo", "--dst-strategy", "dst", "--as", "d4", "--ranks", "0"},
                     "--export-dir only");
  EXPECT_TRUE(EntriesOf(root_).empty());
  // None of these created a job (a job for an unknown checkpoint may be recorded as FAILED).
  EXPECT_THAT(CtlOk({"jobs", "ls"}).stdout_text, Not(HasSubstr("SUCCEEDED")));
  EXPECT_THAT(CtlOk({"jobs", "ls"}).stdout_text, Not(HasSubstr("RUNNING")));
}

// A checkpoint of a few MiB (the demo's tensors with every dimension × 12) under the demo
// strategies, registered as bigsrc / bigdst and uploaded as `big`.
void UploadBigSample(CkptClient& client, const std::string& dir) {
  std::vector<SampleTensor> tensors = DemoTensors();
  for (SampleTensor& t : tensors) {
    for (int64_t& d : t.global_shape) d *= 12;
  }
  ASSERT_TRUE(WriteShardedSample(DemoSourceStrategy(), tensors, dir, {}).ok());
  ASSERT_TRUE(client.PutStrategy("bigsrc", DemoSourceStrategy(), false).ok());
  ASSERT_TRUE(client.PutStrategy("bigdst", DemoDestinationStrategy(), false).ok());
  auto up = client.UploadDirectory("big", "bigsrc", dir);
  ASSERT_TRUE(up.ok()) << up.status();
  ASSERT_TRUE(up->committed);
}

// A job throttled to 1 MiB/s is killed with the server mid-way; after a restart it resumes (or
// fails cleanly), and its directory is never half written. Fetches are not starved by the job.
TEST_F(JobsCliTest, CrashDuringExportResumesOrFailsCleanly) {
  server_.reset();
  client_.reset();
  StartServer({"--job-bandwidth-mib", "1"});
  ASSERT_NO_FATAL_FAILURE(UploadBigSample(*client_, dir_ / "big"));
  const std::string out = InRoot("crash-export");

  auto submitted = CtlOk({"transform", "big", "--dst-strategy", "bigdst", "--export-dir",
                          "crash-export", "--id", "crash"});
  EXPECT_EQ(SubmittedId(submitted.stdout_text), "crash");

  // Wait until it is visibly under way.
  v1::Job job;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = client_->GetJob("crash");
    ASSERT_TRUE(got.ok()) << got.status();
    job = *got;
    if (job.state() == v1::JOB_STATE_RUNNING && job.progress().bytes_done() > 0) break;
    ASSERT_FALSE(IsTerminalJobState(job.state())) << job.DebugString();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING) << job.DebugString();
  ASSERT_GT(job.progress().bytes_total(), int64_t{3} << 20)
      << "the sample is too small to throttle";
  EXPECT_THAT(CtlOk({"jobs", "get", "crash"}).stdout_text, HasSubstr("job crash: RUNNING"));

  // A worker's fetch is not queued behind the job nor held to its bandwidth.
  const auto fetch_start = std::chrono::steady_clock::now();
  CtlOk({"fetch", "big", "--dst-strategy", "bigdst", "--rank", "1", "--out", dir_ / "during.ckpt"});
  const auto fetch_time = std::chrono::steady_clock::now() - fetch_start;
  EXPECT_LT(fetch_time, std::chrono::seconds(5));
  auto still = client_->GetJob("crash");
  ASSERT_TRUE(still.ok());
  ASSERT_EQ(still->state(), v1::JOB_STATE_RUNNING) << "the job ended before the crash";

  CrashAndRestart();

  // Right after the crash nothing half written is presented as the export.
  const std::set<std::string> expected_files = ExportLayout({0, 1, 2});
  if (fs::exists(out)) {
    EXPECT_EQ(FilesUnder(out), expected_files);
  }

  EXPECT_THAT(CtlOk({"jobs", "ls"}).stdout_text, HasSubstr("crash  "));
  const auto watch_start = std::chrono::steady_clock::now();
  auto watch = Ctl({"jobs", "watch", "crash"});
  const double watch_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - watch_start).count();
  auto final_job = client_->GetJob("crash");
  ASSERT_TRUE(final_job.ok()) << final_job.status();

  // Not a terminal: plain progress lines on stdout, at most about one per second.
  int progress_lines = 0;
  for (const std::string& line : testing::SplitLines(watch.stdout_text)) {
    if (line.starts_with("job crash RUNNING")) ++progress_lines;
  }
  EXPECT_LE(progress_lines, static_cast<int>(watch_seconds) + 2) << watch.stdout_text;

  if (final_job->state() == v1::JOB_STATE_SUCCEEDED) {
    EXPECT_EQ(watch.exit_code, 0) << watch.stderr_text;
    EXPECT_THAT(watch.stdout_text, HasSubstr("job crash SUCCEEDED"));
    EXPECT_GE(final_job->attempts(), 2);
    EXPECT_GE(progress_lines, 1) << "a resumed run of several seconds shows progress: "
                                 << watch.stdout_text;
    ExpectExport(out, "big", "bigdst", {0, 1, 2});
  } else {
    ASSERT_EQ(final_job->state(), v1::JOB_STATE_FAILED) << final_job->DebugString();
    EXPECT_FALSE(final_job->reason().empty());
    EXPECT_NE(watch.exit_code, 0);
    EXPECT_EQ(testing::SplitLines(watch.stderr_text).size(), 1u) << watch.stderr_text;
    EXPECT_THAT(watch.stderr_text, HasSubstr("job crash failed: "));
    if (fs::exists(out)) {
      ExpectExport(out, "big", "bigdst", {0, 1, 2});
    }
  }
  // No partial output is left next to it either way.
  EXPECT_THAT(EntriesOf(root_), Not(::testing::Contains(HasSubstr("crash-export."))));
  EXPECT_THAT(CtlOk({"jobs", "ls"}).stdout_text,
              HasSubstr(absl::StrCat("crash  ", JobStateName(final_job->state()))));
}

// Cancelling a running job removes its partial output and makes --wait fail with the reason.
TEST_F(JobsCliTest, CancelledJobFailsTheWaiterAndLeavesNoOutput) {
  server_.reset();
  client_.reset();
  StartServer({"--job-bandwidth-mib", "1"});
  ASSERT_NO_FATAL_FAILURE(UploadBigSample(*client_, dir_ / "big"));
  const std::string out = InRoot("cancelled-export");

  std::thread canceller([&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      auto job = client_->GetJob("victim");
      if (job.ok() && job->state() == v1::JOB_STATE_RUNNING && job->progress().bytes_done() > 0) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // A running job's record cannot be removed: the invalid-argument class (5).
    auto rm = Ctl({"jobs", "rm", "victim"});
    EXPECT_EQ(rm.exit_code, 5) << rm.stderr_text;
    EXPECT_THAT(rm.stderr_text, HasSubstr("FAILED_PRECONDITION: job victim is RUNNING"));
    auto cancel = Ctl({"jobs", "cancel", "victim"});
    EXPECT_EQ(cancel.exit_code, 0) << cancel.stderr_text;
    EXPECT_THAT(cancel.stdout_text, HasSubstr("victim"));
  });
  auto wait = Ctl({"transform", "big", "--dst-strategy", "bigdst", "--export-dir",
                   "cancelled-export", "--id", "victim", "--wait"});
  canceller.join();
  EXPECT_EQ(wait.exit_code, 1) << wait.stdout_text;  // CANCELLED: the "other" class
  EXPECT_EQ(testing::SplitLines(wait.stderr_text).size(), 1u) << wait.stderr_text;
  EXPECT_THAT(wait.stderr_text, HasSubstr("CANCELLED: job victim was cancelled"));
  EXPECT_FALSE(fs::exists(out));
  EXPECT_TRUE(EntriesOf(root_).empty());
  EXPECT_THAT(CtlOk({"jobs", "ls"}).stdout_text, HasSubstr("victim  CANCELLED"));
  // Once finished, its record can be removed.
  EXPECT_THAT(CtlOk({"jobs", "rm", "victim"}).stdout_text, HasSubstr("removed job victim"));
  EXPECT_THAT(CtlOk({"jobs", "ls"}).stdout_text, Not(HasSubstr("victim")));
}

// ------------------------------------------------------------------------------- export root

TEST_F(JobsCliTest, WithoutExportRootServerFilesAreRefused) {
  server_.reset();
  client_.reset();
  StartServer({}, /*export_root=*/false);
  UploadDemo();
  ExpectOneLineError({"transform", "demo", "--dst-strategy", "dst", "--export-dir", "out"},
                     "FAILED_PRECONDITION: export_dir output is disabled on this server: ckptd "
                     "writes server-side files only beneath the directory given by its "
                     "--export-root flag");
  ExpectOneLineError({"transform", "demo", "--merged-file", root_ + "/m.ckpt"}, "--export-root");
  EXPECT_TRUE(EntriesOf(root_).empty());
  // Store-internal outputs still work.
  CtlOk({"transform", "demo", "--dst-strategy", "dst", "--as", "demo3", "--wait"});
}

// Every way out of the export root is refused with a one-line error naming the path as given;
// nothing is written outside it and nothing existing is replaced.
TEST_F(JobsCliTest, PathEscapesAndExistingTargetsAreRefused) {
  UploadDemo();
  const std::string outside = dir_ / "outside";
  fs::create_directories(outside);
  fs::create_directories(InRoot("sub"));
  fs::create_directory_symlink(outside, InRoot("to-outside"));
  fs::create_directory_symlink("../../outside", InRoot("sub/up-and-out"));
  std::ofstream(InRoot("taken.ckpt")) << "keep me";
  fs::create_directories(InRoot("taken-dir"));
  std::ofstream(InRoot("taken-dir/file")) << "keep me too";

  struct Case {
    std::string path;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"../x", "PERMISSION_DENIED"},
      {"sub/../../x", "PERMISSION_DENIED"},
      {"/etc/x", "PERMISSION_DENIED"},
      {outside + "/x", "PERMISSION_DENIED"},
      {"to-outside/x", "PERMISSION_DENIED"},
      {"to-outside/no/such/dir/x", "PERMISSION_DENIED"},
      {"sub/up-and-out/x", "PERMISSION_DENIED"},
      {"taken.ckpt", "ALREADY_EXISTS"},
      {"taken-dir", "ALREADY_EXISTS"},
      {"to-outside", "ALREADY_EXISTS"},
  };
  for (const Case& c : cases) {
    for (const char* flag : {"--export-dir", "--merged-file"}) {
      std::vector<std::string> args = {"transform", "demo", flag, c.path, "--wait"};
      if (std::string(flag) == "--export-dir")
        args.insert(args.begin() + 2, {"--dst-strategy", "dst"});
      auto r = Ctl(args);
      EXPECT_NE(r.exit_code, 0) << c.path;
      EXPECT_EQ(testing::SplitLines(r.stderr_text).size(), 1u) << r.stderr_text;
      EXPECT_THAT(r.stderr_text, HasSubstr(c.error)) << c.path;
      EXPECT_THAT(r.stderr_text, HasSubstr("\"" + c.path + "\"")) << r.stderr_text;
      // Neither the root's location nor anything the caller did not name is revealed.
      if (c.path.find(dir_.path()) == std::string::npos) {
        EXPECT_THAT(r.stderr_text, Not(HasSubstr(dir_.path()))) << r.stderr_text;
      }
    }
  }
  // --merged-file DIR/ never writes a file named DIR.
  ExpectOneLineError({"transform", "demo", "--merged-file", "newdir/"},
                     "INVALID_ARGUMENT: merged_file \"newdir/\" names a directory");
  ExpectOneLineError({"transform", "demo", "--merged-file", "sub"},
                     "ALREADY_EXISTS: merged_file \"sub\" already exists as a directory");
  EXPECT_FALSE(fs::exists(InRoot("newdir")));

  // An absolute path beneath the root is accepted (as the same location).
  CtlOk({"transform", "demo", "--merged-file", InRoot("sub/merged.ckpt"), "--wait"});
  EXPECT_TRUE(testing::ReadFileOrDie(InRoot("sub/merged.ckpt")) == Fetched("demo", "", -1));

  EXPECT_TRUE(EntriesOf(outside).empty());
  EXPECT_EQ(testing::ReadFileOrDie(InRoot("taken.ckpt")), "keep me");
  EXPECT_EQ(EntriesOf(InRoot("taken-dir")), std::set<std::string>{"file"});
  EXPECT_EQ(EntriesOf(root_),
            (std::set<std::string>{"sub", "taken-dir", "taken.ckpt", "to-outside"}));
  EXPECT_EQ(EntriesOf(InRoot("sub")), (std::set<std::string>{"merged.ckpt", "up-and-out"}));
}

// While a slow export runs, its parent directory is moved away and replaced by a symlink to a
// directory outside the root: the job, holding its parent's descriptor, never writes through the
// symlink.
TEST_F(JobsCliTest, SymlinkSwappedInDuringARunningJobIsNeverFollowed) {
  server_.reset();
  client_.reset();
  StartServer({"--job-bandwidth-mib", "1"});
  ASSERT_NO_FATAL_FAILURE(UploadBigSample(*client_, dir_ / "big"));
  const std::string outside = dir_ / "outside";
  fs::create_directories(outside);
  fs::create_directories(InRoot("sub"));
  CtlOk(
      {"transform", "big", "--dst-strategy", "bigdst", "--export-dir", "sub/out", "--id", "swap"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  v1::Job job;
  while (std::chrono::steady_clock::now() < deadline) {
    auto got = client_->GetJob("swap");
    ASSERT_TRUE(got.ok()) << got.status();
    job = *got;
    if (job.state() == v1::JOB_STATE_RUNNING && job.progress().bytes_done() > 0) break;
    ASSERT_FALSE(IsTerminalJobState(job.state())) << job.DebugString();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(job.state(), v1::JOB_STATE_RUNNING);
  fs::rename(InRoot("sub"), InRoot("moved"));
  fs::create_directory_symlink(outside, InRoot("sub"));
  auto watch = Ctl({"jobs", "watch", "swap"});
  EXPECT_EQ(watch.exit_code, 0) << watch.stderr_text;
  EXPECT_TRUE(EntriesOf(outside).empty()) << "a job wrote through the planted symlink";
  ExpectExport(InRoot("moved/out"), "big", "bigdst", {0, 1, 2});
  // New jobs through the symlink are refused.
  ExpectOneLineError({"transform", "big", "--dst-strategy", "bigdst", "--export-dir", "sub/again"},
                     "PERMISSION_DENIED");
}

}  // namespace
}  // namespace ckpt
