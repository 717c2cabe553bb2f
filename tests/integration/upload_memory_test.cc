// ckptd's peak memory during an upload does not grow with the checkpoint's bytes: the same
// tensors with 4 times the rows, each uploaded into a fresh ckptd, raise its peak resident memory
// (VmHWM) by less than a fixed allowance. What an upload holds is bounded by configured sizes:
// the receive window of each upload stream (--receive-window-mib), the store's write blocks, the
// band of chunks being cut per stream. Not timed.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/ckptctl/sample.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/testing/server_process.h"

namespace ckpt {
namespace {

using testing::ServerProcess;
using testing::TempDir;

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kDevices = 4;
constexpr int64_t kTensors = 8;
constexpr int64_t kColumns = 1024;  // Float32: 4 KiB per row
// Rows of each tensor at x1: 8 tensors x 1024 rows x 4 KiB = 32 MiB; x4 is 128 MiB.
constexpr int64_t kRows = 1024;
// How much more ckptd's peak may be at x4 than at x1: the receive windows of the 4 upload
// streams (4 MiB by default, plus the 1 MiB message being read), which the smaller upload may
// not fill. Memory held per byte received, or a window that grew as the upload went on, would
// exceed it.
constexpr int64_t kAllowanceBytes = 20 * kMiB;

// kTensors row-split Float32 tensors of `rows` x kColumns over kDevices devices.
std::vector<SampleTensor> Tensors(int64_t rows) {
  std::vector<SampleTensor> tensors;
  for (int64_t i = 0; i < kTensors; ++i) {
    tensors.push_back({absl::StrFormat("layers.%d.w", i), DType::kFloat32, {rows, kColumns}});
  }
  return tensors;
}

Strategy RowSplit(const std::vector<SampleTensor>& tensors) {
  std::map<std::string, StrategyParam> params;
  for (const SampleTensor& t : tensors) {
    StrategyParam& p = params[t.name];
    p.layout.dev_matrix = {kDevices};
    p.layout.tensor_map = {{0}, {}};
    p.tensor_shape = t.global_shape;
  }
  return *Strategy::Create(std::move(params), 1);
}

// The peak resident memory (VmHWM) of process `pid`, in bytes.
absl::StatusOr<int64_t> PeakRssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) return int64_t{kib} << 10;
  }
  return absl::NotFoundError(absl::StrCat("no VmHWM in /proc/", pid, "/status"));
}

// Uploads the tensors with `rows` rows into a fresh ckptd and returns its peak
// resident memory (-1 after a failure, which is reported).
int64_t PeakOfUpload(const TempDir& dir, int64_t rows) {
  const std::vector<SampleTensor> tensors = Tensors(rows);
  const Strategy strategy = RowSplit(tensors);
  const std::string src = dir / absl::StrCat("src", rows);
  const std::string data = dir / absl::StrCat("data", rows);
  EXPECT_TRUE(WriteShardedSample(strategy, tensors, src, {}).ok());
  auto server = ServerProcess::Start(CKPTD_PATH, data);
  EXPECT_TRUE(server.ok()) << server.status();
  if (!server.ok()) return -1;
  auto client = CkptClient::Connect((*server)->address());
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return -1;
  EXPECT_TRUE((*client)->PutStrategy("rows", strategy, false).ok());
  auto up = (*client)->UploadDirectory("ckpt", "rows", src);
  EXPECT_TRUE(up.ok()) << up.status();
  if (up.ok()) {
    EXPECT_TRUE(up->committed);
  }
  absl::StatusOr<int64_t> peak = PeakRssBytes((*server)->pid());
  EXPECT_TRUE(peak.ok()) << peak.status();
  return peak.ok() ? *peak : -1;
}

TEST(UploadMemoryTest, PeakDoesNotGrowWithTheBytesUploaded) {
  TempDir dir;
  const int64_t x1 = PeakOfUpload(dir, kRows);
  const int64_t x4 = PeakOfUpload(dir, 4 * kRows);
  const int64_t bytes = kTensors * kRows * kColumns * 4;
  std::printf("ckptd peak RSS: %.1f MiB uploading %lld MiB, %.1f MiB uploading %lld MiB\n",
              static_cast<double>(x1) / kMiB, static_cast<long long>(bytes / kMiB),
              static_cast<double>(x4) / kMiB, static_cast<long long>(4 * bytes / kMiB));
  ASSERT_GT(x1, 0);
  ASSERT_GT(x4, 0);
  EXPECT_LT(x4 - x1, kAllowanceBytes)
      << "ckptd's peak grew by " << (x4 - x1) / kMiB << " MiB with 4x the uploaded bytes";
}

}  // namespace
}  // namespace ckpt
