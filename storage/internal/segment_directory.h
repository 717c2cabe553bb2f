// The segment files of the segment store: one append-only file per upload data id
// (`<dir>/<data id, 16 hex digits>.seg`) holding the upload's chunk bytes, indexed by the store's
// chunk-location records (storage/internal/index_records.h). What the segment writer
// (segment_writer.h: extents, write blocks, direct I/O) and the segment reader (segment_reader.h:
// window mapping, map budget) share: their options, the files open in this process, the
// directory's listing. Private to the segment store and its tests; no RocksDB header.
//
// A chunk read from a segment file is a view of a read-only mapping of the file (page cache, no
// copy) that gRPC sends as it is; a chunk the writer has not written yet is read from its write
// block's buffer.
#ifndef CKPT_STORAGE_INTERNAL_SEGMENT_DIRECTORY_H_
#define CKPT_STORAGE_INTERNAL_SEGMENT_DIRECTORY_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/checkpoint_store.h"

namespace ckpt::segment_internal {

struct SegmentOptions {
  // Bytes of one window (a multiple of the page size): what the reader maps at a time, and a
  // boundary the writer never lets a chunk of at most a window straddle.
  int64_t window_bytes = int64_t{16} << 20;
  // At most this many bytes of windows' pages are mapped at once (they count in the process's
  // RSS). Pages are mapped in units of a write block (MADV_POPULATE_READ, the first time a chunk
  // in the unit is read from the window), and a window counts the units it mapped, not its
  // length: a reader of a column band maps a few units of each window. Beyond it, chunks are read
  // into memory of their own (pread): a window's pages served to one reader stay mapped while
  // another reader holds a chunk of the same window, so without a bound concurrent fetches would
  // keep every window they touch mapped.
  int64_t window_budget_bytes = int64_t{192} << 20;
  // Windows kept mapped after their last chunk is released (SegmentReader's recent windows),
  // until the budget needs their room for a window that a read needs. By default as many as the
  // budget holds: a fetch's reads jump between the windows its source ranks were uploaded into
  // (several ranks upload into one file at once), and a short list would map and unmap the same
  // windows over and over.
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

// The system's page size.
int64_t PageBytes();

// "<16 lower-case hex digits>.seg": the name of data id `data_id`'s segment file.
std::string SegmentFileName(uint64_t data_id);

// One data id's segment file, open in this process: created by the writer (writable; the
// writer's file type derives from this one and adds its write state) or opened read-only by the
// reader (the file of a data id committed before this process started). Shared (shared_ptr) by
// the writer, the reader and the directory; the descriptor is closed with the last owner.
// `path`, `fd` and `writable` are fixed once the file is open; the atomics may be read and
// written from any thread.
struct SegmentFile {
  SegmentFile() = default;
  SegmentFile(const SegmentFile&) = delete;
  SegmentFile& operator=(const SegmentFile&) = delete;
  virtual ~SegmentFile();  // closes fd

  // Raises `size` to `at_least` (never lowers it).
  void NoteSize(int64_t at_least) {
    int64_t known = size.load(std::memory_order_relaxed);
    while (known < at_least && !size.compare_exchange_weak(known, at_least)) {
    }
  }

  // Whether a read must ask ReadUnwritten first: the file has write blocks not yet written, or a
  // write failed. Read without a lock: a block only ever holds bytes appended after it was made,
  // so none means the file alone has every appended byte.
  bool MayHoldUnwritten() const {
    return block_count.load(std::memory_order_relaxed) > 0 || failed.load();
  }

  // [begin, end) as a copy, from the buffers of the write blocks not yet written and the file;
  // nullopt when no block holds any of it; the write error once a write failed (every later read
  // fails). The writer's file overrides it; a read-only file has no blocks.
  virtual absl::StatusOr<std::optional<std::unique_ptr<ChunkData>>> ReadUnwritten(int64_t begin,
                                                                                  int64_t end);

  std::string path;
  int fd = -1;
  bool writable = false;
  std::atomic<int64_t> size{0};         // bytes known to exist, so mappable without SIGBUS
  std::atomic<int64_t> block_count{0};  // the writer's blocks not yet written
  std::atomic<bool> failed{false};      // a write of the writer failed
};

// A chunk read into memory of its own (pread, or copied out of a write block).
class CopiedChunk final : public ChunkData {
 public:
  explicit CopiedChunk(size_t size) : bytes_(new char[size]), size_(size) {}
  char* data() { return bytes_.get(); }
  size_t size() const { return size_; }
  std::string_view bytes() const override { return std::string_view(bytes_.get(), size_); }

 private:
  std::unique_ptr<char[]> bytes_;
  size_t size_;
};

// Reads the `n` bytes at `at` of `file` into `out`, part of the chunk at [begin, end): errors
// name the file; one that ends first is DATA_LOSS naming the segment file and the chunk.
absl::Status ReadChunkBytes(const SegmentFile& file, char* out, int64_t n, int64_t at,
                            int64_t begin, int64_t end);

// The directory of segment files and the files open in this process. Thread-safe.
class SegmentDirectory {
 public:
  // Checks `options` (INVALID_ARGUMENT for a window or write block that is not a positive
  // multiple of the page size, or when neither is a multiple of the other) and creates `dir` if
  // needed.
  static absl::StatusOr<std::unique_ptr<SegmentDirectory>> Open(std::string dir,
                                                                SegmentOptions options = {});
  SegmentDirectory(const SegmentDirectory&) = delete;
  SegmentDirectory& operator=(const SegmentDirectory&) = delete;

  const std::string& dir() const { return dir_; }
  const SegmentOptions& options() const { return options_; }
  std::string PathOf(uint64_t data_id) const;

  // The file of `data_id` open in this process, or null.
  std::shared_ptr<SegmentFile> Find(uint64_t data_id) const;
  // The file of `data_id` open in this process, else the one `open(path)` opens (kept from then
  // on). `open` runs with the directory's lock held, so a file is opened once.
  using Opener =
      absl::FunctionRef<absl::StatusOr<std::shared_ptr<SegmentFile>>(const std::string&)>;
  absl::StatusOr<std::shared_ptr<SegmentFile>> FindOrOpen(uint64_t data_id, Opener open);
  // Forgets `data_id`'s open file and deletes the file if it exists. Views read before stay valid
  // (a mapping outlives the name); the reader's windows of it go with SegmentReader::Forget.
  absl::Status Remove(uint64_t data_id);
  // The data ids that have a segment file in the directory, ascending.
  absl::StatusOr<std::vector<uint64_t>> List() const;

 private:
  SegmentDirectory(std::string dir, SegmentOptions options)
      : dir_(std::move(dir)), options_(options) {}

  const std::string dir_;
  const SegmentOptions options_;
  mutable std::mutex mu_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<SegmentFile>> files_;  // guarded by mu_
};

}  // namespace ckpt::segment_internal

#endif  // CKPT_STORAGE_INTERNAL_SEGMENT_DIRECTORY_H_
