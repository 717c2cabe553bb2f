#include "service/rpc/tcp_acceptor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace ckpt {

std::optional<TcpListenAddress> ParseTcpListenAddress(const std::string& listen) {
  std::string host;
  std::string port;
  if (!listen.empty() && listen.front() == '[') {
    const size_t close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':') {
      return std::nullopt;
    }
    host = listen.substr(1, close - 1);
    port = listen.substr(close + 2);
  } else {
    const size_t colon = listen.rfind(':');
    if (colon == std::string::npos) return std::nullopt;
    host = listen.substr(0, colon);
    port = listen.substr(colon + 1);
    // A scheme (unix:, unix-abstract:, vsock:) or a bare IPv6 address is left to gRPC.
    if (host.find(':') != std::string::npos || host == "unix" || host == "unix-abstract" ||
        host == "vsock") {
      return std::nullopt;
    }
  }
  int number = 0;
  if (!absl::SimpleAtoi(port, &number) || number < 0 || number > 65535) return std::nullopt;
  return TcpListenAddress{host, number};
}

namespace {

int BoundPort(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return 0;
  if (addr.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  if (addr.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  return 0;
}

void SetPort(sockaddr* addr, int port) {
  if (addr->sa_family == AF_INET) reinterpret_cast<sockaddr_in*>(addr)->sin_port = htons(port);
  if (addr->sa_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(addr)->sin6_port = htons(port);
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpAcceptor>> TcpAcceptor::Listen(const TcpListenAddress& address) {
  const std::string where = absl::StrCat(address.host, ":", address.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  const int rc = getaddrinfo(address.host.empty() ? nullptr : address.host.c_str(), port.c_str(),
                             &hints, &found);
  if (rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", where, ": ", gai_strerror(rc)));
  }
  bool has_v4 = false;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) has_v4 |= a->ai_family == AF_INET;
  std::unique_ptr<TcpAcceptor> acceptor(new TcpAcceptor());
  std::string last_error;
  int bound_port = address.port;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // An IPv6 wildcard alone serves IPv4 too; next to an IPv4 address it must not take its port.
    if (a->ai_family == AF_INET6) {
      const int v6only = has_v4 ? 1 : 0;
      setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof(v6only));
    }
    sockaddr_storage addr{};
    std::memcpy(&addr, a->ai_addr, a->ai_addrlen);
    SetPort(reinterpret_cast<sockaddr*>(&addr), bound_port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), a->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      last_error = std::strerror(errno);
      close(fd);
      continue;
    }
    bound_port = BoundPort(fd);  // port 0: every further address takes the same port
    acceptor->listeners_.push_back(fd);
  }
  freeaddrinfo(found);
  if (acceptor->listeners_.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", where, ": ",
                                               last_error.empty() ? "no address" : last_error));
  }
  acceptor->port_ = bound_port;
  acceptor->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  acceptor->reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return acceptor;
}

TcpAcceptor::~TcpAcceptor() {
  Stop();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void TcpAcceptor::Start(grpc::experimental::ExternalConnectionAcceptor* handler) {
  thread_ = std::thread([this, handler] { Loop(handler); });
}

void TcpAcceptor::Stop() {
  if (stopping_.exchange(true)) return;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  for (int fd : listeners_) close(fd);
  listeners_.clear();
}

void TcpAcceptor::Loop(grpc::experimental::ExternalConnectionAcceptor* handler) {
  std::vector<pollfd> fds;
  for (int fd : listeners_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_fd_, POLLIN, 0});
  absl::Time paused_until = absl::InfinitePast();
  absl::Time last_report = absl::InfinitePast();
  while (!stopping_) {
    // While paused (out of descriptors), only the wake descriptor is watched.
    const bool paused = absl::Now() < paused_until;
    pollfd* watched = paused ? &fds.back() : fds.data();
    const nfds_t count = paused ? 1 : fds.size();
    const int timeout_ms =
        paused ? static_cast<int>(absl::ToInt64Milliseconds(paused_until - absl::Now())) + 1 : -1;
    if (poll(watched, count, timeout_ms) < 0 && errno != EINTR) {
      spdlog::error("event=accept error=\"poll: {}\"", std::strerror(errno));
      paused_until = absl::Now() + absl::Milliseconds(100);
      continue;
    }
    if (stopping_ || paused) continue;
    for (size_t i = 0; i + 1 < fds.size(); ++i) {
      if ((fds[i].revents & POLLIN) == 0) continue;
      while (true) {
        const int fd = accept4(fds[i].fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          const int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
          p.listener_fd = fds[i].fd;
          p.fd = fd;
          handler->HandleNewConnection(&p);
          accepted_.fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK) break;
        if (error == EINTR || error == ECONNABORTED) continue;
        if (error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM) {
          // Out of descriptors: shed the waiting connection with the reserve, then pause.
          int64_t shed = 0;
          if (reserve_fd_ >= 0) {
            close(reserve_fd_);
            const int victim = accept4(fds[i].fd, nullptr, nullptr, SOCK_CLOEXEC);
            if (victim >= 0) {
              close(victim);
              ++shed;
            }
            reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
          }
          shed_.fetch_add(shed, std::memory_order_relaxed);
          if (absl::Now() - last_report >= absl::Seconds(10)) {
            last_report = absl::Now();
            spdlog::warn(
                "event=accept error=\"{}\" action=shed_and_pause accepted={} shed={} "
                "(the listener stays open)",
                std::strerror(error), accepted_.load(), shed_.load());
          }
        } else {
          spdlog::error("event=accept error=\"{}\"", std::strerror(error));
        }
        paused_until = absl::Now() + absl::Milliseconds(100);
        break;
      }
    }
  }
}

}  // namespace ckpt
