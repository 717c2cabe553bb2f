// Authentication, authorization and per-principal limits of ckptd's RPCs, and the audit log.
//
// Every CheckpointService handler calls Authenticator::Authorize before doing any work: it finds
// the caller's principal (a bearer token in the `authorization: Bearer <token>` metadata, else a
// verified client certificate's common name), checks the role table (auth_policy.h) and returns
// UNAUTHENTICATED or PERMISSION_DENIED, naming the principal and the missing role but nothing of
// the request. With neither --auth-tokens nor --tls-client-ca configured, authentication is off
// and every caller is the principal "anonymous" with role admin (ckptd then listens only on
// loopback unless --insecure; see server.h).
//
// Audit: the logger named "audit" gets one line per mutating call (its outcome) and per denied
// call: `event=audit principal=.. role=.. method=.. peer=.. target=.. outcome=..`.
#ifndef CKPT_SERVICE_RPC_AUTH_H_
#define CKPT_SERVICE_RPC_AUTH_H_

#include <grpcpp/server_context.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/rpc/auth_policy.h"
#include "service/rpc/auth_tokens.h"

namespace ckpt {

struct AuthOptions {
  // --auth-tokens: the principals file (auth_tokens.h); empty: no tokens.
  std::string tokens_file;
  // --tls-client-ca given: clients must present a certificate of that CA (gRPC verifies it). A
  // certificate's subject common name names the principal: its role is the one of the tokens
  // file's `NAME ROLE cert` line, or admin when there is no tokens file (the CA is then the
  // whole access control).
  bool client_certs = false;
  // Per authenticated principal, at the same time; 0 = unlimited. Not applied to "anonymous".
  int max_fetch_streams = 256;  // --max-fetch-streams-per-principal
  int max_uploads = 64;         // --max-uploads-per-principal
  int max_queued_jobs = 16;     // --max-queued-jobs-per-principal (QUEUED or RUNNING)
};

struct Principal {
  std::string name;
  Role role = Role::kReader;
  // How it authenticated: "token", "cert", or "none" (authentication off).
  std::string_view via = "none";
};

// What a per-principal limit counts.
enum class LimitKind { kFetchStreams, kUploads };

// One slot of a per-principal limit, given back when destroyed. Move-only; may outlive the
// Authenticator that issued it.
class LimitLease {
 public:
  LimitLease() = default;
  LimitLease(LimitLease&& other) noexcept { *this = std::move(other); }
  LimitLease& operator=(LimitLease&& other) noexcept;
  ~LimitLease();

 private:
  friend class Authenticator;
  struct Counters;
  std::shared_ptr<Counters> counters_;
  std::string key_;
};

// Thread-safe.
class Authenticator {
 public:
  // Loads the tokens file (when given); INVALID_ARGUMENT etc. naming the file and line.
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(AuthOptions options);
  // No authentication at all: every caller is the anonymous admin.
  static std::unique_ptr<Authenticator> Disabled();

  bool enabled() const { return options_.client_certs || !options_.tokens_file.empty(); }
  const AuthOptions& options() const { return options_; }

  // The caller's principal when the role table lets it call `full_method`; otherwise
  // UNAUTHENTICATED or PERMISSION_DENIED (also written to the audit log).
  absl::StatusOr<Principal> Authorize(const grpc::ServerContextBase& ctx,
                                      std::string_view full_method) const;
  // Re-reads the tokens file. On error the current table stays in force and the error is
  // returned (the caller logs it).
  absl::Status Reload();

  // Takes a slot of `kind` for `principal`; RESOURCE_EXHAUSTED naming the limit and its flag
  // when the principal holds all of them. Always succeeds for the anonymous principal.
  absl::StatusOr<LimitLease> Acquire(const Principal& principal, LimitKind kind) const;

 private:
  explicit Authenticator(AuthOptions options);
  absl::StatusOr<Principal> Authenticate(const grpc::ServerContextBase& ctx) const;

  const AuthOptions options_;
  mutable std::mutex mu_;
  std::shared_ptr<const TokenTable> tokens_;  // guarded by mu_; null without a tokens file
  std::shared_ptr<LimitLease::Counters> counters_;
};

// Writes one audit line. `principal` may be null (authentication failed). `target` names what
// the call acts on (checkpoint, strategy or job id; "-" when unknown). Client-chosen text (the
// target, the peer, the error message) is escaped (EscapeForLog), so none can forge a line.
void Audit(const Principal* principal, std::string_view full_method, std::string_view peer,
           std::string_view target, const absl::Status& outcome);

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_AUTH_H_
