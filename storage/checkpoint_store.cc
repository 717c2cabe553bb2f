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

namespace {

// The default reservation: the chunks' bytes go to one buffer of this object's, and Commit puts
// them with the store's PutChunks.
class BufferedReservation final : public ChunkReservation {
 public:
  BufferedReservation(CheckpointStore* store, const std::vector<ChunkSpace>& chunks, size_t total)
      : store_(store), buffer_(new char[total]) {
    char* at = buffer_.get();
    first_.push_back(0);
    writes_.reserve(chunks.size());
    for (const ChunkSpace& c : chunks) {
      const auto n = static_cast<size_t>(c.bytes);
      if (n > 0) places_.emplace_back(at, n);
      first_.push_back(places_.size());
      writes_.push_back({c.address, std::string_view(at, n), c.stream, c.sole_chunk});
      at += n;
    }
  }
  absl::Status Commit() override { return store_->PutChunks(writes_); }

 private:
  CheckpointStore* const store_;
  const std::unique_ptr<char[]> buffer_;
  std::vector<ChunkWrite> writes_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ChunkReservation>> CheckpointStore::ReserveChunks(
    const std::vector<ChunkSpace>& chunks) {
  size_t total = 0;
  for (const ChunkSpace& c : chunks) {
    if (c.bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", c.address.ToString(), " cannot have ", c.bytes, " bytes"));
    }
    total += static_cast<size_t>(c.bytes);
  }
  return std::make_unique<BufferedReservation>(this, chunks, total);
}

absl::StatusOr<BackupStats> CheckpointStore::Backup(const std::string&) {
  return absl::UnimplementedError("this store cannot be backed up (only the segment store can)");
}

}  // namespace ckpt
