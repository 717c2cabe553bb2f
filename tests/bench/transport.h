// The bench-only transport service (transport_service.proto): a server that streams prepared
// messages, and a client that drains them and reports the throughput.
#ifndef CKPT_TESTS_BENCH_TRANSPORT_H_
#define CKPT_TESTS_BENCH_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt::bench {

// Runs the transport server on 127.0.0.1:0 until SIGTERM/SIGINT; writes the port to `port_file`
// once listening. For the `--transport-server` mode of the bench binary (a child process, like
// ckptd).
int RunTransportServer(const std::string& port_file);

struct TransportResult {
  int64_t bytes = 0;
  double seconds = 0;
};

// Streams `messages` × `message_bytes` from the transport server at `address` through one stream
// (channel configured like CkptClient's: 8 MiB receive limit), after a short warm-up. With
// `source_files`, the server reads the bytes from those files and checksums them, and this side
// verifies every message's checksum (ckptd's, core/checksum.h) as CkptClient does (DATA_LOSS on
// a mismatch): the verified-read ceiling of a fetch.
absl::StatusOr<TransportResult> MeasureTransport(const std::string& address, int64_t messages,
                                                 int64_t message_bytes,
                                                 const std::vector<std::string>& source_files = {});

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_TRANSPORT_H_
