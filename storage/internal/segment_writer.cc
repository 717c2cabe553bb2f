#include "storage/internal/segment_writer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "storage/file_stream.h"
#include "storage/io_buffer.h"

namespace ckpt::segment_internal {
namespace {

constexpr std::string_view kSuffix = ".seg";
constexpr size_t kHexDigits = 16;
// Windows registered since the last sweep of expired entries from the window index.
constexpr int64_t kSweepEvery = 1024;
// Free write-block buffers kept for reuse (BlockBuffers).
constexpr size_t kKeptBlockBuffers = 16;
// Open blocks of one file no append is using, beyond which the least recently appended to are
// written as far as they are filled: a lane's last block stays open until the lane appends past
// it, which the lane of a finished upload stream never does, and a checkpoint may have thousands.
constexpr size_t kMaxIdleBlocks = 16;

// Bytes of units [first, last] (of `unit` bytes each) of a window of `length` bytes, the last
// clipped to the window's end.
int64_t UnitsBytes(int64_t length, int64_t unit, int64_t first, int64_t last) {
  return std::min(length, (last + 1) * unit) - first * unit;
}

// `at`, or the next window boundary when `n` bytes (at most a window) at `at` would straddle
// one: Append never lets a piece or an extent of at most a window cross a window boundary.
int64_t NotStraddlingWindow(int64_t at, int64_t n, int64_t window) {
  return n <= window && at / window != (at + n - 1) / window ? (at / window + 1) * window : at;
}

int64_t PageBytes() {
  static const int64_t page = sysconf(_SC_PAGESIZE) > 0 ? sysconf(_SC_PAGESIZE) : 4096;
  return page;
}

absl::Status Errno(std::string_view op, const std::string& path) {
  return ErrnoToStatus(errno, op, path);
}

// `status` with `what: ` in front (unchanged when `what` is empty).
absl::Status Prefixed(std::string_view what, const absl::Status& status) {
  if (what.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(Sv(what), ": ", status.message()));
}

// A view of a window (or of nothing, for an empty chunk) that keeps the window mapped.
class MappedChunk final : public ChunkData {
 public:
  MappedChunk() = default;
  MappedChunk(std::shared_ptr<const void> window, std::string_view bytes)
      : window_(std::move(window)), bytes_(bytes) {}
  std::string_view bytes() const override { return bytes_; }

 private:
  std::shared_ptr<const void> window_;
  std::string_view bytes_;
};

// A chunk read into memory of its own (pread).
class HeapChunk final : public ChunkData {
 public:
  explicit HeapChunk(size_t size) : bytes_(new char[size]), size_(size) {}
  char* data() { return bytes_.get(); }
  size_t size() const { return size_; }
  std::string_view bytes() const override { return std::string_view(bytes_.get(), size_); }

 private:
  std::unique_ptr<char[]> bytes_;
  size_t size_;
};

}  // namespace

std::string SegmentFileName(uint64_t data_id) {
  return absl::StrFormat("%016x%s", data_id, kSuffix);
}

// The memory of write blocks: IoBuffers (mapped, 2 MiB-aligned huge pages where available, so
// that a block's direct write reaches the disk as one request, not three), not taken from malloc
// (blocks are filled and freed on whichever threads append, and 2 MiB pieces of malloc's
// per-thread arenas kept ckptd ~150 MiB larger after uploads with several lanes), and reused: up
// to `keep` free buffers stay mapped, so that a busy upload does not fault in fresh pages for
// every block. Thread-safe.
class SegmentFiles::BlockBuffers {
 public:
  BlockBuffers(size_t bytes, size_t keep) : bytes_(bytes), keep_(keep) {}
  // Page-aligned (direct I/O needs the logical block size); throws std::bad_alloc.
  IoBuffer Get() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        IoBuffer b = std::move(free_.back());
        free_.pop_back();
        return b;
      }
    }
    absl::StatusOr<IoBuffer> b = IoBuffer::Allocate(bytes_);
    if (!b.ok()) throw std::bad_alloc();
    return *std::move(b);
  }
  void Put(IoBuffer b) {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.size() < keep_) free_.push_back(std::move(b));
    // Otherwise b is unmapped here.
  }

 private:
  const size_t bytes_;
  const size_t keep_;
  std::mutex mu_;
  std::vector<IoBuffer> free_;  // guarded by mu_
};

// A write block (SegmentOptions::write_block_bytes) whose bytes are gathered in memory.
struct SegmentFiles::Block {
  Block(std::shared_ptr<BlockBuffers> pool, int64_t start, int64_t at)
      : start(start),
        lo(at),
        hi(at),
        pool(std::move(pool)),
        buffer(this->pool->Get()) {}
  ~Block() { pool->Put(std::move(buffer)); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  const int64_t start;      // file offset of buffer.data()[0], a multiple of the block size
  int64_t lo, hi;           // the appended bytes in it: [lo, hi) (holes inside are zeroed)
  const std::shared_ptr<BlockBuffers> pool;
  IoBuffer buffer;          // from pool, returned to it; page-aligned, for direct I/O
  int copying = 0;          // appends copying pieces into it now
  uint64_t last_append = 0;  // File::appends when an append last placed bytes in it
  bool closed = false;      // nothing more can be appended to it (or Sync wants it written)
  bool writing = false;     // an append or Sync is writing it (it stays readable until written)
};

// Where one lane (SegmentFiles::Append) appends: the rest of its current extent.
struct SegmentFiles::Lane {
  int64_t at = 0;                             // next free offset
  int64_t extent_start = 0, extent_end = 0;   // its extent; empty before its first append
  int64_t next_extent = 0;                    // bytes of its next extent (0: one block)
};

struct SegmentFiles::File {
  std::string path;
  int fd = -1;
  // Whole blocks are written through this descriptor (O_DIRECT) where the file system allows.
  int direct_fd = -1;
  std::atomic<bool> use_direct{true};
  bool writable = false;
  std::mutex mu;               // guards end, lanes, blocks, write_error and buffered_bytes
  int64_t end = 0;             // the end of the last extent given out (writable files)
  std::map<uint32_t, Lane> lanes;
  int64_t buffered_bytes = 0;  // written through the page cache since the last write-behind
  uint64_t appends = 0;        // Append calls so far (Block::last_append)
  std::atomic<int64_t> size{0};  // bytes known to exist, so mappable without SIGBUS
  // Blocks whose bytes are not all written yet, by start offset; how many (read without mu:
  // none means no read needs them, since a block only ever holds bytes appended after it).
  std::map<int64_t, std::shared_ptr<Block>> blocks;
  std::atomic<int64_t> block_count{0};
  absl::Status write_error;  // the first failed write: every later append, sync and read fails
  std::atomic<bool> failed{false};  // write_error is set (read without mu)
  std::condition_variable written;  // a block was written (or failed to be)
  void Fail(const absl::Status& s) {  // mu held
    if (!write_error.ok()) return;
    write_error = s;
    failed.store(true);
  }

  ~File() {
    if (fd >= 0) ::close(fd);
    if (direct_fd >= 0) ::close(direct_fd);
  }
  void NoteSize(int64_t at_least) {
    int64_t known = size.load(std::memory_order_relaxed);
    while (known < at_least && !size.compare_exchange_weak(known, at_least)) {
    }
  }
};

struct SegmentFiles::Window {
  void* addr = nullptr;
  size_t length = 0;
  int64_t start = 0;  // file offset of addr
  uint64_t data_id = 0;

  // Units (SegmentFiles::unit_bytes_) whose pages were mapped (MADV_POPULATE_READ): bit i is
  // [i * unit, (i + 1) * unit) of the window. Set under populate_mu; read without it.
  std::atomic<uint64_t> populated{0};
  std::mutex populate_mu;
  // Bytes charged to the budget for its populated units (added to under populate_mu; read by
  // MakeRoomLocked only once no chunk holds the window).
  std::atomic<int64_t> charged{0};
  // SegmentFiles::window_bytes_, shared: a chunk read may outlive the SegmentFiles it came from.
  std::shared_ptr<std::atomic<int64_t>> budget;

  // Bytes of units [first, last] of the window, the last clipped to its length.
  int64_t UnitBytes(int64_t unit, int64_t first, int64_t last) const {
    return UnitsBytes(static_cast<int64_t>(length), unit, first, last);
  }

  ~Window() {
    if (addr != nullptr) ::munmap(addr, length);
    if (budget != nullptr) budget->fetch_sub(charged.load(), std::memory_order_relaxed);
  }
};

absl::StatusOr<std::unique_ptr<SegmentFiles>> SegmentFiles::Open(std::string dir,
                                                                  SegmentOptions options) {
  if (options.window_bytes <= 0 || options.window_bytes % PageBytes() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("segment window of ", options.window_bytes,
                                                   " bytes is not a multiple of the page size (",
                                                   PageBytes(), ")"));
  }
  if (options.write_block_bytes <= 0 || options.write_block_bytes % PageBytes() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("segment write block of ",
                                                   options.write_block_bytes,
                                                   " bytes is not a multiple of the page size (",
                                                   PageBytes(), ")"));
  }
  // Extents (the larger of the two) then hold whole blocks and whole windows.
  if (options.window_bytes % options.write_block_bytes != 0 &&
      options.write_block_bytes % options.window_bytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "segment window of ", options.window_bytes, " bytes and write block of ",
        options.write_block_bytes, " bytes: one must be a multiple of the other"));
  }
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "create directory", dir);
  return std::unique_ptr<SegmentFiles>(new SegmentFiles(std::move(dir), options));
}

namespace {

// The unit windows are populated and charged in: a write block (the folio size a window maps
// with one page-table entry) where a window holds a whole number of them, at most 64; else the
// window.
int64_t PopulateUnit(const SegmentOptions& o) {
  const int64_t b = o.write_block_bytes;
  const int64_t w = o.window_bytes;
  return b < w && w % b == 0 && w / b <= 64 ? b : w;
}

}  // namespace

SegmentFiles::SegmentFiles(std::string dir, SegmentOptions options)
    : dir_(std::move(dir)),
      options_(options),
      unit_bytes_(PopulateUnit(options)),
      block_buffers_(std::make_shared<BlockBuffers>(static_cast<size_t>(options.write_block_bytes),
                                                    kKeptBlockBuffers)) {}

SegmentFiles::~SegmentFiles() = default;

std::string SegmentFiles::PathOf(uint64_t data_id) const {
  return absl::StrCat(dir_, "/", SegmentFileName(data_id));
}

absl::StatusOr<std::shared_ptr<SegmentFiles::File>> SegmentFiles::GetFile(uint64_t data_id,
                                                                          bool create) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = files_.find(data_id);
  if (it != files_.end()) {
    if (create && !it->second->writable) {
      return absl::FailedPreconditionError(absl::StrCat("segment file ", it->second->path,
                                                        " of data id ", data_id,
                                                        " is being read, not written"));
    }
    return it->second;
  }
  auto file = std::make_shared<File>();
  file->path = PathOf(data_id);
  file->writable = create;
  // A new data id never had a file; O_TRUNC only guards against a stray one.
  file->fd = create ? ::open(file->path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)
                    : ::open(file->path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file->fd < 0) {
    if (!create && errno == ENOENT) {
      return absl::DataLossError(absl::StrCat("segment file ", file->path, " of data id ",
                                              data_id, " is missing"));
    }
    return Errno(create ? "create" : "open", file->path);
  }
  if (create && options_.direct_writes) {
    // -1 where the file system refuses direct I/O: every block then goes through the page cache.
    file->direct_fd = ::open(file->path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
  }
  if (!create) {
    struct stat st;
    if (::fstat(file->fd, &st) != 0) return Errno("stat", file->path);
    file->size.store(st.st_size);
  }
  files_.emplace(data_id, file);
  return file;
}

namespace {

// Writes all `n` bytes at `at` (pwrite until done).
absl::Status WriteAll(int fd, const std::string& path, const char* bytes, int64_t n, int64_t at) {
  while (n > 0) {
    const ssize_t written = ::pwrite(fd, bytes, static_cast<size_t>(n), at);
    if (written < 0) {
      if (errno == EINTR) continue;
      return Errno("write", path);
    }
    bytes += written;
    n -= written;
    at += written;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint64_t>> SegmentFiles::Append(
    uint64_t data_id, const std::vector<std::string_view>& pieces, uint32_t lane_id) {
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<File> file, GetFile(data_id, /*create=*/true));
  const int64_t w = options_.window_bytes;
  const int64_t b = options_.write_block_bytes;
  const int64_t e = ExtentBytes();
  std::vector<uint64_t> offsets;
  offsets.reserve(pieces.size());
  // Bytes of pieces to copy into blocks.
  struct Copy {
    Block* block;
    int64_t at;  // file offset
    std::string_view bytes;
  };
  std::vector<Copy> copies;
  std::vector<std::shared_ptr<Block>> touched;  // the blocks copies go to
  std::vector<std::shared_ptr<Block>> ready;    // blocks to write
  {
    std::lock_guard<std::mutex> lock(file->mu);
    if (!file->write_error.ok()) return file->write_error;
    CKPT_RETURN_IF_ERROR(WriteIdleBlocksLocked(*file));
    const uint64_t append = ++file->appends;
    // Closes the blocks in [from, to) that are still open: nothing more goes into them. Those
    // no append is copying into are written by this one.
    auto close_blocks = [&](int64_t from, int64_t to) {
      for (auto it = file->blocks.lower_bound(from / b * b);
           it != file->blocks.end() && it->first < to; ++it) {
        Block& block = *it->second;
        if (block.closed) continue;
        block.closed = true;
        if (block.copying == 0) {
          block.writing = true;
          ready.push_back(it->second);
        }
      }
    };
    // Copies `n` bytes of `piece` to `at` onwards through the blocks that hold them.
    auto place = [&](std::string_view piece, int64_t at) {
      const auto n = static_cast<int64_t>(piece.size());
      for (int64_t done = 0; done < n;) {
        const int64_t block_start = at / b * b;
        auto found = file->blocks.find(block_start);
        if (found == file->blocks.end()) {
          // Made before it is entered: a failed allocation (std::bad_alloc) leaves no empty entry.
          auto made = std::make_shared<Block>(block_buffers_, block_start, at);
          found = file->blocks.emplace(block_start, std::move(made)).first;
          file->block_count.fetch_add(1, std::memory_order_relaxed);
        }
        const std::shared_ptr<Block>& block = found->second;
        if (at > block->hi) {  // a hole inside the block: zeros, as a hole reads
          std::memset(block->buffer.data() + (block->hi - block_start), 0,
                      static_cast<size_t>(at - block->hi));
        }
        const int64_t take = std::min(n - done, block_start + b - at);
        block->hi = at + take;
        block->last_append = append;
        if (std::find(touched.begin(), touched.end(), block) == touched.end()) {
          ++block->copying;
          touched.push_back(block);
        }
        copies.push_back({block.get(), at,
                          piece.substr(static_cast<size_t>(done), static_cast<size_t>(take))});
        at += take;
        done += take;
      }
    };
    Lane& lane = file->lanes[lane_id];
    for (std::string_view piece : pieces) {
      const auto n = static_cast<int64_t>(piece.size());
      if (n == 0) {  // nothing to place
        offsets.push_back(static_cast<uint64_t>(lane.at));
        continue;
      }
      if (n > e) {
        // Larger than the largest extent: a region of its own at the end of the file, whose
        // blocks are closed at once.
        const int64_t at = file->end;
        file->end = (at + n + b - 1) / b * b;
        offsets.push_back(static_cast<uint64_t>(at));
        place(piece, at);
        close_blocks(at, at + n);
        continue;
      }
      // Skipping to the next window leaves a hole: no disk space (zeros where a written block
      // spans it).
      int64_t at = NotStraddlingWindow(lane.at, n, w);
      if (lane.extent_end == 0 || at + n > lane.extent_end) {
        // The lane's extent is full: it moves to a new one at the end of the file, and the
        // blocks of the old one are complete. Extents grow from a block to the largest extent
        // (a window, or a block when blocks are larger), each twice its lane's last, so that a
        // lane with few bytes leaves little of the file unused; they never straddle a window.
        if (lane.extent_end != 0) close_blocks(lane.extent_start, lane.extent_end);
        int64_t size = std::max(lane.next_extent, b);
        while (size < n) size *= 2;
        size = std::min(size, e);
        at = NotStraddlingWindow(file->end, size, w);  // a hole, as above
        lane.extent_start = at;
        lane.extent_end = at + size;
        lane.next_extent = std::min(2 * size, e);
        file->end = lane.extent_end;
      }
      offsets.push_back(static_cast<uint64_t>(at));
      place(piece, at);
      // Blocks the lane has gone past are complete (holes included).
      close_blocks(lane.extent_start, (at + n) / b * b);
      lane.at = at + n;
    }
  }
  for (const Copy& c : copies) {
    std::memcpy(c.block->buffer.data() + (c.at - c.block->start), c.bytes.data(), c.bytes.size());
  }
  {
    std::lock_guard<std::mutex> lock(file->mu);
    for (const std::shared_ptr<Block>& block : touched) {
      if (--block->copying == 0 && block->closed && !block->writing) {
        block->writing = true;
        ready.push_back(block);
      }
    }
  }
  CKPT_RETURN_IF_ERROR(WriteBlocks(*file, ready));
  return offsets;
}

absl::Status SegmentFiles::WriteBlocks(File& file,
                                       const std::vector<std::shared_ptr<Block>>& blocks) {
  absl::Status first;
  for (const std::shared_ptr<Block>& block : blocks) {
    absl::Status s;
    // A block filled from its start goes with direct I/O, whole or not: one that was closed
    // short (its lane moved on, leaving the rest of it a hole) is written up to the next page
    // boundary, with zeros after its last byte. Written through the page cache, such a block's
    // pages stayed there as small folios (about 13% of a bench upload's bytes), which windows
    // map and unmap page by page instead of with one entry per 2 MiB.
    const int64_t page = PageBytes();
    const int64_t direct_bytes = (block->hi - block->lo + page - 1) / page * page;
    bool direct = block->lo == block->start && file.direct_fd >= 0 &&
                  file.use_direct.load(std::memory_order_relaxed);
    if (direct) {
      std::memset(block->buffer.data() + (block->hi - block->start), 0,
                  static_cast<size_t>(block->lo + direct_bytes - block->hi));
      s = WriteAll(file.direct_fd, file.path, block->buffer.data(), direct_bytes, block->lo);
      if (absl::IsInvalidArgument(s)) {  // direct I/O refused after all: buffered from now on
        file.use_direct.store(false, std::memory_order_relaxed);
        direct = false;
      }
    }
    if (!direct) {
      s = WriteAll(file.fd, file.path, block->buffer.data() + (block->lo - block->start),
                   block->hi - block->lo, block->lo);
    }
    if (s.ok()) file.NoteSize(block->hi);
    bool write_behind = false;
    {
      std::lock_guard<std::mutex> lock(file.mu);
      // A block that failed to write stays out of reads too: the file's write_error answers them.
      file.blocks.erase(block->start);
      file.block_count.fetch_sub(1, std::memory_order_relaxed);
      if (!s.ok()) file.Fail(s);
      if (s.ok() && !direct) {
        file.buffered_bytes += block->hi - block->lo;
        if (file.buffered_bytes >= options_.write_behind_bytes) {
          file.buffered_bytes = 0;
          write_behind = true;
        }
      }
    }
    file.written.notify_all();
    // Start write-back of what the page cache holds of the file, so that the commit's
    // fdatasync does not meet it all at once.
    if (write_behind) ::sync_file_range(file.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    if (first.ok()) first = s;
  }
  return first;
}

absl::Status SegmentFiles::WritePartLocked(File& file, const Block& block) {
  const absl::Status s =
      WriteAll(file.fd, file.path, block.buffer.data() + (block.lo - block.start),
               block.hi - block.lo, block.lo);
  if (!s.ok()) {
    file.Fail(s);
    return s;
  }
  file.NoteSize(block.hi);
  return absl::OkStatus();
}

absl::Status SegmentFiles::WriteIdleBlocksLocked(File& file) {
  if (file.blocks.size() <= kMaxIdleBlocks) return absl::OkStatus();  // no scan: too few blocks
  std::vector<std::map<int64_t, std::shared_ptr<Block>>::iterator> idle;
  for (auto it = file.blocks.begin(); it != file.blocks.end(); ++it) {
    const Block& block = *it->second;
    if (!block.closed && !block.writing && block.copying == 0) idle.push_back(it);
  }
  if (idle.size() <= kMaxIdleBlocks) return absl::OkStatus();
  std::sort(idle.begin(), idle.end(), [](const auto& a, const auto& b) {
    return a->second->last_append < b->second->last_append;
  });
  idle.resize(idle.size() - kMaxIdleBlocks);
  for (const auto& it : idle) {
    // As Sync does: a later append to its lane starts a new block where this one's bytes end.
    CKPT_RETURN_IF_ERROR(WritePartLocked(file, *it->second));
    file.blocks.erase(it);
    file.block_count.fetch_sub(1, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::Status SegmentFiles::Sync(uint64_t data_id) {
  std::shared_ptr<File> file;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = files_.find(data_id);
    if (it != files_.end()) file = it->second;
  }
  if (file == nullptr) return absl::OkStatus();  // nothing appended
  {
    std::unique_lock<std::mutex> lock(file->mu);
    // Blocks that appends are writing may hold bytes of other appends that have returned.
    file->written.wait(lock, [&] {
      return std::none_of(file->blocks.begin(), file->blocks.end(),
                          [](const auto& entry) { return entry.second->writing; });
    });
    if (!file->write_error.ok()) return file->write_error;
    // The blocks still open, written as far as they are filled, under the lock (a few at most,
    // and no append may reserve bytes in one meanwhile). One that an append is still copying
    // into stays, to be written again when it is closed.
    for (auto it = file->blocks.begin(); it != file->blocks.end();) {
      Block& block = *it->second;
      CKPT_RETURN_IF_ERROR(WritePartLocked(*file, block));
      if (block.copying > 0) {
        ++it;
        continue;
      }
      it = file->blocks.erase(it);
      file->block_count.fetch_sub(1, std::memory_order_relaxed);
    }
  }
  if (::fdatasync(file->fd) != 0) return Errno("sync", file->path);
  const int dir_fd = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return Errno("open directory", dir_);
  const int synced = ::fsync(dir_fd);
  const int sync_errno = errno;
  ::close(dir_fd);
  if (synced != 0) return ErrnoToStatus(sync_errno, "sync directory", dir_);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<SegmentFiles::Window>> SegmentFiles::GetWindow(
    uint64_t data_id, File& file, int64_t start, int64_t begin, int64_t end,
    std::string_view what) {
  const std::pair<uint64_t, int64_t> key{data_id, start / options_.window_bytes};
  // Recent windows no chunk holds, given up to make room: unmapped once the lock is released
  // (declared first, so destroyed last).
  std::vector<std::shared_ptr<Window>> evicted;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = windows_.find(key);
  if (it != windows_.end()) {
    std::shared_ptr<Window> window = it->second.lock();
    // A window mapped while the file was shorter may not reach `end` (a live upload's file).
    if (window != nullptr && window->start + static_cast<int64_t>(window->length) >= end) {
      KeepRecent(window);
      return window;
    }
  }
  const int64_t length =
      std::min(options_.window_bytes, file.size.load(std::memory_order_relaxed) - start);
  // Mapping costs nothing until pages are populated (Populate charges them), but a window that
  // could not populate the units of the chunk it is mapped for would be mapped for nothing.
  const int64_t u = unit_bytes_;
  const int64_t units = UnitsBytes(length, u, (begin - start) / u, (end - 1 - start) / u);
  if (!MakeRoomLocked(units, &evicted)) return nullptr;
  void* addr = ::mmap(nullptr, static_cast<size_t>(length), PROT_READ, MAP_SHARED, file.fd, start);
  if (addr == MAP_FAILED) return Prefixed(what, Errno("map", file.path));
  // Pages not in the page cache come in as 2 MiB folios, mapped whole (advice: errors ignored).
  ::madvise(addr, static_cast<size_t>(length), MADV_HUGEPAGE);
  auto window = std::make_shared<Window>();
  window->addr = addr;
  window->length = static_cast<size_t>(length);
  window->start = start;
  window->data_id = data_id;
  window->budget = window_bytes_;
  windows_[key] = window;
  KeepRecent(window);
  if (++windows_since_sweep_ >= kSweepEvery) {
    windows_since_sweep_ = 0;
    std::erase_if(windows_, [](const auto& entry) { return entry.second.expired(); });
  }
  return window;
}

bool SegmentFiles::MakeRoomLocked(int64_t bytes, std::vector<std::shared_ptr<Window>>* evicted) {
  const int64_t over =
      window_bytes_->load(std::memory_order_relaxed) + bytes - options_.window_budget_bytes;
  if (over <= 0) return true;
  // The least recently used of the windows kept only for reuse make room (their pages still
  // count until they are unmapped, right after): a chunk is copied only when the pages of
  // windows that chunks hold fill the budget.
  // (A window's count only grows under mu_: a count of 1, recent_'s own, cannot change here;
  // and with no chunk of it held, nothing populates it.)
  std::vector<size_t> idle;  // indexes into recent_, least recently used first
  int64_t freed = 0;
  for (size_t k = recent_.size(); k-- > 0 && freed < over;) {
    if (recent_[k].use_count() != 1) continue;
    idle.push_back(k);
    freed += recent_[k]->charged.load(std::memory_order_relaxed);
  }
  if (freed < over) return false;
  for (size_t k : idle) {  // descending: erasing one leaves the others' indexes valid
    evicted->push_back(std::move(recent_[k]));
    recent_.erase(recent_.begin() + static_cast<std::ptrdiff_t>(k));
  }
  return true;
}

absl::StatusOr<bool> SegmentFiles::Populate(Window& window, int64_t begin, int64_t end,
                                            const std::string& path, std::string_view what) {
  const int64_t u = unit_bytes_;
  const int64_t first = (begin - window.start) / u;
  const int64_t last = (end - 1 - window.start) / u;
  const int64_t count = last - first + 1;
  const uint64_t want = (count >= 64 ? ~uint64_t{0} : (uint64_t{1} << count) - 1) << first;
  if ((window.populated.load(std::memory_order_acquire) & want) == want) return true;
  std::lock_guard<std::mutex> lock(window.populate_mu);
  const uint64_t missing = want & ~window.populated.load(std::memory_order_relaxed);
  if (missing == 0) return true;  // populated meanwhile
  // The missing units, as runs of consecutive ones: charged together, populated run by run.
  std::vector<std::pair<int64_t, int64_t>> runs;
  int64_t bytes = 0;
  for (int64_t i = first; i <= last;) {
    if ((missing >> i & 1) == 0) {
      ++i;
      continue;
    }
    int64_t j = i;
    while (j + 1 <= last && (missing >> (j + 1) & 1) != 0) ++j;
    runs.push_back({i, j});
    bytes += window.UnitBytes(u, i, j);
    i = j + 1;
  }
  {
    std::vector<std::shared_ptr<Window>> evicted;  // unmapped once mu_ is released
    std::lock_guard<std::mutex> budget_lock(mu_);
    if (!MakeRoomLocked(bytes, &evicted)) return false;
    window_bytes_->fetch_add(bytes, std::memory_order_relaxed);
  }
  // Charged even if populating fails below (an I/O error): released when the window is unmapped.
  window.charged.fetch_add(bytes, std::memory_order_relaxed);
  for (const auto& [i, j] : runs) {
    // Map the units' pages now, in one call, rather than page fault by page fault wherever
    // their bytes are first touched (a failure here is an I/O error, where a fault would be
    // SIGBUS; EINVAL: a kernel without MADV_POPULATE_READ, the pages then fault in).
    if (::madvise(static_cast<char*>(window.addr) + i * u,
                  static_cast<size_t>(window.UnitBytes(u, i, j)), MADV_POPULATE_READ) != 0 &&
        errno != EINVAL) {
      return Prefixed(what, Errno("read (populate)", path));
    }
  }
  window.populated.fetch_or(missing, std::memory_order_release);
  return true;
}

void SegmentFiles::KeepRecent(const std::shared_ptr<Window>& window) {
  auto it = std::find(recent_.begin(), recent_.end(), window);
  if (it != recent_.end()) {
    std::rotate(recent_.begin(), it, it + 1);  // to the front
    return;
  }
  recent_.insert(recent_.begin(), window);
  if (recent_.size() > options_.recent_windows) recent_.pop_back();
}

absl::StatusOr<std::unique_ptr<ChunkData>> SegmentFiles::Read(uint64_t data_id, uint64_t offset,
                                                              uint64_t length,
                                                              std::string_view what) {
  if (length == 0) return std::make_unique<MappedChunk>();
  absl::StatusOr<std::shared_ptr<File>> opened = GetFile(data_id, /*create=*/false);
  if (!opened.ok()) return Prefixed(what, opened.status());
  File& file = **opened;
  constexpr auto kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  if (offset > kMax || length > kMax - offset) {
    return Prefixed(what, absl::DataLossError(absl::StrCat(
                              "location ", offset, "+", length,
                              " is past any file (damaged location record)")));
  }
  const auto begin = static_cast<int64_t>(offset);
  const auto end = static_cast<int64_t>(offset + length);
  if (file.block_count.load(std::memory_order_relaxed) > 0 || file.failed.load()) {
    std::lock_guard<std::mutex> lock(file.mu);
    if (!file.write_error.ok()) return Prefixed(what, file.write_error);
    if (!file.blocks.empty()) {
      absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> copy =
          ReadFromBlocksLocked(file, begin, end);
      if (!copy.ok()) return Prefixed(what, copy.status());
      if (copy->has_value()) return std::move(**copy);
    }
  }
  if (end > file.size.load(std::memory_order_relaxed)) {
    struct stat st;
    if (::fstat(file.fd, &st) != 0) return Prefixed(what, Errno("stat", file.path));
    file.NoteSize(st.st_size);
    if (end > st.st_size) {
      return Prefixed(what, absl::DataLossError(absl::StrCat("segment file ", file.path, " has ",
                                              st.st_size, " bytes, the chunk is at [", begin, ", ",
                                              end, ") (truncated?)")));
    }
  }
  const int64_t w = options_.window_bytes;
  const int64_t window_start = begin / w * w;
  std::shared_ptr<Window> window;
  if ((end - 1) / w == begin / w) {
    CKPT_ASSIGN_OR_RETURN(window, GetWindow(data_id, file, window_start, begin, end, what));
  }
  if (window != nullptr) {
    CKPT_ASSIGN_OR_RETURN(const bool populated, Populate(*window, begin, end, file.path, what));
    if (!populated) window = nullptr;  // the budget's room went to another reader meanwhile
  }
  if (window == nullptr) {
    // Over the windows' budget (or larger than a window): read a copy, held as long as the
    // chunk is.
    auto copy = std::make_unique<HeapChunk>(static_cast<size_t>(length));
    size_t done = 0;
    while (done < copy->size()) {
      const ssize_t n = ::pread(file.fd, copy->data() + done, copy->size() - done,
                                begin + static_cast<int64_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Prefixed(what, Errno("read", file.path));
      if (n == 0) {
        return Prefixed(what, absl::DataLossError(absl::StrCat("segment file ", file.path,
                                                " ended at ", begin + static_cast<int64_t>(done),
                                                " inside the chunk at [", begin, ", ", end, ")")));
      }
      done += static_cast<size_t>(n);
    }
    bytes_copied_.fetch_add(static_cast<int64_t>(length), std::memory_order_relaxed);
    return copy;
  }
  const char* data = static_cast<const char*>(window->addr) + (begin - window->start);
  return std::make_unique<MappedChunk>(std::move(window),
                                       std::string_view(data, static_cast<size_t>(length)));
}

absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> SegmentFiles::ReadFromBlocksLocked(
    File& file, int64_t begin, int64_t end) {
  const int64_t b = options_.write_block_bytes;
  auto first = file.blocks.lower_bound(begin / b * b);
  if (first == file.blocks.end() || first->first >= end) return std::nullopt;
  auto copy = std::make_unique<HeapChunk>(static_cast<size_t>(end - begin));
  for (int64_t at = begin; at < end;) {
    const int64_t block_start = at / b * b;
    const int64_t to = std::min(end, block_start + b);
    char* out = copy->data() + (at - begin);
    // Bytes before the block's first (a Sync wrote them, with an earlier block of the same
    // place) and of blocks already written come from the file.
    auto it = file.blocks.find(block_start);
    const int64_t buffered_from = it == file.blocks.end() ? to : std::clamp(it->second->lo, at, to);
    if (it != file.blocks.end() && to > it->second->hi) {
      return absl::DataLossError(absl::StrCat("segment file ", file.path,
                                              " has bytes appended up to ", it->second->hi,
                                              " there, the chunk is at [", begin, ", ", end, ")"));
    }
    for (int64_t done = 0; done < buffered_from - at;) {
      const ssize_t n = ::pread(file.fd, out + done, static_cast<size_t>(buffered_from - at - done),
                                at + done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return Errno("read", file.path);
      if (n == 0) {
        return absl::DataLossError(absl::StrCat("segment file ", file.path, " ended at ",
                                                at + done, " inside the chunk at [", begin, ", ",
                                                end, ") (truncated?)"));
      }
      done += n;
    }
    if (buffered_from < to) {
      std::memcpy(out + (buffered_from - at),
                  it->second->buffer.data() + (buffered_from - block_start),
                  static_cast<size_t>(to - buffered_from));
    }
    at = to;
  }
  bytes_copied_.fetch_add(end - begin, std::memory_order_relaxed);
  return std::optional<std::unique_ptr<ChunkData>>(std::move(copy));
}

absl::Status SegmentFiles::Remove(uint64_t data_id) {
  const std::string path = PathOf(data_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    files_.erase(data_id);
    std::erase_if(recent_, [&](const std::shared_ptr<Window>& w) { return w->data_id == data_id; });
    auto it = windows_.lower_bound({data_id, 0});
    while (it != windows_.end() && it->first.first == data_id) it = windows_.erase(it);
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Errno("delete", path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> SegmentFiles::List() const {
  std::vector<uint64_t> ids;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != kHexDigits + kSuffix.size() || !name.ends_with(kSuffix)) continue;
    uint64_t id = 0;
    bool hex = true;
    for (size_t k = 0; k < kHexDigits && hex; ++k) {
      const char c = name[k];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      hex = digit >= 0;
      id = id << 4 | static_cast<uint64_t>(digit < 0 ? 0 : digit);
    }
    if (hex) ids.push_back(id);
  }
  if (ec) return ErrnoToStatus(ec.value(), "list", dir_);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int64_t SegmentFiles::mapped_windows() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::count_if(windows_.begin(), windows_.end(),
                       [](const auto& entry) { return !entry.second.expired(); });
}

}  // namespace ckpt::segment_internal
