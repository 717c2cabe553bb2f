// Files confined beneath one directory: the primitive behind ckptd's --export-root, where
// transform jobs write on behalf of remote callers.
//
// A caller's path is resolved by the kernel relative to a descriptor of the root, never as a
// string: openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, so that neither "..", nor an
// absolute symlink, nor a relative one climbing out, nor a /proc magic link can lead outside.
// Where the kernel lacks openat2 (ENOSYS, or EPERM from a seccomp filter that does not know it)
// the same rule is applied by a walk one component at a time (openat with O_NOFOLLOW, symlinks
// read and resolved against a stack of directory descriptors that never pops past the root).
// Whatever is then created is created relative to directory descriptors obtained that way (the
// *at() calls, O_NOFOLLOW, renameat2(RENAME_NOREPLACE)), so that a symlink planted in the path
// afterwards is never followed, and nothing existing is ever replaced.
//
// All functions are thread-safe; a ConfinedRoot is immutable after Open.
#ifndef CKPT_STORAGE_CONFINED_DIR_H_
#define CKPT_STORAGE_CONFINED_DIR_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckpt {

// An owned file descriptor, closed when destroyed. Movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership; the object then holds no descriptor.
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// How OpenDirectoryBeneath resolves: kAuto uses openat2 and falls back to the walk when the
// kernel or a seccomp filter refuses openat2 itself; the others force one implementation (tests).
enum class BeneathResolver { kAuto, kOpenat2, kWalk };

// Opens directory `relative` (components separated by '/'; "" or "." is the root itself) beneath
// the directory `root_fd`, following symlinks only while they resolve beneath it. Returns the
// descriptor (O_RDONLY | O_DIRECTORY | O_CLOEXEC) or -errno: -EXDEV when the resolution would
// leave the root (including any absolute symlink and any "..", in the path or in a symlink,
// that would climb above it), -ENOENT, -ENOTDIR, -ELOOP (more than 40 symlinks), -EACCES, ...
// An absolute `relative` is -EXDEV. kOpenat2 returns -ENOSYS where openat2 is unavailable.
int OpenDirectoryBeneath(int root_fd, std::string_view relative,
                         BeneathResolver resolver = BeneathResolver::kAuto);

// Renames entry `from` of directory `from_dir` to `to` in `to_dir` without ever replacing an
// existing `to` (ALREADY_EXISTS): renameat2(RENAME_NOREPLACE), or, on a file system without it,
// linkat + unlinkat for a file and an existence check + renameat for a directory (there a
// directory created in between could still be replaced if empty). Neither name is followed if
// it is a symlink. `display` names the target in errors.
absl::Status RenameNoReplaceAt(int from_dir, const std::string& from, int to_dir,
                               const std::string& to, std::string_view display);

// Removes entry `name` of directory `dir_fd` and, if it is a directory, everything beneath it,
// never following a symlink (a symlink is removed itself). A missing entry is not an error.
// Returns the number of entries removed; errors name `display`. Trees deeper than 64 levels are
// refused (FAILED_PRECONDITION) rather than recursed into.
absl::StatusOr<int64_t> RemoveTreeAt(int dir_fd, const std::string& name, std::string_view display);

// fsync of an open directory (makes entries created or renamed in it durable).
absl::Status SyncDirectoryFd(int dir_fd, std::string_view display);

// A directory beneath which remote callers' paths are confined.
class ConfinedRoot {
 public:
  // Opens `root`, which must be an existing directory (symlinks in the configured path itself
  // are followed: it is the operator's choice). NOT_FOUND / FAILED_PRECONDITION naming it.
  static absl::StatusOr<std::unique_ptr<ConfinedRoot>> Open(const std::string& root);

  // The root as configured, and its canonical spelling (realpath at Open).
  const std::string& path() const { return path_; }
  const std::string& canonical_path() const { return canonical_; }
  int fd() const { return fd_.get(); }

  // A caller's path, normalised relative to the root: "a/b". A relative path is taken relative
  // to the root. An absolute path is accepted when it lies beneath the root as configured or in
  // its canonical spelling (it is then made relative), and is PERMISSION_DENIED otherwise. A ".."
  // component is PERMISSION_DENIED (also one that would stay inside: the rule is simple and a
  // caller never needs it); "." components and repeated or trailing '/' are dropped. A path
  // naming the root itself, an empty one, or one with a NUL character is INVALID_ARGUMENT.
  // Errors quote `path` as given, named `what` ("export_dir"), and never the root's location.
  // Lexical only: where the path leads is decided by the kernel when it is opened.
  absl::StatusOr<std::string> Normalize(std::string_view what, const std::string& path) const;

  // A location beneath the root: its parent directory, opened beneath the root, and its last
  // component (not resolved: it may be absent, a file, a directory or a symlink).
  struct Location {
    UniqueFd parent;
    std::string name;
  };
  // Opens the parent of `relative` (a Normalize result) beneath the root. Errors name `display`
  // (the caller's spelling) and never anything outside the root: PERMISSION_DENIED when the
  // parent's resolution would leave the root (or meets a symlink loop or a magic link),
  // FAILED_PRECONDITION when it does not exist or is not a directory.
  absl::StatusOr<Location> OpenParent(const std::string& relative, std::string_view what,
                                      std::string_view display) const;

 private:
  ConfinedRoot(std::string path, std::string canonical, UniqueFd fd)
      : path_(std::move(path)), canonical_(std::move(canonical)), fd_(std::move(fd)) {}

  const std::string path_;
  const std::string canonical_;
  const UniqueFd fd_;
};

}  // namespace ckpt

#endif  // CKPT_STORAGE_CONFINED_DIR_H_
