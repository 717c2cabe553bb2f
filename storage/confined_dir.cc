#include "storage/confined_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "storage/posix_io.h"

namespace ckpt {
namespace {

constexpr int kDirFlags = O_RDONLY | O_DIRECTORY | O_CLOEXEC;
constexpr int kMaxSymlinks = 40;  // as the kernel's own path walk
constexpr int kMaxRemoveDepth = 64;

// The non-empty '/'-separated components of `path`.
std::vector<std::string> Components(std::string_view path) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (end > start) out.emplace_back(path.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Set once openat2 was seen to be unavailable, so that later calls go straight to the walk.
std::atomic<bool> openat2_unavailable{false};

int OpenWithOpenat2(int root_fd, std::string_view relative) {
  struct open_how how = {};
  how.flags = kDirFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  const std::string path = relative.empty() ? std::string(".") : std::string(relative);
  for (int attempt = 0;; ++attempt) {
    const long fd = ::syscall(SYS_openat2, root_fd, path.c_str(), &how, sizeof(how));
    if (fd >= 0) return static_cast<int>(fd);
    // EAGAIN: a concurrent rename or mount made the kernel unsure the walk stayed beneath; the
    // call is simply retried (a persistent one is reported).
    if ((errno == EAGAIN || errno == EINTR) && attempt < 16) continue;
    return -errno;
  }
}

// The walk: one component at a time, each opened with O_NOFOLLOW relative to the directory
// before it; a symlink met on the way is read and its components are resolved in its place, an
// absolute one or a ".." above the root being -EXDEV (RESOLVE_BENEATH's rule).
int OpenWithWalk(int root_fd, std::string_view relative) {
  std::vector<UniqueFd> stack;
  {
    const int root = ::fcntl(root_fd, F_DUPFD_CLOEXEC, 0);
    if (root < 0) return -errno;
    stack.emplace_back(root);
  }
  std::deque<std::string> pending;
  for (std::string& c : Components(relative)) pending.push_back(std::move(c));
  int symlinks = 0;
  while (!pending.empty()) {
    const std::string c = std::move(pending.front());
    pending.pop_front();
    if (c == ".") continue;
    if (c == "..") {
      if (stack.size() == 1) return -EXDEV;
      stack.pop_back();
      continue;
    }
    const int fd = ::openat(stack.back().get(), c.c_str(), kDirFlags | O_NOFOLLOW);
    if (fd >= 0) {
      stack.emplace_back(fd);
      continue;
    }
    const int err = errno;
    if (err != ELOOP && err != ENOTDIR) return -err;
    // O_NOFOLLOW|O_DIRECTORY on a symlink gives ELOOP or ENOTDIR: see whether it is one.
    struct stat st;
    if (::fstatat(stack.back().get(), c.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return -errno;
    if (!S_ISLNK(st.st_mode)) return -ENOTDIR;
    if (++symlinks > kMaxSymlinks) return -ELOOP;
    char target[PATH_MAX];
    const ssize_t n = ::readlinkat(stack.back().get(), c.c_str(), target, sizeof(target));
    if (n < 0) return -errno;
    if (n == 0) return -ENOENT;
    if (static_cast<size_t>(n) >= sizeof(target)) return -ENAMETOOLONG;
    if (target[0] == '/') return -EXDEV;
    const std::vector<std::string> parts =
        Components(std::string_view(target, static_cast<size_t>(n)));
    pending.insert(pending.begin(), parts.begin(), parts.end());
  }
  return stack.back().release();
}

absl::StatusOr<int64_t> RemoveTreeAtDepth(int dir_fd, const std::string& name,
                                          std::string_view display, int depth) {
  if (::unlinkat(dir_fd, name.c_str(), 0) == 0) return 1;
  if (errno == ENOENT) return 0;
  if (errno != EISDIR && errno != EPERM) return ErrnoToStatus(errno, "remove", display);
  if (depth >= kMaxRemoveDepth) {
    return absl::FailedPreconditionError(absl::StrCat("not removing ", Sv(display), ": more than ",
                                                      kMaxRemoveDepth, " levels deep"));
  }
  const int fd = ::openat(dir_fd, name.c_str(), kDirFlags | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    return ErrnoToStatus(errno, "open", display);
  }
  UniqueFd dir(fd);
  const int list_fd = ::fcntl(dir.get(), F_DUPFD_CLOEXEC, 0);
  if (list_fd < 0) return ErrnoToStatus(errno, "open", display);
  DIR* d = ::fdopendir(list_fd);
  if (d == nullptr) {
    const int err = errno;
    ::close(list_fd);
    return ErrnoToStatus(err, "list", display);
  }
  std::vector<std::string> entries;
  errno = 0;
  while (struct dirent* ent = ::readdir(d)) {
    const std::string_view n = ent->d_name;
    if (n != "." && n != "..") entries.emplace_back(n);
  }
  ::closedir(d);
  int64_t removed = 0;
  for (const std::string& entry : entries) {
    auto sub =
        RemoveTreeAtDepth(dir.get(), entry, absl::StrCat(Sv(display), "/", entry), depth + 1);
    if (!sub.ok()) return sub.status();
    removed += *sub;
  }
  if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "remove", display);
  }
  return removed + 1;
}

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

int OpenDirectoryBeneath(int root_fd, std::string_view relative, BeneathResolver resolver) {
  if (!relative.empty() && relative.front() == '/') return -EXDEV;
  if (relative.find('\0') != std::string_view::npos) return -EINVAL;
  if (resolver == BeneathResolver::kWalk) return OpenWithWalk(root_fd, relative);
  if (resolver == BeneathResolver::kOpenat2 || !openat2_unavailable.load()) {
    const int fd = OpenWithOpenat2(root_fd, relative);
    if (resolver == BeneathResolver::kOpenat2) return fd;
    // ENOSYS: an old kernel. EPERM: a seccomp filter that does not know openat2 (opening a
    // directory read-only is otherwise not refused with EPERM); the walk then gives the answer.
    if (fd != -ENOSYS && fd != -EPERM) return fd;
    if (fd == -ENOSYS) openat2_unavailable = true;
  }
  return OpenWithWalk(root_fd, relative);
}

absl::Status RenameNoReplaceAt(int from_dir, const std::string& from, int to_dir,
                               const std::string& to, std::string_view display) {
  if (::renameat2(from_dir, from.c_str(), to_dir, to.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  if (errno == EEXIST) {
    return absl::AlreadyExistsError(absl::StrCat(Sv(display), " already exists; not replaced"));
  }
  if (errno != EINVAL && errno != ENOSYS) return ErrnoToStatus(errno, "rename to", display);
  struct stat st;
  if (::fstatat(from_dir, from.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return ErrnoToStatus(errno, "rename to", display);
  }
  if (!S_ISDIR(st.st_mode)) {
    // link(2) refuses an existing target atomically.
    if (::linkat(from_dir, from.c_str(), to_dir, to.c_str(), 0) != 0) {
      if (errno == EEXIST) {
        return absl::AlreadyExistsError(absl::StrCat(Sv(display), " already exists; not replaced"));
      }
      return ErrnoToStatus(errno, "link to", display);
    }
    if (::unlinkat(from_dir, from.c_str(), 0) != 0)
      return ErrnoToStatus(errno, "rename to", display);
    return absl::OkStatus();
  }
  if (::fstatat(to_dir, to.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) {
    return absl::AlreadyExistsError(absl::StrCat(Sv(display), " already exists; not replaced"));
  }
  if (::renameat(from_dir, from.c_str(), to_dir, to.c_str()) != 0) {
    return ErrnoToStatus(errno, "rename to", display);
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RemoveTreeAt(int dir_fd, const std::string& name,
                                     std::string_view display) {
  return RemoveTreeAtDepth(dir_fd, name, display, 0);
}

absl::Status SyncDirectoryFd(int dir_fd, std::string_view display) {
  if (::fsync(dir_fd) != 0) return ErrnoToStatus(errno, "fsync directory", display);
  return absl::OkStatus();
}

// ------------------------------------------------------------------------------- ConfinedRoot

absl::StatusOr<std::unique_ptr<ConfinedRoot>> ConfinedRoot::Open(const std::string& root) {
  if (root.empty()) return absl::InvalidArgumentError("the export root is an empty path");
  const int fd = ::open(root.c_str(), kDirFlags);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("export root ", root, " is not a directory"));
    }
    return ErrnoToStatus(err, "open export root", root);
  }
  UniqueFd dir(fd);
  char* real = ::realpath(root.c_str(), nullptr);
  if (real == nullptr) return ErrnoToStatus(errno, "resolve export root", root);
  std::string canonical(real);
  ::free(real);
  std::string configured = root;
  while (configured.size() > 1 && configured.back() == '/') configured.pop_back();
  return std::unique_ptr<ConfinedRoot>(
      new ConfinedRoot(std::move(configured), std::move(canonical), std::move(dir)));
}

absl::StatusOr<std::string> ConfinedRoot::Normalize(std::string_view what,
                                                    const std::string& path) const {
  auto quoted = [&] { return absl::StrCat(Sv(what), " \"", path, "\""); };
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " contains a NUL character"));
  }
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(Sv(what), " is empty"));
  std::string_view rest = path;
  if (rest.front() == '/') {
    // Beneath the root in either spelling: what follows it, after a '/', is the relative path.
    auto strip = [&](const std::string& base) {
      if (base == "/") return true;  // a root of "/" contains everything
      if (rest.substr(0, base.size()) != base) return false;
      if (rest.size() > base.size() && rest[base.size()] != '/') return false;
      rest.remove_prefix(base.size());
      return true;
    };
    if (!strip(path_) && !strip(canonical_)) {
      return absl::PermissionDeniedError(absl::StrCat(
          quoted(), " is outside the server's export root; give a path relative to it"));
    }
  }
  std::string out;
  for (const std::string& c : Components(rest)) {
    if (c == ".") continue;
    if (c == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat(quoted(), " contains \"..\"; paths stay beneath the server's export root"));
    }
    if (!out.empty()) out.push_back('/');
    out.append(c);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(quoted(), " names the export root itself; name a new entry beneath it"));
  }
  return out;
}

absl::StatusOr<ConfinedRoot::Location> ConfinedRoot::OpenParent(const std::string& relative,
                                                                std::string_view what,
                                                                std::string_view display) const {
  const size_t slash = relative.find_last_of('/');
  const std::string parent = slash == std::string::npos ? std::string() : relative.substr(0, slash);
  Location loc;
  loc.name = slash == std::string::npos ? relative : relative.substr(slash + 1);
  const int fd = OpenDirectoryBeneath(fd_.get(), parent);
  if (fd >= 0) {
    loc.parent = UniqueFd(fd);
    return loc;
  }
  const std::string quoted = absl::StrCat(Sv(what), " \"", Sv(display), "\"");
  switch (-fd) {
    case EXDEV:
      return absl::PermissionDeniedError(absl::StrCat(
          quoted, " leads outside the server's export root (through a symlink); refused"));
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat(quoted, " goes through a symlink loop or a /proc magic link; refused"));
    case ENOENT:
      return absl::FailedPreconditionError(
          absl::StrCat("the parent directory of ", quoted, " does not exist in the export root"));
    case ENOTDIR:
      return absl::FailedPreconditionError(
          absl::StrCat("the parent of ", quoted, " is not a directory"));
    default:
      return ErrnoToStatus(-fd, "open the parent directory of", quoted);
  }
}

}  // namespace ckpt
