#include "core/rank_files.h"

#include <algorithm>
#include <charconv>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"

namespace ckpt {
namespace {

constexpr std::string_view kRankDirPrefix = "rank_";

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

std::string RankDirName(int64_t rank) { return absl::StrCat(Sv(kRankDirPrefix), rank); }

std::string RankFileName(std::string_view prefix, int64_t rank) {
  return absl::StrCat(Sv(prefix), rank, ".ckpt");
}

std::string RankFilePath(std::string_view dir, std::string_view prefix, int64_t rank) {
  return absl::StrCat(Sv(dir), "/", RankDirName(rank), "/", RankFileName(prefix, rank));
}

bool LooksLikeRankDirName(std::string_view name) {
  if (!name.starts_with(kRankDirPrefix)) return false;
  const std::string_view digits = name.substr(kRankDirPrefix.size());
  return !digits.empty() && std::all_of(digits.begin(), digits.end(), IsDigit);
}

std::optional<int64_t> ParseRankDirName(std::string_view name) {
  if (!LooksLikeRankDirName(name)) return std::nullopt;
  const std::string_view digits = name.substr(kRankDirPrefix.size());
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return value;
}

absl::Status ValidateRankFilePrefix(std::string_view prefix) {
  const bool valid_chars = std::all_of(prefix.begin(), prefix.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || IsDigit(c) || c == '.' || c == '_' ||
           c == '-';
  });
  if (prefix.empty() || prefix.size() > 200 || !valid_chars) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid file name prefix \"", Sv(prefix),
        "\": use 1-200 characters of A-Z a-z 0-9 . _ - (default ", kDefaultRankFilePrefix, ")"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
