#include "tests/bench/child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ckpt::bench {

std::string SelfExe() {
  std::error_code ec;
  const auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : p.string();
}

absl::StatusOr<std::unique_ptr<Child>> Child::Spawn(const std::vector<std::string>& argv,
                                                    Options options) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  int in_pipe[2] = {-1, -1};
  int out_pipe[2] = {-1, -1};
  if (options.pipe_stdin && pipe2(in_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  if (options.pipe_stdout && pipe2(out_pipe, O_CLOEXEC) != 0) {
    if (in_pipe[0] >= 0) {
      close(in_pipe[0]);
      close(in_pipe[1]);
    }
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Everything the child touches is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (options.pipe_stdin) dup2(in_pipe[0], 0);
    if (options.pipe_stdout) dup2(out_pipe[1], 1);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  std::unique_ptr<Child> child(new Child());
  child->pid_ = pid;
  if (options.pipe_stdin) {
    close(in_pipe[0]);
    child->stdin_fd_ = in_pipe[1];
  }
  if (options.pipe_stdout) {
    close(out_pipe[1]);
    child->stdout_fd_ = out_pipe[0];
  }
  return child;
}

Child::~Child() {
  if (stdin_fd_ >= 0) close(stdin_fd_);
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

absl::Status Child::WriteLine(const std::string& line) {
  if (stdin_fd_ < 0) return absl::FailedPreconditionError("child has no stdin pipe");
  const std::string data = line + "\n";
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(stdin_fd_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat("write to child: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

std::optional<std::string> Child::ReadLine() {
  while (true) {
    const size_t nl = read_buffer_.find('\n');
    if (nl != std::string::npos) {
      std::string line = read_buffer_.substr(0, nl);
      read_buffer_.erase(0, nl + 1);
      return line;
    }
    if (eof_ || stdout_fd_ < 0) {
      if (read_buffer_.empty()) return std::nullopt;
      std::string rest = std::move(read_buffer_);
      read_buffer_.clear();
      return rest;
    }
    char buf[4096];
    const ssize_t n = read(stdout_fd_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      continue;
    }
    read_buffer_.append(buf, static_cast<size_t>(n));
  }
}

void Child::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

Child::Exit Child::Wait() {
  Exit exit;
  if (pid_ <= 0) return exit;
  int status = 0;
  struct rusage usage {};
  while (wait4(pid_, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  exit.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  exit.max_rss_kib = usage.ru_maxrss;
  exit.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                     static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
  return exit;
}

absl::StatusOr<int64_t> ProcessPeakRssBytes(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      return std::stoll(line.substr(6)) * 1024;  // "VmHWM:   123456 kB"
    }
  }
  return absl::UnavailableError(absl::StrCat("no VmHWM in /proc/", pid, "/status"));
}

absl::StatusOr<double> ProcessCpuSeconds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/stat");
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  // "pid (comm) state ppid ...": comm may hold spaces, so count fields after its ')'. utime and
  // stime are fields 14 and 15 of the line, i.e. the 12th and 13th after the comm.
  const size_t close = line.rfind(')');
  if (close == std::string::npos) {
    return absl::UnavailableError(absl::StrCat("unexpected format of ", path));
  }
  const std::vector<std::string> fields =
      absl::StrSplit(line.substr(close + 1), ' ', absl::SkipEmpty());
  if (fields.size() < 13) return absl::UnavailableError(absl::StrCat("short ", path));
  int64_t utime = 0;
  int64_t stime = 0;
  if (!absl::SimpleAtoi(fields[11], &utime) || !absl::SimpleAtoi(fields[12], &stime)) {
    return absl::UnavailableError(absl::StrCat("utime/stime in ", path, " are not numbers"));
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double SelfCpuSeconds() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

}  // namespace ckpt::bench
