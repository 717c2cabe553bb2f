// The upload phase: the disk and store write limits, kRepeats upload passes into ckptd and the
// first fetch after them.
#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status_macros.h"
#include "storage/checkpoint_store.h"
#include "storage/file_stream.h"
#include "tests/bench/fetch_verify.h"
#include "tests/bench/harness.h"

namespace ckpt::bench {

namespace fs = std::filesystem;

void Harness::MeasureUpload() {
  if (!MeasureDiskWrite()) return;
  MeasureStoreWrite();
  if (!PutStrategies()) return;
  UploadPasses();
}

bool Harness::MeasureDiskWrite() {
  // Raw sequential write of the same bytes to the data directory's file system: with direct I/O
  // (the disk's own speed: the limit the upload target and the transform floor use; the median
  // of kRepeats passes, as the disk's speed drifts) and through the page cache + fsync (what
  // buffered writers such as RocksDB pay; one pass).
  for (int pass = 0; pass < kRepeats; ++pass) {
    absl::StatusOr<double> gibps = DiskWritePass(/*direct=*/true);
    if (!gibps.ok()) {
      Error("disk write", gibps.status());
      return false;
    }
    disk_runs_.push_back(*gibps);
  }
  disk_gibps_ = Median(disk_runs_);
  absl::StatusOr<double> buffered = DiskWritePass(/*direct=*/false);
  if (!buffered.ok()) {
    Error("disk write", buffered.status());
    return false;
  }
  disk_buffered_gibps_ = *buffered;
  return true;
}

absl::StatusOr<double> Harness::DiskWritePass(bool direct) {
  const std::string path = work_ + "/disk-write.tmp";
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<AtomicFileSink> sink,
                        AtomicFileSink::Create(path, direct));  // write + fsync + rename
  const std::string buffer = PatternBytes(static_cast<size_t>(kMessageBytes), 0);
  const auto start = Clock::now();
  absl::Status s;
  for (int64_t done = 0; done < source_file_bytes_ && s.ok(); done += kMessageBytes) {
    s = sink->Write(std::string_view(buffer).substr(
        0, static_cast<size_t>(std::min(kMessageBytes, source_file_bytes_ - done))));
  }
  if (s.ok()) s = sink->Commit();
  const double seconds = Seconds(start);
  std::error_code ec;
  fs::remove(path, ec);
  CKPT_RETURN_IF_ERROR(s);
  const double gibps = source_file_bytes_ / kGiB / seconds;
  if (direct) {
    Progress(absl::StrFormat("raw disk write (%s) + fsync: %.2f GiB/s",
                             sink->direct_io() ? "direct I/O" : "direct I/O refused, buffered",
                             gibps));
  } else {
    Progress(absl::StrFormat("buffered disk write + fsync: %.2f GiB/s", gibps));
  }
  return gibps;
}

void Harness::MeasureStoreWrite() {
  // The same bytes as the upload, as 1 MiB chunks in writes of 4, into a fresh store opened as
  // ckptd opens its own (chunk bytes appended to a segment file, their locations through
  // RocksDB's WAL), then committed (which syncs the segment file and the batch). One thread puts;
  // RocksDB's background threads run beside it, as in ckptd.
  const std::string dir = work_ + "/store-write";
  {
    StoreOptions options;
    options.min_free_disk_bytes = int64_t{64} << 20;
    auto store = OpenSegmentStore(dir, options);
    if (!store.ok()) return Error("store write: open", store.status());
    std::vector<std::string> payloads;
    for (uint32_t k = 0; k < 4; ++k) {
      payloads.push_back(PatternBytes(static_cast<size_t>(kMessageBytes), k + 1));
    }
    const double cpu_start = SelfCpuSeconds();
    const auto start = Clock::now();
    auto data_id = (*store)->BeginData();
    if (!data_id.ok()) return Error("store write: begin", data_id.status());
    int64_t written = 0;
    for (uint32_t chunk = 0; written < source_file_bytes_;) {
      std::vector<ChunkWrite> writes;
      for (const std::string& p : payloads) {
        if (written >= source_file_bytes_) break;
        const auto n = static_cast<size_t>(std::min(kMessageBytes, source_file_bytes_ - written));
        writes.push_back(
            {{*data_id, chunk / 1024, 0, chunk % 1024}, std::string_view(p).substr(0, n)});
        ++chunk;
        written += static_cast<int64_t>(n);
      }
      if (auto s = (*store)->PutChunks(writes); !s.ok()) return Error("store write: put", s);
    }
    if (auto s = (*store)->CommitCheckpoint("store-write", "", *data_id); !s.ok()) {
      return Error("store write: commit", s);
    }
    const double seconds = Seconds(start);
    const double gib = static_cast<double>(written) / kGiB;
    store_write_gibps_ = gib / seconds;
    store_write_cpu_ = (SelfCpuSeconds() - cpu_start) / gib;
    Progress(absl::StrFormat("store write limit: %.3f GiB in %.2f s = %.2f GiB/s, %.2f CPU s/GiB",
                             gib, seconds, *store_write_gibps_, *store_write_cpu_));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

bool Harness::PutStrategies() {
  for (const char* name : {kSourceName, kThreeName, kColumnName, kPlainName}) {
    auto put = client_->PutStrategy(name, *StrategyByName(spec_, name), true);
    if (!put.ok()) {
      Error(absl::StrCat("PutStrategy ", name), put.status());
      return false;
    }
  }
  return true;
}

void Harness::UploadPasses() {
  // kRepeats passes into the same ckptd, the checkpoint deleted between them; the last one stays
  // for the fetch cases. The first pass also pays for the fresh process growing its heap
  // (memtables, gRPC buffers) and for the fresh store's first page-cache pages, so it is shown on
  // its own; the target is judged on the median pass, like every other throughput here.
  std::vector<double> pass_seconds;
  std::vector<std::optional<CpuPerGib>> pass_cpu;
  int64_t file_bytes = 0;
  for (int pass = 0; pass < kRepeats; ++pass) {
    if (pass > 0) {
      if (auto s = client_->DeleteCheckpoint(kCheckpointId); !s.ok()) {
        return Error("delete the uploaded checkpoint before the next upload pass", s);
      }
      uploaded_ = false;  // until the next pass commits it again
    }
    const CpuMeter cpu(server_->pid());
    const auto start = Clock::now();
    auto up = client_->UploadDirectory(kCheckpointId, kSourceName, work_ + "/src");
    const double seconds = Seconds(start);
    if (!up.ok()) return Error("upload", up.status());
    if (!up->committed) return Error("upload", absl::InternalError("checkpoint not committed"));
    uploaded_ = true;
    file_bytes = up->file_bytes;
    pass_seconds.push_back(seconds);
    pass_cpu.push_back(cpu.Finish(up->file_bytes));
    Progress(absl::StrFormat("upload pass %d: %.3f GiB in %.2f s = %.2f GiB/s (%lld bytes stored)",
                             pass + 1, up->file_bytes / kGiB, seconds,
                             up->file_bytes / kGiB / seconds,
                             static_cast<long long>(up->bytes_stored)));
  }
  const auto median = std::find(pass_seconds.begin(), pass_seconds.end(), Median(pass_seconds));
  upload_gibps_ = file_bytes / kGiB / *median;
  upload_cpu_ = pass_cpu[median - pass_seconds.begin()];
  upload_first_gibps_ = file_bytes / kGiB / pass_seconds.front();
  upload_first_cpu_ = pass_cpu.front();
}

void Harness::MeasureFirstFetch() {
  v1::FetchRequest request;
  request.set_checkpoint_id(kCheckpointId);
  request.set_merged(true);
  CheckingVisitor visitor(&spec_, nullptr, 0, "");
  const auto start = Clock::now();
  absl::Status s = client_->Fetch(request, visitor);
  if (s.ok()) s = visitor.Complete();
  if (!s.ok()) return Error("first fetch after the upload", s);
  const double seconds = Seconds(start);
  first_fetch_gibps_ = visitor.bytes() / kGiB / seconds;
  Progress(absl::StrFormat("first fetch after the upload (merged): %.3f GiB in %.2f s = %.2f GiB/s",
                           visitor.bytes() / kGiB, seconds, *first_fetch_gibps_));
}

}  // namespace ckpt::bench
