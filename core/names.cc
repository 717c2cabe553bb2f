#include "core/names.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"

namespace ckpt {
namespace {

// Length of the valid UTF-8 sequence at the start of `s` (1-4) and its code point; 0 when the
// bytes there are not valid UTF-8 (overlong forms, surrogates and values past U+10FFFF included).
size_t DecodeUtf8(std::string_view s, uint32_t* cp) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t n = 0;
  uint32_t min = 0;
  if ((b0 & 0xe0) == 0xc0) {
    n = 2;
    *cp = b0 & 0x1f;
    min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    n = 3;
    *cp = b0 & 0x0f;
    min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    n = 4;
    *cp = b0 & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xc0) != 0x80) return 0;
    *cp = (*cp << 6) | (b & 0x3f);
  }
  if (*cp < min || *cp > 0x10ffff || (*cp >= 0xd800 && *cp <= 0xdfff)) return 0;
  return n;
}

bool IsControl(uint32_t cp) {
  return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029;
}

}  // namespace

absl::Status ValidatePrintableName(std::string_view what, std::string_view name, size_t max_bytes) {
  if (name.empty() || name.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(what), " must be 1 to ", max_bytes, " bytes long, got ", name.size(),
        name.empty() ? "" : absl::StrCat(" (\"", EscapeForLog(name.substr(0, 64)), "...\")")));
  }
  for (size_t i = 0; i < name.size();) {
    uint32_t cp = 0;
    const size_t n = DecodeUtf8(name.substr(i), &cp);
    if (n == 0 || IsControl(cp)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Sv(what), " \"", EscapeForLog(name), "\" holds ",
                       n == 0 ? "bytes that are not valid UTF-8"
                              : absl::StrFormat("the control character U+%04X", cp),
                       " at byte ", i, "; names must be printable UTF-8 text"));
    }
    i += n;
  }
  return absl::OkStatus();
}

std::string EscapeForLog(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (size_t i = 0; i < value.size();) {
    uint32_t cp = 0;
    const size_t n = DecodeUtf8(value.substr(i), &cp);
    if (n == 0 || IsControl(cp)) {
      // Every byte of the character (or the one invalid byte) escaped.
      const size_t bytes = n == 0 ? 1 : n;
      for (size_t k = 0; k < bytes; ++k) {
        const auto b = static_cast<unsigned char>(value[i + k]);
        switch (b) {
          case '\n':
            out += "\\n";
            break;
          case '\r':
            out += "\\r";
            break;
          case '\t':
            out += "\\t";
            break;
          default:
            absl::StrAppendFormat(&out, "\\x%02x", b);
        }
      }
      i += bytes;
      continue;
    }
    if (cp == '\\' || cp == '"') out.push_back('\\');
    out.append(value.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace ckpt
