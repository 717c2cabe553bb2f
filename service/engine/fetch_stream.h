// Produces the messages of one Fetch: a plan summary, then per tensor a header and its bytes in
// ≤ max_message_bytes pieces. Bytes are assembled one band of destination rows at a time from
// only the stored chunks that overlap, so memory stays bounded whatever the tensor size. For a
// Fetch client (FetchReader::kClient) the messages are those of proto/ckpt.proto FetchData:
// parts with checksums, and bands of tiles where stored chunks do not stack into rows.
#ifndef CKPT_SERVICE_ENGINE_FETCH_STREAM_H_
#define CKPT_SERVICE_ENGINE_FETCH_STREAM_H_

#include <cstdint>
#include <functional>
#include <limits>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "ckpt.pb.h"
#include "core/chunk_grid.h"
#include "core/reshard.h"
#include "service/engine/fetch_layout.h"
#include "service/engine/loaded_checkpoint.h"
#include "service/engine/shared_chunks.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct FetchOptions {
  // Largest data message (the API promises ≤ 1 MiB).
  int64_t max_message_bytes = int64_t{1} << 20;
  // Destination rows are assembled in bands of about this many bytes. Where the rows are whole
  // rows of stored chunks, a band references the chunks instead of copying them, and ends at a
  // chunk boundary where it can so that the next bands hold whole chunks.
  int64_t band_bytes = int64_t{1} << 20;
  // A whole stored chunk at least this large is sent as a message of its own, carrying the
  // chunk's stored checksum; smaller ones are combined into messages of up to max_message_bytes.
  int64_t whole_chunk_message_bytes = int64_t{256} << 10;
  // Recently read chunks kept for the next band (a chunk's rows can span several bands). They
  // are shared with other streams (SharedChunks), so this bounds what one stream holds on to,
  // not memory of its own.
  int64_t chunk_cache_bytes = int64_t{16} << 20;
  // FetchReader::kClient: a whole stored chunk at least this large in a combined message is a
  // part of its own with its stored checksum; smaller ones are hashed with their neighbours.
  int64_t min_part_bytes = int64_t{4} << 10;
  // FetchReader::kClient, for a client that reads batches (FetchRequest.accept_batches): runs of
  // tensors of at most batch_tensor_bytes each go whole in FetchTensorBatch messages of at most
  // max_message_bytes of data. A stream's first batch holds at most batch_first_tensors tensors
  // (its first bytes leave early), each next one twice as many as the one before, up to
  // batch_max_tensors. Every tensor that fits in a message by default: one of more than half a
  // message then costs one message instead of a header and a data message.
  bool batches = false;
  int64_t batch_tensor_bytes = int64_t{1} << 20;
  int batch_first_tensors = 16;
  int batch_max_tensors = 2048;
  // Batches of direct tensors (FetchLayout) are made from the plan's layout, not band by band
  // (false: every tensor band by band, as tests compare).
  bool direct_batches = true;
};

// Who reads a stream's data messages, which decides how they are checksummed and laid out. Every
// byte a stream produces is verified against its stored checksum: by the stream, or (whole stored
// chunks to kClient) by the client.
enum class FetchReader {
  // A reader in this process (a transform job): row-major bytes only, no checksums.
  kInProcess,
  // A Fetch client (proto/ckpt.proto FetchData): every data message is cut into checksummed
  // parts. Whole stored chunks (a message, or a part, of their own) carry their stored checksum
  // and are not hashed here at all: the client, which verifies every part, checks them. A band
  // that several stored chunks supply without stacking into rows comes as tiles (the chunks'
  // regions, whole chunks as stored) for the client to assemble.
  kClient,
};

// A run of a data message's bytes, kept alive by `owner` (a stored chunk read from the store, or
// a buffer the stream assembled): messages reference chunk memory instead of copying it.
struct DataSegment {
  std::shared_ptr<const void> owner;
  std::string_view bytes;
  // Set when `bytes` is a whole stored chunk: its manifest checksum, so that a message or part of
  // just this chunk needs no pass over its bytes on the server.
  std::optional<uint64_t> stored_checksum;
  // The stored chunk `bytes` come from; null for an assembled band (verified bytes).
  std::shared_ptr<StreamChunk> chunk;
};

// A run of a data message's bytes and their Checksum (FetchData.part_bytes / part_checksums).
struct ChecksumPart {
  int64_t bytes = 0;
  uint64_t checksum = 0;
};

// One Fetch message: `message` (the plan summary, a tensor header, or a batch without its data)
// when `segments` is empty; otherwise a data message whose bytes are the concatenated segments,
// or, when `message` holds a batch (FetchTensorBatch: its headers only), that batch's data.
struct FetchPiece {
  v1::FetchResponse message;
  // For a batch: its tensors' headers serialised as protobuf writes FetchTensorBatch.tensors
  // (AppendBatchTensorHeader), ahead of any in message.batch().tensors. FetchStream writes them
  // here rather than building a message per tensor.
  std::string batch_headers;
  std::vector<DataSegment> segments;
  // FetchReader::kClient: the parts in order, at least one; they cover the segments exactly.
  // Empty for kInProcess.
  std::vector<ChecksumPart> parts;
  int64_t data_bytes = 0;
  // A message of tiles (FetchData.tile_box, band_rows): one part per tile, each tile's box in
  // the slice's local coordinates, lo then hi.
  std::vector<int64_t> tile_box;
  int64_t band_rows = 0;
};

// Appends FetchTensorBatch.tensors entry (field 1) holding FetchTensorHeader{name, dtype,
// local_shape (box's shape), global_shape, box_lo, box_hi, total_bytes, verbatim} to `out`, byte
// for byte as protobuf serialises it (fields in number order, defaults omitted, repeated int64
// packed).
void AppendBatchTensorHeader(std::string_view name, std::string_view dtype, const Box& box,
                             std::span<const int64_t> global_shape, int64_t total_bytes,
                             bool verbatim, std::string* out);

// Not thread-safe: one producer at a time.
class FetchStream {
 public:
  // Reads stored chunks through `chunks` (shared with the other streams; not owned, must outlive
  // the stream), as `member` of its cohort (the streams of identical plans; may be null).
  FetchStream(std::shared_ptr<const LoadedCheckpoint> checkpoint,
              std::shared_ptr<const RankPlan> plan, SharedChunks* chunks, FetchOptions options,
              std::unique_ptr<CohortMember> member = nullptr);

  // Whether the next piece may be produced now without running too far ahead of the stream's
  // cohort (CohortMember::MayProceed): when false, `wake` is called once when it may. A caller
  // that never asks is not held back (but others may wait for it).
  bool MayProceed(std::function<void()> wake) {
    return member_ == nullptr || member_->MayProceed(std::move(wake));
  }

  // Fills `out` with the next message for `reader`, without copying data: `out->segments`
  // reference chunk or band memory. False when the stream is complete. Errors name the checkpoint
  // and tensor (DATA_LOSS on a checksum mismatch). The same `reader` must be passed to every
  // call. Once it returns false or an error the stream has left its cohort and pace group.
  absl::StatusOr<bool> NextPiece(FetchPiece* out, FetchReader reader);
  // NextPiece for FetchReader::kInProcess with the data copied into `out` (FetchData.data only,
  // row-major, no checksums): for in-process readers that want messages, and tests.
  absl::StatusOr<bool> Next(v1::FetchResponse* out);

  int64_t total_bytes() const { return total_bytes_; }
  int64_t bytes_produced() const { return bytes_produced_; }
  // Tensors sent from the plan's layout (DirectBatchPiece).
  int64_t direct_tensors() const { return direct_tensors_; }

 private:
  // A stored chunk and the region of the current band it supplies, in global coordinates.
  struct Piece {
    std::shared_ptr<StreamChunk> chunk;
    Box chunk_box;
    Box region;
  };
  // One copy op of the current tensor, resolved once per tensor rather than per band: its
  // source region (global coordinates), the stored slice that holds it, and its chunk grid.
  struct Source {
    Box region;
    const records::BlobRecord* blob = nullptr;
    std::vector<int64_t> blob_lo;
    ChunkGrid grid;
  };

  // When every piece supplies whole rows of the band that are also whole rows of its chunk,
  // fills `out` with views of the chunks in row order (sorting `pieces` so) and returns true;
  // otherwise returns false with `out` empty (see the definition).
  static bool ReferenceChunks(DType dtype, const Box& band, std::span<Piece> pieces,
                              std::vector<DataSegment>* out);
  // Fills band_ with the next band of the current tensor, or sets tensor_done_; the functions
  // after it are its steps.
  absl::Status BuildBand();
  // A str tensor's next band: its next stored chunk, raw.
  absl::Status BuildStrBand(const TensorPlan& t, const records::TensorRecord& r);
  // Sets `band_box` (a copy of the tensor's box) to the next rows, about band_bytes of them, and
  // `row_bytes` to the bytes of one row; false when the tensor is done.
  bool NextBandRows(const TensorPlan& t, Box* band_box, int64_t* row_bytes);
  // Extends `band_box` to the end of the chunks `pieces` cut, if that is within `max_bytes`:
  // true when it did (the pieces are then to be collected again).
  bool WidenToChunkEnds(const TensorPlan& t, std::span<const Piece> pieces, int64_t row_bytes,
                        int64_t max_bytes, Box* band_box);
  // For a band of referenced chunks (`pieces` in row order, one per segment of band_) that ends
  // inside a chunk: ends it at the last chunk boundary within it instead (the cut chunk stays
  // cached for the next band), so that the bands after it start at chunk boundaries and hold
  // whole chunks.
  void EndAtChunkBoundary(std::span<const Piece> pieces, Box* band_box);
  // NextPiece's work; NextPiece leaves the cohort once it returns false or an error.
  absl::StatusOr<bool> ProducePiece(FetchPiece* out, FetchReader reader);
  // The band as tiles (FetchReader::kClient): whole chunks as stored, parts of chunks verified
  // and cut out.
  absl::Status CutTiles(const TensorPlan& t, const Box& band_box, std::span<const Piece> pieces,
                        int64_t band_bytes);
  // The band assembled row-major in a buffer of its own from the (verified) pieces.
  absl::Status AssembleBand(const TensorPlan& t, const Box& band_box, std::span<const Piece> pieces,
                            int64_t band_bytes);
  // NextPiece's messages: the plan summary; a tensor's header (resetting the per-tensor state);
  // the next tiles of a band of tiles; the next data message of any other band.
  void SummaryPiece(FetchPiece* out) const;
  void HeaderPiece(const TensorPlan& t, FetchPiece* out);
  // Resets the per-tensor state for the next tensor, and fills `h` with its header.
  void StartTensor();
  void FillHeader(const TensorPlan& t, v1::FetchTensorHeader* h) const;
  // FillHeader's header, serialised onto `out` (AppendBatchTensorHeader).
  void AppendHeader(const TensorPlan& t, std::string* out) const;
  // Whether a tensor of `bytes` bytes may go in a batch (options_.batches).
  bool Batchable(int64_t bytes) const;
  // A FetchTensorBatch of the tensors from the current one on (the current one batchable): each
  // tensor's bands as rows, its chunks verified unless they leave whole with their stored
  // checksum, then the batch's parts.
  absl::Status BatchPiece(FetchPiece* out);
  // BatchPiece for a batch that starts with a direct tensor (FetchLayout): the direct tensors'
  // chunk ranges, got with one SharedChunks::GetMany, verified unless they leave whole with their
  // stored checksum; any other tensor of the batch assembled by AppendBatchTensor. The same
  // messages as BatchPiece's. (BatchPiece, for batches that start with another tensor, ends them
  // at the next direct tensor.)
  absl::Status DirectBatchPiece(const FetchLayout& layout, FetchPiece* out);
  // Appends direct tensor `lt` of `layout` (the current one) to the batch `out`: its header and
  // views of its chunk ranges, whose chunks are `requests[j - ref_begin].result` for its refs j.
  absl::Status AppendDirectTensor(const FetchLayout& layout, const FetchLayout::Tensor& lt,
                                  std::span<const SharedChunks::Request> requests, size_t ref_begin,
                                  FetchPiece* out);
  // Appends tensor `t` (the current one, of `bytes` bytes) to the batch `out`: its header, and
  // its bands as rows, their chunks verified unless they leave whole with their stored checksum.
  absl::Status AppendBatchTensor(const TensorPlan& t, int64_t bytes, FetchPiece* out);
  void TilePiece(FetchPiece* out);
  absl::Status DataPiece(FetchReader reader, FetchPiece* out);
  // Fills sources_ for the current tensor (unless done, or resolved ahead by PrefetchBatch):
  // errors name a copy op without a stored slice, or a slice whose recorded grid is invalid.
  absl::Status ResolveSources();
  // Resolves the copy ops of plan_->tensors[tensor] into the first `*count` of `*sources`.
  absl::Status ResolveSourcesInto(size_t tensor, std::vector<Source>* sources, size_t* count);
  // Before a batch: resolves its tensors' sources and gets every stored chunk they overlap with
  // one SharedChunks::GetMany, into prefetched_ (in the order the batch's bands ask for them).
  // Anything it cannot resolve is left to the bands, which report it.
  void PrefetchBatch();
  // Drops what PrefetchBatch got that the batch did not take.
  void ReleasePrefetched();
  // Appends the stored chunks overlapping `band_box` (global coordinates), each with the region
  // of the band it supplies, to pieces_[0, piece_count_) (reset first).
  absl::Status CollectPieces(const Box& band_box);
  // Drops the current pieces and their chunk references (pieces_ keeps its boxes' storage).
  void ReleasePieces();
  // The chunk at `address` with its manifest checksum, from the stream's LRU or the shared layer
  // (verified there when another stream shares it, otherwise not yet);
  // `row_end` is its end along dim 0 in global coordinates (CachedChunk::row_end).
  absl::StatusOr<std::shared_ptr<StreamChunk>> Chunk(
      const ChunkAddress& address, uint64_t checksum,
      int64_t row_end = std::numeric_limits<int64_t>::max());
  // Verifies `chunk` unless done before (by any stream sharing it): DATA_LOSS naming the
  // checkpoint, tensor and chunk.
  absl::Status Verify(StreamChunk& chunk);
  // Verifies the chunks of segments that leave without their own stored checksum, then (kClient)
  // sets out's parts.
  absl::Status ChecksumMessage(FetchReader reader, FetchPiece* out);
  // `s` prefixed with the checkpoint and the current tensor.
  absl::Status Annotate(const absl::Status& s) const;
  int64_t TensorBytes(const TensorPlan& t) const;
  const records::TensorRecord& Record(const TensorPlan& t) const;
  const records::BlobRecord* BlobFor(const records::TensorRecord& r, const CopyOp& op) const;

  std::shared_ptr<const LoadedCheckpoint> checkpoint_;
  const std::shared_ptr<const RankPlan> plan_;  // shared with other streams of the rank (read-only)
  // The plan's layout (LoadedCheckpoint::fetch_layouts), got by the first batch.
  std::shared_ptr<const FetchLayout> layout_;
  // DirectBatchPiece's requests (kept for their storage; their chunks released after each batch).
  std::vector<SharedChunks::Request> direct_requests_;
  // ChecksumMessage's run of segments hashed together, kept so that its storage is reused.
  std::vector<std::string_view> checksum_run_;
  SharedChunks* chunks_;
  FetchOptions options_;
  std::unique_ptr<CohortMember> member_;
  int64_t total_bytes_ = 0;
  int64_t bytes_produced_ = 0;
  int64_t direct_tensors_ = 0;

  bool summary_sent_ = false;
  size_t tensor_ = 0;  // index into plan_.tensors
  bool header_sent_ = false;
  int64_t next_row_ = 0;    // next destination row (dim 0, slice-local) to assemble
  int64_t next_chunk_ = 0;  // str values: next raw chunk
  bool tensor_done_ = false;
  // The current band: its bytes as segments, and the read position (segment, offset in it).
  std::vector<DataSegment> band_;
  int64_t band_left_ = 0;  // bytes of the band not yet sent
  bool tiles_ = false;     // bands may come as tiles (FetchReader::kClient)
  // For a band of tiles: each segment's box in local coordinates (else empty), and its rows.
  std::vector<Box> band_tiles_;
  int64_t band_rows_ = 0;
  size_t band_segment_ = 0;
  size_t band_offset_ = 0;
  // The most tensors the next batch may hold (FetchOptions::batch_first_tensors, doubling).
  int batch_tensors_ = 0;

  // The current tensor's resolved copy ops (for plan_.tensors[sources_tensor_]): the first
  // source_count_ of sources_ (kept with their storage from tensor to tensor).
  std::vector<Source> sources_;
  size_t source_count_ = 0;
  // PrefetchBatch's sources of the batch's tensors, in tensor order (the first ahead_count_;
  // ahead_next_ is the next to be used), swapped into sources_ as each tensor starts.
  struct AheadSources {
    size_t tensor = 0;
    std::vector<Source> sources;
    size_t count = 0;
  };
  std::vector<AheadSources> ahead_;
  size_t ahead_count_ = 0;
  size_t ahead_next_ = 0;
  // PrefetchBatch's chunks (results of GetMany), which Chunk takes before asking SharedChunks;
  // prefetch_taken_[i] once taken; prefetch_next_: the first not taken.
  std::vector<SharedChunks::Request> prefetched_;
  std::vector<uint8_t> prefetch_taken_;
  size_t prefetch_next_ = 0;
  size_t sources_tensor_ = std::numeric_limits<size_t>::max();
  Shape blob_shape_, blob_tile_;      // scratch of ResolveSources
  std::vector<int64_t> overlapping_;  // scratch of CollectPieces
  // BuildBand's pieces: the first piece_count_ are the current band's. Kept from band to band
  // so that their boxes keep their storage instead of being allocated again for every band;
  // their chunk references are dropped when each band is built.
  std::vector<Piece> pieces_;
  size_t piece_count_ = 0;
  Box part_, local_;  // scratch of CollectPieces
  Box band_box_;      // scratch of BuildBand

  // LRU of recently read chunks (most recent first), indexed by (tensor << 32 | blob, chunk).
  using ChunkKey = std::pair<uint64_t, uint64_t>;
  static ChunkKey KeyOf(const ChunkAddress& address) {
    return {(uint64_t{address.tensor} << 32) | address.blob, address.chunk};
  }
  struct CachedChunk {
    ChunkKey key;
    std::shared_ptr<StreamChunk> chunk;
    // The chunk's end along dim 0 in global coordinates, once a band has placed it: no band
    // starting at or after it needs the chunk again.
    int64_t row_end = std::numeric_limits<int64_t>::max();
  };
  // Drops cached chunks that no band from `first_row` (global) of record tensor `tensor` on can
  // use: those of other tensors (each is fetched once) and those ending at or before it.
  void DropConsumedChunks(uint32_t tensor, int64_t first_row);
  std::list<CachedChunk> cache_;
  absl::flat_hash_map<ChunkKey, std::list<CachedChunk>::iterator> cache_index_;
  int64_t cache_bytes_ = 0;
};

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_FETCH_STREAM_H_
