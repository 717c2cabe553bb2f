#include "service/rpc/auth_tokens.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/absl_compat.h"

namespace ckpt {
namespace {

bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '@' && c != ':' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ParseHex(std::string_view hex, Sha256Digest* out) {
  if (hex.size() != 64) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace

Sha256Digest Sha256(std::string_view data) {
  Sha256Digest digest{};
  unsigned int size = 0;
  // EVP_Digest with EVP_sha256 cannot fail for in-memory input short of allocation failure; the
  // digest stays zero then, which matches no entry (a token hashing to zero is not computable).
  EVP_Digest(data.data(), data.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

std::string DigestHex(const Sha256Digest& digest) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (uint8_t b : digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

absl::StatusOr<TokenTable> TokenTable::Parse(std::string_view text, std::string_view source) {
  TokenTable table;
  std::map<std::string, Role, std::less<>> roles;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(Sv(text), '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) line = line.substr(0, hash);
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
    if (fields.empty()) continue;
    auto bad = [&](const std::string& problem) {
      return absl::InvalidArgumentError(absl::StrCat(Sv(source), ":", line_number, ": ", problem));
    };
    if (fields.size() != 3) {
      return bad(absl::StrCat("expected NAME ROLE SHA256HEX (or NAME ROLE cert), found ",
                              fields.size(), " field(s)"));
    }
    Entry e;
    if (!ValidName(Std(fields[0]))) {
      return bad(absl::StrCat("principal name \"", fields[0],
                              "\" must be 1-128 characters of A-Z a-z 0-9 . _ @ : -"));
    }
    e.name = std::string(fields[0]);
    std::optional<Role> role = ParseRole(Std(fields[1]));
    if (!role) {
      return bad(absl::StrCat("unknown role \"", fields[1], "\" (reader, writer or admin)"));
    }
    e.role = *role;
    if (fields[2] == "cert") {
      e.cert = true;
    } else if (!ParseHex(Std(fields[2]), &e.hash)) {
      return bad(
          "the third field must be the token's SHA-256 as 64 lowercase hex digits, or "
          "\"cert\"");
    }
    if (auto it = roles.find(e.name); it != roles.end() && it->second != e.role) {
      return bad(absl::StrCat("principal ", e.name, " was given role ", Sv(RoleName(it->second)),
                              " on an earlier line"));
    }
    for (const Entry& other : table.entries_) {
      if (e.cert && other.cert && other.name == e.name) {
        return bad(absl::StrCat("a second cert line for ", e.name));
      }
      if (!e.cert && !other.cert && other.hash == e.hash) {
        return bad(absl::StrCat("this token hash is already listed for ", other.name));
      }
    }
    roles.emplace(e.name, e.role);
    table.entries_.push_back(std::move(e));
  }
  if (table.entries_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(source), ": no principal (lines NAME ROLE SHA256HEX or NAME ROLE cert)"));
  }
  return table;
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string message =
        absl::StrCat("cannot read the auth tokens file ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::PermissionDeniedError(message);
  }
  std::stringstream text;
  text << in.rdbuf();
  return Parse(text.str(), path);
}

const TokenTable::Entry* TokenTable::FindToken(std::string_view token) const {
  const Sha256Digest digest = Sha256(token);
  const Entry* found = nullptr;
  // Every entry is compared (no early exit), each in constant time.
  for (const Entry& e : entries_) {
    const bool equal = CRYPTO_memcmp(e.hash.data(), digest.data(), digest.size()) == 0;
    if (equal && !e.cert) found = &e;
  }
  return found;
}

const TokenTable::Entry* TokenTable::FindCert(std::string_view common_name) const {
  for (const Entry& e : entries_) {
    if (e.cert && e.name == common_name) return &e;
  }
  return nullptr;
}

}  // namespace ckpt
