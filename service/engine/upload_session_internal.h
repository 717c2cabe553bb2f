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
#include "core/dtype.h"

namespace ckpt::upload_internal {

inline constexpr int kMaxDims = 64;

// Element bits and shape under which a tensor's bytes are chunked: str values are raw bytes.
inline int StorageBits(DType dtype) { return dtype == DType::kStr ? 8 : ElementBits(dtype); }
inline std::string StagesString(const std::vector<int32_t>& stages) {
  return absl::StrCat("[", absl::StrJoin(stages, ", "), "]");
}

// Adds `rank` to `holders` (ascending, distinct), keeping them so.
template <typename Holders>
void AddHolder(Holders& holders, int64_t rank) {
  auto at = std::lower_bound(holders.begin(), holders.end(), rank);
  if (at != holders.end() && *at == rank) return;
  holders.insert(at, static_cast<typename Holders::value_type>(rank));
}

template <typename Holders>
void RemoveHolder(Holders& holders, int64_t rank) {
  holders.erase(std::remove(holders.begin(), holders.end(), rank), holders.end());
}

}  // namespace ckpt::upload_internal

#endif  // CKPT_SERVICE_ENGINE_UPLOAD_SESSION_INTERNAL_H_
