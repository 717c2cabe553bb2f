// The write side of segment files (segment_directory.h): appends in extents per upload stream,
// gathered in write blocks and written with direct I/O. Private to the segment store and its
// tests; no RocksDB header.
//
// Appended bytes reach the file in aligned *write blocks* (SegmentOptions::write_block_bytes,
// 2 MiB): gathered in a block's buffer, a block is written once nothing more can be appended to
// it, with direct I/O (no page cache): whole, or up to the next page boundary when its lane left
// it short (zeros after its last byte). What Sync or the bound on idle blocks writes of a block
// still open goes through the page cache. Until a block is written, reads of its bytes are served
// from its buffer (SegmentFile::ReadUnwritten).
//
// Why direct I/O: a block written through the page cache would leave its pages there as small
// folios, which the reader's windows map and unmap page by page instead of with one entry per
// 2 MiB; and an upload would fill the page cache with freshly allocated pages, which on a VM that
// hands free memory back to its host must be faulted in again. Blocks read back after direct
// writes come in as 2 MiB folios (the windows' MADV_HUGEPAGE). The cost: the first read of a
// freshly uploaded checkpoint comes from the disk.
#ifndef CKPT_STORAGE_INTERNAL_SEGMENT_WRITER_H_
#define CKPT_STORAGE_INTERNAL_SEGMENT_WRITER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/internal/segment_directory.h"

namespace ckpt::segment_internal {

// Thread-safe.
class SegmentWriter {
  struct File;
  struct Block;

 public:
  // Writes the files of `directory` (which must outlive the writer) with its options.
  explicit SegmentWriter(SegmentDirectory* directory);
  ~SegmentWriter();
  SegmentWriter(const SegmentWriter&) = delete;
  SegmentWriter& operator=(const SegmentWriter&) = delete;

  // Appends each piece to `data_id`'s file (created on first use), concurrently with other
  // appends to it, and returns each piece's offset; the reader serves the pieces from then on,
  // from the write blocks' buffers until those are written. Unsynced. RESOURCE_EXHAUSTED when the
  // disk is full. A failed write fails every later Append, Sync and read of the data id too (a
  // block held other appends' bytes); its pieces are unreferenced until the caller records their
  // offsets, and go when the data id's file is removed. FAILED_PRECONDITION when this process
  // opened the file to read it (a data id committed before it started).
  //
  // Pieces of one `lane` (an upload stream: the store passes ChunkWrite::stream) go one after
  // the other into *extents* of the file that are the lane's alone, a new one at the end of the
  // file when the lane's current one is full. A lane's extents grow from one write block to the
  // larger of a window and a block (16 MiB by default), each twice the last, and never straddle
  // a window; a piece larger than that gets a region of its own. So a stream's chunks stay
  // together in the file however many streams append at once: a reader of one stored slice maps
  // the few windows that hold it rather than every window the concurrent uploads interleaved it
  // into, and a lane with few bytes leaves little unused. The rest of an extent a lane leaves is
  // a hole (no disk space). A piece of at most a window never straddles a window boundary (the
  // lane skips to the boundary, leaving a hole), so the reader can serve it as a view of one
  // window.
  absl::StatusOr<std::vector<uint64_t>> Append(uint64_t data_id,
                                               const std::vector<std::string_view>& pieces,
                                               uint32_t lane = 0);

  // Room for pieces whose bytes the caller writes in place (Reserve), and what Finish needs.
  // Movable; one owner. The places stay valid until Finish.
  struct Reservation {
    Reservation();
    Reservation(Reservation&&) noexcept;
    Reservation& operator=(Reservation&&) noexcept;
    ~Reservation();
    uint64_t data_id = 0;
    std::vector<uint64_t> offsets;  // of each piece in the file
    // Piece i's bytes go to places[first[i]] .. places[first[i + 1] - 1], in order (more than
    // one where it crosses a write block boundary).
    std::vector<std::span<char>> places;
    std::vector<size_t> first;

   private:
    friend class SegmentWriter;
    std::shared_ptr<File> file;
    std::vector<std::shared_ptr<Block>> touched;  // the blocks its places are in
  };
  // Append's placement without the bytes: each of `sizes` gets its place as Append would give a
  // piece of that size, and its bytes are the caller's to write (what it leaves unwritten reads
  // as whatever the block held). Until Finish, the blocks it lies in stay in memory and are not
  // written. Errors as Append's.
  absl::StatusOr<Reservation> Reserve(uint64_t data_id, const std::vector<int64_t>& sizes,
                                      uint32_t lane = 0);
  // Ends a reservation whose bytes are in place (or that is abandoned: its bytes are then
  // unreferenced, as those of a failed Append): the blocks nothing more can go into are written.
  // The pieces are served from then on. Once per reservation; a second call is a no-op. Errors as
  // Append's.
  absl::Status Finish(Reservation* reservation);
  // Makes every byte of `data_id` appended by the calls that have returned durable (writes the
  // partly filled blocks, then fdatasync of the file and fsync of the directory). A data id with
  // nothing appended has no file: OK.
  absl::Status Sync(uint64_t data_id);

 private:
  struct Lane;
  class BlockBuffers;

  // Bytes of a lane's largest extent: the larger of a window and a write block (one divides
  // the other).
  int64_t ExtentBytes() const {
    return std::max(options_.window_bytes, options_.write_block_bytes);
  }
  // The open, writable file of `data_id`, created when this process has not opened it.
  absl::StatusOr<std::shared_ptr<File>> GetFile(uint64_t data_id);
  // With file.mu held: gives each piece of `sizes` its place in the lane's extents (or a region
  // of its own), into *r its offsets and places and the blocks they lie in, into *ready the
  // blocks to write.
  void PlaceLocked(File& file, const std::vector<int64_t>& sizes, uint32_t lane_id, Reservation* r,
                   std::vector<std::shared_ptr<Block>>* ready);
  // With file.mu held: moves `lane` to a new extent at the end of the file with room for `n`
  // bytes (closing the blocks of its old one); its first offset.
  int64_t NewExtentLocked(File& file, Lane& lane, int64_t n,
                          std::vector<std::shared_ptr<Block>>* ready);
  // With file.mu held: makes the blocks [at, at + n) lies in and adds its places in them to *r
  // (the bytes go there once the lock is released).
  void PlacePieceLocked(File& file, int64_t n, int64_t at, uint64_t append, Reservation* r);
  // With file.mu held: closes the blocks in [from, to) that are still open: nothing more goes
  // into them. Those no reservation is filling go to *ready, to be written by this call.
  static void CloseBlocksLocked(File& file, int64_t from, int64_t to,
                                std::vector<std::shared_ptr<Block>>* ready);
  // Writes `block` as far as it is filled, through the page cache; a failure fails `file`.
  // file.mu held (Sync, WriteIdleBlocksLocked).
  static absl::Status WritePartLocked(File& file, const Block& block);
  // Beyond kMaxIdleBlocks open blocks that no append is using, writes the least recently
  // appended to as far as they are filled and drops them, so that the memory of blocks stays
  // bounded however many lanes a file has. file.mu held.
  static absl::Status WriteIdleBlocksLocked(File& file);
  // Writes blocks that Append or Sync marked for writing, then drops them from `file`.
  absl::Status WriteBlocks(File& file, const std::vector<std::shared_ptr<Block>>& blocks);

  SegmentDirectory* const directory_;
  const SegmentOptions options_;
  const std::shared_ptr<BlockBuffers> block_buffers_;
};

}  // namespace ckpt::segment_internal

#endif  // CKPT_STORAGE_INTERNAL_SEGMENT_WRITER_H_
