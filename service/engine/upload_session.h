// Receiving a checkpoint: one RankUpload per source-rank stream, all feeding one PendingCheckpoint
// that commits atomically when its last rank has been received and validated.
#ifndef CKPT_SERVICE_ENGINE_UPLOAD_SESSION_H_
#define CKPT_SERVICE_ENGINE_UPLOAD_SESSION_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt.pb.h"
#include "core/band_chunker.h"
#include "core/chunk_grid.h"
#include "core/dtype.h"
#include "core/layout.h"
#include "core/strategy.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct UploadOptions {
  ChunkGridOptions chunk_grid;
  // Verbatim (non-sharded) tensors up to this size are buffered so that identical copies from
  // several ranks are stored once; larger ones are stored per rank.
  int64_t verbatim_dedupe_bytes = int64_t{64} << 20;
  // How long a rank that re-sends a slice another rank is still writing waits for it.
  absl::Duration replica_wait = absl::Minutes(10);
  // How long a stream that claims a rank another stream still holds waits for that stream to end
  // (a client that retries at once after its connection dropped races the server's clean-up of
  // the dropped stream).
  absl::Duration rank_release_wait = absl::Seconds(5);
  // Most tensor bytes one rank's upload stream may announce in its tensor headers, in total
  // (ckptd's --max-upload-gib). A header beyond it is refused with RESOURCE_EXHAUSTED before
  // anything is allocated for it. Default 64 GiB.
  int64_t max_upload_bytes = int64_t{64} << 30;
  // A slice this rank writes (outside a batch) is cut into chunks straight in the store's room
  // for them (CheckpointStore::ReserveChunks), reserved a group of bands of rows at a time: as
  // many bands as fit in this many bytes. The group's chunks are placed column band by column
  // band, so that the tiles of one column band of the slice lie together. A band larger than
  // this (and every band, at 0 or less) is cut into the chunker's own buffers, which grow with
  // the bytes that arrive, and written with PutChunks. Default 8 MiB: a slice of up to that is
  // one group, and tiles of ~1 MiB make bands of up to 8 MiB.
  int64_t column_group_bytes = int64_t{8} << 20;
};

class RankUpload;

// One whole tensor of a batch (an UploadTensorBatch): its header and all of its bytes, borrowed.
struct BatchTensor {
  const v1::UploadTensorHeader* header = nullptr;
  std::string_view data;
};

// The shared state of one checkpoint being uploaded. Thread-safe (one mutex); owned by the
// manager's pending map and by every RankUpload of it (shared_ptr).
class PendingCheckpoint {
 public:
  PendingCheckpoint(std::string id, std::string strategy_name,
                    std::shared_ptr<const Strategy> strategy, uint64_t data_id,
                    CheckpointStore* store, UploadOptions options);
  // Frees the records of the tensors received and, when there were many
  // (kTrimAfterSlices slices or more), marks the allocator's free memory for release to the
  // kernel (MarkFreeHeapMemoryForRelease; CheckpointManager::ReleaseFreedUploadMemory releases
  // it once no upload is in progress): a checkpoint of many small tensors leaves hundreds of MiB
  // of freed records that the heap would otherwise keep for as long as the process runs.
  ~PendingCheckpoint();
  PendingCheckpoint(const PendingCheckpoint&) = delete;
  PendingCheckpoint& operator=(const PendingCheckpoint&) = delete;

  // Slices (blobs) of a pending checkpoint from which its release trims the heap.
  static constexpr int64_t kTrimAfterSlices = 10000;

  const std::string& id() const { return id_; }
  const std::string& strategy_name() const { return strategy_name_; }
  uint64_t data_id() const { return data_id_; }
  int64_t world_size() const;
  // True when no stream is active and nothing happened since `cutoff`.
  bool IdleSince(absl::Time cutoff) const;
  bool committed() const;
  // Waits (at most options.rank_release_wait) until no stream holds `rank`: a stream that is
  // ending (its client cancelled or disconnected) releases it soon. Call without other locks.
  void AwaitRankRelease(int64_t rank);
  // True when no stream is active and no rank was received: nothing worth keeping.
  bool Abandoned() const;

 private:
  friend class RankUpload;

  enum class BlobState : uint8_t { kWriting, kDone };
  // One stored blob: a sharded tensor's grid cell or a verbatim tensor's variant. Its manifest
  // record (box, tile, blob index) is worked out from these when the manifest is built.
  struct Slice {
    int64_t cell = 0;  // sharded: the row-major grid cell; verbatim: the variant (its blob index)
    int64_t total_bytes = 0;
    int32_t owner_rank = -1;  // the rank that writes it
    BlobState state = BlobState::kWriting;
    absl::InlinedVector<uint64_t, 1> checksums;  // per chunk, in chunk order (once kDone)
    absl::InlinedVector<int32_t, 2> holders;     // ranks whose files hold these bytes, ascending
    // Verbatim: the tile of its own chunk grid. A sharded cell's is its tensor's cell_chunks'.
    std::vector<int64_t> tile;
  };
  // Grids of up to this many cells find a claimed cell through a dense table (4 bytes a cell),
  // larger ones through a hash map, so that a tensor costs memory in proportion to the slices
  // received rather than to its grid.
  static constexpr int64_t kDenseCells = 256;
  struct Tensor {
    std::string name;  // tensors_'s key views it
    DType dtype = DType::kFloat32;
    const Layout* layout = nullptr;  // sharded: its layout in strategy_ (which outlives it)
    Shape global;                    // the global shape
    // Sharded: the first slice's local shape (whose global shape is `global`), the layout's grid
    // of cells and their number, and the chunk grid of a cell (every cell of a layout has the
    // same shape), in cell_grids_ (once set, never changed while the tensor lives).
    Shape known_local;
    std::vector<int64_t> cell_grid;
    int64_t cell_count = 0;
    const ChunkGrid* cell_chunks = nullptr;
    // Sharded: the cells claimed so far, in the order claimed. Verbatim: the distinct contents,
    // in the order stored.
    std::vector<Slice> slices;
    // Sharded: cell -> index in `slices` (-1: unclaimed), dense for grids of up to kDenseCells
    // cells, else in sparse_slots.
    std::vector<int32_t> dense_slots;
    absl::flat_hash_map<int64_t, int32_t> sparse_slots;
    int32_t rank_count = 0;  // ranks that sent it
    int64_t first_rank = 0;  // order key: (first_rank, position)
    int64_t position = 0;
    uint32_t tensor_index = 0;
    uint32_t next_blob_index = 0;
    // A rank is storing a new variant (RankUpload::StoreVerbatim); others wait for it on cv_.
    bool storing_variant = false;
    // A parameter of the strategy under its own name (not an optimizer state inheriting one).
    bool strategy_param = false;

    // The claimed cell `cell` of a sharded tensor, or null. The pointer is valid until the next
    // AddCell or EraseSlice.
    Slice* FindCell(int64_t cell);
    // Claims cell `cell` (not claimed yet) of a sharded tensor.
    Slice& AddCell(int64_t cell);
    // The variant whose blob index is `blob_index` of a verbatim tensor, or null.
    Slice* FindVariant(int64_t blob_index);
    // Drops slices[i]: a sharded tensor's cell (the last slice takes its place) or a verbatim
    // tensor's variant (the order of the others is kept).
    void EraseSlice(size_t i);
    // The box of grid cell `cell` in global coordinates (sharded); the second form reuses the
    // storage of `*box`.
    Box CellBoxOf(int64_t cell) const;
    void CellBoxOf(int64_t cell, Box* box) const;
    // The shape of every cell (sharded).
    Shape CellShape() const;
  };

  // The chunk grid of a slice of `shape` with `elem_bits` bits per element, made once per pending
  // checkpoint (tensors of one shape share it); null when ChunkGrid::Make refuses the shape.
  // mu_ held. The grid stays at its address, unchanged, while the pending checkpoint lives.
  const ChunkGrid* CellGrid(const Shape& shape, int elem_bits);
  // The manifest's wire form; requires mu_ held and every rank received.
  std::string SerializeManifest();
  // mu_ held: undo a failed rank's contributions. `sent`: the tensor indexes it sent.
  void ReleaseRank(int64_t rank, const std::vector<bool>& sent);

  const std::string id_;
  const std::string strategy_name_;
  const std::shared_ptr<const Strategy> strategy_;  // null: one whole-tensor rank
  const uint64_t data_id_;
  CheckpointStore* const store_;
  const UploadOptions options_;
  // By pipeline stage: the strategy's parameters that the stage holds.
  std::vector<int64_t> stage_params_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // By name (a view of the tensor's own name).
  absl::flat_hash_map<std::string_view, std::unique_ptr<Tensor>> tensors_;
  std::uint32_t next_tensor_index_ = 0;
  absl::node_hash_map<std::pair<Shape, int>, ChunkGrid> cell_grids_;  // CellGrid's
  std::set<int64_t> received_;
  std::set<int64_t> active_;
  std::map<int64_t, std::string> source_files_;
  absl::Time last_activity_;
  bool committed_ = false;
};

// One source rank's stream. Not thread-safe: calls come in stream order. Destroying an unfinished
// upload undoes its contributions (a client killed mid-upload leaves nothing visible). Once a
// message is refused (StartTensor, Append, AddBatch or EndBatch returned an error) the upload is
// failed: those calls and Finish return FAILED_PRECONDITION naming that first refusal, and only
// its destruction remains (it then holds nothing of the refused message's bytes).
class RankUpload {
 public:
  // FAILED_PRECONDITION when the rank is already being received or was received.
  static absl::StatusOr<std::unique_ptr<RankUpload>> Start(
      std::shared_ptr<PendingCheckpoint> pending, int64_t rank, std::string source_file);
  ~RankUpload();

  absl::Status StartTensor(const v1::UploadTensorHeader& header);
  absl::Status Append(std::string_view data);
  // A run of whole tensors (an UploadTensorBatch): between BeginBatch and EndBatch the chunks of
  // the slices this rank writes are collected (copied) instead of written one tensor at a time,
  // and EndBatch stores them in one PutChunks and only then marks those slices complete, so that
  // a failed write leaves them unclaimed, as an unfinished slice is. Verbatim values are written
  // at once (other ranks may count on a stored copy as soon as it is listed). No tensor may be
  // open at EndBatch.
  void BeginBatch();
  absl::Status EndBatch();
  // A whole UploadTensorBatch: each tensor started and given all of its bytes between BeginBatch
  // and EndBatch. INVALID_ARGUMENT when a tensor's header is refused or its bytes are not exactly
  // the announced ones, or when a tensor's bytes were still due before the batch; any error fails
  // the upload (above) and drops what the batch collected.
  absl::Status AddBatch(const std::vector<BatchTensor>& tensors);
  // Validates completeness, waits for replicas being written by other ranks, and commits the
  // checkpoint when this was its last rank.
  absl::StatusOr<v1::UploadResponse> Finish();

  // True between a tensor header and the last of its announced bytes.
  bool tensor_open() const { return current_.has_value(); }
  int64_t rank() const { return rank_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  RankUpload(std::shared_ptr<PendingCheckpoint> pending, int64_t rank);

  enum class Mode { kWrite, kVerify, kBuffer };
  using Checksums = absl::InlinedVector<uint64_t, 1>;
  struct Current {
    // The header's name (valid while the header is) until the slice is claimed, then its
    // tensor's own.
    std::string_view name;
    DType dtype = DType::kFloat32;
    Mode mode = Mode::kWrite;
    int64_t total = 0;
    int64_t received = 0;
    int64_t cell = 0;  // sharded: the grid cell
    uint32_t tensor_index = 0;
    uint32_t blob_index = 0;
    // Set by AddTensorLocked; stays in tensors_ while this rank holds it (only this rank's
    // ReleaseRank, on this thread, can drop it).
    PendingCheckpoint::Tensor* tensor = nullptr;
    const ChunkGrid* grid = nullptr;     // sharded: the tensor's cell_chunks, when made
    std::optional<BandChunker> chunker;  // cuts the slice's bytes into chunks, band by band
    // Written in place (StartBand): the store's room for the bands [group_begin, group_end),
    // column band by column band.
    bool in_place = false;
    std::unique_ptr<ChunkReservation> reservation;
    int64_t group_begin = 0;
    int64_t group_end = 0;
    int64_t group_bytes = 0;
    int64_t next_band = -1;     // in place: the band StartBand starts when its first byte arrives
    std::vector<int64_t> tile;  // verbatim: the tile of its own chunk grid (empty for 0 bytes)
    std::string value;    // the whole value, while buffered for a verbatim comparison (kBuffer)
    Checksums checksums;  // per chunk, in chunk order
  };
  // The message calls' work (the public calls check and record the upload's failure around it).
  absl::Status DoStartTensor(const v1::UploadTensorHeader& header);
  absl::Status DoAppend(std::string_view data);
  absl::Status DoEndBatch();
  absl::Status DoAddBatch(const std::vector<BatchTensor>& tensors);
  // OK, or FAILED_PRECONDITION naming the refusal that failed the upload.
  absl::Status CheckNotFailed() const;
  // Returns `s`. An error fails the upload (the first is kept in failed_) and drops what a batch
  // had collected, whose writes may point into the refused message's bytes.
  absl::Status Refuse(absl::Status s);

  // A slice written in a batch, marked complete by EndBatch.
  struct WrittenSlice {
    PendingCheckpoint::Tensor* tensor = nullptr;  // as Current::tensor
    int64_t cell = 0;                             // sharded: the grid cell; verbatim: the variant
    std::vector<int64_t> tile;                    // verbatim
    Checksums checksums;
    int64_t total = 0;
  };
  // A replica of a slice another rank writes, compared with it at Finish.
  struct Verification {
    PendingCheckpoint::Tensor* tensor = nullptr;  // as Current::tensor
    int64_t cell = 0;
    Checksums checksums;
  };

  // A tensor header checked on its own: the slice to claim (cur) and its local shape.
  struct Prepared {
    Current cur;
    Shape local;
  };
  absl::Status PrepareTensor(const v1::UploadTensorHeader& header, Prepared* p) const;
  // Makes the claimed slice `cur` current: its chunk grid and chunker. `whole`: all of its bytes
  // (a batched tensor), for a slice of one chunk checksummed and queued as a view of them at once
  // (the tensor is then finished).
  absl::Status BeginTensor(Current cur, const std::string_view* whole);
  // PrepareTensor's steps. Checks the header on its own and fills cur's name, dtype and total and
  // the slice's local shape (dims [0] and str values are scalars).
  absl::Status CheckHeader(const v1::UploadTensorHeader& header, Current* cur, Shape* local) const;
  // The global shape of a slice of shape `local` under `layout` (null: the tensor is verbatim, so
  // `local`); INVALID_ARGUMENT when this rank's stage does not hold the tensor or the shape does
  // not fit the layout.
  absl::StatusOr<Shape> GlobalShape(std::string_view name, const Layout* layout,
                                    const Shape& local) const;
  // Records the slice in the pending checkpoint (creating its tensor, with its layout in the
  // strategy, on first sight), checks it against the copies earlier ranks sent, and claims its
  // cell or variant in `cur`. INVALID_ARGUMENT when this rank sent the tensor before.
  // pending_->mu_ held.
  absl::Status AddTensorLocked(const Shape& local, Current* cur);
  // A tensor seen for the first time (this rank first sends it): its record, with `global` and,
  // when `layout` is set, the grid of its cells, added to pending_->tensors_ under cur's name.
  // pending_->mu_ held.
  PendingCheckpoint::Tensor* NewTensorLocked(const Current& cur, const Layout* layout,
                                             bool strategy_param, const Shape& local, Shape global);
  // A sharded slice: its grid cell, written by this rank or verified against the rank that
  // writes it. pending_->mu_ held.
  absl::Status ClaimCellLocked(PendingCheckpoint::Tensor& t, Current* cur);
  // A verbatim tensor: buffered for comparison with other ranks' copies when small, else
  // written as a variant of its own. pending_->mu_ held.
  void ClaimVariantLocked(PendingCheckpoint::Tensor& t, Current* cur);
  // Finish's steps: every parameter of this rank's pipeline stage was sent; every replica equals
  // the stored copy (waiting for the rank that writes it; pending_->mu_ held by `lock`); and, for
  // the last rank, the completeness check and the commit. pending_->mu_ held.
  absl::Status CheckStageSentLocked() const;
  absl::Status VerifyReplicasLocked(std::unique_lock<std::mutex>& lock);
  absl::Status CommitLocked();
  // Feeds slice bytes to the chunker, starting each band (Current::next_band) when its first
  // byte arrives and flushing every band it completes.
  absl::Status ChunkBands(std::string_view data);
  absl::Status FlushBand();  // checksums and (unless verifying) writes the chunker's full band
  // Starts the chunker's band `band`: in place (Current::in_place) into the group reserved for it,
  // reserving the group that begins with it first, or (not in place, or a band larger than a
  // group) into the chunker's buffers.
  absl::Status StartBand(int64_t band);
  // Reserves the group of bands that begins with `band` (UploadOptions::column_group_bytes);
  // none when that band alone exceeds it.
  absl::Status ReserveGroup(int64_t band);
  absl::Status FinishTensor();
  // FinishTensor's work for the slice `c` (current_ or a slice finished before it became
  // current): queued for EndBatch, marked written, or kept for verification.
  absl::Status CompleteSlice(Current& c);
  // Records a written slice's tile, checksums and size and marks it complete. pending_->mu_ held.
  absl::Status MarkWrittenLocked(WrittenSlice& slice);
  absl::Status StoreVerbatim();
  std::string Where() const;  // "checkpoint X rank R"
  // True when this rank sent the tensor of index `tensor_index`.
  bool Sent(uint32_t tensor_index) const {
    return tensor_index < sent_.size() && sent_[tensor_index];
  }

  std::shared_ptr<PendingCheckpoint> pending_;
  const int64_t rank_;
  const int32_t stage_;
  const int64_t local_rank_;
  std::optional<Current> current_;
  // By tensor index (PendingCheckpoint::Tensor::tensor_index): the tensors this rank sent, set
  // when their slice is claimed; and how many.
  std::vector<bool> sent_;
  int64_t tensors_sent_ = 0;
  // Of them, parameters of the strategy under their own name (each in this rank's stage, or its
  // slice would have been refused).
  int64_t params_sent_ = 0;
  std::vector<Verification> verifications_;
  // Between BeginBatch and EndBatch: chunk writes not stored yet and the slices they complete.
  // Their bytes are copied one after the other into batch_bytes_ (whose capacity is kept from
  // batch to batch) and batch_writes_[i].bytes is set at EndBatch from batch_ends_[i] (its end
  // in batch_bytes_), when batch_bytes_ no longer grows.
  bool batching_ = false;
  std::vector<ChunkWrite> batch_writes_;
  std::string batch_bytes_;
  std::vector<size_t> batch_ends_;  // kBorrowedBytes: the write's bytes are the caller's
  static constexpr size_t kBorrowedBytes = ~size_t{0};
  std::vector<Prepared> prepared_;  // AddBatch's, reused
  std::vector<WrittenSlice> batch_slices_;
  std::vector<ChunkWrite> band_writes_;                        // FlushBand's, reused
  std::vector<ChunkSpace> group_spaces_;                       // ReserveGroup's, reused
  std::vector<std::span<const std::span<char>>> band_places_;  // StartBand's, reused
  absl::Status failed_;                                        // the first refused message's error
  int64_t bytes_received_ = 0;
  int64_t bytes_announced_ = 0;  // total_bytes of the tensor headers accepted so far
  int64_t bytes_stored_ = 0;
  int64_t position_ = 0;
  std::vector<std::string> warnings_;
  bool finished_ = false;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_UPLOAD_SESSION_H_
