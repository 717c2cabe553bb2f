// Fuzz target: the upload stream handler (service/engine/upload_session.h) as ckptd runs it,
// without gRPC. The input is a sequence of records (fuzz_streams.h), each one UploadRequest as a
// client sends it, read as the upload reactor (service/rpc/upload_reactor.cc) reads it: by the wire
// reader (service/engine/upload_wire.h), then by protobuf for the forms it leaves to it. A header
// message begins a new stream (the previous one is finished first), tensor headers, data and
// batches of whole tensors go to the current stream, and the last stream is finished at the end,
// as the reactor does. The manager and a segment store in
// a temporary directory live for the whole run, with the sample's strategies registered as
// "demo" (2 stages x 4 devices) and "dst" (3 devices); every checkpoint an input names is deleted
// after it; both are closed at exit. A crash, leak or undefined behaviour is a finding.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt.pb.h"
#include "client/ckptctl/sample.h"
#include "core/strategy.h"
#include "service/engine/manager.h"
#include "service/engine/upload_session.h"
#include "service/engine/upload_wire.h"
#include "storage/checkpoint_store.h"
#include "tests/fuzz/fuzz_streams.h"

namespace {

// The data message limit of ckptd's upload reactor (CheckpointServiceOptions).
constexpr int64_t kMaxDataMessageBytes = int64_t{1} << 20;

std::string* store_dir = nullptr;
ckpt::CheckpointStore* store = nullptr;
ckpt::CheckpointManager* manager = nullptr;

void RemoveStoreDir() {
  std::error_code ec;
  if (store_dir != nullptr) std::filesystem::remove_all(*store_dir, ec);
}

// Closes the manager and the store before the process's static objects are destroyed: RocksDB's
// background threads still run while the database is open, and at exit they would touch the
// library's already destroyed statics (a use-after-free report after the last input). Registered
// with atexit after the store is open, so it runs before those statics' destructors.
void CloseStore() {
  delete manager;
  manager = nullptr;
  delete store;
  store = nullptr;
}

void Die(const std::string& what) {
  fprintf(stderr, "upload_fuzzer: %s\n", what.c_str());
  abort();
}

// Finishes `upload` (if any) as the reactor does at the end of a stream, then drops it.
void FinishStream(std::unique_ptr<ckpt::RankUpload>& upload, const std::string& id) {
  if (!upload) return;
  auto response = upload->Finish();
  if (response.ok() && response->committed()) manager->OnUploadFinished(id);
  upload.reset();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::string pattern = std::filesystem::temp_directory_path().string() + "/ckpt-fuzz-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) Die("cannot create a temporary directory");
  store_dir = new std::string(pattern);
  atexit(RemoveStoreDir);
  ckpt::StoreOptions store_options;
  store_options.min_free_disk_bytes = 0;  // the campaign must not depend on the machine's disk
  auto opened = ckpt::OpenSegmentStore(*store_dir, store_options);
  if (!opened.ok()) Die(std::string(opened.status().message()));
  store = opened->release();
  ckpt::ManagerOptions options;
  // Small chunks and bands, so that short inputs cross chunk and band boundaries.
  options.upload.chunk_grid.target_chunk_bytes = 256;
  options.upload.chunk_grid.min_column_bytes = 16;
  options.upload.verbatim_dedupe_bytes = 1024;
  options.upload.replica_wait = absl::Milliseconds(10);
  options.upload.rank_release_wait = absl::Milliseconds(10);
  manager = new ckpt::CheckpointManager(store, options);
  atexit(CloseStore);
  for (const auto& [name, strategy] :
       {std::pair{"demo", ckpt::DemoSourceStrategy()}, {"dst", ckpt::DemoDestinationStrategy()}}) {
    auto put = manager->PutStrategy(
        name, ckpt::SerializeStrategy(strategy, ckpt::StrategyFormat::kBinary),
        ckpt::v1::STRATEGY_FORMAT_BINARY, /*overwrite=*/true);
    if (!put.ok()) Die(std::string(put.status().message()));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::set<std::string> ids;
  std::unique_ptr<ckpt::RankUpload> upload;
  std::string id;
  ckpt::UploadMessageViews views;
  std::vector<ckpt::v1::UploadTensorHeader> headers;
  std::vector<ckpt::BatchTensor> batch;
  for (std::string_view record : ckpt::fuzz::SplitRecords(input, 4096)) {
    // As the reactor reads a message: the wire reader first (data and batches in place), then
    // protobuf's parser for the other forms.
    auto kind = ckpt::ReadUploadMessage(record, &views);
    if (!kind.ok()) break;
    ckpt::v1::UploadRequest request;
    batch.clear();
    absl::Status status;
    if (*kind == ckpt::UploadWireKind::kData) {
      request.set_data(std::string(views.data));
    } else if (*kind == ckpt::UploadWireKind::kBatch) {
      if (headers.size() < views.tensors.size()) headers.resize(views.tensors.size());
      for (size_t i = 0; i < views.tensors.size() && status.ok(); ++i) {
        const std::string_view h = views.tensors[i].header;
        if (!headers[i].ParseFromArray(h.data(), static_cast<int>(h.size()))) {
          status = absl::InvalidArgumentError("malformed tensor header");
        }
        batch.push_back({&headers[i], views.tensors[i].data});
      }
      if (!status.ok()) break;
      request.mutable_batch();  // its tensors are in `batch`
    } else if (!request.ParseFromArray(record.data(), static_cast<int>(record.size()))) {
      break;
    } else if (request.kind_case() == ckpt::v1::UploadRequest::kBatch) {
      for (const ckpt::v1::UploadTensor& t : request.batch().tensors()) {
        batch.push_back({&t.header(), t.data()});
      }
    }
    switch (request.kind_case()) {
      case ckpt::v1::UploadRequest::kHeader: {
        FinishStream(upload, id);
        id = request.header().checkpoint_id();
        ids.insert(id);
        auto begun = manager->BeginUpload(request.header());
        status = begun.status();
        if (begun.ok()) upload = std::move(*begun);
        break;
      }
      case ckpt::v1::UploadRequest::kTensor:
        status = upload ? upload->StartTensor(request.tensor())
                        : absl::InvalidArgumentError("no header");
        break;
      case ckpt::v1::UploadRequest::kData:
        if (!upload || static_cast<int64_t>(request.data().size()) > kMaxDataMessageBytes) {
          status = absl::InvalidArgumentError("no header, or data message too large");
        } else {
          status = upload->Append(request.data());
        }
        break;
      case ckpt::v1::UploadRequest::kBatch: {
        int64_t bytes = 0;
        for (const ckpt::BatchTensor& t : batch) bytes += static_cast<int64_t>(t.data.size());
        if (!upload || bytes > kMaxDataMessageBytes) {
          status = absl::InvalidArgumentError("no header, or batch too large");
        } else {
          status = upload->AddBatch(batch);
        }
        break;
      }
      case ckpt::v1::UploadRequest::KIND_NOT_SET:
        status = absl::InvalidArgumentError("empty upload message");
        break;
    }
    // A refused message ends its stream (the reactor cancels it): the upload is undone.
    if (!status.ok()) upload.reset();
  }
  FinishStream(upload, id);
  for (const std::string& name : ids) (void)manager->DeleteCheckpoint(name);
  return 0;
}
