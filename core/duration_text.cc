#include "core/duration_text.h"

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"

namespace ckpt {

absl::StatusOr<absl::Duration> ParseDurationText(std::string_view text) {
  auto invalid = [&]() {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid duration \"", Sv(text),
                     "\": expected a non-negative number with a unit, e.g. 30s, 5m, 2h, 7d"));
  };
  if (text.empty()) return invalid();
  absl::Duration d;
  if (text.back() == 'd') {
    double days = 0;
    if (!absl::SimpleAtod(Sv(text.substr(0, text.size() - 1)), &days) || !(days >= 0) ||
        days > 1e6) {
      return invalid();
    }
    d = absl::Hours(24) * days;
  } else if (!absl::ParseDuration(std::string(text), &d)) {
    return invalid();
  }
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) return invalid();
  return d;
}

std::string FormatDurationText(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "inf";
  absl::Duration rest;
  const int64_t days = absl::IDivDuration(d, absl::Hours(24), &rest);
  if (days > 0 && rest == absl::ZeroDuration()) return absl::StrCat(days, "d");
  return absl::FormatDuration(d);
}

}  // namespace ckpt
