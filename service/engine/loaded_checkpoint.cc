#include "service/engine/loaded_checkpoint.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "core/status_macros.h"
#include "service/engine/stored_strategy.h"

namespace ckpt {
namespace {

// The enum value's name, or "unknown" for a number this version does not define.
std::string ChunkChecksumText(records::ChunkChecksum value) {
  const std::string& name = records::ChunkChecksum_Name(value);
  return name.empty() ? "unknown" : name;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> LoadedCheckpoint::Decode(
    const std::string& bytes) {
  auto arena = std::make_unique<google::protobuf::Arena>();
  auto* parsed = google::protobuf::Arena::CreateMessage<records::CheckpointManifest>(arena.get());
  if (!parsed->ParseFromString(bytes)) {
    return absl::DataLossError("a stored checkpoint manifest does not parse");
  }
  auto out = std::make_shared<LoadedCheckpoint>(std::move(arena), *parsed);
  const records::CheckpointManifest& m = *parsed;
  if (m.chunk_checksum() != records::CHUNK_CHECKSUM_XXH3_64) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its manifest records chunk checksum algorithm ", static_cast<int>(m.chunk_checksum()),
        " (", ChunkChecksumText(m.chunk_checksum()),
        "); this version of ckptd verifies chunks with ", kChecksumName, " only (",
        static_cast<int>(records::CHUNK_CHECKSUM_XXH3_64), ")"));
  }
  if (!m.strategy_json().empty() || !m.strategy_binary().empty()) {
    CKPT_ASSIGN_OR_RETURN(Strategy s, DecodeStoredStrategy(m.strategy_binary(), m.strategy_json()));
    out->strategy = std::make_shared<const Strategy>(std::move(s));
  }
  for (int i = 0; i < m.tensors_size(); ++i) {
    const records::TensorRecord& t = m.tensors(i);
    out->tensor_by_name[t.name()] = i;
    TensorInfo info;
    info.name = t.name();
    CKPT_ASSIGN_OR_RETURN(info.dtype, ParseDType(t.dtype()));
    info.global_shape.assign(t.global_shape().begin(), t.global_shape().end());
    if (!t.sharded()) {
      std::set<int64_t> holders;
      for (const auto& b : t.blobs()) holders.insert(b.holders().begin(), b.holders().end());
      info.holders.assign(holders.begin(), holders.end());
    }
    out->catalog.push_back(std::move(info));
  }
  return std::shared_ptr<const LoadedCheckpoint>(std::move(out));
}

}  // namespace ckpt
