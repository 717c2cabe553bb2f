// Rank lists on ckptctl's command line (--ranks 0,2,5-7) and in its output.
#ifndef CKPT_CLIENT_CKPTCTL_RANK_LIST_H_
#define CKPT_CLIENT_CKPTCTL_RANK_LIST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

// Largest rank a LIST may name (keeps "0-999999999999" from allocating the world).
inline constexpr int64_t kMaxListedRank = (int64_t{1} << 20) - 1;

// Parses a rank LIST: comma-separated ranks and inclusive ranges, "0,2,5-7" -> {0, 2, 5, 6, 7}.
// Spaces around items are ignored. INVALID_ARGUMENT naming the offending item for an empty list
// or item, anything but decimal digits (negative ranks included), a reversed range ("7-5"), a
// rank above kMaxListedRank, or a rank listed twice (also through overlapping ranges). The result
// is ascending.
absl::StatusOr<std::vector<int64_t>> ParseRankList(std::string_view list);

// The inverse for ascending distinct ranks: {0, 2, 5, 6, 7} -> "0,2,5-7"; "" for none.
std::string FormatRankList(const std::vector<int64_t>& ranks);

// The value of a --ranks option: ParseRankList with "--ranks: " before its errors, or no ranks
// when the option was not given.
absl::StatusOr<std::vector<int64_t>> ParseRanksOption(const std::optional<std::string>& ranks);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_RANK_LIST_H_
