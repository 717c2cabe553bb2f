// TcpAcceptor's hold on the connections gRPC ends (tcp_acceptor.h), against a stand-in for gRPC
// that ends a connection as gRPC 1.51 does: shutdown(SHUT_RDWR), then close(). Real sockets on
// 127.0.0.1; the clients are plain blocking sockets.
#include "service/rpc/tcp_acceptor.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

// Takes the connections TcpAcceptor hands over, as gRPC would.
class FakeGrpc : public grpc::experimental::ExternalConnectionAcceptor {
 public:
  void HandleNewConnection(NewConnectionParameters* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.push_back(p->fd);
    cv_.notify_all();
  }
  // The next connection handed over; -1 after 10 s without one.
  int Next() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(10), [this] { return !fds_.empty(); })) return -1;
    const int fd = fds_.front();
    fds_.pop_front();
    return fd;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> fds_;
};

// Whether `done` becomes true within `within`, looking every 10 ms.
bool Eventually(const std::function<bool()>& done, absl::Duration within) {
  const absl::Time until = absl::Now() + within;
  while (!done()) {
    if (absl::Now() >= until) return false;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return true;
}

// Ends `fd` as gRPC does.
void EndAsGrpc(int fd) {
  shutdown(fd, SHUT_RDWR);
  close(fd);
}

// Writes to `fd` (non-blocking, as gRPC's sockets are) until the kernel takes no more; returns
// the bytes written.
int64_t FillSocket(int fd) {
  std::vector<char> chunk(1 << 16, 'x');
  int64_t written = 0;
  while (true) {
    const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      written += n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // The client's kernel may still be opening its window: give it a moment before concluding.
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, 200) <= 0) return written;
  }
}

class TcpAcceptorTest : public ::testing::Test {
 protected:
  void Start(absl::Duration linger, int64_t max_connections = 0) {
    auto a = TcpAcceptor::Listen(TcpListenAddress{"127.0.0.1", 0}, linger);
    ASSERT_TRUE(a.ok()) << a.status();
    acceptor_ = std::move(*a);
    acceptor_->set_max_connections(max_connections);
    acceptor_->Start(&grpc_);
  }
  // A connected client socket (blocking); `receive_buffer` > 0 sets SO_RCVBUF before connecting,
  // so that a client that reads slowly holds the server's bytes in the server's send buffer.
  int Connect(int receive_buffer = 0) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_GE(fd, 0);
    if (receive_buffer > 0) {
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(acceptor_->port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    clients_.push_back(fd);
    return fd;
  }
  // Whether `fd` reads end-of-stream within `within` (after any bytes still in flight).
  static bool ReadsEndOfStream(int fd, absl::Duration within) {
    char buffer[4096];
    const absl::Time until = absl::Now() + within;
    while (absl::Now() < until) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 10) <= 0) continue;
      const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0 && errno != EAGAIN && errno != EINTR) return false;
    }
    return false;
  }
  void TearDown() override {
    for (int fd : clients_) close(fd);
    acceptor_.reset();
  }

  FakeGrpc grpc_;
  std::unique_ptr<TcpAcceptor> acceptor_;
  std::vector<int> clients_;
};

TEST_F(TcpAcceptorTest, TheShutdownInForceIsTheAcceptors) {
  EXPECT_TRUE(TcpAcceptor::ReadSideIsKept());
}

// The case that loses data without the hold: the server's bytes wait in its send buffer, the
// client has sent bytes the server never read and goes on sending (flow-control updates) while
// it reads the rest slowly. It receives every byte, then end-of-stream, never a reset.
TEST_F(TcpAcceptorTest, ASlowClientStillSendingReceivesEveryByteAfterGrpcEndedItsConnection) {
  Start(absl::Seconds(30));
  const int client = Connect(64 << 10);
  const int server = grpc_.Next();
  ASSERT_GE(server, 0);
  const int64_t sent = FillSocket(server);
  ASSERT_GT(sent, int64_t{256} << 10) << "the kernel buffered too little to test anything";
  ASSERT_EQ(send(client, "u", 1, MSG_NOSIGNAL), 1);
  absl::SleepFor(absl::Milliseconds(50));  // the server has the byte, unread
  EndAsGrpc(server);
  EXPECT_EQ(acceptor_->held().open, 1);

  std::vector<char> buffer(16 << 10);
  int64_t received = 0;
  int error = 0;
  while (true) {
    const ssize_t n = recv(client, buffer.data(), buffer.size(), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      error = errno;
      break;
    }
    received += n;
    // An update after every read, and slowly: about 16 MiB/s.
    if (send(client, "u", 1, MSG_NOSIGNAL) != 1 && errno != EAGAIN) {
      error = errno;
      break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(error, 0) << std::strerror(error);
  EXPECT_EQ(received, sent);
  // The client closes: the hold ends.
  close(client);
  clients_.clear();
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().open == 0; }, absl::Seconds(5)));
}

// gRPC still owns the socket: its reads are its own, the hold takes nothing from it.
TEST_F(TcpAcceptorTest, AConnectionGrpcStillUsesIsLeftAlone) {
  Start(absl::Seconds(30));
  const int client = Connect();
  const int server = grpc_.Next();
  ASSERT_GE(server, 0);
  std::vector<char> data(1 << 20, 'y');
  ASSERT_EQ(send(client, data.data(), data.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(data.size()));
  absl::SleepFor(absl::Milliseconds(1500));  // past a sweep of every held connection
  int64_t read_by_grpc = 0;
  while (read_by_grpc < static_cast<int64_t>(data.size())) {
    pollfd p{server, POLLIN, 0};
    if (poll(&p, 1, 2000) <= 0) break;
    const ssize_t n = recv(server, data.data(), data.size(), MSG_DONTWAIT);
    if (n <= 0) break;
    read_by_grpc += n;
  }
  EXPECT_EQ(read_by_grpc, static_cast<int64_t>(data.size()));
  EXPECT_EQ(acceptor_->held().open, 1);
  EXPECT_EQ(acceptor_->held().released, 0);
  EndAsGrpc(server);
}

// Ending a connection is as prompt as without the hold: the client reads end-of-stream at once,
// and when it closes its end, the acceptor lets go.
TEST_F(TcpAcceptorTest, ClientsSeeEndOfStreamAtOnceAndTheHoldEndsWhenTheyClose) {
  Start(absl::Seconds(30));
  const int client = Connect();
  const int server = grpc_.Next();
  ASSERT_GE(server, 0);
  EndAsGrpc(server);
  EXPECT_TRUE(ReadsEndOfStream(client, absl::Milliseconds(500)));
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().released == 1; }, absl::Seconds(3)));
  close(client);
  clients_.clear();
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().open == 0; }, absl::Seconds(3)));
}

// gRPC closing without shutdown(): the acceptor sends the end-of-stream itself.
TEST_F(TcpAcceptorTest, AConnectionClosedWithoutShutdownStillEnds) {
  Start(absl::Seconds(30));
  const int client = Connect();
  const int server = grpc_.Next();
  ASSERT_GE(server, 0);
  close(server);
  EXPECT_TRUE(ReadsEndOfStream(client, absl::Seconds(3)));
}

// A client that never reads, its bytes unacknowledged, is let go at the linger bound: a dead or
// stuck client does not hold a descriptor for long.
TEST_F(TcpAcceptorTest, AClientThatNeverReadsIsLetGoAtTheLingerBound) {
  Start(absl::Seconds(2));
  Connect(64 << 10);
  const int server = grpc_.Next();
  ASSERT_GE(server, 0);
  ASSERT_GT(FillSocket(server), 0);
  EndAsGrpc(server);
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().released == 1; }, absl::Seconds(3)));
  const TcpAcceptor::Held held = acceptor_->held();
  EXPECT_EQ(held.unacknowledged, 1);
  EXPECT_GT(held.unacknowledged_bytes, 0);
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().open == 0; }, absl::Seconds(4)));
}

// A client that has acknowledged every byte but never closes is let go after kAckedLinger, well
// before the linger bound.
TEST_F(TcpAcceptorTest, AClientWithEveryByteThatNeverClosesIsLetGoAfterTheAckedLinger) {
  Start(absl::Seconds(60));
  Connect();
  const int server = grpc_.Next();
  ASSERT_GE(server, 0);
  EndAsGrpc(server);
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().released == 1; }, absl::Seconds(3)));
  // The client's kernel acknowledges the FIN late (a socket that receives a FIN delays its ACK,
  // hoping to send it with its own FIN): until then the FIN is the one unacknowledged byte.
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().unacknowledged == 0; }, absl::Seconds(1)));
  EXPECT_EQ(acceptor_->held().open, 1);
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().open == 0; },
                         TcpAcceptor::kAckedLinger + absl::Seconds(3)));
}

// Beyond the maximum, a connection is closed before gRPC sees it; once gRPC lets go of one of
// its connections, the next is handed over again.
TEST_F(TcpAcceptorTest, ConnectionsBeyondTheMaximumAreClosedBeforeGrpcSeesThem) {
  Start(absl::Seconds(30), /*max_connections=*/2);
  Connect();
  Connect();
  const int first = grpc_.Next();
  ASSERT_GE(first, 0);
  ASSERT_GE(grpc_.Next(), 0);
  const int third = Connect();
  EXPECT_TRUE(ReadsEndOfStream(third, absl::Seconds(3)));
  EXPECT_TRUE(Eventually([&] { return acceptor_->refused() == 1; }, absl::Seconds(3)));
  EXPECT_EQ(acceptor_->accepted(), 2);
  EndAsGrpc(first);
  // gRPC's shutdown() wakes the acceptor, which sees the descriptor closed within a sweep.
  EXPECT_TRUE(Eventually([&] { return acceptor_->held().released == 1; }, absl::Seconds(3)));
  Connect();
  EXPECT_GE(grpc_.Next(), 0);
  EXPECT_EQ(acceptor_->refused(), 1);
}

}  // namespace
}  // namespace ckpt
