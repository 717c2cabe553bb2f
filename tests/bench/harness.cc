// Harness set-up (work directory, ckptd, the source checkpoint) and the order of the phases.
#include "tests/bench/harness.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/malloc_tuning.h"
#include "core/status_macros.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;

// The fetch cases, in the order they run.
std::vector<FetchCase> FetchCases() {
  return {
      {"8to3", kThreeName, "", 1.1, "row split"},
      {"row_to_col", kColumnName, "", 1.25, "column"},
      {"opt_to_plain", kPlainName, "opt.", 1.25, "opt-shard"},
      {"merged", "", "", 1.1, "row split"},
  };
}

}  // namespace

void Harness::Note(const std::string& note) {
  notes_.push_back(note);
  std::fprintf(stderr, "note: %s\n", note.c_str());
}

void Harness::Error(const std::string& what, const absl::Status& status) {
  const std::string e = absl::StrCat(what, ": ", status.ToString());
  errors_.push_back(e);
  std::fprintf(stderr, "ERROR %s\n", e.c_str());
  if (server_) {
    const std::string log = server_->Log();
    std::fprintf(stderr, "--- ckptd log (tail) ---\n%s\n",
                 log.substr(log.size() > 4000 ? log.size() - 4000 : 0).c_str());
  }
}

void Harness::Progress(const std::string& what) {
  std::fprintf(stderr, "[%7.1fs] %s\n", Seconds(start_), what.c_str());
}

absl::Status Harness::PrepareWorkDir() {
  if (!work_dir_arg_.empty()) {
    work_ = fs::absolute(work_dir_arg_).string();
    std::error_code ec;
    if (!fs::exists(work_)) {
      fs::create_directories(work_, ec);
      created_work_ = true;
    }
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", work_, ": ", ec.message()));
    return absl::OkStatus();
  }
  std::string tmpl = std::string(CKPT_BENCH_BUILD_DIR) + "/bench-work-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", tmpl, " failed"));
  }
  work_ = tmpl;
  created_work_ = true;
  return absl::OkStatus();
}

void Harness::Cleanup() {
  client_.reset();
  stats_stub_.reset();
  StopServer();
  StopTransportServer();
  if (work_.empty() || keep_) return;
  std::error_code ec;
  if (created_work_) {
    fs::remove_all(work_, ec);
  } else {
    for (const char* sub : {"src", "data", "data.log", "data.port", "export", "baseline", "pki",
                            "disk-write.tmp", "store-write", "transport.port", "growth-src",
                            "growth-export", "many-src", "strategy-50k.json"}) {
      fs::remove_all(fs::path(work_) / sub, ec);
    }
  }
  work_.clear();
}

absl::Status Harness::StartServer(const std::vector<std::string>& extra_args,
                                  ClientOptions options) {
  // Transform jobs export beneath the work directory (harness_transform.cc).
  std::vector<std::string> args = {"--export-root", work_};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  CKPT_ASSIGN_OR_RETURN(server_, testing::ServerProcess::Start(CKPTD_PATH, work_ + "/data", args));
  options.connect_timeout = absl::Seconds(20);
  CKPT_ASSIGN_OR_RETURN(client_, CkptClient::Connect(server_->address(), options));
  stats_stub_ = v1::CheckpointService::NewStub(
      grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  return absl::OkStatus();
}

void Harness::StopServer() {
  client_.reset();
  stats_stub_.reset();
  if (server_) {
    const int code = server_->Stop();
    if (code != 0) Note(absl::StrCat("ckptd exited with code ", code));
    server_.reset();
  }
}

absl::StatusOr<v1::ServerStats> Harness::Stats() {
  if (stats_unimplemented_) return absl::UnimplementedError("GetStats");
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerStats stats;
  const grpc::Status s = stats_stub_->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (s.ok()) return stats;
  const absl::Status status = FromGrpcStatus(s);
  if (status.code() == absl::StatusCode::kUnimplemented) {
    stats_unimplemented_ = true;
    Note("ckptd does not implement GetStats yet (UNIMPLEMENTED): read_amplification is null");
  }
  return status;
}

absl::Status Harness::Generate() {
  Progress(absl::StrCat("generating ", spec_.Describe(), " over 8 source ranks"));
  const auto start = Clock::now();
  CKPT_ASSIGN_OR_RETURN(source_file_bytes_,
                        WriteSourceCheckpoint(spec_, SourceStrategy(spec_), work_ + "/src", 2));
  Progress(absl::StrFormat("generated %.3f GiB of rank files in %.1f s", source_file_bytes_ / kGiB,
                           Seconds(start)));
  return absl::OkStatus();
}

void Harness::MeasureUploaded() {
  // From here on this process is the fetching client of every single-stream case (and of the
  // limits they are compared with), so it opts in to the client library's allocator policy for
  // streaming, as ckptctl and the concurrent workers do. The upload and the store write limit
  // ran with glibc's defaults; the baseline child process keeps them too (it stands for
  // MindSpore's Python tool).
  TuneMallocForStreaming();
  MeasureFirstFetch();
  if (Selected("transport")) MeasureTransportLimit();
  if (Selected("storage")) MeasureStorageLimit();
  for (const FetchCase& c : FetchCases()) {
    if (server_ && (Selected("fetch") || Selected(c.name))) MeasureFetch(c);
  }
  if (server_ && Selected("python")) MeasurePython();
  if (server_ && Selected("concurrent")) MeasureConcurrent();
  if (server_ && Selected("storm")) MeasureStorm();
  StopTransportServer();
  // Before the phases that restart ckptd with other options or leave it stopped.
  if (server_ && Selected("many_tensors")) MeasureManyTensors();
  if (server_ && Selected("tls")) MeasureTls();
  if (server_ && Selected("transform")) MeasureTransformPhase();
}

void Harness::MeasureDependencies() {
  auto r = MeasureDeps();
  if (!r.ok()) return Error("deps", r.status());
  deps_ = *r;
  Progress(absl::StrFormat("deps --all: %d params, %d -> %d ranks: %.1f / %.1f / %.1f ms",
                           r->params, r->src_world, r->dst_world, r->runs_ms[0], r->runs_ms[1],
                           r->runs_ms[2]));
}

void Harness::WriteResults() {
  const nlohmann::json results = Results();
  const fs::path out(out_);
  std::error_code ec;
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  std::ofstream f(out_);
  f << results.dump(2) << "\n";
  if (!f) {
    std::fprintf(stderr, "ckpt_bench: cannot write %s\n", out_.c_str());
    errors_.push_back("cannot write results");
  }
}

int Harness::Run() {
  if (auto s = PrepareWorkDir(); !s.ok()) {
    std::fprintf(stderr, "ckpt_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  Progress(absl::StrCat("work dir ", work_));
  if (auto s = Generate(); !s.ok()) {
    Error("generate", s);
  } else if (auto s2 = StartServer(); !s2.ok()) {
    Error("start ckptd", s2);
  } else {
    MeasureUpload();
  }
  if (uploaded_) MeasureUploaded();
  StopServer();
  if (Selected("growth")) MeasureGrowth();
  StopServer();
  if (Selected("deps")) MeasureDependencies();
  speeds_at_end_ = MeasureCpuSpeeds();
  WriteResults();
  Print();
  Cleanup();
  return errors_.empty() ? 0 : 1;
}

}  // namespace ckpt::bench
