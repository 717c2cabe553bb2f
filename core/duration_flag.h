// A CLI11 check for command-line flags that take a duration ("30s", "5m", "7d"), shared by
// ckptd and ckptctl so both accept and reject the same text with the same message. Header-only:
// only the binaries that parse command lines include it.
#ifndef CKPT_CORE_DURATION_FLAG_H_
#define CKPT_CORE_DURATION_FLAG_H_

#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/duration_text.h"

namespace ckpt {

// Accepts what ParseDurationText accepts; otherwise CLI11 reports its message for the flag.
inline CLI::Validator DurationValidator() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        absl::StatusOr<absl::Duration> d = ParseDurationText(text);
        return d.ok() ? std::string() : std::string(d.status().message());
      },
      "DURATION");
}

}  // namespace ckpt

#endif  // CKPT_CORE_DURATION_FLAG_H_
