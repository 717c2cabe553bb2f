// CheckpointStore held entirely in memory, for tests of everything above the store (service,
// client) and as the reference the segment store is checked against (the conformance suite runs
// against both). Nothing survives destruction; there is no disk, so "free disk" is whatever
// StoreOptions::free_disk_bytes reports (unlimited when unset).
#ifndef CKPT_STORAGE_MEMORY_STORE_H_
#define CKPT_STORAGE_MEMORY_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

// Thread-safe: one mutex guards all state (tests do not need more concurrency than that).
// Chunks are shared immutable strings, so a ChunkData returned by ReadChunk stays valid even
// after the chunk is deleted or the store is destroyed.
class MemoryStore final : public CheckpointStore {
 public:
  explicit MemoryStore(StoreOptions options);
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  absl::Status PutStrategy(const std::string& name, std::string_view record,
                           bool overwrite) override;
  absl::StatusOr<std::string> GetStrategy(const std::string& name) override;
  absl::StatusOr<std::vector<std::string>> ListStrategies() override;
  absl::Status DeleteStrategy(const std::string& name) override;

  absl::StatusOr<uint64_t> BeginData() override;
  // StoreOptions::free_disk_bytes, when set, is called with the store's mutex held: it must not
  // call back into the store.
  absl::Status PutChunks(const std::vector<ChunkWrite>& chunks) override;
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadChunkUnverified(
      const ChunkAddress& address) override;
  absl::Status DiscardData(uint64_t data_id) override;

  absl::Status CommitCheckpoint(const std::string& id, std::string_view manifest,
                                uint64_t data_id) override;
  absl::StatusOr<std::string> GetManifest(const std::string& id) override;
  absl::StatusOr<std::vector<std::string>> ListCheckpoints() override;
  absl::Status DeleteCheckpoint(const std::string& id) override;

  absl::Status PutJob(const std::string& id, std::string_view record) override;
  absl::StatusOr<std::string> GetJob(const std::string& id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs() override;
  absl::Status DeleteJob(const std::string& id) override;

  absl::StatusOr<int64_t> CollectGarbage() override;
  absl::Status Flush() override;
  StoreStats stats() const override;

 private:
  // (data id, tensor, blob, chunk): ordered like the segment store's chunk keys, so a data id is
  // one range.
  using ChunkKey = std::tuple<uint64_t, uint32_t, uint32_t, uint32_t>;
  struct Checkpoint {
    std::string manifest;
    uint64_t data_id = 0;
  };

  // Erases every chunk of `data_id`. Requires mu_.
  void EraseChunksLocked(uint64_t data_id);

  const StoreOptions options_;

  mutable std::mutex mu_;
  std::map<std::string, std::string> strategies_;
  std::map<std::string, Checkpoint> checkpoints_;
  std::map<ChunkKey, std::shared_ptr<const std::string>> chunks_;
  std::map<std::string, std::string> jobs_;
  std::set<uint64_t> live_;       // begun, neither committed nor discarded
  std::set<uint64_t> committed_;  // referenced by a manifest
  uint64_t next_data_id_ = 1;
  StoreStats stats_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_MEMORY_STORE_H_
