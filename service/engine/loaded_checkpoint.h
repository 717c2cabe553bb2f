// A committed checkpoint's manifest decoded for serving: its source strategy, tensor lookup and
// the planner catalog. Immutable; shared between concurrent fetches.
#ifndef CKPT_SERVICE_ENGINE_LOADED_CHECKPOINT_H_
#define CKPT_SERVICE_ENGINE_LOADED_CHECKPOINT_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "ckpt_records.pb.h"
#include "core/reshard.h"
#include "core/strategy.h"
#include "google/protobuf/arena.h"
#include "service/engine/fetch_layout.h"

namespace ckpt {

struct LoadedCheckpoint {
  // The manifest's messages live on `arena` (one block allocation per few hundred records instead
  // of one per record and repeated field: a manifest of many tensors holds hundreds of thousands
  // of them). `manifest` refers into it; both live as long as this object.
  std::unique_ptr<google::protobuf::Arena> arena;
  const records::CheckpointManifest& manifest;
  std::shared_ptr<const Strategy> strategy;  // null: a single whole-tensor source rank
  // -> index in manifest.tensors; the keys are the manifest's own names.
  absl::flat_hash_map<std::string_view, int> tensor_by_name;
  std::vector<TensorInfo> catalog;  // planner input, manifest order
  // The layouts of the destination rank plans being fetched from this checkpoint (FetchStream's
  // batches of small tensors); a cache, hence mutable (thread-safe).
  mutable FetchLayoutCache fetch_layouts;

  // Decodes and checks a stored manifest: DATA_LOSS when it does not parse, FAILED_PRECONDITION
  // naming the value when it does not record its chunks' checksums as XXH3-64
  // (records::CHUNK_CHECKSUM_XXH3_64), the only algorithm this version verifies. Messages do not
  // name the checkpoint: the caller prefixes them.
  static absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> Decode(const std::string& bytes);

  LoadedCheckpoint(std::unique_ptr<google::protobuf::Arena> arena,
                   const records::CheckpointManifest& manifest)
      : arena(std::move(arena)), manifest(manifest) {}
  LoadedCheckpoint(const LoadedCheckpoint&) = delete;
  LoadedCheckpoint& operator=(const LoadedCheckpoint&) = delete;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_LOADED_CHECKPOINT_H_
