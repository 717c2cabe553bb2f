// What a Fetch of many small tensors needs of each tensor of a destination rank's plan, worked out
// once per plan and kept with the checkpoint (FetchLayoutCache), so that producing a batch of
// small tensors (FetchTensorBatch) is a walk over two arrays instead of resolving every tensor's
// copy ops, stored slices and chunk grids in the manifest again for every stream.
//
// A tensor is *direct* when its bytes, row-major, are byte ranges of stored chunks in order: every
// chunk it overlaps supplies whole rows of the tensor's box that are also whole rows of the chunk,
// and the chunks stack without a gap (row and optimizer-shard re-splits, whole tensors of row
// splits). Its bytes are then those ranges; anything else (column re-splits, str values, rows of
// sub-byte elements, tensors beyond the size bound) goes through FetchStream's band assembly.
#ifndef CKPT_SERVICE_ENGINE_FETCH_LAYOUT_H_
#define CKPT_SERVICE_ENGINE_FETCH_LAYOUT_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "ckpt_records.pb.h"
#include "core/reshard.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct LoadedCheckpoint;

// Immutable once built; shared by every stream of the plan.
struct FetchLayout {
  // A byte range of one stored chunk.
  struct ChunkRef {
    ChunkAddress address;
    uint64_t checksum = 0;  // the chunk's manifest checksum
    uint32_t offset = 0;    // of the range in the chunk
    uint32_t length = 0;
    uint32_t chunk_bytes = 0;  // the chunk's size by its grid (a stored chunk of another size is
                               // DATA_LOSS)
  };
  struct Tensor {
    int64_t bytes = 0;  // the tensor's bytes (FetchStream::TensorBytes)
    // Direct tensors: refs [first_ref, first_ref + ref_count) in order are its bytes, and
    // headers [header_offset, header_offset + header_length) its FetchTensorBatch entry
    // (AppendBatchTensorHeader).
    bool direct = false;
    uint32_t first_ref = 0;
    uint32_t ref_count = 0;
    uint32_t header_offset = 0;
    uint32_t header_length = 0;
  };

  int64_t max_tensor_bytes = 0;  // tensors larger than this are never direct
  std::vector<Tensor> tensors;   // one per plan tensor, in plan order
  std::vector<ChunkRef> refs;
  std::string headers;
};

// Works out `plan`'s layout against `checkpoint`'s manifest. Tensors of more than
// `max_tensor_bytes` bytes, and any whose copy ops or stored slices do not resolve (the band path
// reports those), are not direct.
FetchLayout BuildFetchLayout(const LoadedCheckpoint& checkpoint, const RankPlan& plan,
                             int64_t max_tensor_bytes);

// The layouts of the plans being fetched, kept while their plans are alive (at most a few dozen).
// Thread-safe: concurrent streams of one plan build its layout once (the others wait for it).
class FetchLayoutCache {
 public:
  std::shared_ptr<const FetchLayout> Get(const LoadedCheckpoint& checkpoint,
                                         const std::shared_ptr<const RankPlan>& plan,
                                         int64_t max_tensor_bytes);
  // The bytes `plan` delivers (every stream's summary gives them), worked out by `compute` the
  // first time and kept while the plan is alive, as its layouts are: a plan of tens of thousands
  // of tensors takes a millisecond or two to sum, on the way to every stream's first byte.
  int64_t TotalBytes(const std::shared_ptr<const RankPlan>& plan,
                     absl::FunctionRef<int64_t()> compute);

 private:
  static constexpr size_t kMaxKept = 64;
  struct Kept {
    std::weak_ptr<const RankPlan> plan;
    std::shared_ptr<const FetchLayout> layout;
  };
  struct Total {
    std::weak_ptr<const RankPlan> plan;
    int64_t bytes = 0;
  };
  std::mutex mu_;
  std::vector<Kept> kept_;     // most recently used last
  std::vector<Total> totals_;  // most recently used last
};

// The stored slice of `r` that holds `op`'s source box; null when none does.
const records::BlobRecord* FindBlob(const records::TensorRecord& r, const CopyOp& op);

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_FETCH_LAYOUT_H_
