#include "storage/memory_store.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt {
namespace {

// Shares the stored string: no copy, and the bytes outlive deletion of the chunk.
class SharedChunkData final : public ChunkData {
 public:
  explicit SharedChunkData(std::shared_ptr<const std::string> bytes) : bytes_(std::move(bytes)) {}
  std::string_view bytes() const override { return *bytes_; }

 private:
  std::shared_ptr<const std::string> bytes_;
};

}  // namespace

MemoryStore::MemoryStore(StoreOptions options) : options_(std::move(options)) {}

// --- Strategies ---------------------------------------------------------------------------------

absl::Status MemoryStore::PutStrategy(const std::string& name, std::string_view record,
                                      bool overwrite) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, inserted] = strategies_.try_emplace(name, record);
  if (!inserted) {
    if (!overwrite) return absl::AlreadyExistsError(absl::StrCat("strategy ", name, " exists"));
    it->second.assign(record);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::GetStrategy(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = strategies_.find(name);
  if (it == strategies_.end())
    return absl::NotFoundError(absl::StrCat("strategy ", name, " not found"));
  return it->second;
}

absl::StatusOr<std::vector<std::string>> MemoryStore::ListStrategies() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  names.reserve(strategies_.size());
  for (const auto& [name, record] : strategies_) names.push_back(name);
  return names;
}

absl::Status MemoryStore::DeleteStrategy(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (strategies_.erase(name) == 0) {
    return absl::NotFoundError(absl::StrCat("strategy ", name, " not found"));
  }
  return absl::OkStatus();
}

// --- Chunks -------------------------------------------------------------------------------------

absl::StatusOr<uint64_t> MemoryStore::BeginData() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_data_id_++;
  live_.insert(id);
  return id;
}

absl::Status MemoryStore::PutChunks(const std::vector<ChunkWrite>& chunks) {
  if (chunks.empty()) return absl::OkStatus();
  int64_t incoming = 0;
  for (const ChunkWrite& c : chunks) incoming += static_cast<int64_t>(c.bytes.size());

  std::lock_guard<std::mutex> lock(mu_);
  // Validate everything before changing anything: a refused call writes nothing.
  for (const ChunkWrite& c : chunks) {
    if (!live_.contains(c.address.data_id)) return DataIdNotLive(c.address.data_id);
  }
  if (options_.free_disk_bytes) {
    absl::StatusOr<int64_t> free = options_.free_disk_bytes();
    if (!free.ok()) return free.status();
    if (*free - incoming < options_.min_free_disk_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "refusing to write %d bytes of chunks: %d bytes free, below the reserve of %d bytes "
          "(StoreOptions.min_free_disk_bytes)",
          incoming, *free, options_.min_free_disk_bytes));
    }
  }
  for (const ChunkWrite& c : chunks) {
    const ChunkAddress& a = c.address;
    chunks_[ChunkKey(a.data_id, a.tensor, a.blob, a.chunk)] =
        std::make_shared<const std::string>(c.bytes);
  }
  stats_.chunks_written += static_cast<int64_t>(chunks.size());
  stats_.chunk_bytes_written += incoming;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ChunkData>> MemoryStore::ReadChunkUnverified(
    const ChunkAddress& address) {
  std::shared_ptr<const std::string> bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = chunks_.find(ChunkKey(address.data_id, address.tensor, address.blob, address.chunk));
    if (it == chunks_.end()) {
      return absl::NotFoundError(absl::StrCat("chunk ", address.ToString(), " not found"));
    }
    bytes = it->second;
    stats_.chunks_read += 1;
    stats_.chunk_bytes_read += static_cast<int64_t>(bytes->size());
  }
  // The caller hashes outside the lock: the string is immutable.
  return std::make_unique<SharedChunkData>(std::move(bytes));
}

absl::Status MemoryStore::DiscardData(uint64_t data_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (live_.erase(data_id) == 0) return DataIdNotLive(data_id);
  EraseChunksLocked(data_id);
  return absl::OkStatus();
}

void MemoryStore::EraseChunksLocked(uint64_t data_id) {
  auto begin = chunks_.lower_bound(ChunkKey(data_id, 0, 0, 0));
  auto end = data_id == std::numeric_limits<uint64_t>::max()
                 ? chunks_.end()
                 : chunks_.lower_bound(ChunkKey(data_id + 1, 0, 0, 0));
  chunks_.erase(begin, end);
}

// --- Checkpoints --------------------------------------------------------------------------------

absl::Status MemoryStore::CommitCheckpoint(const std::string& id, std::string_view manifest,
                                           uint64_t data_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (checkpoints_.contains(id)) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", id, " exists"));
  }
  if (!live_.contains(data_id)) return DataIdNotLive(data_id);
  checkpoints_.emplace(id, Checkpoint{std::string(manifest), data_id});
  live_.erase(data_id);
  committed_.insert(data_id);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::GetManifest(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checkpoints_.find(id);
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", id, " not found"));
  }
  return it->second.manifest;
}

absl::StatusOr<std::vector<std::string>> MemoryStore::ListCheckpoints() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> ids;
  ids.reserve(checkpoints_.size());
  for (const auto& [id, checkpoint] : checkpoints_) ids.push_back(id);
  return ids;
}

absl::Status MemoryStore::DeleteCheckpoint(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = checkpoints_.find(id);
  if (it == checkpoints_.end()) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", id, " not found"));
  }
  const uint64_t data_id = it->second.data_id;
  checkpoints_.erase(it);
  committed_.erase(data_id);
  EraseChunksLocked(data_id);
  return absl::OkStatus();
}

// --- Jobs ---------------------------------------------------------------------------------------

absl::Status MemoryStore::PutJob(const std::string& id, std::string_view record) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_[id].assign(record);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::GetJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  return it->second;
}

absl::Status MemoryStore::DeleteJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(id);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<JobRecord>> MemoryStore::ListJobs() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<JobRecord> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& [id, record] : jobs_) jobs.push_back(JobRecord{id, record});
  return jobs;
}

// --- Maintenance --------------------------------------------------------------------------------

absl::StatusOr<int64_t> MemoryStore::CollectGarbage() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t collected = 0;
  auto it = chunks_.begin();
  while (it != chunks_.end()) {
    const uint64_t data_id = std::get<0>(it->first);
    if (live_.contains(data_id) || committed_.contains(data_id)) {
      if (data_id == std::numeric_limits<uint64_t>::max()) break;
      it = chunks_.lower_bound(ChunkKey(data_id + 1, 0, 0, 0));
      continue;
    }
    EraseChunksLocked(data_id);
    ++collected;
    // The erased range's successor: the first chunk of the next data id.
    it = chunks_.lower_bound(ChunkKey(data_id, 0, 0, 0));
  }
  return collected;
}

absl::Status MemoryStore::Flush() { return absl::OkStatus(); }

StoreStats MemoryStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::unique_ptr<CheckpointStore> NewMemoryStore(const StoreOptions& options) {
  return std::make_unique<MemoryStore>(options);
}

}  // namespace ckpt
