// The limits the fetch figures are compared with: the transport limit (a bench-only gRPC stream
// of prepared messages, in a child process), the verified-read ceiling (the same stream reading
// and checksumming the rank files) and the storage limit (every stored chunk read through the
// store in this process, ckptd stopped).
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "ckpt_records.pb.h"
#include "storage/checkpoint_store.h"
#include "tests/bench/harness.h"
#include "tests/bench/transport.h"

namespace ckpt::bench {
namespace {

// One pass of the storage limit: every chunk of `manifest`, in key order, read and
// checksum-verified through `store` by this thread. The bytes read.
absl::StatusOr<int64_t> ReadEveryChunk(CheckpointStore& store,
                                       const records::CheckpointManifest& manifest) {
  int64_t bytes = 0;
  for (const records::TensorRecord& t : manifest.tensors()) {
    for (const records::BlobRecord& b : t.blobs()) {
      for (int c = 0; c < b.chunk_checksums_size(); ++c) {
        const ChunkAddress address{manifest.data_id(), t.tensor_index(), b.blob_index(),
                                   static_cast<uint32_t>(c)};
        auto chunk = store.ReadChunk(address, b.chunk_checksums(c));
        if (!chunk.ok()) return chunk.status();
        bytes += static_cast<int64_t>((*chunk)->bytes().size());
      }
    }
  }
  return bytes;
}

}  // namespace

void Harness::MeasureTransportLimit() {
  if (!StartTransportServer()) return;
  for (int run = 0; run < kRepeats; ++run) {
    if (!TransportPass()) return;
  }
  MeasureReadCeiling();
}

bool Harness::StartTransportServer() {
  const std::string port_file = work_ + "/transport.port";
  auto child = Child::Spawn({SelfExe(), "--transport-server", port_file}, {});
  if (!child.ok()) {
    Error("transport server", child.status());
    return false;
  }
  int port = 0;
  for (int i = 0; i < 1500 && port == 0; ++i) {
    std::ifstream in(port_file);
    if (!(in >> port)) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (port == 0) {
    Error("transport server", absl::DeadlineExceededError("no port"));
    return false;
  }
  transport_server_ = *std::move(child);
  transport_address_ = absl::StrCat("127.0.0.1:", port);
  return true;
}

void Harness::MeasureReadCeiling() {
  // Verified passes reading the rank files, with their own CPU meter.
  std::vector<std::string> files;
  for (int64_t r = 0; r < SourceStrategy(spec_).world_size(); ++r) {
    files.push_back(absl::StrCat(work_, "/src/rank_", r, "/", kRankFileName));
  }
  const int64_t messages = (spec_.total_bytes + kMessageBytes - 1) / kMessageBytes;
  std::vector<double> runs;
  CpuTally tally;
  for (int run = 0; run < kRepeats; ++run) {
    const CpuMeter cpu(transport_server_->pid());
    auto r = MeasureTransport(transport_address_, messages, kMessageBytes, files);
    if (!r.ok()) return Error("verified-read ceiling", r.status());
    // MeasureTransport's warm-up stream moved up to 32 messages more.
    cpu.AddTo(&tally, r->bytes + std::min<int64_t>(messages, 32) * kMessageBytes);
    runs.push_back(r->bytes / kGiB / r->seconds);
    Progress(absl::StrFormat("verified-read ceiling: %.3f GiB in %.2f s = %.2f GiB/s",
                             r->bytes / kGiB, r->seconds, runs.back()));
  }
  ceiling_gibps_ = Median(runs);
  ceiling_cpu_ = tally.PerGib();
}

bool Harness::TransportPass() {
  if (!transport_server_) return false;
  const int64_t messages = (spec_.total_bytes + kMessageBytes - 1) / kMessageBytes;
  const CpuMeter cpu(transport_server_->pid());
  auto r = MeasureTransport(transport_address_, messages, kMessageBytes);
  if (!r.ok()) {
    Error("transport", r.status());
    StopTransportServer();
    return false;
  }
  // MeasureTransport's warm-up stream moved up to 32 messages more.
  cpu.AddTo(&transport_tally_, r->bytes + std::min<int64_t>(messages, 32) * kMessageBytes);
  transport_passes_.push_back(r->bytes / kGiB / r->seconds);
  transport_gibps_ = Median(transport_passes_);
  transport_cpu_ = transport_tally_.PerGib();
  Progress(absl::StrFormat("transport: %.3f GiB in %.2f s = %.2f GiB/s", r->bytes / kGiB,
                           r->seconds, transport_passes_.back()));
  return true;
}

void Harness::StopTransportServer() {
  if (!transport_server_) return;
  transport_server_->Signal(SIGTERM);
  transport_server_->Wait();
  transport_server_.reset();
}

void Harness::MeasureStorageLimit() {
  StopServer();  // the store takes RocksDB's lock
  if (!StoragePasses()) return;
  if (auto s = StartServer(); !s.ok()) Error("restart ckptd", s);
}

bool Harness::StoragePasses() {
  StoreOptions options;
  options.min_free_disk_bytes = int64_t{64} << 20;
  auto store = OpenSegmentStore(work_ + "/data", options);
  if (!store.ok()) {
    Error("open store", store.status());
    return false;
  }
  auto manifest_bytes = (*store)->GetManifest(kCheckpointId);
  if (!manifest_bytes.ok()) {
    Error("manifest", manifest_bytes.status());
    return false;
  }
  records::CheckpointManifest manifest;
  if (!manifest.ParseFromString(*manifest_bytes)) {
    Error("manifest", absl::DataLossError("cannot parse the manifest"));
    return false;
  }
  if (manifest.chunk_checksum() != records::CHUNK_CHECKSUM_XXH3_64) {
    Error("manifest", absl::DataLossError("unknown chunk checksum algorithm"));
    return false;
  }
  // One thread, in key order, every chunk checksum-verified: what one Fetch stream's producer
  // could read at best. The median of kRepeats passes, like the other limits.
  for (int pass = 0; pass < kRepeats; ++pass) {
    const auto start = Clock::now();
    const absl::StatusOr<int64_t> bytes = ReadEveryChunk(**store, manifest);
    if (!bytes.ok()) {
      Error("read chunk", bytes.status());
      return false;
    }
    const double seconds = Seconds(start);
    storage_bytes_ = *bytes;
    storage_runs_.push_back(*bytes / kGiB / seconds);
    Progress(absl::StrFormat("storage: %.3f GiB of chunks in %.2f s = %.2f GiB/s", *bytes / kGiB,
                             seconds, storage_runs_.back()));
  }
  storage_gibps_ = Median(storage_runs_);
  return true;
}

}  // namespace ckpt::bench
