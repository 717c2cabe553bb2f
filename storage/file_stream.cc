#include "storage/file_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "storage/confined_dir.h"

namespace ckpt {
namespace {

// "dir" part of a path, for fsync after rename and for the temporary file's location.
std::string DirName(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string RandomSuffix() {
  // Not security-relevant: O_EXCL makes collisions safe; randomness only avoids retries when
  // several writers target the same path.
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%016x", rng());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// FileByteSource

FileByteSource::FileByteSource(std::string path, int fd, int64_t size)
    : path_(std::move(path)), fd_(fd), size_(size), buffer_(new char[kBufferBytes]) {}

FileByteSource::~FileByteSource() { ::close(fd_); }

absl::StatusOr<std::unique_ptr<FileByteSource>> FileByteSource::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, "open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoToStatus(err, "stat", path);
  }
  // open(2) succeeds on a directory; reading it would fail later with a less clear EISDIR.
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  }
  const int64_t size = S_ISREG(st.st_mode) ? static_cast<int64_t>(st.st_size) : -1;
  return std::unique_ptr<FileByteSource>(new FileByteSource(path, fd, size));
}

absl::StatusOr<size_t> FileByteSource::Read(char* buf, size_t n) {
  if (n == 0) return 0;
  if (buffer_pos_ == buffer_end_) {
    // Large reads go straight to the caller's memory: buffering would only add a copy.
    const bool direct = n >= kBufferBytes;
    char* target = direct ? buf : buffer_.get();
    const size_t want = direct ? n : kBufferBytes;
    ssize_t got;
    do {
      got = ::read(fd_, target, want);
    } while (got < 0 && errno == EINTR);
    if (got < 0) return ErrnoToStatus(errno, "read", path_);
    if (direct) return static_cast<size_t>(got);
    buffer_pos_ = 0;
    buffer_end_ = static_cast<size_t>(got);
    if (got == 0) return 0;
  }
  const size_t k = std::min(n, buffer_end_ - buffer_pos_);
  std::memcpy(buf, buffer_.get() + buffer_pos_, k);
  buffer_pos_ += k;
  return k;
}

std::optional<std::string> FileByteSource::Tail(size_t n) {
  if (size_ < 0) return std::nullopt;
  const auto k = static_cast<size_t>(std::min<int64_t>(size_, static_cast<int64_t>(n)));
  std::string out(k, '\0');
  // An error, or the file shrank: no answer.
  if (!PreadFully(fd_, out.data(), k, size_ - static_cast<int64_t>(k), path_).ok()) {
    return std::nullopt;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// AtomicFileSink

namespace {
// False when the environment variable CKPT_DIRECT_IO is 0, false, off or no (any case): the
// operator's way out of direct I/O on a file system where it is accepted but slow.
bool DirectIoAllowed() {
  const char* value = std::getenv("CKPT_DIRECT_IO");
  if (value == nullptr) return true;
  const std::string v = absl::AsciiStrToLower(value);
  return !(v == "0" || v == "false" || v == "off" || v == "no");
}
}  // namespace

AtomicFileSink::AtomicFileSink(std::string path, std::string temp_path, int fd, bool direct,
                               bool in_place, IoBuffer buffer)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      fd_(fd),
      direct_(direct),
      in_place_(in_place),
      buffer_(std::move(buffer)) {}

AtomicFileSink::~AtomicFileSink() {
  if (!committed_) Abandon();
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

absl::StatusOr<std::unique_ptr<AtomicFileSink>> AtomicFileSink::Create(const std::string& path,
                                                                       bool try_direct_io) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("invalid output file path \"", path, "\""));
  }
  struct stat st;
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a directory; cannot write a file there"));
  }
  const bool in_place = exists && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode));
  if (exists && !in_place && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is neither a regular file nor a character device or pipe; cannot write there"));
  }
  absl::StatusOr<IoBuffer> buffer = IoBuffer::Allocate(kBufferBytes);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(), absl::StrCat("the write buffer for ", path, ": ",
                                                             buffer.status().message()));
  }
  if (in_place) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoToStatus(errno, "open", path);
    return std::unique_ptr<AtomicFileSink>(new AtomicFileSink(
        path, path, fd, /*direct=*/false, /*in_place=*/true, *std::move(buffer)));
  }
  // A few attempts: O_EXCL fails only if a temp file of the same random name exists.
  int last_errno = EEXIST;
  std::string temp_path;
  for (int attempt = 0; attempt < 8; ++attempt) {
    temp_path = absl::StrCat(path, ".tmp.", RandomSuffix());
    const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      // Direct I/O is switched on after creating the file: a file system without it refuses
      // here (EINVAL) and the file is simply written through the page cache.
      const int flags = ::fcntl(fd, F_GETFL);
      const bool direct = try_direct_io && DirectIoAllowed() && flags >= 0 &&
                          ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
      return std::unique_ptr<AtomicFileSink>(new AtomicFileSink(
          path, std::move(temp_path), fd, direct, /*in_place=*/false, *std::move(buffer)));
    }
    last_errno = errno;
    if (last_errno != EEXIST) break;
  }
  return ErrnoToStatus(last_errno, "create", temp_path);
}

absl::StatusOr<std::unique_ptr<AtomicFileSink>> AtomicFileSink::CreateAt(int dir_fd,
                                                                         const std::string& name,
                                                                         const std::string& display,
                                                                         bool try_direct_io) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("invalid output file name \"", name, "\""));
  }
  absl::StatusOr<IoBuffer> buffer = IoBuffer::Allocate(kBufferBytes);
  if (!buffer.ok()) {
    return absl::Status(buffer.status().code(), absl::StrCat("the write buffer for ", display, ": ",
                                                             buffer.status().message()));
  }
  const int dir = ::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0);
  if (dir < 0) return ErrnoToStatus(errno, "open the directory of", display);
  int last_errno = EEXIST;
  std::string temp_name;
  for (int attempt = 0; attempt < 8; ++attempt) {
    temp_name = absl::StrCat(name, ".tmp.", RandomSuffix());
    const int fd = ::openat(dir, temp_name.c_str(),
                            O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) {
      const int flags = ::fcntl(fd, F_GETFL);
      const bool direct = try_direct_io && DirectIoAllowed() && flags >= 0 &&
                          ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
      std::unique_ptr<AtomicFileSink> sink(
          new AtomicFileSink(display, absl::StrCat(display, temp_name.substr(name.size())), fd,
                             direct, /*in_place=*/false, *std::move(buffer)));
      sink->dir_fd_ = dir;
      sink->name_ = name;
      sink->temp_name_ = std::move(temp_name);
      return sink;
    }
    last_errno = errno;
    if (last_errno != EEXIST) break;
  }
  ::close(dir);
  return ErrnoToStatus(last_errno, "create", absl::StrCat(display, temp_name.substr(name.size())));
}

bool AtomicFileSink::StopDirectIo() {
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_DIRECT) != 0) return false;
  direct_ = false;
  return true;
}

absl::Status AtomicFileSink::WriteAt(const char* data, size_t n, int64_t offset) {
  while (n > 0) {
    const ssize_t put =
        in_place_ ? ::write(fd_, data, n) : ::pwrite(fd_, data, n, static_cast<off_t>(offset));
    if (put < 0) {
      if (errno == EINTR) continue;
      // Direct I/O can still be refused per write (a device with larger blocks, a file system
      // that accepts the flag but not the request): go on through the page cache.
      if (errno == EINVAL && direct_ && StopDirectIo()) continue;
      return ErrnoToStatus(errno, "write", temp_path_);
    }
    data += put;
    n -= static_cast<size_t>(put);
    offset += put;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileSink::WriteAll(const char* data, size_t n) {
  CKPT_RETURN_IF_ERROR(WriteAt(data, n, file_bytes_));
  file_bytes_ += static_cast<int64_t>(n);
  if (!direct_ && !in_place_ && file_bytes_ - writeback_start_ >= kWritebackBytes) {
    // Only a hint: an I/O error it would see is reported by Commit's fsync.
    (void)::sync_file_range(fd_, writeback_start_, file_bytes_ - writeback_start_,
                            SYNC_FILE_RANGE_WRITE);
    writeback_start_ = file_bytes_;
  }
  return absl::OkStatus();
}

absl::Status AtomicFileSink::StartBackgroundWrite(size_t n) {
  CKPT_RETURN_IF_ERROR(FinishBackgroundWrite());  // spare_ is free from here on
  if (spare_.data() == nullptr) {
    absl::StatusOr<IoBuffer> spare = IoBuffer::Allocate(kBufferBytes);
    // Without a second buffer the sink still works, writing in the caller's thread.
    if (!spare.ok()) return WriteAll(buffer_.data(), n);
    spare_ = *std::move(spare);
  }
  aio_ = {};
  aio_.aio_fildes = fd_;
  aio_.aio_buf = buffer_.data();
  aio_.aio_nbytes = n;
  aio_.aio_offset = static_cast<off_t>(file_bytes_);
  aio_.aio_sigevent.sigev_notify = SIGEV_NONE;
  // EAGAIN (no resources for another request): write it here instead.
  if (::aio_write(&aio_) != 0) return WriteAll(buffer_.data(), n);
  writing_ = true;
  file_bytes_ += static_cast<int64_t>(n);
  std::swap(buffer_, spare_);
  return absl::OkStatus();
}

int AtomicFileSink::AwaitBackgroundWrite(ssize_t* put) {
  const struct aiocb* const list[] = {&aio_};
  int error;
  while ((error = ::aio_error(&aio_)) == EINPROGRESS) {
    (void)::aio_suspend(list, 1, nullptr);  // EINTR: check again
  }
  *put = ::aio_return(&aio_);
  writing_ = false;
  return error;
}

absl::Status AtomicFileSink::FinishBackgroundWrite() {
  if (!writing_) return absl::OkStatus();
  ssize_t put = 0;
  const int error = AwaitBackgroundWrite(&put);
  // spare_ holds the bytes written.
  const auto offset = static_cast<int64_t>(aio_.aio_offset);
  const size_t n = aio_.aio_nbytes;
  if (error == 0) {  // a short write (e.g. interrupted): the rest here
    const auto done = static_cast<size_t>(put);
    return WriteAt(spare_.data() + done, n - done, offset + static_cast<int64_t>(done));
  }
  if (error == EINVAL && direct_ && StopDirectIo()) return WriteAt(spare_.data(), n, offset);
  return ErrnoToStatus(error, "write", temp_path_);
}

absl::Status AtomicFileSink::FlushBuffer(bool last) {
  if (direct_ && !last && buffered_ > 0) {
    const size_t n = buffered_;
    buffered_ = 0;
    return StartBackgroundWrite(n);
  }
  CKPT_RETURN_IF_ERROR(FinishBackgroundWrite());
  if (buffered_ == 0) return absl::OkStatus();
  size_t n = buffered_;
  if (direct_ && n % kDirectAlign != 0) {
    // Only the last flush can end inside a block: pad it; Commit truncates the padding away.
    const size_t padded = (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    std::memset(buffer_.data() + n, 0, padded - n);
    n = padded;
  }
  buffered_ = 0;
  return WriteAll(buffer_.data(), n);
}

absl::Status AtomicFileSink::Write(std::string_view bytes) {
  if (committed_) {
    return absl::FailedPreconditionError(absl::StrCat("write to ", path_, " after Commit()"));
  }
  if (!status_.ok()) return status_;
  const auto size = static_cast<int64_t>(bytes.size());
  absl::Status s;
  if (!direct_ && bytes.size() >= kBypassBytes) {
    s = FlushBuffer(/*last=*/true);
    if (s.ok()) s = WriteAll(bytes.data(), bytes.size());
  } else {
    while (!bytes.empty() && s.ok()) {
      const size_t n = std::min(bytes.size(), kBufferBytes - buffered_);
      std::memcpy(buffer_.data() + buffered_, bytes.data(), n);
      buffered_ += n;
      bytes.remove_prefix(n);
      if (buffered_ == kBufferBytes) s = FlushBuffer(/*last=*/false);
    }
  }
  if (!s.ok()) {
    status_ = s;
    return s;
  }
  bytes_written_ += size;
  return absl::OkStatus();
}

absl::Status AtomicFileSink::Commit() {
  if (committed_) {
    return absl::FailedPreconditionError(absl::StrCat(path_, " was already committed"));
  }
  if (!status_.ok()) return status_;
  absl::Status s = FlushBuffer(/*last=*/true);
  if (in_place_) {  // a device or a pipe: nothing to sync or rename
    const int rc = ::close(fd_);
    fd_ = -1;
    if (s.ok() && rc != 0) s = ErrnoToStatus(errno, "close", path_);
    if (!s.ok()) {
      status_ = s;
      return s;
    }
    committed_ = true;
    return absl::OkStatus();
  }
  if (s.ok() && file_bytes_ != bytes_written_ && ::ftruncate(fd_, bytes_written_) != 0) {
    s = ErrnoToStatus(errno, "truncate", temp_path_);  // dropping the last block's padding
  }
  if (s.ok() && ::fsync(fd_) != 0) s = ErrnoToStatus(errno, "fsync", temp_path_);
  if (s.ok()) {
    // close() can report deferred write errors (e.g. on NFS), so it is checked.
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) s = ErrnoToStatus(errno, "close", temp_path_);
  }
  if (s.ok() && dir_fd_ >= 0) {
    s = RenameNoReplaceAt(dir_fd_, temp_name_, dir_fd_, name_, path_);
  } else if (s.ok() && ::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    s = ErrnoToStatus(errno, absl::StrCat("rename ", temp_path_, " to"), path_);
  }
  if (!s.ok()) {
    status_ = s;
    Abandon();
    return s;
  }
  committed_ = true;
  if (dir_fd_ >= 0) return SyncDirectoryFd(dir_fd_, path_);
  // Make the rename durable: without syncing the directory a crash may lose the new entry.
  const std::string dir = DirName(path_);
  return SyncDirectory(dir);
}

void AtomicFileSink::Abandon() {
  // A background write still reads spare_ and writes to fd_: wait for it (its result no longer
  // matters, and nothing more is written).
  ssize_t put = 0;
  if (writing_) (void)AwaitBackgroundWrite(&put);
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  // Best effort: it may already be gone.
  if (dir_fd_ >= 0) {
    ::unlinkat(dir_fd_, temp_name_.c_str(), 0);
  } else if (!in_place_) {
    ::unlink(temp_path_.c_str());
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes) {
  absl::StatusOr<std::unique_ptr<FileByteSource>> source = FileByteSource::Open(path);
  if (!source.ok()) return source.status();
  auto too_large = [&](std::string_view size_text) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is ", Sv(size_text),
                                                   " bytes, larger than the limit of ", max_bytes,
                                                   " bytes for this kind of file"));
  };
  if ((*source)->size() > max_bytes) return too_large(absl::StrCat((*source)->size()));
  std::string out;
  if ((*source)->size() > 0) out.reserve(static_cast<size_t>((*source)->size()));
  char chunk[64 * 1024];
  for (;;) {
    absl::StatusOr<size_t> got = (*source)->Read(chunk, sizeof(chunk));
    if (!got.ok()) return got.status();
    if (*got == 0) break;
    out.append(chunk, *got);
    // The file may have grown since it was opened, or not be a regular file at all.
    if (static_cast<int64_t>(out.size()) > max_bytes) {
      return too_large(absl::StrCat("more than ", max_bytes));
    }
  }
  return out;
}

absl::StatusOr<int64_t> FreeDiskBytes(const std::string& dir) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) return ErrnoToStatus(errno, "statvfs", dir);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(st.f_bavail), static_cast<uint64_t>(st.f_frsize),
                             &bytes) ||
      bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return std::numeric_limits<int64_t>::max();
  }
  return static_cast<int64_t>(bytes);
}

}  // namespace ckpt
