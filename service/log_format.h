// ckptd's log line formats (--log-format): "text", the human `key=value` lines, and "json", one
// JSON object per line for log collectors. Both carry the time with its zone.
#ifndef CKPT_SERVICE_LOG_FORMAT_H_
#define CKPT_SERVICE_LOG_FORMAT_H_

#include <memory>
#include <string>

#include "spdlog/formatter.h"

namespace ckpt {

// spdlog's pattern of the text format: "2026-01-02T03:04:05.678+00:00 info ckptd event=start ...".
inline constexpr char kTextLogPattern[] = "%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ %n %v";

// Formats each record as one JSON object and a newline:
//   {"time":"2026-01-02T03:04:05.678+00:00","level":"info","logger":"ckptd",
//    "msg":"event=start listen=... port=50051", "event":"start","port":50051, ...}
// The message's `key=value` pairs (values optionally "quoted"; a quoted value ends at a '"'
// followed by the end or by ` key=`) also become fields of their own,
// integers and decimals as numbers, true/false as booleans; a key that would clash with time,
// level, logger or msg is prefixed with "field_". Invalid UTF-8 is replaced, never fatal.
class JsonLogFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override;
  std::unique_ptr<spdlog::formatter> clone() const override;
};

// Names the default logger `name` and formats every logger's lines as `format` ("text" or
// "json"; anything else is "text"). Call before other loggers are cloned from the default.
void SetUpLogging(const std::string& name, const std::string& format);

}  // namespace ckpt

#endif  // CKPT_SERVICE_LOG_FORMAT_H_
