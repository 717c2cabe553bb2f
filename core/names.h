// Names that clients choose (tensor, strategy, checkpoint and job names) and values that end up in
// log lines. Pure.
#ifndef CKPT_CORE_NAMES_H_
#define CKPT_CORE_NAMES_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ckpt {

// Longest name accepted (bytes).
inline constexpr size_t kMaxNameBytes = 4096;

// OK when `name` is 1 to `max_bytes` bytes of valid UTF-8 holding no control character: no C0
// control (U+0000-U+001F), DEL (U+007F), C1 control (U+0080-U+009F) and no line or paragraph
// separator (U+2028, U+2029), so that a name can neither forge a log line nor hide in one.
// INVALID_ARGUMENT otherwise, the message naming `what` ("tensor name") and showing the name
// escaped (EscapeForLog).
absl::Status ValidatePrintableName(std::string_view what, std::string_view name,
                                   size_t max_bytes = kMaxNameBytes);

// `value` made safe to put in one log line or quoted field: backslash, double quote and every
// byte of a control character or of invalid UTF-8 are written as escapes (\\, \", \n, \t, \r,
// \xNN); other UTF-8 is kept.
std::string EscapeForLog(std::string_view value);

}  // namespace ckpt

#endif  // CKPT_CORE_NAMES_H_
