// Produces the messages of one Fetch: a plan summary, then per tensor a header and its bytes in
// ≤ max_message_bytes pieces. Bytes are assembled one band of destination rows at a time from
// only the stored chunks that overlap, so memory stays bounded whatever the tensor size.
#ifndef CKPT_SERVICE_FETCH_STREAM_H_
#define CKPT_SERVICE_FETCH_STREAM_H_

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "core/reshard.h"
#include "service/loaded_checkpoint.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct FetchOptions {
  // Largest data message (the API promises ≤ 1 MiB).
  int64_t max_message_bytes = int64_t{1} << 20;
  // Destination rows are assembled in bands of about this many bytes.
  int64_t band_bytes = int64_t{4} << 20;
  // Recently read chunks kept for the next band (a chunk's rows can span several bands).
  int64_t chunk_cache_bytes = int64_t{16} << 20;
};

// Not thread-safe: one producer at a time.
class FetchStream {
 public:
  FetchStream(std::shared_ptr<const LoadedCheckpoint> checkpoint, RankPlan plan,
              CheckpointStore* store, FetchOptions options);

  // Fills `out` with the next message; false when the stream is complete. Errors name the
  // checkpoint and tensor (DATA_LOSS on a checksum mismatch).
  absl::StatusOr<bool> Next(v1::FetchResponse* out);

  int64_t total_bytes() const { return total_bytes_; }
  int64_t bytes_produced() const { return bytes_produced_; }

 private:
  absl::Status BuildBand();  // fills band_ with the next band of the current tensor
  absl::StatusOr<std::shared_ptr<ChunkData>> Chunk(const ChunkAddress& address, uint64_t checksum);
  int64_t TensorBytes(const TensorPlan& t) const;
  const records::TensorRecord& Record(const TensorPlan& t) const;
  const records::BlobRecord* BlobFor(const records::TensorRecord& r, const CopyOp& op) const;

  std::shared_ptr<const LoadedCheckpoint> checkpoint_;
  RankPlan plan_;
  CheckpointStore* store_;
  FetchOptions options_;
  int64_t total_bytes_ = 0;
  int64_t bytes_produced_ = 0;

  bool summary_sent_ = false;
  size_t tensor_ = 0;       // index into plan_.tensors
  bool header_sent_ = false;
  int64_t next_row_ = 0;    // next destination row (dim 0, slice-local) to assemble
  int64_t next_chunk_ = 0;  // str values: next raw chunk
  bool tensor_done_ = false;
  std::string band_;
  size_t band_pos_ = 0;

  // LRU of recently read chunks.
  struct CachedChunk {
    uint64_t key_hi;
    uint64_t key_lo;
    std::shared_ptr<ChunkData> data;
  };
  std::list<CachedChunk> cache_;
  int64_t cache_bytes_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_FETCH_STREAM_H_
