// A CheckpointStore that forwards every call to another one: tests derive from it to inject
// faults into a few methods (a failed read, corrupted bytes) around a real store.
#ifndef CKPT_TESTS_TESTING_FORWARDING_STORE_H_
#define CKPT_TESTS_TESTING_FORWARDING_STORE_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "storage/checkpoint_store.h"

namespace ckpt::testing {

// Thread-safe as the store it wraps (which it owns).
class ForwardingStore : public CheckpointStore {
 public:
  explicit ForwardingStore(std::unique_ptr<CheckpointStore> base) : base_(std::move(base)) {}

  absl::Status PutStrategy(const std::string& name, std::string_view record,
                           bool overwrite) override {
    return base_->PutStrategy(name, record, overwrite);
  }
  absl::StatusOr<std::string> GetStrategy(const std::string& name) override {
    return base_->GetStrategy(name);
  }
  absl::StatusOr<std::vector<std::string>> ListStrategies() override {
    return base_->ListStrategies();
  }
  absl::Status DeleteStrategy(const std::string& name) override {
    return base_->DeleteStrategy(name);
  }
  absl::StatusOr<uint64_t> BeginData() override { return base_->BeginData(); }
  absl::Status PutChunks(const std::vector<ChunkWrite>& chunks) override {
    return base_->PutChunks(chunks);
  }
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override {
    return base_->ReadChunkUnverified(address);
  }
  absl::Status DiscardData(uint64_t data_id) override { return base_->DiscardData(data_id); }
  absl::Status CommitCheckpoint(const std::string& id, std::string_view manifest,
                                uint64_t data_id) override {
    return base_->CommitCheckpoint(id, manifest, data_id);
  }
  absl::StatusOr<std::string> GetManifest(const std::string& id) override {
    return base_->GetManifest(id);
  }
  absl::StatusOr<std::vector<std::string>> ListCheckpoints() override {
    return base_->ListCheckpoints();
  }
  absl::Status DeleteCheckpoint(const std::string& id) override {
    return base_->DeleteCheckpoint(id);
  }
  absl::Status PutJob(const std::string& id, std::string_view record) override {
    return base_->PutJob(id, record);
  }
  absl::StatusOr<std::string> GetJob(const std::string& id) override { return base_->GetJob(id); }
  absl::StatusOr<std::vector<JobRecord>> ListJobs() override { return base_->ListJobs(); }
  absl::Status DeleteJob(const std::string& id) override { return base_->DeleteJob(id); }
  absl::StatusOr<int64_t> CollectGarbage() override { return base_->CollectGarbage(); }
  absl::Status Flush() override { return base_->Flush(); }
  StoreStats stats() const override { return base_->stats(); }

 protected:
  CheckpointStore& base() { return *base_; }

 private:
  const std::unique_ptr<CheckpointStore> base_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_FORWARDING_STORE_H_
