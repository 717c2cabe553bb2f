// ckptd's TLS: server credentials from PEM files, re-read while the server runs.
//
// gRPC's FileWatcherCertificateProvider re-reads the certificate, key and client CA files every
// kTlsRefreshSeconds and gives new handshakes the new credentials; established connections and
// their streams are untouched. SIGHUP (CkptServer::Reload) checks the files with OpenSSL and
// logs the outcome, so an operator who replaced them learns at once whether they will be used.
// Replace the certificate and key together (e.g. rename both into place): the watcher reads
// the pair atomically but cannot know about a half-finished update.
#ifndef CKPT_SERVICE_RPC_AUTH_TLS_H_
#define CKPT_SERVICE_RPC_AUTH_TLS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt {

inline constexpr int kTlsRefreshSeconds = 1;

struct TlsOptions {
  std::string cert_file;       // --tls-cert: PEM certificate chain of the server
  std::string key_file;        // --tls-key: its PEM private key
  std::string client_ca_file;  // --tls-client-ca: PEM CA(s) client certificates must chain to
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

// Summary of valid files ("CN=ckptd, expires 2027-...") or INVALID_ARGUMENT naming the file and
// the problem: unreadable, not PEM, key not matching the certificate, no CA certificate.
absl::StatusOr<std::string> CheckTlsFiles(const TlsOptions& options);

// TLS (mutual when client_ca_file is set) server credentials over a file watcher. Call
// CheckTlsFiles first: the watcher itself only logs unreadable files.
std::shared_ptr<grpc::ServerCredentials> MakeTlsServerCredentials(const TlsOptions& options);

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_AUTH_TLS_H_
