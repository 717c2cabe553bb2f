// The read side of segment files (segment_directory.h): chunks as views of shared read-only
// mappings of their files, within a budget of mapped bytes. Private to the segment store and its
// tests; no RocksDB header.
//
// Mappings are *windows* (SegmentOptions::window_bytes), shared by the chunks that lie in them and
// unmapped when the last chunk read from them is released (and it is not among the recent windows
// kept for reuse), so a process maps (and counts in its RSS) only what its readers hold. The
// writer never lets a chunk of at most a window straddle a window boundary, so every such chunk is
// a view of one window. Windows are mapped with MADV_HUGEPAGE: a read of a write block that is
// not in the page cache brings it in as one 2 MiB folio, which the window then maps with one
// page-table entry instead of 512, and a window maps its pages, and counts them against
// SegmentOptions::window_budget_bytes, a write block at a time (MADV_POPULATE_READ, which also
// turns a disk error into an error naming the file instead of a SIGBUS). A chunk the budget has no
// room for, or one larger than a window, is read as a copy.
#ifndef CKPT_STORAGE_INTERNAL_SEGMENT_READER_H_
#define CKPT_STORAGE_INTERNAL_SEGMENT_READER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"
#include "storage/internal/segment_directory.h"

namespace ckpt::segment_internal {

struct SegmentWindow;  // a mapping of part of a segment file (segment_reader.cc)

// What one caller's reads of many chunks in a row keep from one read to the next
// (SegmentReader::Read): the file and the last few windows its chunks came from, so that a chunk
// of the same file, or of one of those windows, is read without looking them up again (the chunks
// of many small tensors lie side by side). Not thread-safe: one per thread. Holding it keeps that
// file open and those windows mapped: drop it when the run of reads ends.
class ReadCursor {
 private:
  friend class SegmentReader;
  uint64_t data_id_ = 0;
  std::shared_ptr<SegmentFile> file_;
  // The last few windows of file_ (a tensor's chunks come from a few source ranks' extents),
  // each with the units seen populated.
  struct Slot {
    std::shared_ptr<SegmentWindow> window;
    uint64_t populated = 0;
  };
  std::array<Slot, 8> windows_;
  size_t next_ = 0;  // the slot the next new window takes
};

// Thread-safe. Chunks it returns stay valid after the reader, its directory and the file are gone
// (a view keeps its window mapped).
class SegmentReader {
 public:
  // Reads the files of `directory` (which must outlive the reader) with its options.
  explicit SegmentReader(SegmentDirectory* directory);
  ~SegmentReader();
  SegmentReader(const SegmentReader&) = delete;
  SegmentReader& operator=(const SegmentReader&) = delete;

  // The `length` bytes at `offset` of `data_id`'s file, as a view of a shared read-only mapping
  // (a copy when the windows' budget is spent or the chunk is larger than a window); the bytes of
  // a live upload that the writer has not written yet come from its write blocks (a copy).
  // DATA_LOSS naming the file when it is missing or too short (damaged behind the store's back);
  // `what` ("chunk data 3 tensor 1 blob 0 chunk 2") prefixes errors; empty: no prefix (a caller
  // that names the chunk itself, and only on error).
  absl::StatusOr<std::unique_ptr<ChunkData>> Read(uint64_t data_id, uint64_t offset,
                                                  uint64_t length, std::string_view what);

  // Read, reusing and updating `cursor`.
  absl::StatusOr<std::unique_ptr<ChunkData>> Read(uint64_t data_id, uint64_t offset,
                                                  uint64_t length, std::string_view what,
                                                  ReadCursor& cursor);
  // Drops the windows of `data_id` (its file is being removed); views read before stay valid.
  void Forget(uint64_t data_id);

  // Windows currently mapped (tests).
  int64_t mapped_windows() const;
  // Bytes of windows' pages mapped now (the units populated, SegmentOptions::window_budget_bytes).
  int64_t mapped_bytes() const { return window_bytes_->load(std::memory_order_relaxed); }
  // Bytes of chunks Read returned as copies (over the budget, larger than a window, or not yet
  // written by the writer).
  int64_t bytes_copied() const { return bytes_copied_.load(std::memory_order_relaxed); }

 private:
  using Window = SegmentWindow;

  // The open file of `data_id` (opened read-only when this process has not opened it).
  absl::StatusOr<std::shared_ptr<SegmentFile>> GetFile(uint64_t data_id);
  void KeepRecent(const std::shared_ptr<Window>& window);  // mu_ held
  // The shared window of `file` that starts at `start` and reaches `end`, for a chunk at
  // [begin, end); null when the budget has no room for the units of the chunk (a new window).
  absl::StatusOr<std::shared_ptr<Window>> GetWindow(uint64_t data_id, const SegmentFile& file,
                                                    int64_t start, int64_t begin, int64_t end,
                                                    std::string_view what);
  // With mu_ held: room for `bytes` more of mapped pages within the budget, made by taking the
  // least recently used windows that no chunk holds out of recent_ (into *evicted, to be unmapped
  // once mu_ is released). False, and nothing taken, when that is not enough.
  bool MakeRoomLocked(int64_t bytes, std::vector<std::shared_ptr<Window>>* evicted);
  // The bits of `window`'s units that [begin, end) lies in (Window::populated).
  uint64_t UnitMask(const Window& window, int64_t begin, int64_t end) const;
  // Maps the pages of the units of `window` that [begin, end) lies in, unless mapped before (no
  // system call then), charging them to the budget. False when the budget has no room (the
  // caller reads a copy); an error when the pages cannot be read.
  absl::StatusOr<bool> Populate(Window& window, int64_t begin, int64_t end, const std::string& path,
                                std::string_view what);
  // [begin, end) of `file` read into memory of its own.
  absl::StatusOr<std::unique_ptr<ChunkData>> ReadCopy(const SegmentFile& file, int64_t begin,
                                                      int64_t end, std::string_view what);

  SegmentDirectory* const directory_;
  const SegmentOptions options_;
  const int64_t unit_bytes_;  // windows are populated and charged in units of this many bytes
  mutable std::mutex mu_;
  // Live windows by (data id, window index); expired entries are swept now and then.
  std::map<std::pair<uint64_t, int64_t>, std::weak_ptr<Window>> windows_;  // guarded by mu_
  int64_t windows_since_sweep_ = 0;                                        // guarded by mu_
  // The most recently used windows, kept mapped even when no chunk of theirs is held, so that a
  // reader going through chunks one at a time does not map and unmap a window for each.
  std::vector<std::shared_ptr<Window>> recent_;  // guarded by mu_, most recent first
  std::atomic<int64_t> bytes_copied_{0};
  // Bytes of windows mapped (shared with the windows, which may outlive this object).
  const std::shared_ptr<std::atomic<int64_t>> window_bytes_ =
      std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace ckpt::segment_internal

#endif  // CKPT_STORAGE_INTERNAL_SEGMENT_READER_H_
