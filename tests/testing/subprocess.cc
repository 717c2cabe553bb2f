#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace ckpt::testing {
namespace {

absl::Status ErrnoError(const char* what, int err) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(err)));
}

// Owns one file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Close(); }

  int get() const { return fd_; }
  void Reset(int fd) {
    Close();
    fd_ = fd;
  }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

absl::Status MakePipe(Fd& read_end, Fd& write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2", errno);
  read_end.Reset(fds[0]);
  write_end.Reset(fds[1]);
  return absl::OkStatus();
}

// posix_spawn_file_actions_t with RAII destruction.
class FileActions {
 public:
  FileActions() { ::posix_spawn_file_actions_init(&actions_); }
  FileActions(const FileActions&) = delete;
  FileActions& operator=(const FileActions&) = delete;
  ~FileActions() { ::posix_spawn_file_actions_destroy(&actions_); }
  posix_spawn_file_actions_t* get() { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
};

// Reads what is available on `fd` into `out`; false at end of file or on a read error.
bool Drain(int fd, std::string* out) {
  char buffer[16384];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      out->append(buffer, static_cast<size_t>(n));
      return true;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;  // 0: EOF; <0: the pipe is unusable, treat as closed
  }
}

}  // namespace

absl::StatusOr<SubprocessResult> RunSubprocess(const std::vector<std::string>& argv,
                                               const SubprocessOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("RunSubprocess: empty argv");

  Fd out_read, out_write, err_read, err_write;
  if (absl::Status s = MakePipe(out_read, out_write); !s.ok()) return s;
  if (absl::Status s = MakePipe(err_read, err_write); !s.ok()) return s;

  FileActions actions;
  int rc = ::posix_spawn_file_actions_addopen(actions.get(), STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  // dup2 clears close-on-exec on the target descriptor; the originals stay close-on-exec.
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(actions.get(), out_write.get(), STDOUT_FILENO);
  if (rc == 0) rc = ::posix_spawn_file_actions_adddup2(actions.get(), err_write.get(), STDERR_FILENO);
  if (rc == 0 && !options.working_dir.empty()) {
    rc = ::posix_spawn_file_actions_addchdir_np(actions.get(), options.working_dir.c_str());
  }
  if (rc != 0) return ErrnoError("posix_spawn_file_actions", rc);

  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  pid_t pid = 0;
  rc = ::posix_spawn(&pid, args[0], actions.get(), nullptr, args.data(), environ);
  if (rc != 0) return ErrnoError(absl::StrCat("cannot start ", argv[0]).c_str(), rc);
  // Only the child may hold the write ends, so that its exit is seen as end of file.
  out_write.Close();
  err_write.Close();

  SubprocessResult result;
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  bool out_open = true, err_open = true;
  while (out_open || err_open) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid, SIGKILL);
      result.timed_out = true;
      break;
    }
    pollfd fds[2];
    nfds_t count = 0;
    if (out_open) fds[count++] = {out_read.get(), POLLIN, 0};
    if (err_open) fds[count++] = {err_read.get(), POLLIN, 0};
    const int ready = ::poll(fds, count, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      return ErrnoError("poll", err);
    }
    for (nfds_t i = 0; i < count; ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      if (fds[i].fd == out_read.get()) {
        out_open = Drain(out_read.get(), &result.stdout_text);
      } else {
        err_open = Drain(err_read.get(), &result.stderr_text);
      }
    }
  }
  out_read.Close();
  err_read.Close();

  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoError("waitpid", errno);
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.term_signal = WTERMSIG(status);
    result.exit_code = 128 + result.term_signal;
  }
  return result;
}

std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

}  // namespace ckpt::testing
