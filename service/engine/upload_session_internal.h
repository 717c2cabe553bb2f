// Helpers shared by the files that implement upload_session.h (upload_session.cc,
// upload_claim.cc, upload_commit.cc, upload_batch.cc). Internal to service/engine.
#ifndef CKPT_SERVICE_ENGINE_UPLOAD_SESSION_INTERNAL_H_
#define CKPT_SERVICE_ENGINE_UPLOAD_SESSION_INTERNAL_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt_records.pb.h"
#include "core/box.h"
#include "core/dtype.h"

namespace ckpt::upload_internal {

inline constexpr int kMaxDims = 64;

// Element bits and shape under which a tensor's bytes are chunked: str values are raw bytes.
inline int StorageBits(DType dtype) { return dtype == DType::kStr ? 8 : ElementBits(dtype); }
inline std::string StagesString(const std::vector<int32_t>& stages) {
  return absl::StrCat("[", absl::StrJoin(stages, ", "), "]");
}

// Keeps the holders sorted and distinct.
inline void AddHolder(records::BlobRecord* record, int64_t rank) {
  auto* holders = record->mutable_holders();
  auto at = std::lower_bound(holders->begin(), holders->end(), rank);
  if (at != holders->end() && *at == rank) return;
  const auto index = at - holders->begin();
  holders->Add(rank);
  std::rotate(holders->begin() + index, holders->end() - 1, holders->end());
}

inline void RemoveHolder(records::BlobRecord* record, int64_t rank) {
  auto* holders = record->mutable_holders();
  holders->erase(std::remove(holders->begin(), holders->end(), rank), holders->end());
}

// True when `box` has shape `shape` (Box::shape() without building it).
inline bool BoxHasShape(const Box& box, const Shape& shape) {
  if (box.rank() != shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (box.extent(i) != shape[i]) return false;
  }
  return true;
}

inline void SetBox(records::BlobRecord* record, const Box& box) {
  record->mutable_box_lo()->Assign(box.lo.begin(), box.lo.end());
  record->mutable_box_hi()->Assign(box.hi.begin(), box.hi.end());
}

}  // namespace ckpt::upload_internal

#endif  // CKPT_SERVICE_ENGINE_UPLOAD_SESSION_INTERNAL_H_
