#include "service/rpc/tcp_acceptor.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

// The sockets whose read side shutdown() keeps open: held connections, by gRPC's descriptor
// number, with the identity of their socket (a number gRPC closed may be reused by any file) and
// the eventfd of the reaper holding them. Process-wide, as shutdown() is; never destroyed, so that
// calls during exit still find it.
struct KeptSocket {
  dev_t dev;
  ino_t ino;
  int wake_fd;
};
struct KeptSockets {
  std::mutex mu;
  std::unordered_map<int, KeptSocket> by_fd;  // guarded by mu
};
KeptSockets& Kept() {
  static KeptSockets* kept = new KeptSockets();
  return *kept;
}

// True when `fd` is a held connection's socket, whose reaper it then wakes.
bool KeepReadSide(int fd) {
  KeptSockets& kept = Kept();
  std::lock_guard<std::mutex> lock(kept.mu);
  const auto it = kept.by_fd.find(fd);
  if (it == kept.by_fd.end()) return false;
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_dev != it->second.dev || st.st_ino != it->second.ino) {
    return false;
  }
  const uint64_t one = 1;
  (void)!write(it->second.wake_fd, &one, sizeof(one));
  return true;
}

}  // namespace
}  // namespace ckpt

// The process's shutdown() (see tcp_acceptor.h): a held connection keeps its read side, so that
// the client's last flow-control updates are read instead of answered with a reset. Every other
// socket gets the system call as asked.
extern "C" int shutdown(int fd, int how) noexcept {
  if ((how == SHUT_RD || how == SHUT_RDWR) && ckpt::KeepReadSide(fd)) {
    if (how == SHUT_RD) return 0;
    how = SHUT_WR;
  }
  return static_cast<int>(syscall(SYS_shutdown, fd, how));
}

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

bool TcpAcceptor::ReadSideIsKept() {
  using Shutdown = int (*)(int, int);
  return dlsym(RTLD_DEFAULT, "shutdown") ==
         reinterpret_cast<void*>(static_cast<Shutdown>(&::shutdown));
}

absl::StatusOr<std::unique_ptr<TcpAcceptor>> TcpAcceptor::Listen(const TcpListenAddress& address,
                                                                 absl::Duration linger) {
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
  acceptor->linger_ = std::max(linger, absl::ZeroDuration());
  acceptor->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  acceptor->reaper_wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  acceptor->reserve_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (!ReadSideIsKept()) {
    spdlog::warn(
        "event=listen warning=\"shutdown() is not interposed: a client still reading when its "
        "connection ends may be reset and lose the end of its stream\"");
  }
  return acceptor;
}

TcpAcceptor::~TcpAcceptor() {
  Stop();
  if (reaper_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reaper_stopping_ = true;
    }
    const uint64_t one = 1;
    (void)!write(reaper_wake_fd_, &one, sizeof(one));
    reaper_.join();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    SweepLocked(absl::Now(), Sweep::kAll);
  }
  {
    // No entry may name reaper_wake_fd_ once it is closed.
    KeptSockets& kept = Kept();
    std::lock_guard<std::mutex> lock(kept.mu);
    for (auto it = kept.by_fd.begin(); it != kept.by_fd.end();) {
      if (it->second.wake_fd == reaper_wake_fd_) {
        it = kept.by_fd.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  if (reaper_wake_fd_ >= 0) close(reaper_wake_fd_);
  if (reserve_fd_ >= 0) close(reserve_fd_);
}

void TcpAcceptor::Start(grpc::experimental::ExternalConnectionAcceptor* handler) {
  reaper_ = std::thread([this] { Reap(); });
  thread_ = std::thread([this, handler] { Loop(handler); });
}

bool TcpAcceptor::Hold(int fd) {
  struct stat st {};
  if (reaper_wake_fd_ < 0 || fstat(fd, &st) != 0) return false;
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return false;
  Connection c;
  c.grpc_fd = fd;
  c.fd = copy;
  c.dev = st.st_dev;
  c.ino = st.st_ino;
  std::lock_guard<std::mutex> lock(mu_);
  held_.push_back(c);
  ++in_grpc_;
  KeptSockets& kept = Kept();
  std::lock_guard<std::mutex> kept_lock(kept.mu);
  kept.by_fd[fd] = KeptSocket{st.st_dev, st.st_ino, reaper_wake_fd_};
  return true;
}

bool TcpAcceptor::DrainEnded(int fd) {
  char buffer[16384];
  for (int i = 0; i < 64; ++i) {  // at most 1 MiB a call: a flooding client cannot hold the thread
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n > 0) continue;
    if (n == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK;
  }
  return false;
}

namespace {

int64_t Unacknowledged(int fd) {
  int bytes = 0;
  return ioctl(fd, SIOCOUTQ, &bytes) == 0 ? bytes : 0;
}

}  // namespace

void TcpAcceptor::Release(const Connection& c, absl::Time now, bool expired) {
  if (c.released) {
    // Nothing left unread: the close sends no reset, and the kernel goes on sending what is
    // still queued.
    DrainEnded(c.fd);
    if (expired) {
      if (const int64_t bytes = Unacknowledged(c.fd); bytes > 0) {
        spdlog::warn(
            "event=connection outcome=let_go unacknowledged_bytes={} held_ms={} (the client "
            "neither read nor closed)",
            bytes, absl::ToInt64Milliseconds(now - c.released_at));
      }
    }
  } else {
    // gRPC still uses the socket: only the hold ends (its reads are gRPC's).
    KeptSockets& kept = Kept();
    std::lock_guard<std::mutex> lock(kept.mu);
    const auto it = kept.by_fd.find(c.grpc_fd);
    if (it != kept.by_fd.end() && it->second.dev == c.dev && it->second.ino == c.ino) {
      kept.by_fd.erase(it);
    }
  }
  close(c.fd);
}

int TcpAcceptor::SweepLocked(absl::Time now, Sweep sweep) {
  int closed = 0;
  for (size_t i = 0; i < held_.size();) {
    Connection& c = held_[i];
    if (!c.released && sweep != Sweep::kReleased) {
      struct stat st {};
      if (fstat(c.grpc_fd, &st) != 0 || st.st_dev != c.dev || st.st_ino != c.ino) {
        // gRPC closed its descriptor: the socket is TcpAcceptor's alone from now on.
        c.released = true;
        c.released_at = now;
        --in_grpc_;
        KeptSockets& kept = Kept();
        {
          std::lock_guard<std::mutex> lock(kept.mu);
          const auto it = kept.by_fd.find(c.grpc_fd);
          if (it != kept.by_fd.end() && it->second.dev == c.dev && it->second.ino == c.ino) {
            kept.by_fd.erase(it);
          }
        }
        shutdown(c.fd, SHUT_WR);  // the FIN, in case gRPC closed without shutdown()
      }
    }
    bool done = sweep == Sweep::kAll || (sweep == Sweep::kReleasedNow && c.released);
    bool expired = false;
    if (c.released && !done) {
      if (DrainEnded(c.fd)) {
        done = true;  // the client closed its end (or the connection failed)
      } else if (Unacknowledged(c.fd) == 0) {
        if (c.acked_since == absl::InfiniteFuture()) c.acked_since = now;
        done = now - c.acked_since >= kAckedLinger;
      } else {
        c.acked_since = absl::InfiniteFuture();
      }
      if (!done && now - c.released_at >= linger_) done = expired = true;
    }
    if (done) {
      if (!c.released) --in_grpc_;
      Release(c, now, expired);
      held_[i] = held_.back();
      held_.pop_back();
      ++closed;
    } else {
      ++i;
    }
  }
  return closed;
}

void TcpAcceptor::Reap() {
  std::vector<pollfd> fds;
  absl::Time fast_until = absl::InfinitePast();
  absl::Time last_check = absl::InfinitePast();
  while (true) {
    // Watched: the wake eventfd and every released connection (its client's bytes and end).
    // Released connections are also looked at every 100 ms (acknowledgement, linger); after a
    // shutdown() of a held connection every 20 ms for a second (gRPC closes right after); and
    // every held connection once a second (gRPC may close without shutdown()).
    fds.clear();
    fds.push_back({reaper_wake_fd_, POLLIN, 0});
    absl::Duration timeout = absl::Seconds(1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reaper_stopping_) return;
      for (const Connection& c : held_) {
        if (!c.released) continue;
        fds.push_back({c.fd, POLLIN | POLLRDHUP, 0});
        timeout = std::min(timeout, absl::Milliseconds(100));
      }
    }
    if (absl::Now() < fast_until) timeout = std::min(timeout, absl::Milliseconds(20));
    if (poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(timeout))) < 0 &&
        errno != EINTR) {
      spdlog::error("event=connection error=\"poll: {}\"", std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(100));
    }
    const absl::Time now = absl::Now();
    if ((fds[0].revents & POLLIN) != 0) {
      uint64_t count = 0;
      (void)!read(reaper_wake_fd_, &count, sizeof(count));
      fast_until = now + absl::Seconds(1);
    }
    const bool check_grpc = now < fast_until || now - last_check >= absl::Seconds(1);
    if (check_grpc) last_check = now;
    std::lock_guard<std::mutex> lock(mu_);
    if (reaper_stopping_) return;
    SweepLocked(now, check_grpc ? Sweep::kEvents : Sweep::kReleased);
  }
}

int64_t TcpAcceptor::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_grpc_;
}

TcpAcceptor::Held TcpAcceptor::held() const {
  Held h;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Connection& c : held_) {
    ++h.open;
    if (c.released) ++h.released;
    if (const int64_t bytes = Unacknowledged(c.fd); bytes > 0) {
      ++h.unacknowledged;
      h.unacknowledged_bytes += bytes;
    }
  }
  return h;
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

bool TcpAcceptor::RefusedOverMaximum(int fd) {
  if (max_connections_ <= 0) return false;
  int64_t in_use = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_use = in_grpc_;
  }
  if (in_use < max_connections_) return false;
  close(fd);
  const int64_t refused = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
  // One line for the first refusal and then one per 1000, so a flood cannot flood the log.
  if (refused % 1000 == 1) {
    spdlog::warn(
        "event=accept action=refuse reason=max_connections connections={} "
        "max_connections={} refused={} (raise --max-connections, or add replicas)",
        in_use, max_connections_, refused);
  }
  return true;
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
          if (RefusedOverMaximum(fd)) continue;
          const int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          Hold(fd);  // not held when dup() fails: gRPC alone ends it
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
          // Out of descriptors: let go of ending connections, else of every hold, and retry;
          // when that frees nothing, shed the waiting connection with the reserve, then pause.
          int freed = 0;
          {
            std::lock_guard<std::mutex> lock(mu_);
            freed = SweepLocked(absl::Now(), Sweep::kReleasedNow);
            if (freed == 0) freed = SweepLocked(absl::Now(), Sweep::kAll);
          }
          if (freed > 0) continue;
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
