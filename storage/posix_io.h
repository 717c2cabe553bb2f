// Small POSIX file-system helpers shared by the store, the server's export jobs
// and the client's local exports: errno mapping, full pread/pwrite loops,
// directory sync, no-replace renames and temporary directories. Every error
// names the operation and the path. All functions are thread-safe (they keep no
// state); TempDirectory is not (one owner).
#ifndef CKPT_STORAGE_POSIX_IO_H_
#define CKPT_STORAGE_POSIX_IO_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// Maps an errno value from operation `op` ("open", "rename", ...) on `path` to
// a status whose message reads "<op> <path>: <strerror>". ENOENT/ENOTDIR →
// NOT_FOUND, EACCES/EPERM → PERMISSION_DENIED, EISDIR → INVALID_ARGUMENT,
// ENOSPC/EDQUOT/EFBIG → RESOURCE_EXHAUSTED (disk or quota), EEXIST →
// ALREADY_EXISTS; others as absl::ErrnoToStatusCode.
absl::Status ErrnoToStatus(int error_number, std::string_view op, std::string_view path);

// Writes all `n` bytes of `data` at `offset` of `fd` (pwrite until done,
// retrying EINTR). `path` only names the file in errors.
absl::Status PwriteFully(int fd, const void *data, size_t n, int64_t offset, std::string_view path);

// Reads exactly `n` bytes at `offset` of `fd` into `out` (pread until done,
// retrying EINTR). A file that ends first is DATA_LOSS naming the path and the
// offset where it ended.
absl::Status PreadFully(int fd, void *out, size_t n, int64_t offset, std::string_view path);

// fsync of the directory `dir`: makes renames and new entries in it durable.
absl::Status SyncDirectory(const std::string &dir);

// Renames `from` to `to`, refusing (ALREADY_EXISTS) to replace an existing
// `to`. Atomic where the filesystem supports renameat2(RENAME_NOREPLACE);
// elsewhere after an existence check.
absl::Status RenameNoReplace(const std::string &from, const std::string &to);

// Creates a new directory `parent`/`stem`<8 random characters> with mode 0777
// minus the umask (mkdtemp's 0700 would be kept by a final rename and surprise
// users sharing an export) and returns its path.
absl::StatusOr<std::string> MakeUniqueDirectory(const std::string &parent, std::string_view stem);

// Owns a directory and removes it, with everything in it, when destroyed,
// unless released. Removal is best effort (the directory is a leftover of a
// failed operation).
class TempDirectory {
 public:
  // Creates it as MakeUniqueDirectory does.
  static absl::StatusOr<TempDirectory> Create(const std::string &parent, std::string_view stem);

  TempDirectory(TempDirectory &&other) noexcept;
  TempDirectory &operator=(TempDirectory &&other) noexcept;
  TempDirectory(const TempDirectory &) = delete;
  TempDirectory &operator=(const TempDirectory &) = delete;
  ~TempDirectory();

  const std::string &path() const { return path_; }
  // Keeps the directory (e.g. after it was renamed into place); path() becomes
  // empty.
  void Release() { path_.clear(); }

 private:
  explicit TempDirectory(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_POSIX_IO_H_
