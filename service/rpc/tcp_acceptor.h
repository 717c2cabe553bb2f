// ckptd's own TCP listener, handing accepted connections to gRPC (ServerBuilder's external
// connection acceptor), so that running out of file descriptors does not cost the listener.
//
// gRPC 1.51's accept loop stops watching its listening socket after any accept error but EAGAIN
// and EINTR: a single EMFILE would leave the server deaf for good, its port still open and
// clients' connections waiting in the backlog. TcpAcceptor keeps one descriptor in reserve; when
// accept fails for want of descriptors it frees the reserve, accepts and closes the waiting
// connection (its client sees the connection closed and may retry), takes the reserve again and
// pauses briefly, then goes on accepting.
#ifndef CKPT_SERVICE_RPC_TCP_ACCEPTOR_H_
#define CKPT_SERVICE_RPC_TCP_ACCEPTOR_H_

#include <grpcpp/server_builder.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

// HOST and PORT of a "HOST:PORT" or "[V6]:PORT" listen address; nullopt for other forms
// (unix:PATH and the like), which gRPC listens on itself.
struct TcpListenAddress {
  std::string host;
  int port = 0;
};
std::optional<TcpListenAddress> ParseTcpListenAddress(const std::string& listen);

// Thread-safe. The destructor stops accepting and closes the listening sockets.
class TcpAcceptor {
 public:
  // Binds and listens on every address `host` resolves to (port 0: a free port, the same on
  // all of them). Errors: UNAVAILABLE naming the address and the reason.
  static absl::StatusOr<std::unique_ptr<TcpAcceptor>> Listen(const TcpListenAddress& address);
  ~TcpAcceptor();

  int port() const { return port_; }
  // Starts the accept thread, which hands every connection to `handler` (which must outlive
  // Stop()). Call once.
  void Start(grpc::experimental::ExternalConnectionAcceptor* handler);
  // Stops accepting and closes the listening sockets. Idempotent.
  void Stop();
  // Connections accepted, and connections closed at once for want of descriptors.
  int64_t accepted() const { return accepted_.load(); }
  int64_t shed() const { return shed_.load(); }

 private:
  TcpAcceptor() = default;
  void Loop(grpc::experimental::ExternalConnectionAcceptor* handler);

  std::vector<int> listeners_;
  int wake_fd_ = -1;     // eventfd: Stop() wakes the thread
  int reserve_fd_ = -1;  // /dev/null, given up to accept-and-close when out of descriptors
  int port_ = 0;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> shed_{0};
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_TCP_ACCEPTOR_H_
