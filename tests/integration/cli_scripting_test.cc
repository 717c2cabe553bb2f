// ckptctl as scripts and CI use it, against a real ckptd on 127.0.0.1:0: every command's --json
// output parses and carries exact byte counts; each exit-code class of client/ckptctl/exit_codes.h
// is produced for real and checked against one table; --wait-for-server outlasts a ckptd that
// starts after the client; fetch --out - streams the .ckpt alone on standard output; jobs rm and
// ckptd's --job-retention remove finished job records.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/exit_codes.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/server_process.h"
#include "tests/testing/stored_chunks.h"
#include "tests/testing/subprocess.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ServerProcess;
using testing::TempDir;
using Json = nlohmann::json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A TCP port on 127.0.0.1 that nothing listens on (bound, then released).
int UnusedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

class CliScriptingTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(); }

  void StartServer(const std::vector<std::string>& extra_args = {}) {
    // Transform jobs write beneath dir_ (paths relative to it).
    std::vector<std::string> args = {"--export-root", dir_.path()};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", args);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  testing::SubprocessResult CtlAt(const std::string& server, std::vector<std::string> args) {
    args.insert(args.begin(), {CKPTCTL_PATH, "--server", server});
    auto r = testing::RunSubprocess(args);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : testing::SubprocessResult{};
  }
  testing::SubprocessResult Ctl(const std::vector<std::string>& args) {
    return CtlAt(server_->address(), args);
  }

  // Runs ckptctl with --json, expects success and one JSON value per stdout line; returns the
  // last one.
  Json CtlJson(std::vector<std::string> args, std::vector<Json>* all_lines = nullptr) {
    args.push_back("--json");
    auto r = Ctl(args);
    EXPECT_EQ(r.exit_code, 0) << absl::StrJoin(args, " ") << "\nstdout: " << r.stdout_text
                              << "\nstderr: " << r.stderr_text;
    Json last;
    const std::vector<std::string> lines = testing::SplitLines(r.stdout_text);
    EXPECT_FALSE(lines.empty()) << absl::StrJoin(args, " ");
    for (const std::string& line : lines) {
      Json j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
      EXPECT_FALSE(j.is_discarded()) << absl::StrJoin(args, " ") << ": not JSON: " << line;
      if (all_lines != nullptr) all_lines->push_back(j);
      last = std::move(j);
    }
    return last;
  }

  void UploadDemo() {
    ASSERT_EQ(Ctl({"sample", dir_ / "demo"}).exit_code, 0);
    ASSERT_EQ(Ctl({"strategy", "put", "src", dir_ / "demo/src_strategy.ckpt"}).exit_code, 0);
    ASSERT_EQ(Ctl({"strategy", "put", "dst", dir_ / "demo/dst_strategy.json"}).exit_code, 0);
    ASSERT_EQ(
        Ctl({"upload", "demo", "--strategy", "src", "--dir", dir_ / "demo/checkpoint"}).exit_code,
        0);
  }

  // Flips one byte in the middle of one stored chunk, with the server stopped, then restarts it.
  void CorruptOneChunk() {
    ASSERT_EQ(server_->Stop(), 0);
    const absl::Status s = testing::FlipByteOfFirstStoredChunk(dir_ / "data");
    ASSERT_TRUE(s.ok()) << s;
    StartServer();
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
};

void ExpectBytes(const Json& j, const std::string& key) {
  ASSERT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
  EXPECT_TRUE(j[key].is_number_integer()) << key << " in " << j.dump();
  EXPECT_GT(j[key].get<int64_t>(), 0) << key << " in " << j.dump();
}

TEST_F(CliScriptingTest, EveryCommandPrintsParseableJson) {
  const std::string demo = dir_ / "demo";
  Json sample = CtlJson({"sample", demo});
  EXPECT_EQ(sample["dir"], demo);
  // strategy show/get --json print the strategy file itself (indented, several lines).
  auto shown = Ctl({"strategy", "show", demo + "/dst_strategy.json", "--json"});
  EXPECT_EQ(shown.exit_code, 0) << shown.stderr_text;
  EXPECT_TRUE(Json::parse(shown.stdout_text).contains("parallel_layout_item"));
  // One stage's file, as a pipelined job saves it.
  std::ofstream(dir_ / "stage0.json")
      << R"({"current_stage": 0, "parallel_strategy_item": {"MatMul_w": {"stage": 0, )"
      << R"("parallel_strategy": [[2, 1], [1, 2]]}}, "parallel_layout_item": {"w": )"
      << R"({"dev_matrix": [2, 2], "tensor_map": [1, 0], "tensor_shape": [48, 24]}}})";
  Json merged = CtlJson({"strategy", "merge", dir_ / "stage0.json", "--out", dir_ / "merged.json"});
  EXPECT_EQ(merged["parameter_count"], 1);
  EXPECT_EQ(merged["stage_count"], 1);
  Json inspect = CtlJson({"inspect", demo + "/whole.ckpt"});
  ExpectBytes(inspect, "total_bytes");

  Json put = CtlJson({"strategy", "put", "src", demo + "/src_strategy.ckpt"});
  EXPECT_EQ(put["registered"]["world_size"], 8);
  CtlJson({"strategy", "put", "dst", demo + "/dst_strategy.json"});
  Json strategies = CtlJson({"strategy", "ls"});
  ASSERT_TRUE(strategies.is_array());
  EXPECT_EQ(strategies.size(), 2u);
  EXPECT_EQ(strategies[0]["name"], "dst");
  auto got = Ctl({"strategy", "get", "dst", "--json"});
  EXPECT_EQ(got.exit_code, 0) << got.stderr_text;
  EXPECT_TRUE(Json::parse(got.stdout_text).contains("parallel_layout_item"));

  Json upload = CtlJson({"upload", "demo", "--strategy", "src", "--dir", demo + "/checkpoint"});
  EXPECT_EQ(upload["committed"], true);
  EXPECT_EQ(upload["ranks"].size(), 8u);
  ExpectBytes(upload, "file_bytes");
  ExpectBytes(upload, "stored_bytes");
  Json whole = CtlJson({"upload", "whole", "--file", demo + "/whole.ckpt"});
  EXPECT_EQ(whole["ranks_total"], 1);

  Json list = CtlJson({"ls"});
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0]["id"], "demo");
  ExpectBytes(list[0], "stored_bytes");
  ExpectBytes(list[0], "logical_bytes");
  Json described = CtlJson({"describe", "demo"});
  EXPECT_EQ(described["checkpoint"]["id"], "demo");
  EXPECT_EQ(described["tensors"].size(), described["checkpoint"]["tensor_count"].get<size_t>());
  ExpectBytes(described["tensors"][0], "stored_bytes");

  Json deps = CtlJson({"deps", "demo", "--dst-strategy", "dst", "--all"});
  EXPECT_EQ(deps.size(), 3u);
  Json local_deps = CtlJson({"deps", "--src-strategy", demo + "/src_strategy.ckpt",
                             "--dst-strategy", demo + "/dst_strategy.json", "--rank", "1"});
  EXPECT_EQ(local_deps["rank"], 1);

  Json fetched = CtlJson(
      {"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out", dir_ / "f/rank1.ckpt"});
  ExpectBytes(fetched, "total_bytes");
  EXPECT_EQ(fetched["out"], dir_ / "f/rank1.ckpt");
  Json exported = CtlJson({"export", "demo", "--dst-strategy", "dst", "--dir", dir_ / "exported"});
  EXPECT_EQ(exported["ranks"].size(), 3u);
  ExpectBytes(exported, "total_bytes");

  Json submitted =
      CtlJson({"transform", "demo", "--dst-strategy", "dst", "--as", "demo_dst", "--id", "j1"});
  EXPECT_EQ(submitted["job_id"], "j1");
  EXPECT_EQ(submitted["created"], true);
  std::vector<Json> states;
  Json final_state = CtlJson({"jobs", "watch", "j1"}, &states);
  EXPECT_EQ(final_state["state"], "SUCCEEDED");
  EXPECT_EQ(final_state["percent"], 100);
  ExpectBytes(final_state["progress"], "bytes_total");
  Json job = CtlJson({"jobs", "get", "j1"});
  EXPECT_EQ(job["target"]["new_checkpoint_id"], "demo_dst");
  Json jobs = CtlJson({"jobs", "ls"});
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0]["id"], "j1");
  EXPECT_EQ(CtlJson({"jobs", "cancel", "j1"})["state"], "SUCCEEDED");
  // transform --wait: the submission, then the job's states, one JSON line each.
  states.clear();
  Json waited = CtlJson(
      {"transform", "demo", "--merged-file", "merged.ckpt", "--id", "j2", "--wait"}, &states);
  ASSERT_FALSE(states.empty());
  EXPECT_EQ(states.front()["job_id"], "j2");
  EXPECT_EQ(waited["state"], "SUCCEEDED");
  EXPECT_EQ(CtlJson({"jobs", "rm", "j1"})["deleted_job"], "j1");
  EXPECT_EQ(CtlJson({"jobs", "ls"}).size(), 1u);

  Json health = CtlJson({"health"});
  EXPECT_EQ(health["status"], "SERVING");
  EXPECT_EQ(CtlJson({"rm", "whole"})["deleted_checkpoint"], "whole");
  EXPECT_EQ(CtlJson({"strategy", "rm", "dst"})["deleted_strategy"], "dst");
}

// One row per exit-code class, each produced for real.
TEST_F(CliScriptingTest, ExitCodeOfEveryFailureClass) {
  UploadDemo();
  // A strategy with a field split: ckptd and ckptctl refuse it as UNIMPLEMENTED ("other").
  Json field_split = Json::parse(ReadFile(dir_ / "demo/dst_strategy.json"));
  ASSERT_TRUE(field_split.contains("parallel_layout_item")) << field_split.dump();
  for (auto& [name, item] : field_split["parallel_layout_item"].items()) {
    item["field"] = 1;
    break;
  }
  std::ofstream(dir_ / "field_split.json") << field_split.dump();
  std::ofstream(dir_ / "junk.txt") << "not a checkpoint\n";
  const std::string nobody = absl::StrCat("127.0.0.1:", UnusedPort());

  struct Row {
    std::string what;
    std::string server;
    std::vector<std::string> args;
    ExitCode expected;
    std::string code_in_message;  // the status printed on stderr; empty for usage errors
  };
  const std::string self = server_->address();
  const std::vector<Row> rows = {
      {"usage", self, {"ls", "--no-such-option"}, ExitCode::kUsage, ""},
      {"usage: bad --progress", self, {"ls", "--progress", "fancy"}, ExitCode::kUsage, ""},
      {"not found", self, {"describe", "no-such-checkpoint"}, ExitCode::kNotFound, "NOT_FOUND"},
      {"already exists",
       self,
       {"upload", "demo", "--strategy", "src", "--dir", dir_ / "demo/checkpoint"},
       ExitCode::kAlreadyExists,
       "ALREADY_EXISTS"},
      {"invalid argument: rank outside the world",
       self,
       {"fetch", "demo", "--dst-strategy", "dst", "--rank", "3", "--out", dir_ / "r3.ckpt"},
       ExitCode::kInvalidArgument,
       "OUT_OF_RANGE"},
      {"invalid argument: not a checkpoint file",
       self,
       {"upload", "junk", "--file", dir_ / "junk.txt"},
       ExitCode::kInvalidArgument,
       "INVALID_ARGUMENT"},
      {"unavailable: no server", nobody, {"ls"}, ExitCode::kUnavailable, "UNAVAILABLE"},
      {"unavailable: health of no server",
       nobody,
       {"health"},
       ExitCode::kUnavailable,
       "UNAVAILABLE"},
      {"other: unsupported strategy",
       self,
       {"strategy", "show", dir_ / "field_split.json"},
       ExitCode::kOther,
       "UNIMPLEMENTED"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.what);
    auto r = CtlAt(row.server, row.args);
    EXPECT_EQ(r.exit_code, static_cast<int>(row.expected))
        << row.what << ": expected class " << ExitCodeName(row.expected)
        << "\nstderr: " << r.stderr_text;
    EXPECT_EQ(testing::SplitLines(r.stderr_text).size(), 1u) << r.stderr_text;
    if (!row.code_in_message.empty()) {
      EXPECT_THAT(r.stderr_text, HasSubstr("ckptctl: " + row.code_in_message + ": "));
    }
  }

  // Data loss: a stored chunk corrupted behind the server's back.
  CorruptOneChunk();
  auto r = Ctl({"fetch", "demo", "--merged", "--out", dir_ / "merged.ckpt"});
  EXPECT_EQ(r.exit_code, static_cast<int>(ExitCode::kDataLoss)) << r.stderr_text;
  EXPECT_THAT(r.stderr_text, HasSubstr("ckptctl: DATA_LOSS: "));
  EXPECT_FALSE(fs::exists(dir_ / "merged.ckpt"));
}

TEST_F(CliScriptingTest, WaitForServerOutlastsALateServer) {
  UploadDemo();
  ASSERT_EQ(server_->Stop(), 0);
  // The server comes back on a port chosen now, a few seconds after the client started.
  const int port = UnusedPort();
  const std::string address = absl::StrCat("127.0.0.1:", port);
  std::unique_ptr<ServerProcess> late;
  std::thread starter([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    auto s = ServerProcess::Start(CKPTD_PATH, dir_ / "data", {"--listen", address});
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) late = std::move(*s);
  });
  const auto start = std::chrono::steady_clock::now();
  auto fetched = CtlAt(address, {"--wait-for-server", "60s", "fetch", "demo", "--dst-strategy",
                                 "dst", "--rank", "0", "--out", dir_ / "late/rank0.ckpt"});
  auto health = CtlAt(address, {"health", "--wait-for-server", "30s"});
  starter.join();
  EXPECT_EQ(fetched.exit_code, 0) << fetched.stderr_text;
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(fs::exists(dir_ / "late/rank0.ckpt"));
  EXPECT_EQ(health.exit_code, 0) << health.stderr_text;
  // Without waiting, a missing server fails fast after a few bounded retries.
  const auto before = std::chrono::steady_clock::now();
  auto gone = CtlAt(absl::StrCat("127.0.0.1:", UnusedPort()), {"ls"});
  EXPECT_EQ(gone.exit_code, static_cast<int>(ExitCode::kUnavailable));
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::seconds(10));
  // A non-idempotent command is not retried once sent, but --wait-for-server still bounds it.
  auto upload =
      CtlAt(absl::StrCat("127.0.0.1:", UnusedPort()),
            {"--wait-for-server", "1s", "upload", "x", "--file", dir_ / "demo/whole.ckpt"});
  EXPECT_EQ(upload.exit_code, static_cast<int>(ExitCode::kUnavailable)) << upload.stderr_text;
  if (late) late->Stop();
}

TEST_F(CliScriptingTest, FetchToStandardOutputIsTheFileAlone) {
  UploadDemo();
  const std::string file = dir_ / "rank1.ckpt";
  ASSERT_EQ(Ctl({"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out", file}).exit_code,
            0);
  const std::string expected = ReadFile(file);
  ASSERT_FALSE(expected.empty());
  for (const std::string out : {"-", "/dev/stdout"}) {
    SCOPED_TRACE(out);
    auto r = Ctl({"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out", out});
    EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
    EXPECT_TRUE(r.stdout_text == expected)
        << "stdout is not the fetched .ckpt: " << r.stdout_text.size() << " bytes, expected "
        << expected.size();
    EXPECT_THAT(r.stderr_text, HasSubstr("fetched 11 tensors"));
    auto j = Ctl({"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out", out, "--json"});
    EXPECT_TRUE(j.stdout_text == expected);
    EXPECT_THAT(j.stderr_text, HasSubstr("\"total_bytes\":"));
  }
  // Standard output redirected to a regular file: written in place, no rename over /dev/stdout.
  const std::string redirected = dir_ / "redirected.ckpt";
  auto r = testing::RunSubprocess(
      {"/bin/sh", "-c",
       absl::StrCat(CKPTCTL_PATH, " --server ", server_->address(),
                    " fetch demo --dst-strategy dst --rank 1 --out /dev/stdout > ", redirected)});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->exit_code, 0) << r->stderr_text;
  EXPECT_TRUE(ReadFile(redirected) == expected);
  EXPECT_TRUE(fs::is_symlink("/dev/stdout"));
  // A symbolic link to a file: the file is replaced, the link stays.
  const std::string target = dir_ / "target.ckpt";
  std::ofstream(target) << "old";
  fs::create_symlink(target, dir_ / "link.ckpt");
  ASSERT_EQ(
      Ctl({"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out", dir_ / "link.ckpt"})
          .exit_code,
      0);
  EXPECT_TRUE(fs::is_symlink(dir_ / "link.ckpt"));
  EXPECT_TRUE(ReadFile(target) == expected);
  // Missing parent directories are created, as export does.
  ASSERT_EQ(Ctl({"fetch", "demo", "--dst-strategy", "dst", "--rank", "1", "--out",
                 dir_ / "a/b/c/rank1.ckpt"})
                .exit_code,
            0);
  EXPECT_TRUE(ReadFile(dir_ / "a/b/c/rank1.ckpt") == expected);
}

TEST_F(CliScriptingTest, JobRecordsExpireAfterTheRetention) {
  UploadDemo();
  ASSERT_EQ(Ctl({"transform", "demo", "--dst-strategy", "dst", "--as", "demo_dst", "--id", "old",
                 "--wait"})
                .exit_code,
            0);
  EXPECT_EQ(Ctl({"jobs", "rm", "nope"}).exit_code, static_cast<int>(ExitCode::kNotFound));
  // Restarted with a retention shorter than the job's age: the record is gone, the output stays.
  ASSERT_EQ(server_->Stop(), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));
  StartServer({"--job-retention", "1s"});
  auto got = Ctl({"jobs", "get", "old"});
  EXPECT_EQ(got.exit_code, static_cast<int>(ExitCode::kNotFound)) << got.stdout_text;
  EXPECT_EQ(Ctl({"describe", "demo_dst"}).exit_code, 0);
  EXPECT_THAT(server_->Log(), HasSubstr("event=job_expire job=old"));
  // A bad retention is a usage error of ckptd.
  auto bad = testing::RunSubprocess({CKPTD_PATH, "--job-retention", "soon"});
  ASSERT_TRUE(bad.ok());
  EXPECT_NE(bad->exit_code, 0);
  EXPECT_THAT(bad->stderr_text, HasSubstr("invalid duration"));
}

}  // namespace
}  // namespace ckpt
