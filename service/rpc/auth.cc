#include "service/rpc/auth.h"

#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/names.h"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

constexpr std::string_view kAnonymous = "anonymous";

const std::shared_ptr<spdlog::logger>& AuditLogger() {
  static const std::shared_ptr<spdlog::logger> logger = spdlog::default_logger()->clone("audit");
  return logger;
}

std::string_view LimitFlag(LimitKind kind) {
  return kind == LimitKind::kFetchStreams ? "--max-fetch-streams-per-principal"
                                          : "--max-uploads-per-principal";
}

std::string_view LimitWhat(LimitKind kind) {
  return kind == LimitKind::kFetchStreams ? "open fetch streams" : "open uploads";
}

// The method's short name, for messages: "Fetch" of "/ckpt.v1.CheckpointService/Fetch".
std::string_view ShortMethod(std::string_view full_method) {
  const size_t slash = full_method.rfind('/');
  return slash == std::string_view::npos ? full_method : full_method.substr(slash + 1);
}

}  // namespace

struct LimitLease::Counters {
  std::mutex mu;
  std::map<std::string, int> held;  // "<kind>/<principal>" -> slots held
};

LimitLease& LimitLease::operator=(LimitLease&& other) noexcept {
  if (this != &other) {
    this->~LimitLease();
    counters_ = std::move(other.counters_);
    key_ = std::move(other.key_);
    other.counters_.reset();
  }
  return *this;
}

LimitLease::~LimitLease() {
  if (!counters_) return;
  std::lock_guard<std::mutex> lock(counters_->mu);
  auto it = counters_->held.find(key_);
  if (it != counters_->held.end() && --it->second <= 0) counters_->held.erase(it);
  counters_.reset();
}

Authenticator::Authenticator(AuthOptions options)
    : options_(std::move(options)), counters_(std::make_shared<LimitLease::Counters>()) {}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(AuthOptions options) {
  std::unique_ptr<Authenticator> auth(new Authenticator(std::move(options)));
  if (!auth->options_.tokens_file.empty()) {
    absl::StatusOr<TokenTable> table = TokenTable::Load(auth->options_.tokens_file);
    if (!table.ok()) return table.status();
    auth->tokens_ = std::make_shared<const TokenTable>(std::move(*table));
  }
  return auth;
}

std::unique_ptr<Authenticator> Authenticator::Disabled() {
  return std::unique_ptr<Authenticator>(new Authenticator(AuthOptions{}));
}

absl::Status Authenticator::Reload() {
  if (options_.tokens_file.empty()) return absl::OkStatus();
  absl::StatusOr<TokenTable> table = TokenTable::Load(options_.tokens_file);
  if (!table.ok()) return table.status();
  auto fresh = std::make_shared<const TokenTable>(std::move(*table));
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ = std::move(fresh);
  return absl::OkStatus();
}

absl::StatusOr<Principal> Authenticator::Authenticate(const grpc::ServerContextBase& ctx) const {
  if (!enabled()) return Principal{std::string(kAnonymous), Role::kAdmin, "none"};
  std::shared_ptr<const TokenTable> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    tokens = tokens_;
  }
  const auto& metadata = ctx.client_metadata();
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    std::string_view value(it->second.data(), it->second.size());
    constexpr std::string_view kScheme = "bearer ";
    if (value.size() <= kScheme.size() ||
        !absl::EqualsIgnoreCase(Sv(value.substr(0, kScheme.size())), Sv(kScheme))) {
      return absl::UnauthenticatedError("the authorization metadata must be: Bearer TOKEN");
    }
    const absl::string_view stripped = absl::StripAsciiWhitespace(Sv(value.substr(kScheme.size())));
    const std::string_view token(stripped.data(), stripped.size());
    const TokenTable::Entry* entry = tokens ? tokens->FindToken(token) : nullptr;
    if (entry == nullptr) return absl::UnauthenticatedError("invalid bearer token");
    return Principal{entry->name, entry->role, "token"};
  }
  if (options_.client_certs) {
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    if (auth && auth->IsPeerAuthenticated()) {
      std::vector<grpc::string_ref> names = auth->FindPropertyValues("x509_common_name");
      if (!names.empty()) {
        const std::string cn(names.front().data(), names.front().size());
        if (!tokens) return Principal{cn, Role::kAdmin, "cert"};
        if (const TokenTable::Entry* entry = tokens->FindCert(cn)) {
          return Principal{entry->name, entry->role, "cert"};
        }
        return absl::UnauthenticatedError(absl::StrCat("client certificate CN=", cn,
                                                       " is not in the tokens file (a line: ", cn,
                                                       " ROLE cert)"));
      }
    }
  }
  return absl::UnauthenticatedError(
      "no credentials: send a bearer token (authorization metadata; ckptctl --token-file) or a "
      "client certificate");
}

absl::StatusOr<Principal> Authenticator::Authorize(const grpc::ServerContextBase& ctx,
                                                   std::string_view full_method) const {
  absl::StatusOr<Principal> principal = Authenticate(ctx);
  if (!principal.ok()) {
    Audit(nullptr, full_method, ctx.peer(), "-", principal.status());
    return principal.status();
  }
  const MethodPolicy* policy = FindMethodPolicy(full_method);
  absl::Status denied;
  if (policy == nullptr) {
    denied = absl::PermissionDeniedError(
        absl::StrCat("method ", Sv(full_method), " has no entry in ckptd's role table"));
  } else if (principal->role < policy->min_role) {
    denied = absl::PermissionDeniedError(absl::StrCat(
        "principal ", principal->name, " (role ", Sv(RoleName(principal->role)), ") may not call ",
        Sv(ShortMethod(full_method)), ": it needs role ", Sv(RoleName(policy->min_role))));
  }
  if (!denied.ok()) {
    Audit(&*principal, full_method, ctx.peer(), "-", denied);
    return denied;
  }
  return principal;
}

absl::StatusOr<LimitLease> Authenticator::Acquire(const Principal& principal,
                                                  LimitKind kind) const {
  LimitLease lease;
  if (principal.via == "none") return lease;
  const int limit =
      kind == LimitKind::kFetchStreams ? options_.max_fetch_streams : options_.max_uploads;
  if (limit <= 0) return lease;
  std::string key = absl::StrCat(static_cast<int>(kind), "/", principal.name);
  std::lock_guard<std::mutex> lock(counters_->mu);
  int& held = counters_->held[key];
  if (held >= limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat("principal ", principal.name, " already has ", held, " ", Sv(LimitWhat(kind)),
                     ", the limit per principal (", Sv(LimitFlag(kind)), "=", limit, ")"));
  }
  ++held;
  lease.counters_ = counters_;
  lease.key_ = std::move(key);
  return lease;
}

void Audit(const Principal* principal, std::string_view full_method, std::string_view peer,
           std::string_view target, const absl::Status& outcome) {
  const auto level = outcome.ok() ? spdlog::level::info : spdlog::level::warn;
  AuditLogger()->log(
      level, "event=audit principal={} role={} method={} peer={} target={} outcome={}{}",
      principal ? principal->name : "-", principal ? RoleName(principal->role) : "-",
      ShortMethod(full_method), EscapeForLog(peer), target.empty() ? std::string("-") : EscapeForLog(target),
      absl::StatusCodeToString(outcome.code()),
      outcome.ok() ? ""
                   : absl::StrCat(" error=\"", EscapeForLog(std::string(outcome.message())), "\""));
}

}  // namespace ckpt
