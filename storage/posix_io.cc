#include "storage/posix_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <random>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"

namespace ckpt {
namespace {

absl::StatusCode CodeForErrno(int error_number) {
  switch (error_number) {
    case ENOENT:
    case ENOTDIR:
      return absl::StatusCode::kNotFound;
    case EACCES:
    case EPERM:
      return absl::StatusCode::kPermissionDenied;
    case EISDIR:
      return absl::StatusCode::kInvalidArgument;
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    case EEXIST:
      return absl::StatusCode::kAlreadyExists;
    case EFAULT:
      // From the kernel failing to bring in a page of a mapping (not a bad pointer of ours):
      // transient, e.g. memory or tmpfs space ran short. Retryable.
      return absl::StatusCode::kUnavailable;
    default:
      return absl::ErrnoToStatusCode(error_number);
  }
}

}  // namespace

absl::Status ErrnoToStatus(int error_number, std::string_view op, std::string_view path) {
  // absl's message uses a thread-safe strerror.
  const absl::Status base = absl::ErrnoToStatus(error_number, absl::StrCat(Sv(op), " ", Sv(path)));
  return absl::Status(CodeForErrno(error_number), base.message());
}

absl::Status PwriteFully(int fd, const void *data, size_t n, int64_t offset,
                         std::string_view path) {
  const char *bytes = static_cast<const char *>(data);
  while (n > 0) {
    const ssize_t written = ::pwrite(fd, bytes, n, static_cast<off_t>(offset));
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write", path);
    }
    bytes += written;
    n -= static_cast<size_t>(written);
    offset += written;
  }
  return absl::OkStatus();
}

absl::Status PreadFully(int fd, void *out, size_t n, int64_t offset, std::string_view path) {
  char *bytes = static_cast<char *>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, bytes, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "read", path);
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat("file ", Sv(path), " ended at byte ", offset, ", ", n, " bytes short"));
    }
    bytes += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string &dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open directory", dir);
  absl::Status status;
  if (::fsync(fd) != 0) status = ErrnoToStatus(errno, "fsync directory", dir);
  ::close(fd);
  return status;
}

absl::Status RenameNoReplace(const std::string &from, const std::string &to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL && errno != ENOSYS) return ErrnoToStatus(errno, "rename", to);
  struct stat st;
  if (::lstat(to.c_str(), &st) == 0) return ErrnoToStatus(EEXIST, "rename", to);
  if (::rename(from.c_str(), to.c_str()) != 0) return ErrnoToStatus(errno, "rename", to);
  return absl::OkStatus();
}

absl::StatusOr<std::string> MakeUniqueDirectory(const std::string &parent, std::string_view stem) {
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string path;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string suffix(8, ' ');
    for (char &c : suffix) c = kAlphabet[rng() % (sizeof(kAlphabet) - 1)];
    path = (std::filesystem::path(parent) / absl::StrCat(Sv(stem), suffix)).string();
    if (::mkdir(path.c_str(), 0777) == 0) return path;
    if (errno != EEXIST) return ErrnoToStatus(errno, "create directory", path);
  }
  return absl::AlreadyExistsError(absl::StrCat("cannot create a unique directory like ", path));
}

absl::StatusOr<TempDirectory> TempDirectory::Create(const std::string &parent,
                                                    std::string_view stem) {
  absl::StatusOr<std::string> path = MakeUniqueDirectory(parent, stem);
  if (!path.ok()) return path.status();
  return TempDirectory(*std::move(path));
}

TempDirectory::TempDirectory(TempDirectory &&other) noexcept : path_(std::move(other.path_)) {
  other.path_.clear();
}

TempDirectory &TempDirectory::operator=(TempDirectory &&other) noexcept {
  if (this != &other) {
    TempDirectory old(std::move(*this));
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

TempDirectory::~TempDirectory() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);  // best effort
}

}  // namespace ckpt
