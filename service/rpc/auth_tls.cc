#include "service/rpc/auth_tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};

std::string OpenSslError() {
  const unsigned long err = ERR_get_error();
  ERR_clear_error();
  if (err == 0) return "no PEM data found";
  char buffer[256];
  ERR_error_string_n(err, buffer, sizeof(buffer));
  return buffer;
}

absl::StatusOr<std::unique_ptr<BIO, BioFree>> OpenFile(const std::string& path, const char* what) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_file(path.c_str(), "r"));
  if (!bio) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  }
  return bio;
}

absl::StatusOr<std::unique_ptr<X509, X509Free>> ReadCert(const std::string& path,
                                                         const char* what) {
  auto bio = OpenFile(path, what);
  if (!bio.ok()) return bio.status();
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio->get(), nullptr, nullptr, nullptr));
  if (!cert) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", what, " ", path, " holds no PEM certificate: ", OpenSslError()));
  }
  return cert;
}

std::string SubjectCn(X509* cert) {
  char cn[256] = "";
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
  return cn;
}

std::string NotAfter(X509* cert) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  ASN1_TIME_print(bio.get(), X509_get0_notAfter(cert));
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, n > 0 ? n : 0);
}

}  // namespace

absl::StatusOr<std::string> CheckTlsFiles(const TlsOptions& options) {
  if (options.cert_file.empty() || options.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  auto cert = ReadCert(options.cert_file, "TLS certificate file");
  if (!cert.ok()) return cert.status();
  auto key_bio = OpenFile(options.key_file, "TLS key file");
  if (!key_bio.ok()) return key_bio.status();
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(key_bio->get(), nullptr, nullptr, nullptr));
  if (!key) {
    return absl::InvalidArgumentError(absl::StrCat("the TLS key file ", options.key_file,
                                                   " holds no PEM private key: ", OpenSslError()));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat(
        "the TLS key ", options.key_file, " does not match the certificate ", options.cert_file));
  }
  std::string summary = absl::StrCat("certificate CN=", SubjectCn(cert->get()), " valid until ",
                                     NotAfter(cert->get()));
  if (!options.client_ca_file.empty()) {
    auto ca = ReadCert(options.client_ca_file, "TLS client CA file");
    if (!ca.ok()) return ca.status();
    absl::StrAppend(&summary, ", client CA CN=", SubjectCn(ca->get()));
  }
  return summary;
}

std::shared_ptr<grpc::ServerCredentials> MakeTlsServerCredentials(const TlsOptions& options) {
  using grpc::experimental::FileWatcherCertificateProvider;
  auto provider = std::make_shared<FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.client_ca_file, kTlsRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (options.client_ca_file.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

}  // namespace ckpt
