// Durations as operators write them on command lines: "90s", "5m", "2h30m", "500ms", "7d".
// Pure (no I/O).
#ifndef CKPT_CORE_DURATION_TEXT_H_
#define CKPT_CORE_DURATION_TEXT_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt {

// Parses a non-negative, finite duration: Go-style units as absl::ParseDuration accepts them
// ("ms", "s", "m", "h", combined as in "1h30m", decimals as in "1.5h"), plus whole or decimal
// days ("7d", "1.5d"), and "0". INVALID_ARGUMENT naming `text` otherwise (no unit, a negative
// or infinite value, trailing text).
absl::StatusOr<absl::Duration> ParseDurationText(std::string_view text);

// "7d", "12h", "1h30m", "90s", "500ms": the shortest exact form of `d` in the units above.
// Infinite durations print as "inf". For flag defaults and messages.
std::string FormatDurationText(absl::Duration d);

}  // namespace ckpt

#endif  // CKPT_CORE_DURATION_TEXT_H_
