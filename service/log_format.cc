#include "service/log_format.h"

#include <cctype>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

bool IsKeyChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

// Whether the '"' at `quote` closes a quoted value: the text ends there or the next pair starts.
bool EndsQuotedValue(std::string_view text, size_t quote) {
  size_t k = quote + 1;
  if (k == text.size()) return true;
  if (text[k] != ' ') return false;
  ++k;
  const size_t key_start = k;
  while (k < text.size() && IsKeyChar(text[k])) ++k;
  return k > key_start && k < text.size() && text[k] == '=';
}

// A value as JSON: integers and decimals as numbers, true/false as booleans, else a string.
nlohmann::ordered_json Typed(std::string_view value, bool quoted) {
  if (quoted) return std::string(value);
  int64_t i = 0;
  if (absl::SimpleAtoi(absl::string_view(value.data(), value.size()), &i)) return i;
  double d = 0;
  if (value.find_first_not_of("0123456789.-") == std::string_view::npos &&
      absl::SimpleAtod(absl::string_view(value.data(), value.size()), &d)) {
    return d;
  }
  if (value == "true") return true;
  if (value == "false") return false;
  return std::string(value);
}

// Adds the `key=value` / `key="quoted value"` pairs of `text` to `out`. Words that are not
// pairs are skipped (they stay in "msg"). A quoted value ends at the first '"' followed by the
// end of the text or by " key=", so that quotes inside an error message survive.
void AddFields(std::string_view text, nlohmann::ordered_json& out) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && text[i] == ' ') ++i;
    size_t k = i;
    while (k < text.size() && IsKeyChar(text[k])) ++k;
    if (k == i || k >= text.size() || text[k] != '=') {
      while (i < text.size() && text[i] != ' ') ++i;  // not a pair: skip the word
      continue;
    }
    std::string key(text.substr(i, k - i));
    size_t v = k + 1;
    std::string_view value;
    bool quoted = false;
    if (v < text.size() && text[v] == '"') {
      size_t end = v + 1;
      while (end < text.size() && !(text[end] == '"' && EndsQuotedValue(text, end))) ++end;
      value = text.substr(v + 1, end - v - 1);
      quoted = true;
      i = end + 1;
    } else {
      size_t end = v;
      while (end < text.size() && text[end] != ' ') ++end;
      value = text.substr(v, end - v);
      i = end;
    }
    if (key == "time" || key == "level" || key == "logger" || key == "msg") key = "field_" + key;
    out[key] = Typed(value, quoted);
  }
}

}  // namespace

void JsonLogFormatter::format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) {
  const std::string_view text(msg.payload.data(), msg.payload.size());
  nlohmann::ordered_json line = nlohmann::ordered_json::object();
  line["time"] =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3S%Ez", absl::FromChrono(msg.time), absl::LocalTimeZone());
  const auto level = spdlog::level::to_string_view(msg.level);
  line["level"] = std::string(level.data(), level.size());
  line["logger"] = std::string(msg.logger_name.data(), msg.logger_name.size());
  line["msg"] = std::string(text);
  AddFields(text, line);
  const std::string out =
      line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  dest.append(out.data(), out.data() + out.size());
}

std::unique_ptr<spdlog::formatter> JsonLogFormatter::clone() const {
  return std::make_unique<JsonLogFormatter>();
}

void SetUpLogging(const std::string& name, const std::string& format) {
  spdlog::set_default_logger(spdlog::default_logger()->clone(name));
  if (format == "json") {
    spdlog::set_formatter(std::make_unique<JsonLogFormatter>());
  } else {
    spdlog::set_pattern(kTextLogPattern);
  }
}

}  // namespace ckpt
