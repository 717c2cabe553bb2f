// The principals file of --auth-tokens: who may authenticate, and with which role.
//
// One principal per line, fields separated by spaces or tabs, `#` starts a comment:
//   NAME ROLE SHA256HEX   a bearer token: SHA256HEX is the lowercase hex SHA-256 of the token
//                         (`printf %s "$TOKEN" | sha256sum`), so the file holds no secret
//   NAME ROLE cert        a client certificate (mutual TLS) whose subject common name is NAME
// NAME is 1-128 of [A-Za-z0-9._@:-]; ROLE is reader, writer or admin. A name may have several
// token lines (rotation) but only one role. Hashing is OpenSSL's (EVP SHA-256); presented tokens
// are compared with CRYPTO_memcmp against every entry, so the time taken does not depend on how
// much of a hash matched nor on which entry did.
#ifndef CKPT_SERVICE_RPC_AUTH_TOKENS_H_
#define CKPT_SERVICE_RPC_AUTH_TOKENS_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "service/rpc/auth_policy.h"

namespace ckpt {

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 of `data` (OpenSSL EVP).
Sha256Digest Sha256(std::string_view data);
// Lowercase hex of a digest.
std::string DigestHex(const Sha256Digest& digest);

// Immutable once parsed, so a table may be read from any thread; reloads build a new one.
class TokenTable {
 public:
  struct Entry {
    std::string name;
    Role role = Role::kReader;
    bool cert = false;    // a `cert` line: matches a client certificate's common name
    Sha256Digest hash{};  // of the token; unused for cert lines
  };

  // Parses the file's text; `source` names it in errors ("FILE:LINE: problem").
  static absl::StatusOr<TokenTable> Parse(std::string_view text, std::string_view source);
  // Reads and parses `path`. NOT_FOUND / PERMISSION_DENIED when unreadable, INVALID_ARGUMENT for
  // a malformed line (naming the file and line), or a file with no principal.
  static absl::StatusOr<TokenTable> Load(const std::string& path);

  // The entry whose token is `token`, or null.
  const Entry* FindToken(std::string_view token) const;
  // The `cert` entry named `common_name`, or null.
  const Entry* FindCert(std::string_view common_name) const;
  size_t size() const { return entries_.size(); }

 private:
  std::vector<Entry> entries_;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_AUTH_TOKENS_H_
