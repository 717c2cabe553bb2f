// For tests that drive a CheckpointManager in process: chunks that own their bytes (for stores
// that hand back altered copies), and a sample checkpoint uploaded rank by rank as a client does.
#ifndef CKPT_TESTS_TESTING_MANAGER_UPLOADS_H_
#define CKPT_TESTS_TESTING_MANAGER_UPLOADS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/ckptctl/sample.h"
#include "core/status_macros.h"
#include "core/strategy.h"
#include "service/engine/manager.h"
#include "storage/checkpoint_store.h"

namespace ckpt::testing {

// A chunk holding bytes of its own.
class OwnedChunk final : public ChunkData {
 public:
  explicit OwnedChunk(std::string bytes) : bytes_(std::move(bytes)) {}
  std::string_view bytes() const override { return bytes_; }

 private:
  const std::string bytes_;
};

// Uploads checkpoint `id` through `manager`: every rank of `strategy` (registered as
// `strategy_name`) sends its slice of each of `tensors` (SampleSlice with `seed`), a tensor at a
// time, and finishes. The first error, naming the rank and tensor.
inline absl::Status UploadSampleRanks(CheckpointManager& manager, const std::string& id,
                                      const std::string& strategy_name, const Strategy& strategy,
                                      const std::vector<SampleTensor>& tensors, uint64_t seed) {
  for (int64_t r = 0; r < strategy.world_size(); ++r) {
    v1::UploadHeader h;
    h.set_checkpoint_id(id);
    h.set_source_strategy(strategy_name);
    h.set_rank(r);
    CKPT_ASSIGN_OR_RETURN(auto upload, manager.BeginUpload(h));
    for (const SampleTensor& t : tensors) {
      const Box box = *strategy.Find(t.name)->layout.SliceBox(t.global_shape, r);
      const std::string bytes = SampleSlice(t.name, t.dtype, t.global_shape, box, seed);
      v1::UploadTensorHeader th;
      th.set_name(t.name);
      th.set_dtype(std::string(DTypeName(t.dtype)));
      for (int64_t d : box.shape()) th.add_dims(d);
      th.set_total_bytes(static_cast<int64_t>(bytes.size()));
      absl::Status s = upload->StartTensor(th);
      if (s.ok()) s = upload->Append(bytes);
      if (!s.ok())
        return absl::Status(s.code(),
                            absl::StrCat("rank ", r, " tensor ", t.name, ": ", s.message()));
    }
    CKPT_RETURN_IF_ERROR(upload->Finish().status());
    manager.OnUploadFinished(id);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_MANAGER_UPLOADS_H_
