#include "client/ckptctl/rank_list.h"

#include <algorithm>
#include <charconv>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"

namespace ckpt {

absl::StatusOr<std::vector<int64_t>> ParseRankList(std::string_view list) {
  auto error = [list](std::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid rank list \"", Sv(list), "\": ", Sv(why),
                     " (expected comma-separated ranks and ranges, e.g. 0,2,5-7)"));
  };
  // One rank: decimal digits only, so "-1", "+1", "0x3" and "1.5" are refused.
  auto parse_rank = [&](std::string_view text) -> absl::StatusOr<int64_t> {
    if (text.empty()) return error("a range needs a rank on both sides of '-'");
    if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return error(absl::StrCat("\"", Sv(text), "\" is not a rank (ranks are 0 or more)"));
    }
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value > kMaxListedRank) {
      return error(absl::StrCat("rank ", Sv(text), " is too large (at most ", kMaxListedRank, ")"));
    }
    return value;
  };

  if (absl::StripAsciiWhitespace(absl::string_view(list.data(), list.size())).empty()) {
    return error("it is empty");
  }
  std::vector<int64_t> ranks;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    const absl::string_view stripped = absl::StripAsciiWhitespace(raw);
    const std::string_view item(stripped.data(), stripped.size());
    if (item.empty()) return error("it has an empty item");
    if (item.front() == '-') {
      return error(absl::StrCat("\"", Sv(item), "\": ranks cannot be negative"));
    }
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      CKPT_ASSIGN_OR_RETURN(const int64_t rank, parse_rank(item));
      ranks.push_back(rank);
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(const int64_t first, parse_rank(item.substr(0, dash)));
    CKPT_ASSIGN_OR_RETURN(const int64_t last, parse_rank(item.substr(dash + 1)));
    if (last < first) {
      return error(absl::StrCat("range ", Sv(item), " is reversed (write ", last, "-", first, ")"));
    }
    for (int64_t r = first; r <= last; ++r) ranks.push_back(r);
    if (static_cast<int64_t>(ranks.size()) > kMaxListedRank + 1) {
      return error("it lists more ranks than exist");  // only via overlapping ranges
    }
  }
  std::sort(ranks.begin(), ranks.end());
  const auto duplicate = std::adjacent_find(ranks.begin(), ranks.end());
  if (duplicate != ranks.end()) {
    return error(absl::StrCat("rank ", *duplicate, " is listed more than once"));
  }
  return ranks;
}

std::string FormatRankList(const std::vector<int64_t>& ranks) {
  std::vector<std::string> items;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    items.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(items, ",");
}

absl::StatusOr<std::vector<int64_t>> ParseRanksOption(const std::optional<std::string>& ranks) {
  if (!ranks.has_value()) return std::vector<int64_t>();
  absl::StatusOr<std::vector<int64_t>> parsed = ParseRankList(*ranks);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks: ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace ckpt
