// Fetch over TLS with a bearer token, against plaintext fetch in the same run: ckptd restarted
// with --tls-cert/--tls-key/--auth-tokens (certificates and tokens made by
// deploy/make-test-pki.sh), the merged case fetched (a warm-up, then kRepeats passes), then ckptd
// restarted in plaintext and the same passes again. Also the machine's AES-GCM speed, which
// bounds what TLS can keep of the plaintext rate (docs/performance.md).
#include <openssl/evp.h>
#include <time.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tests/bench/harness.h"
#include "tests/testing/subprocess.h"

namespace ckpt::bench {
namespace {

// CPU seconds this thread has used: the cipher's speed on one core, however busy the machine.
double ThreadCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

// GiB per CPU second of one core encrypting with `cipher` (AES-GCM: what TLS 1.3 streams use),
// in 16 KiB records as TLS writes them, for about half a second of CPU time.
std::optional<double> CipherGibps(const EVP_CIPHER* cipher) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) return std::nullopt;
  const std::vector<unsigned char> key(32, 7), iv(12, 9);
  std::vector<unsigned char> in(16 << 10, 1), out(in.size() + 32);
  unsigned char tag[16];
  int64_t bytes = 0;
  const double start = ThreadCpuSeconds();
  // The key is set once, as for a TLS connection; each record only gets its nonce.
  bool ok = EVP_EncryptInit_ex(ctx, cipher, nullptr, key.data(), iv.data()) == 1;
  while (ok && ThreadCpuSeconds() - start < 0.5) {
    for (int i = 0; i < 256 && ok; ++i) {
      int n = 0;
      ok = EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, iv.data()) == 1 &&
           EVP_EncryptUpdate(ctx, out.data(), &n, in.data(), static_cast<int>(in.size())) == 1 &&
           EVP_EncryptFinal_ex(ctx, out.data() + n, &n) == 1 &&
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, sizeof(tag), tag) == 1;
      bytes += static_cast<int64_t>(in.size());
    }
  }
  const double seconds = ThreadCpuSeconds() - start;
  EVP_CIPHER_CTX_free(ctx);
  if (!ok || seconds <= 0) return std::nullopt;
  return bytes / kGiB / seconds;
}

}  // namespace

std::optional<double> Harness::MergedFetchPasses(const std::string& label,
                                                 std::vector<double>* passes,
                                                 std::optional<CpuPerGib>* cpu) {
  const FetchCase merged{"merged", "", "", 1.1, "row split"};
  int64_t verified = 0;
  std::vector<double> seconds;
  int64_t bytes = 0;
  CpuTally tally;
  for (int pass = 0; pass <= kRepeats; ++pass) {  // pass 0: warm-up, not measured
    const CpuMeter pass_cpu(server_->pid());
    const auto start = Clock::now();
    const std::optional<int64_t> b = FetchAllRanks(merged, nullptr, 1, &verified);
    if (!b) return std::nullopt;
    if (pass == 0) continue;
    pass_cpu.AddTo(&tally, *b);
    bytes = *b;
    seconds.push_back(Seconds(start));
    passes->push_back(*b / kGiB / seconds.back());
    Progress(absl::StrFormat("fetch merged %s: %.3f GiB = %.2f GiB/s", label, *b / kGiB,
                             passes->back()));
  }
  *cpu = tally.PerGib();
  return bytes / kGiB / Median(seconds);
}

void Harness::MeasureTls() {
  aes128_gcm_gibps_ = CipherGibps(EVP_aes_128_gcm());
  aes256_gcm_gibps_ = CipherGibps(EVP_aes_256_gcm());
  Progress(absl::StrFormat("AES-GCM on one core: 128-bit %s, 256-bit %s GiB per CPU second",
                           aes128_gcm_gibps_ ? absl::StrFormat("%.2f", *aes128_gcm_gibps_) : "?",
                           aes256_gcm_gibps_ ? absl::StrFormat("%.2f", *aes256_gcm_gibps_) : "?"));
  const std::string pki = work_ + "/pki";
  auto made = testing::RunSubprocess({"/bin/bash", CKPT_PKI_SCRIPT, pki});
  if (!made.ok() || made->exit_code != 0) {
    return Error("tls: make-test-pki.sh",
                 made.ok() ? absl::InternalError(made->stderr_text) : made.status());
  }
  StopServer();
  ClientOptions tls;
  tls.tls_ca = pki + "/ca.pem";
  tls.token_file = pki + "/reader.token";
  if (auto s = StartServer({"--tls-cert", pki + "/server.pem", "--tls-key", pki + "/server.key",
                            "--auth-tokens", pki + "/tokens.txt"},
                           tls);
      !s.ok()) {
    return Error("tls: start ckptd with TLS", s);
  }
  tls_gibps_ = MergedFetchPasses("over TLS + token", &tls_passes_, &tls_cpu_);
  StopServer();
  if (auto s = StartServer(); !s.ok()) return Error("tls: restart ckptd", s);
  plain_gibps_ = MergedFetchPasses("plaintext", &plain_passes_, &plain_cpu_);
}

}  // namespace ckpt::bench
