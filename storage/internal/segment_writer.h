// The files that hold the RocksDB store's chunk bytes: one append-only *segment file* per upload
// data id (`<dir>/<data id, 16 hex digits>.seg`), indexed by the store's chunk-location records.
// Private to storage/rocksdb_store.cc and its tests; no RocksDB header.
//
// Why not RocksDB's blob files: Debian's RocksDB 7.8 copies every blob it reads twice (pread into
// its buffer, then into the PinnableSlice), and those two copies were ~31% of ckptd's CPU in a
// fetch profile. A chunk read from a segment file is a view of a read-only mapping of the file
// (page cache, no copy) that gRPC sends as it is.
//
// Mappings are *windows* (SegmentOptions::window_bytes), shared by the chunks that lie in them and
// unmapped when the last chunk read from them is released, so a process maps (and counts in its
// RSS) only what its readers hold. Append never lets a chunk of at most a window straddle a window
// boundary (it skips to the boundary, leaving a hole that takes no disk space), so every such chunk
// is a view of one window.
//
// Appended bytes reach the file in aligned *write blocks* (SegmentOptions::write_block_bytes,
// 2 MiB): gathered in a block's buffer, a block is written once nothing more can be appended to it,
// with direct I/O (no page cache): whole, or up to the next page boundary when its lane left it
// short (zeros after its last byte). What Sync or the bound on idle blocks writes of a block still
// open goes through the page cache. Windows are mapped with MADV_HUGEPAGE, so a read of a block
// that is not in the page cache brings it in as one 2 MiB folio, which the window then maps with
// one page-table entry instead of 512 (and a window maps its pages, and counts them against
// SegmentOptions::window_budget_bytes, a write block at a time). Why (README, Performance): mapping
// and unmapping the windows' 4 KiB pages was ~18% of ckptd's CPU in a row_to_col fetch; written
// through the page cache in 2 MiB pieces, the blocks became 2 MiB folios too, but on a VM that
// hands free memory back to its host those folios came from memory the host had to fault in again
// (uploads 0.6 instead of 1.4 GiB/s), and direct I/O leaves the page cache alone during an upload.
// The cost: the first read of a freshly uploaded checkpoint comes from the disk.
#ifndef CKPT_STORAGE_INTERNAL_SEGMENT_FILES_H_
#define CKPT_STORAGE_INTERNAL_SEGMENT_FILES_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"

namespace ckpt::segment_internal {

struct SegmentOptions {
  // Bytes of one window (a multiple of the page size).
  int64_t window_bytes = int64_t{16} << 20;
  // At most this many bytes of windows' pages are mapped at once (they count in the process's
  // RSS). Pages are mapped in units of a write block (MADV_POPULATE_READ, the first time a chunk
  // in the unit is read from the window), and a window counts the units it mapped, not its
  // length: a reader of a column band maps a few units of each window. Beyond it, chunks are read
  // into memory of their own (pread): a window's pages served to one reader stay mapped while
  // another reader holds a chunk of the same window, and 8 concurrent fetches took a fresh ckptd
  // to 821 MiB of peak RSS uncapped.
  int64_t window_budget_bytes = int64_t{192} << 20;
  // Windows kept mapped after their last chunk is released (SegmentFiles::recent_), until the
  // budget needs their room for a window that a read needs. By default as many as the budget
  // holds: a fetch's reads jump between the windows its source ranks were uploaded into (several
  // ranks upload into one file at once), and keeping only 8 mapped each window about 2.3 times
  // per destination rank in a row_to_col fetch (README, Performance).
  size_t recent_windows = 1024;
  // Bytes of one file written through the page cache (partial blocks, or every block where
  // direct I/O is refused) after which their write-back starts (sync_file_range), so that the
  // commit's fdatasync does not meet the whole upload at once.
  int64_t write_behind_bytes = int64_t{16} << 20;
  // Appended bytes reach the file in aligned blocks of this many bytes (a multiple of the page
  // size, and a multiple or a divisor of window_bytes; the default is the PMD size of x86-64 and
  // 4 KiB-page arm64, the folio size a window maps with one page-table entry).
  int64_t write_block_bytes = int64_t{2} << 20;
  // Closed blocks are written with O_DIRECT where the file system allows it (else, and when
  // false, through the page cache, like the parts of open blocks that Sync writes).
  bool direct_writes = true;
};

// "<16 lower-case hex digits>.seg": the name of data id `data_id`'s segment file.
std::string SegmentFileName(uint64_t data_id);

// Thread-safe.
class SegmentFiles {
 public:
  // Creates `dir` if needed. INVALID_ARGUMENT for a window size that is not a positive multiple
  // of the page size.
  static absl::StatusOr<std::unique_ptr<SegmentFiles>> Open(std::string dir,
                                                            SegmentOptions options = {});
  ~SegmentFiles();
  SegmentFiles(const SegmentFiles&) = delete;
  SegmentFiles& operator=(const SegmentFiles&) = delete;

  const std::string& dir() const { return dir_; }
  std::string PathOf(uint64_t data_id) const;

  // Appends each piece to `data_id`'s file (created on first use), concurrently with other
  // appends to it, and returns each piece's offset; Read serves the pieces from then on, from
  // the write blocks' buffers until those are written (SegmentOptions::write_block_bytes).
  // Unsynced. RESOURCE_EXHAUSTED when the disk is full. A failed write fails every later Append
  // and Sync of the data id too (a block held other appends' bytes); its pieces are unreferenced
  // until the caller records their offsets, and go when the data id's file is removed.
  //
  // Pieces of one `lane` (an upload stream: the store passes ChunkWrite::stream) go one after
  // the other into *extents* of the file that are the lane's alone, a new one at the end of the
  // file when the lane's current one is full. A lane's extents grow from one write block to the
  // larger of a window and a block (16 MiB by default), each twice the last, and never straddle
  // a window; a piece larger than that gets a region of its own. So a stream's chunks stay
  // together in the file however many streams append at once: a reader of one stored slice maps
  // the few windows that hold it rather than every window the concurrent uploads interleaved it
  // into, and a lane with few bytes leaves little unused. The rest of an extent a lane leaves is
  // a hole (no disk space).
  absl::StatusOr<std::vector<uint64_t>> Append(uint64_t data_id,
                                               const std::vector<std::string_view>& pieces,
                                               uint32_t lane = 0);
  // Makes every byte of `data_id` appended by the calls that have returned durable (writes the
  // partly filled blocks, then fdatasync of the file and fsync of the directory). A data id with
  // nothing appended has no file: OK.
  absl::Status Sync(uint64_t data_id);
  // The `length` bytes at `offset` of `data_id`'s file, as a view of a shared read-only mapping
  // (a copy when the windows' budget is spent or the chunk is larger than a window).
  // DATA_LOSS naming the file when it is missing or too short (damaged behind the store's back);
  // `what` ("chunk data 3 tensor 1 blob 0 chunk 2") prefixes errors; empty: no prefix (a caller
  // that names the chunk itself, and only on error).
  absl::StatusOr<std::unique_ptr<ChunkData>> Read(uint64_t data_id, uint64_t offset,
                                                  uint64_t length, std::string_view what);
  // Deletes `data_id`'s file if it exists. Views read before stay valid (the mapping outlives the
  // name).
  absl::Status Remove(uint64_t data_id);
  // The data ids that have a segment file in the directory, ascending.
  absl::StatusOr<std::vector<uint64_t>> List() const;

  // Windows currently mapped (tests).
  int64_t mapped_windows() const;
  // Bytes of windows' pages mapped now (the units populated, SegmentOptions::window_budget_bytes).
  int64_t mapped_bytes() const { return window_bytes_->load(std::memory_order_relaxed); }
  // Bytes of chunks Read returned as copies (over the budget, or larger than a window).
  int64_t bytes_copied() const { return bytes_copied_.load(std::memory_order_relaxed); }

 private:
  struct File;
  struct Window;
  struct Block;
  struct Lane;
  class BlockBuffers;
  SegmentFiles(std::string dir, SegmentOptions options);

  // Bytes of a lane's largest extent: the larger of a window and a write block (one divides
  // the other).
  int64_t ExtentBytes() const {
    return std::max(options_.window_bytes, options_.write_block_bytes);
  }
  // The open file of `data_id`: created (writable) when `create`, else opened read-only.
  absl::StatusOr<std::shared_ptr<File>> GetFile(uint64_t data_id, bool create);
  // Writes `block` as far as it is filled, through the page cache; a failure fails `file`.
  // file.mu held (Sync, WriteIdleBlocksLocked).
  static absl::Status WritePartLocked(File& file, const Block& block);
  // Beyond kMaxIdleBlocks open blocks that no append is using, writes the least recently
  // appended to as far as they are filled and drops them, so that the memory of blocks stays
  // bounded however many lanes a file has. file.mu held.
  static absl::Status WriteIdleBlocksLocked(File& file);
  // Writes blocks that Append or Sync marked for writing, then drops them from `file`.
  absl::Status WriteBlocks(File& file, const std::vector<std::shared_ptr<Block>>& blocks);
  // [begin, end) of `file` as a copy, from the buffers of the blocks not yet written and the
  // file; nullopt when no block holds any of it. file.mu held.
  absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> ReadFromBlocksLocked(File& file,
                                                                                 int64_t begin,
                                                                                 int64_t end);
  void KeepRecent(const std::shared_ptr<Window>& window);  // mu_ held
  // The shared window of `file` that starts at `start` and reaches `end`, for a chunk at
  // [begin, end); null when the budget has no room for the units of the chunk (a new window).
  absl::StatusOr<std::shared_ptr<Window>> GetWindow(uint64_t data_id, File& file, int64_t start,
                                                    int64_t begin, int64_t end,
                                                    std::string_view what);
  // With mu_ held: room for `bytes` more of mapped pages within the budget, made by taking the
  // least recently used windows that no chunk holds out of recent_ (into *evicted, to be unmapped
  // once mu_ is released). False, and nothing taken, when that is not enough.
  bool MakeRoomLocked(int64_t bytes, std::vector<std::shared_ptr<Window>>* evicted);
  // Maps the pages of the units of `window` that [begin, end) lies in, unless mapped before (no
  // system call then), charging them to the budget. False when the budget has no room (the
  // caller reads a copy); an error when the pages cannot be read.
  absl::StatusOr<bool> Populate(Window& window, int64_t begin, int64_t end,
                                const std::string& path, std::string_view what);

  const std::string dir_;
  const SegmentOptions options_;
  const int64_t unit_bytes_;  // windows are populated and charged in units of this many bytes
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<File>> files_;  // guarded by mu_
  // Live windows by (data id, window index); expired entries are swept now and then.
  std::map<std::pair<uint64_t, int64_t>, std::weak_ptr<Window>> windows_;  // guarded by mu_
  int64_t windows_since_sweep_ = 0;                                       // guarded by mu_
  // The most recently used windows, kept mapped even when no chunk of theirs is held, so that a
  // reader going through chunks one at a time does not map and unmap a window for each.
  std::vector<std::shared_ptr<Window>> recent_;  // guarded by mu_, most recent first
  std::atomic<int64_t> bytes_copied_{0};
  const std::shared_ptr<BlockBuffers> block_buffers_;
  // Bytes of windows mapped (shared with the windows, which may outlive this object).
  const std::shared_ptr<std::atomic<int64_t>> window_bytes_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace ckpt::segment_internal

#endif  // CKPT_STORAGE_INTERNAL_SEGMENT_FILES_H_
