#include "storage/checkpoint_store.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/checksum.h"

namespace ckpt {

std::string ChunkAddress::ToString() const {
  return absl::StrCat("data ", data_id, " tensor ", tensor, " blob ", blob, " chunk ", chunk);
}

absl::Status VerifyChunk(const ChunkAddress& address, std::string_view bytes,
                         uint64_t expected_checksum) {
  const uint64_t actual = Checksum(bytes);
  if (actual == expected_checksum) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrFormat("chunk %s failed its %s checksum (expected %016x, got %016x)",
                      address.ToString(), kChecksumName, expected_checksum, actual));
}

absl::Status DataIdNotLive(uint64_t data_id) {
  return absl::FailedPreconditionError(absl::StrCat(
      "data id ", data_id, " is not live (never begun, already committed or discarded)"));
}

void CheckpointStore::ReadChunksUnverified(
    std::span<const ChunkAddress> addresses,
    std::vector<absl::StatusOr<std::unique_ptr<ChunkData>>>* out) {
  out->clear();
  out->reserve(addresses.size());
  for (const ChunkAddress& a : addresses) out->push_back(ReadChunkUnverified(a));
}

absl::StatusOr<std::unique_ptr<ChunkData>> CheckpointStore::ReadChunk(const ChunkAddress& address,
                                                                      uint64_t expected_checksum) {
  absl::StatusOr<std::unique_ptr<ChunkData>> data = ReadChunkUnverified(address);
  if (!data.ok()) return data;
  if (absl::Status s = VerifyChunk(address, (*data)->bytes(), expected_checksum); !s.ok()) {
    return s;
  }
  return data;
}

absl::StatusOr<BackupStats> CheckpointStore::Backup(const std::string&) {
  return absl::UnimplementedError("this store cannot be backed up (only the segment store can)");
}

}  // namespace ckpt
