#include "storage/internal/segment_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "storage/io_buffer.h"
#include "storage/posix_io.h"

namespace ckpt::segment_internal {
namespace {

// Free write-block buffers kept for reuse (BlockBuffers).
constexpr size_t kKeptBlockBuffers = 16;
// Open blocks of one file no append is using, beyond which the least recently appended to are
// written as far as they are filled: a lane's last block stays open until the lane appends past
// it, which the lane of a finished upload stream never does, and a checkpoint may have thousands.
constexpr size_t kMaxIdleBlocks = 16;

// `at`, or the next window boundary when `n` bytes (at most a window) at `at` would straddle
// one: Append never lets a piece or an extent of at most a window cross a window boundary.
int64_t NotStraddlingWindow(int64_t at, int64_t n, int64_t window) {
  return n <= window && at / window != (at + n - 1) / window ? (at / window + 1) * window : at;
}

}  // namespace

// The memory of write blocks: IoBuffers (mapped, 2 MiB-aligned huge pages where available, so
// that a block's direct write reaches the disk as one request), not taken from malloc (blocks are
// filled and freed on whichever threads append, and 2 MiB pieces of malloc's per-thread arenas
// would stay with those arenas after an upload), and reused: up to `keep` free buffers stay
// mapped, so that a busy upload does not fault in fresh pages for every block. Thread-safe.
class SegmentWriter::BlockBuffers {
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
struct SegmentWriter::Block {
  Block(std::shared_ptr<BlockBuffers> pool, int64_t start, int64_t at)
      : start(start), lo(at), hi(at), pool(std::move(pool)), buffer(this->pool->Get()) {}
  ~Block() { pool->Put(std::move(buffer)); }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;

  const int64_t start;  // file offset of buffer.data()[0], a multiple of the block size
  int64_t lo, hi;       // the appended bytes in it: [lo, hi) (holes inside are zeroed)
  const std::shared_ptr<BlockBuffers> pool;
  IoBuffer buffer;           // from pool, returned to it; page-aligned, for direct I/O
  int copying = 0;           // reservations (appends among them) whose bytes go into it, unfinished
  uint64_t last_append = 0;  // File::appends when an append last placed bytes in it
  bool closed = false;       // nothing more can be appended to it (or Sync wants it written)
  bool writing = false;      // an append or Sync is writing it (it stays readable until written)
};

// Where one lane (SegmentWriter::Append) appends: the rest of its current extent.
struct SegmentWriter::Lane {
  int64_t at = 0;                            // next free offset
  int64_t extent_start = 0, extent_end = 0;  // its extent; empty before its first append
  int64_t next_extent = 0;                   // bytes of its next extent (0: one block)
};

// A writable segment file with its write state.
struct SegmentWriter::File final : SegmentFile {
  ~File() override {
    if (direct_fd >= 0) ::close(direct_fd);
  }

  // Serves reads of bytes still in blocks (SegmentFile::ReadUnwritten).
  absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> ReadUnwritten(int64_t begin,
                                                                          int64_t end) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!write_error.ok()) return write_error;
    if (blocks.empty()) return std::nullopt;
    return ReadBlocksLocked(begin, end);
  }
  // [begin, end) as a copy, from the buffers of the blocks not yet written and the file; nullopt
  // when no block holds any of it. mu held.
  absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> ReadBlocksLocked(int64_t begin,
                                                                             int64_t end);

  void Fail(const absl::Status& s) {  // mu held
    if (!write_error.ok()) return;
    write_error = s;
    failed.store(true);
  }
  void DropBlock(std::map<int64_t, std::shared_ptr<Block>>::iterator it) {  // mu held
    blocks.erase(it);
    block_count.fetch_sub(1, std::memory_order_relaxed);
  }

  int64_t block_bytes = 0;  // SegmentOptions::write_block_bytes
  // Whole blocks are written through this descriptor (O_DIRECT) where the file system allows.
  int direct_fd = -1;
  std::atomic<bool> use_direct{true};
  std::mutex mu;    // guards end, lanes, appends, blocks, write_error and buffered_bytes
  int64_t end = 0;  // the end of the last extent given out
  std::map<uint32_t, Lane> lanes;
  int64_t buffered_bytes = 0;  // written through the page cache since the last write-behind
  uint64_t appends = 0;        // Append calls so far (Block::last_append)
  // Blocks whose bytes are not all written yet, by start offset (SegmentFile::block_count counts
  // them for readers that do not take mu).
  std::map<int64_t, std::shared_ptr<Block>> blocks;
  absl::Status write_error;  // the first failed write: every later append, sync and read fails
  std::condition_variable written;  // a block was written (or failed to be)
};

absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> SegmentWriter::File::ReadBlocksLocked(
    int64_t begin, int64_t end) {
  const int64_t b = block_bytes;
  auto first = blocks.lower_bound(begin / b * b);
  if (first == blocks.end() || first->first >= end) return std::nullopt;
  auto copy = std::make_unique<CopiedChunk>(static_cast<size_t>(end - begin));
  for (int64_t at = begin; at < end;) {
    const int64_t block_start = at / b * b;
    const int64_t to = std::min(end, block_start + b);
    char* out = copy->data() + (at - begin);
    // Bytes before the block's first (a Sync wrote them, with an earlier block of the same
    // place) and of blocks already written come from the file.
    auto it = blocks.find(block_start);
    const int64_t buffered_from = it == blocks.end() ? to : std::clamp(it->second->lo, at, to);
    if (it != blocks.end() && to > it->second->hi) {
      return absl::DataLossError(absl::StrCat("segment file ", path, " has bytes appended up to ",
                                              it->second->hi, " there, the chunk is at [", begin,
                                              ", ", end, ")"));
    }
    CKPT_RETURN_IF_ERROR(ReadChunkBytes(*this, out, buffered_from - at, at, begin, end));
    if (buffered_from < to) {
      std::memcpy(out + (buffered_from - at),
                  it->second->buffer.data() + (buffered_from - block_start),
                  static_cast<size_t>(to - buffered_from));
    }
    at = to;
  }
  return std::optional<std::unique_ptr<ChunkData>>(std::move(copy));
}

SegmentWriter::SegmentWriter(SegmentDirectory* directory)
    : directory_(directory),
      options_(directory->options()),
      block_buffers_(std::make_shared<BlockBuffers>(static_cast<size_t>(options_.write_block_bytes),
                                                    kKeptBlockBuffers)) {}

SegmentWriter::~SegmentWriter() = default;

absl::StatusOr<std::shared_ptr<SegmentWriter::File>> SegmentWriter::GetFile(uint64_t data_id) {
  CKPT_ASSIGN_OR_RETURN(
      std::shared_ptr<SegmentFile> found,
      directory_->FindOrOpen(
          data_id, [&](const std::string& path) -> absl::StatusOr<std::shared_ptr<SegmentFile>> {
            auto file = std::make_shared<File>();
            file->path = path;
            file->writable = true;
            file->block_bytes = options_.write_block_bytes;
            // A new data id never had a file; O_TRUNC only guards against a stray one.
            file->fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
            if (file->fd < 0) return ErrnoToStatus(errno, "create", path);
            if (options_.direct_writes) {
              // -1 where the file system refuses direct I/O: every block then goes through the
              // page cache.
              file->direct_fd = ::open(path.c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
            }
            return file;
          }));
  if (!found->writable) {
    return absl::FailedPreconditionError(absl::StrCat("segment file ", found->path, " of data id ",
                                                      data_id, " is being read, not written"));
  }
  return std::static_pointer_cast<File>(std::move(found));
}

SegmentWriter::Reservation::Reservation() = default;
SegmentWriter::Reservation::Reservation(Reservation&&) noexcept = default;
SegmentWriter::Reservation& SegmentWriter::Reservation::operator=(Reservation&&) noexcept = default;
SegmentWriter::Reservation::~Reservation() = default;

absl::StatusOr<std::vector<uint64_t>> SegmentWriter::Append(
    uint64_t data_id, const std::vector<std::string_view>& pieces, uint32_t lane_id) {
  std::vector<int64_t> sizes;
  sizes.reserve(pieces.size());
  for (std::string_view piece : pieces) sizes.push_back(static_cast<int64_t>(piece.size()));
  CKPT_ASSIGN_OR_RETURN(Reservation r, Reserve(data_id, sizes, lane_id));
  // The copies run without the lock: appends of other lanes copy at the same time.
  for (size_t i = 0; i < pieces.size(); ++i) {
    const char* from = pieces[i].data();
    for (size_t p = r.first[i]; p < r.first[i + 1]; ++p) {
      std::memcpy(r.places[p].data(), from, r.places[p].size());
      from += r.places[p].size();
    }
  }
  CKPT_RETURN_IF_ERROR(Finish(&r));
  return std::move(r.offsets);
}

absl::StatusOr<SegmentWriter::Reservation> SegmentWriter::Reserve(uint64_t data_id,
                                                                  const std::vector<int64_t>& sizes,
                                                                  uint32_t lane_id) {
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<File> file, GetFile(data_id));
  Reservation r;
  r.data_id = data_id;
  std::vector<std::shared_ptr<Block>> ready;
  {
    std::lock_guard<std::mutex> lock(file->mu);
    if (!file->write_error.ok()) return file->write_error;
    CKPT_RETURN_IF_ERROR(WriteIdleBlocksLocked(*file));
    PlaceLocked(*file, sizes, lane_id, &r, &ready);
  }
  r.file = std::move(file);
  // Blocks of the lane's earlier extents that this placement closed.
  const absl::Status written = WriteBlocks(*r.file, ready);
  if (!written.ok()) {
    Finish(&r).IgnoreError();  // its bytes are unreferenced; the file has failed
    return written;
  }
  return r;
}

absl::Status SegmentWriter::Finish(Reservation* r) {
  if (r->file == nullptr) return absl::OkStatus();
  const std::shared_ptr<File> file = std::move(r->file);  // r->file is null from here: done
  std::vector<std::shared_ptr<Block>> ready;
  {
    std::lock_guard<std::mutex> lock(file->mu);
    for (const std::shared_ptr<Block>& block : r->touched) {
      if (--block->copying == 0 && block->closed && !block->writing) {
        block->writing = true;
        ready.push_back(block);
      }
    }
  }
  r->touched.clear();
  r->places.clear();
  return WriteBlocks(*file, ready);
}

void SegmentWriter::PlaceLocked(File& file, const std::vector<int64_t>& sizes, uint32_t lane_id,
                                Reservation* r, std::vector<std::shared_ptr<Block>>* ready) {
  const int64_t w = options_.window_bytes;
  const int64_t b = options_.write_block_bytes;
  const int64_t e = ExtentBytes();
  const uint64_t append = ++file.appends;
  r->offsets.reserve(sizes.size());
  r->first.reserve(sizes.size() + 1);
  r->first.push_back(0);
  Lane& lane = file.lanes[lane_id];
  for (const int64_t n : sizes) {
    if (n == 0) {  // nothing to place
      r->offsets.push_back(static_cast<uint64_t>(lane.at));
      r->first.push_back(r->places.size());
      continue;
    }
    if (n > e) {
      // Larger than the largest extent: a region of its own at the end of the file, whose
      // blocks are closed at once.
      const int64_t at = file.end;
      file.end = (at + n + b - 1) / b * b;
      r->offsets.push_back(static_cast<uint64_t>(at));
      PlacePieceLocked(file, n, at, append, r);
      CloseBlocksLocked(file, at, at + n, ready);
      continue;
    }
    // Skipping to the next window leaves a hole: no disk space (zeros where a written block
    // spans it).
    int64_t at = NotStraddlingWindow(lane.at, n, w);
    if (lane.extent_end == 0 || at + n > lane.extent_end) {
      at = NewExtentLocked(file, lane, n, ready);
    }
    r->offsets.push_back(static_cast<uint64_t>(at));
    PlacePieceLocked(file, n, at, append, r);
    // Blocks the lane has gone past are complete (holes included).
    CloseBlocksLocked(file, lane.extent_start, (at + n) / b * b, ready);
    lane.at = at + n;
  }
}

int64_t SegmentWriter::NewExtentLocked(File& file, Lane& lane, int64_t n,
                                       std::vector<std::shared_ptr<Block>>* ready) {
  // The lane's extent is full: it moves to a new one at the end of the file, and the blocks of
  // the old one are complete. Extents grow from a block to the largest extent (a window, or a
  // block when blocks are larger), each twice its lane's last, so that a lane with few bytes
  // leaves little of the file unused; they never straddle a window.
  const int64_t e = ExtentBytes();
  if (lane.extent_end != 0) CloseBlocksLocked(file, lane.extent_start, lane.extent_end, ready);
  int64_t size = std::max(lane.next_extent, options_.write_block_bytes);
  while (size < n) size *= 2;
  size = std::min(size, e);
  const int64_t at = NotStraddlingWindow(file.end, size, options_.window_bytes);  // a hole
  lane.extent_start = at;
  lane.extent_end = at + size;
  lane.next_extent = std::min(2 * size, e);
  file.end = lane.extent_end;
  return at;
}

void SegmentWriter::PlacePieceLocked(File& file, int64_t n, int64_t at, uint64_t append,
                                     Reservation* r) {
  const int64_t b = options_.write_block_bytes;
  for (int64_t done = 0; done < n;) {
    const int64_t block_start = at / b * b;
    auto found = file.blocks.find(block_start);
    if (found == file.blocks.end()) {
      // Made before it is entered: a failed allocation (std::bad_alloc) leaves no empty entry.
      auto made = std::make_shared<Block>(block_buffers_, block_start, at);
      found = file.blocks.emplace(block_start, std::move(made)).first;
      file.block_count.fetch_add(1, std::memory_order_relaxed);
    }
    const std::shared_ptr<Block>& block = found->second;
    if (at > block->hi) {  // a hole inside the block: zeros, as a hole reads
      std::memset(block->buffer.data() + (block->hi - block_start), 0,
                  static_cast<size_t>(at - block->hi));
    }
    const int64_t take = std::min(n - done, block_start + b - at);
    block->hi = at + take;
    block->last_append = append;
    if (std::find(r->touched.begin(), r->touched.end(), block) == r->touched.end()) {
      ++block->copying;
      r->touched.push_back(block);
    }
    r->places.emplace_back(block->buffer.data() + (at - block_start), static_cast<size_t>(take));
    at += take;
    done += take;
  }
  r->first.push_back(r->places.size());
}

void SegmentWriter::CloseBlocksLocked(File& file, int64_t from, int64_t to,
                                      std::vector<std::shared_ptr<Block>>* ready) {
  const int64_t b = file.block_bytes;
  for (auto it = file.blocks.lower_bound(from / b * b); it != file.blocks.end() && it->first < to;
       ++it) {
    Block& block = *it->second;
    if (block.closed) continue;
    block.closed = true;
    if (block.copying == 0) {
      block.writing = true;
      ready->push_back(it->second);
    }
  }
}

absl::Status SegmentWriter::WriteBlocks(File& file,
                                        const std::vector<std::shared_ptr<Block>>& blocks) {
  absl::Status first;
  for (const std::shared_ptr<Block>& block : blocks) {
    absl::Status s;
    // A block filled from its start goes with direct I/O, whole or not: one that was closed
    // short (its lane moved on, leaving the rest of it a hole) is written up to the next page
    // boundary, with zeros after its last byte, so that none of its pages stay in the page cache
    // as small folios.
    const int64_t page = PageBytes();
    const int64_t direct_bytes = (block->hi - block->lo + page - 1) / page * page;
    bool direct = block->lo == block->start && file.direct_fd >= 0 &&
                  file.use_direct.load(std::memory_order_relaxed);
    if (direct) {
      std::memset(block->buffer.data() + (block->hi - block->start), 0,
                  static_cast<size_t>(block->lo + direct_bytes - block->hi));
      s = PwriteFully(file.direct_fd, block->buffer.data(), static_cast<size_t>(direct_bytes),
                      block->lo, file.path);
      if (absl::IsInvalidArgument(s)) {  // direct I/O refused after all: buffered from now on
        file.use_direct.store(false, std::memory_order_relaxed);
        direct = false;
      }
    }
    if (!direct) {
      s = PwriteFully(file.fd, block->buffer.data() + (block->lo - block->start),
                      static_cast<size_t>(block->hi - block->lo), block->lo, file.path);
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

absl::Status SegmentWriter::WritePartLocked(File& file, const Block& block) {
  const absl::Status s = PwriteFully(file.fd, block.buffer.data() + (block.lo - block.start),
                                     static_cast<size_t>(block.hi - block.lo), block.lo, file.path);
  if (!s.ok()) {
    file.Fail(s);
    return s;
  }
  file.NoteSize(block.hi);
  return absl::OkStatus();
}

absl::Status SegmentWriter::WriteIdleBlocksLocked(File& file) {
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
    file.DropBlock(it);
  }
  return absl::OkStatus();
}

absl::Status SegmentWriter::Sync(uint64_t data_id) {
  const std::shared_ptr<SegmentFile> found = directory_->Find(data_id);
  if (found == nullptr) return absl::OkStatus();  // nothing appended
  if (found->writable) {
    File& file = static_cast<File&>(*found);
    std::unique_lock<std::mutex> lock(file.mu);
    // Blocks that appends are writing may hold bytes of other appends that have returned.
    file.written.wait(lock, [&] {
      return std::none_of(file.blocks.begin(), file.blocks.end(),
                          [](const auto& entry) { return entry.second->writing; });
    });
    if (!file.write_error.ok()) return file.write_error;
    // The blocks still open, written as far as they are filled, under the lock (a few at most,
    // and no append may reserve bytes in one meanwhile). One that a reservation is still filling
    // stays, to be written again when it is closed.
    for (auto it = file.blocks.begin(); it != file.blocks.end();) {
      Block& block = *it->second;
      CKPT_RETURN_IF_ERROR(WritePartLocked(file, block));
      if (block.copying > 0) {
        ++it;
        continue;
      }
      file.DropBlock(it++);
    }
  }
  if (::fdatasync(found->fd) != 0) return ErrnoToStatus(errno, "sync", found->path);
  return SyncDirectory(directory_->dir());
}

}  // namespace ckpt::segment_internal
