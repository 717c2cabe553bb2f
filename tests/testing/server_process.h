// A real ckptd in a child process for integration tests: listening on 127.0.0.1:0, its RocksDB
// under a caller-owned directory, its log captured to a file.
#ifndef CKPT_TESTS_TESTING_SERVER_PROCESS_H_
#define CKPT_TESTS_TESTING_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::testing {

// Not thread-safe. The destructor stops the server (SIGTERM, then SIGKILL after 20 s).
class ServerProcess {
 public:
  // Starts `ckptd_path` with --listen 127.0.0.1:0 (unless `extra_args` has its own --listen)
  // --data DATA_DIR and waits (up to 30 s) until it has written its port file.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& ckptd_path, const std::string& data_dir,
      const std::vector<std::string>& extra_args = {});
  ~ServerProcess();

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // SIGTERM and wait; returns the exit code (or 128 + signal).
  int Stop();
  // SIGKILL and wait (a crash).
  void Kill();
  // What the server logged so far.
  std::string Log() const;

 private:
  ServerProcess() = default;
  int WaitForExit();

  pid_t pid_ = -1;
  std::string address_;
  std::string log_path_;
  std::string port_file_;
};

// A fresh directory under /tmp, removed (recursively) by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TESTING_SERVER_PROCESS_H_
