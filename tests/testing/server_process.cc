#include "tests/testing/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"

namespace ckpt::testing {

TempDir::TempDir() {
  std::string tmpl = "/tmp/ckpt-test-XXXXXX";
  char* made = mkdtemp(tmpl.data());
  path_ = made ? made : "/tmp/ckpt-test-fallback";
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& ckptd_path, const std::string& data_dir,
    const std::vector<std::string>& extra_args) {
  std::unique_ptr<ServerProcess> p(new ServerProcess());
  p->port_file_ = data_dir + ".port";
  p->log_path_ = data_dir + ".log";
  std::filesystem::remove(p->port_file_);
  std::vector<std::string> args = {ckptd_path, "--data", data_dir, "--port-file", p->port_file_};
  // Any free port unless the test names the address (--listen 127.0.0.1:PORT).
  if (std::find(extra_args.begin(), extra_args.end(), "--listen") == extra_args.end()) {
    args.insert(args.end(), {"--listen", "127.0.0.1:0"});
  }
  // Test machines may have little free disk: a small reserve unless the test sets its own.
  if (std::find(extra_args.begin(), extra_args.end(), "--min-free-disk-mib") == extra_args.end()) {
    args.insert(args.end(), {"--min-free-disk-mib", "64"});
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int log_fd = open(p->log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", p->log_path_));
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(log_fd);
  p->pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(p->port_file_);
    int port = 0;
    if (in >> port && port > 0) {
      p->address_ = absl::StrCat("127.0.0.1:", port);
      return p;
    }
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      p->pid_ = -1;
      return absl::InternalError(absl::StrCat("ckptd exited during start-up: ", p->Log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("ckptd did not start: ", p->Log()));
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) Stop();
}

int ServerProcess::WaitForExit() {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  pid_ = -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

int ServerProcess::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  return WaitForExit();
}

void ServerProcess::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitForExit();
}

std::string ServerProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ckpt::testing
