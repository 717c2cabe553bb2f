// ckptd's own TCP listener, handing accepted connections to gRPC (ServerBuilder's external
// connection acceptor), so that running out of file descriptors does not cost the listener, and
// so that a connection gRPC ends still delivers every byte gRPC wrote to it.
//
// Descriptors. gRPC 1.51's accept loop stops watching its listening socket after any accept
// error but EAGAIN and EINTR: a single EMFILE would leave the server deaf for good, its port still
// open and clients' connections waiting in the backlog. TcpAcceptor keeps one descriptor in
// reserve; when accept fails for want of descriptors it first lets go of the connections it holds
// (below), and if that frees nothing it frees the reserve, accepts and closes the waiting
// connection (its client sees the connection closed and may retry), takes the reserve again and
// pauses briefly, then goes on accepting.
//
// Connection ends. gRPC completes a call once its last bytes are in the kernel's send buffer, and
// ends a connection with shutdown(SHUT_RDWR) and close(). On Linux both lose those bytes when the
// client is behind: a socket whose read side is shut down answers the client's next segment (a
// flow-control update for the data it is reading) with a reset, and close() of a socket holding
// received bytes nobody read resets it too; a reset discards whatever the send buffer still held,
// and the client sees its stream fail short of its end. So, for each connection it hands to gRPC,
// TcpAcceptor
//   - keeps a duplicate of its descriptor, so that gRPC's close() does not release the socket
//     (when dup() fails, e.g. EMFILE, the connection is not held and ends as gRPC ends it);
//   - narrows gRPC's shutdown(SHUT_RDWR) to shutdown(SHUT_WR): this file defines the process's
//     shutdown(), which does so for held connections only and passes every other call through
//     (ReadSideIsKept() says whether the definition is the one in force). The client still gets
//     its end-of-stream (FIN) right away, after the last queued byte;
//   - once gRPC has closed its descriptor, keeps reading and discarding what the client still
//     sends, and closes the duplicate when the client has closed its end (it does once it has
//     read everything), when the client has acknowledged every byte for kAckedLinger without
//     closing, when `linger` has passed since gRPC let go (a dead or stuck client), or at once
//     when accept runs out of descriptors. With nothing left unread, that close sends no reset
//     (the kernel goes on sending whatever is still queued). It sends the FIN itself if gRPC
//     closed without shutdown().
// A reaper thread does this; it wakes when gRPC shuts a held connection down, when a released
// one becomes readable, and at least every second. Peers see EOF as promptly as without the
// hold; the cost is a second descriptor per connection, kept at most `linger` past gRPC's close.
#ifndef CKPT_SERVICE_RPC_TCP_ACCEPTOR_H_
#define CKPT_SERVICE_RPC_TCP_ACCEPTOR_H_

#include <grpcpp/server_builder.h>
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckpt {

// HOST and PORT of a "HOST:PORT" or "[V6]:PORT" listen address; nullopt for other forms
// (unix:PATH and the like), which gRPC listens on itself.
struct TcpListenAddress {
  std::string host;
  int port = 0;
};
std::optional<TcpListenAddress> ParseTcpListenAddress(const std::string& listen);

// Thread-safe. The destructor stops accepting, closes the listening sockets and lets go of every
// held connection (reading what its client sent first, so that none is reset for it).
class TcpAcceptor {
 public:
  // A released connection whose client acknowledged every byte but has not closed its end is let
  // go after this long: its client has everything, and a gRPC client closes on end-of-stream.
  static constexpr absl::Duration kAckedLinger = absl::Seconds(5);

  // Binds and listens on every address `host` resolves to (port 0: a free port, the same on
  // all of them). A connection gRPC has let go is held at most `linger` (above). Errors:
  // UNAVAILABLE naming the address and the reason.
  static absl::StatusOr<std::unique_ptr<TcpAcceptor>> Listen(
      const TcpListenAddress& address, absl::Duration linger = absl::Seconds(30));
  ~TcpAcceptor();

  int port() const { return port_; }
  // Starts the accept thread, which hands every connection to `handler` (which must outlive
  // Stop()). Call once.
  void Start(grpc::experimental::ExternalConnectionAcceptor* handler);
  // Stops accepting and closes the listening sockets; held connections are still seen to their
  // end (held()). Idempotent.
  void Stop();
  // At most `max` connections that gRPC still uses at once (0: no maximum). A connection beyond
  // it is closed as soon as it is accepted, before gRPC sees it: its client gets UNAVAILABLE and
  // retries with its backoff. Connections gRPC has let go (ending, above) do not count. Call
  // before Start().
  void set_max_connections(int64_t max) { max_connections_ = max; }
  // Connections accepted, connections closed at once for want of descriptors, and connections
  // refused for being over the maximum.
  int64_t accepted() const { return accepted_.load(); }
  int64_t shed() const { return shed_.load(); }
  int64_t refused() const { return refused_.load(); }
  // Connections gRPC uses now (held and not released; counted against the maximum).
  int64_t connections() const;

  // Connections whose socket TcpAcceptor still holds: `open` in all, `released` of them closed
  // by gRPC (ending), and `unacknowledged` of them with `unacknowledged_bytes` sent but not yet
  // acknowledged by the client (SIOCOUTQ; the FIN counts as a byte).
  struct Held {
    int64_t open = 0;
    int64_t released = 0;
    int64_t unacknowledged = 0;
    int64_t unacknowledged_bytes = 0;
  };
  Held held() const;

  // Whether this file's shutdown() is the one gRPC calls (the executable exports it). When not,
  // gRPC's shutdown(SHUT_RDWR) applies as is and a client still sending can be reset.
  static bool ReadSideIsKept();

 private:
  // One held connection: gRPC's descriptor and TcpAcceptor's duplicate of it.
  struct Connection {
    int grpc_fd = -1;  // its number may be reused once gRPC closed it: compare `dev` and `ino`
    int fd = -1;       // the duplicate
    dev_t dev = 0;
    ino_t ino = 0;
    bool released = false;  // gRPC closed grpc_fd
    absl::Time released_at = absl::InfiniteFuture();
    absl::Time acked_since = absl::InfiniteFuture();  // send queue seen empty since
  };

  TcpAcceptor() = default;
  void Loop(grpc::experimental::ExternalConnectionAcceptor* handler);
  // Closes `fd` at once when gRPC already uses max_connections_ connections; true when it did.
  bool RefusedOverMaximum(int fd);
  // Duplicates `fd` (gRPC's, about to be handed over) and holds it; false when dup() failed.
  bool Hold(int fd);
  // The reaper thread: waits for events and sweeps the held connections.
  void Reap();
  // What a sweep looks at and closes: kReleased, the connections gRPC let go (closing those that
  // ended: the client closed, acknowledged everything kAckedLinger ago, or `linger` passed);
  // kEvents, that and whether gRPC let go of the others; kReleasedNow, every connection gRPC let
  // go, ended or not; kAll, every held connection (the hold of those gRPC still uses ends).
  enum class Sweep { kReleased, kEvents, kReleasedNow, kAll };
  // Returns how many connections it closed. Called with mu_ held.
  int SweepLocked(absl::Time now, Sweep sweep);
  // Reads and discards what the client sent; true when it closed its end or the socket failed.
  static bool DrainEnded(int fd);
  // Closes the duplicate (of a released connection, after reading what the client sent);
  // `expired`: at `linger`, counted and logged when bytes were still unacknowledged.
  void Release(const Connection& c, absl::Time now, bool expired);

  std::vector<int> listeners_;
  int wake_fd_ = -1;         // eventfd: Stop() wakes the accept thread
  int reaper_wake_fd_ = -1;  // eventfd: shutdown() of a held connection, or the destructor
  int reserve_fd_ = -1;      // /dev/null, given up to accept-and-close when out of descriptors
  int port_ = 0;
  absl::Duration linger_ = absl::Seconds(30);
  std::thread thread_;
  std::thread reaper_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> accepted_{0};
  std::atomic<int64_t> shed_{0};
  std::atomic<int64_t> refused_{0};
  int64_t max_connections_ = 0;  // set before Start()

  mutable std::mutex mu_;
  std::vector<Connection> held_;  // guarded by mu_
  int64_t in_grpc_ = 0;           // held_ entries not released; guarded by mu_
  bool reaper_stopping_ = false;  // guarded by mu_
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_RPC_TCP_ACCEPTOR_H_
