// POSIX file implementations of core's ByteSource/ByteSink, plus small file helpers shared by the
// client (ckptctl upload/download) and the server (imports, exports). Errors carry the path and
// the system's reason, with the codes ErrnoToStatus (posix_io.h) gives them.
#ifndef CKPT_STORAGE_FILE_STREAM_H_
#define CKPT_STORAGE_FILE_STREAM_H_

#include <aio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/byte_stream.h"
#include "storage/io_buffer.h"
#include "storage/posix_io.h"

namespace ckpt {

// Reads a file sequentially through a 1 MiB buffer (reads at least that large bypass it).
// Owns its descriptor. Not thread-safe.
class FileByteSource final : public ByteSource {
 public:
  // NOT_FOUND / PERMISSION_DENIED from open, INVALID_ARGUMENT for a directory; messages name the
  // path and the system's reason.
  static absl::StatusOr<std::unique_ptr<FileByteSource>> Open(const std::string& path);

  ~FileByteSource() override;
  FileByteSource(const FileByteSource&) = delete;
  FileByteSource& operator=(const FileByteSource&) = delete;

  absl::StatusOr<size_t> Read(char* buf, size_t n) override;
  std::string Describe() const override { return path_; }
  // Read with pread at the size the file had when opened; nullopt for a non-regular file.
  std::optional<std::string> Tail(size_t n) override;

  // Size of the file when opened, or -1 when it is not a regular file (a pipe, a device).
  int64_t size() const { return size_; }

 private:
  FileByteSource(std::string path, int fd, int64_t size);

  static constexpr size_t kBufferBytes = size_t{1} << 20;

  std::string path_;
  int fd_;
  int64_t size_;
  std::unique_ptr<char[]> buffer_;
  size_t buffer_pos_ = 0;
  size_t buffer_end_ = 0;
};

// Writes `path` atomically: bytes go to `<path>.tmp.<random>` in the same directory, and Commit()
// flushes, fsyncs, renames over `path` and fsyncs the directory, so readers see either the old
// file or the complete new one, also after a crash. Destroying the sink without a successful
// Commit() removes the temporary file and leaves `path` untouched. Owns its descriptor. Not
// thread-safe.
//
// Bytes are collected in a 4 MiB IoBuffer (huge pages where available) and written with direct I/O
// (O_DIRECT) where the file system allows it: the disk then reads them straight from the buffer,
// instead of the kernel copying every byte into freshly allocated page-cache pages and writing
// those back at the fsync (for multi-GiB outputs that copy cost more CPU than producing the bytes).
// A full buffer is written in the background (POSIX AIO) while a second one fills, so that the disk
// is not idle while the caller copies the next 4 MiB; a file smaller than two buffers never
// allocates the second. An error of a background write is returned by the Write that fills the next
// buffer, or by Commit. The last block is padded and the file truncated to its exact size. Where
// direct I/O is refused (tmpfs, some network file systems, unusual block sizes), or the environment
// sets CKPT_DIRECT_IO=0, the sink writes through the page cache instead, in the caller's thread,
// and starts the writeback as it goes.
//
// When `path` is a character device or a pipe (/dev/null, /dev/stdout, a named pipe) the bytes are
// written to it in place: renaming a file over it would replace the device node or the pipe.
class AtomicFileSink final : public ByteSink {
 public:
  // Creates the temporary file (mode 0666 minus umask). Errors name the temporary path.
  // `try_direct_io` false always writes through the page cache. INVALID_ARGUMENT when `path` is
  // a directory, a block device or a socket.
  static absl::StatusOr<std::unique_ptr<AtomicFileSink>> Create(const std::string& path,
                                                                bool try_direct_io = true);
  // The same for entry `name` of the open directory `dir_fd` (duplicated; the caller keeps its
  // own): the temporary file is created in that directory and Commit() publishes it there with
  // renameat2(RENAME_NOREPLACE), so no path is resolved again, a symlink is never followed and an
  // existing `name` is never replaced (ALREADY_EXISTS). `display` names the file in errors (the
  // temporary file as `display`.tmp.<random>).
  static absl::StatusOr<std::unique_ptr<AtomicFileSink>> CreateAt(int dir_fd,
                                                                  const std::string& name,
                                                                  const std::string& display,
                                                                  bool try_direct_io = true);

  ~AtomicFileSink() override;
  AtomicFileSink(const AtomicFileSink&) = delete;
  AtomicFileSink& operator=(const AtomicFileSink&) = delete;

  // RESOURCE_EXHAUSTED when the disk is full. After a failed write every later Write/Commit
  // returns that error again (the output would have a hole); FAILED_PRECONDITION after Commit().
  absl::Status Write(std::string_view bytes) override;
  // Publishes the file. On failure the temporary file is removed and the sink is unusable.
  absl::Status Commit();

  const std::string& path() const { return path_; }
  // The file being written: `path` itself for a device or a pipe.
  const std::string& temp_path() const { return temp_path_; }
  // Whether `path` is a device or a pipe written in place.
  bool in_place() const { return in_place_; }
  // Bytes accepted by Write so far.
  int64_t bytes_written() const { return bytes_written_; }
  // Whether the file is being written with direct I/O (false after a fallback).
  bool direct_io() const { return direct_; }

 private:
  AtomicFileSink(std::string path, std::string temp_path, int fd, bool direct, bool in_place,
                 IoBuffer buffer);

  // Writes out the buffer: with direct I/O and `last` false in the background (the buffer is then
  // full, a whole number of blocks), else at once, after any background write; with direct I/O
  // the last flush pads the last block.
  absl::Status FlushBuffer(bool last);
  // Writes `n` bytes at file_bytes_ (a device or a pipe: at its position) and advances it.
  absl::Status WriteAll(const char* data, size_t n);
  // Writes `n` bytes at `offset` (in place: at the position), switching to buffered I/O where a
  // direct write is refused.
  absl::Status WriteAt(const char* data, size_t n, int64_t offset);
  // Starts writing the full buffer's `n` bytes in the background and swaps in the spare buffer.
  absl::Status StartBackgroundWrite(size_t n);
  // Waits for the background write, if any, and returns its error (a short write's rest is
  // written here).
  absl::Status FinishBackgroundWrite();
  // Waits for the background write (writing_ must be true) and ends it: its errno value (0 when
  // it wrote), and in *put what aio_return gave.
  int AwaitBackgroundWrite(ssize_t* put);
  // Switches the descriptor to buffered I/O (direct I/O refused a write).
  bool StopDirectIo();
  void Abandon();  // closes and unlinks the temporary file (never `path` written in place)

  static constexpr size_t kBufferBytes = size_t{4} << 20;
  // Alignment of direct I/O buffers, offsets and sizes: the largest logical block size in use.
  static constexpr size_t kDirectAlign = 4096;
  // Without direct I/O, writes at least this large bypass the buffer (a copy into it would cost
  // more than the extra write call).
  static constexpr size_t kBypassBytes = size_t{64} << 10;
  // Without direct I/O, written bytes are handed to the kernel's writeback (sync_file_range)
  // every this many, so that the disk writes while the file is still being produced and the
  // fsync finds little left to do.
  static constexpr int64_t kWritebackBytes = int64_t{8} << 20;

  std::string path_;
  std::string temp_path_;
  int fd_;
  bool direct_;
  const bool in_place_;
  IoBuffer buffer_;  // kBufferBytes, kDirectAlign-aligned: the one being filled
  IoBuffer spare_;   // the other: being written in the background, or free; allocated on first use
  // The background write of spare_ (direct I/O only), while writing_.
  struct aiocb aio_ = {};
  bool writing_ = false;
  size_t buffered_ = 0;
  int64_t bytes_written_ = 0;
  int64_t file_bytes_ = 0;       // written to fd_ (with direct I/O: including padding)
  int64_t writeback_start_ = 0;  // file_bytes_ at the last sync_file_range
  bool committed_ = false;
  absl::Status status_;  // first error; sticky
  // CreateAt only: the directory (owned) and the entry names in it; -1 for a path-based sink.
  int dir_fd_ = -1;
  std::string name_;
  std::string temp_name_;
};

// Reads a whole small file (strategy files, JSON). INVALID_ARGUMENT when it is larger than
// `max_bytes`, besides the errors of FileByteSource::Open.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, int64_t max_bytes);

// Bytes available to unprivileged users on the file system holding `dir` (statvfs f_bavail).
absl::StatusOr<int64_t> FreeDiskBytes(const std::string& dir);

}  // namespace ckpt

#endif  // CKPT_STORAGE_FILE_STREAM_H_
