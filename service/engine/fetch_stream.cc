#include "service/engine/fetch_stream.h"

#include <algorithm>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "core/checksum.h"
#include "core/chunk_grid.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"

namespace ckpt {
namespace {

// Moves `box` by `sign` * `by` in place.
void ShiftInPlace(Box* box, const std::vector<int64_t>& by, int sign) {
  for (size_t i = 0; i < by.size(); ++i) {
    box->lo[i] += sign * by[i];
    box->hi[i] += sign * by[i];
  }
}

Box Shift(const Box& box, const std::vector<int64_t>& by, int sign) {
  Box out = box;
  ShiftInPlace(&out, by, sign);
  return out;
}

// A view of `length` bytes of `chunk` from `offset`, carrying the chunk's stored checksum when
// the view is the whole chunk.
DataSegment ChunkSegment(const std::shared_ptr<StreamChunk>& chunk, size_t offset, size_t length) {
  const std::string_view bytes = chunk->data->bytes();
  DataSegment s{chunk, bytes.substr(offset, length), std::nullopt, chunk};
  if (offset == 0 && length == bytes.size()) s.stored_checksum = chunk->checksum;
  return s;
}

}  // namespace

// When every piece supplies whole rows of the band (all dims but the first span the band) that
// are also whole rows of its chunk, each piece is one contiguous byte range of its chunk and the
// band is those ranges in row order (row and optimizer-shard re-splits, whole tensors of row
// splits): fills `out` with views of the chunks, copying nothing, and returns true. Otherwise
// (column re-splits, rows that are not whole bytes) returns false and leaves `out` empty.
bool FetchStream::ReferenceChunks(DType dtype, const Box& band, std::span<Piece> pieces,
                                  std::vector<DataSegment>* out) {
  out->clear();
  if (pieces.empty()) return false;
  const size_t rank = band.lo.size();
  if (rank == 0) {  // a scalar: one piece, the whole chunk
    if (pieces.size() != 1) return false;
    const Piece& p = pieces.front();
    out->push_back(ChunkSegment(p.chunk, 0, p.chunk->data->bytes().size()));
    return true;
  }
  int64_t row_elements = 1;
  for (size_t i = 1; i < rank; ++i) row_elements *= band.hi[i] - band.lo[i];
  const int64_t row_bits = row_elements * ElementBits(dtype);
  if (row_bits % 8 != 0) return false;
  const int64_t row_bytes = row_bits / 8;
  for (const Piece& p : pieces) {
    for (size_t i = 1; i < rank; ++i) {
      if (p.region.lo[i] != band.lo[i] || p.region.hi[i] != band.hi[i] ||
          p.chunk_box.lo[i] != band.lo[i] || p.chunk_box.hi[i] != band.hi[i]) {
        return false;
      }
    }
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.region.lo[0] < b.region.lo[0]; });
  int64_t next = band.lo[0];
  for (const Piece& p : pieces) {
    if (p.region.lo[0] != next) break;  // a gap or an overlap: not a plain stack of rows
    const auto offset = static_cast<size_t>((p.region.lo[0] - p.chunk_box.lo[0]) * row_bytes);
    const auto length = static_cast<size_t>((p.region.hi[0] - p.region.lo[0]) * row_bytes);
    out->push_back(ChunkSegment(p.chunk, offset, length));
    next = p.region.hi[0];
  }
  if (next != band.hi[0] || out->size() != pieces.size()) {
    out->clear();
    return false;
  }
  return true;
}

absl::Status FetchStream::Annotate(const absl::Status& s) const {
  const std::string tensor = tensor_ < plan_->tensors.size() ? plan_->tensors[tensor_].name : "?";
  return absl::Status(s.code(), absl::StrCat("checkpoint ", checkpoint_->manifest.id(), " tensor ",
                                             tensor, ": ", s.message()));
}

absl::Status FetchStream::Verify(StreamChunk& chunk) {
  if (chunk.verified()) return absl::OkStatus();
  if (absl::Status s = chunk.Verify(); !s.ok()) return Annotate(s);
  return absl::OkStatus();
}

// For kClient, whole stored chunks of at least min_part_bytes are parts of their own: the client
// verifies them against their stored checksum. Every other stored byte is verified here before
// it is hashed into a part's checksum (or, for kInProcess, handed on).
absl::Status FetchStream::ChecksumMessage(FetchReader reader, FetchPiece* out) {
  auto own_part = [&](const DataSegment& s) {
    return reader == FetchReader::kClient && s.stored_checksum &&
           static_cast<int64_t>(s.bytes.size()) >= options_.min_part_bytes;
  };
  for (const DataSegment& s : out->segments) {
    if (s.chunk && !own_part(s)) CKPT_RETURN_IF_ERROR(Verify(*s.chunk));
  }
  if (reader == FetchReader::kInProcess) return absl::OkStatus();
  // A run of segments hashed together; own parts end a run.
  std::vector<std::string_view>& run = checksum_run_;
  run.clear();
  int64_t run_bytes = 0;
  out->parts.reserve(out->parts.size() + out->segments.size());
  auto end_run = [&] {
    if (run.empty()) return;
    out->parts.push_back({run_bytes, Checksum(run)});
    run.clear();
    run_bytes = 0;
  };
  for (const DataSegment& s : out->segments) {
    const auto size = static_cast<int64_t>(s.bytes.size());
    if (own_part(s)) {
      end_run();
      out->parts.push_back({size, *s.stored_checksum});
    } else {
      run.push_back(s.bytes);
      run_bytes += size;
    }
  }
  end_run();
  return absl::OkStatus();
}

FetchStream::FetchStream(std::shared_ptr<const LoadedCheckpoint> checkpoint,
                         std::shared_ptr<const RankPlan> plan, SharedChunks* chunks,
                         FetchOptions options, std::unique_ptr<CohortMember> member)
    : checkpoint_(std::move(checkpoint)),
      plan_(std::move(plan)),
      chunks_(chunks),
      options_(options),
      member_(std::move(member)) {
  total_bytes_ = checkpoint_->fetch_layouts.TotalBytes(plan_, [this] {
    int64_t bytes = 0;
    for (const TensorPlan& t : plan_->tensors) bytes += TensorBytes(t);
    return bytes;
  });
}

const records::TensorRecord& FetchStream::Record(const TensorPlan& t) const {
  // The planner's catalog is the manifest's tensors in order (LoadedCheckpoint::catalog).
  const records::CheckpointManifest& m = checkpoint_->manifest;
  if (t.catalog_index >= 0 && t.catalog_index < m.tensors_size()) {
    const records::TensorRecord& r = m.tensors(static_cast<int>(t.catalog_index));
    if (r.name() == t.name) return r;
  }
  return m.tensors(checkpoint_->tensor_by_name.at(t.name));
}

int64_t FetchStream::TensorBytes(const TensorPlan& t) const {
  if (t.dtype == DType::kStr) {  // raw UTF-32 bytes: the stored copy's size
    if (t.ops.empty()) return 0;
    const records::BlobRecord* b = BlobFor(Record(t), t.ops[0]);
    return b ? b->total_bytes() : 0;
  }
  return *ByteSizeOf(t.dtype, *t.dst_box.Volume());
}

const records::BlobRecord* FetchStream::BlobFor(const records::TensorRecord& r,
                                                const CopyOp& op) const {
  return FindBlob(r, op);
}

absl::StatusOr<std::shared_ptr<StreamChunk>> FetchStream::Chunk(const ChunkAddress& address,
                                                                uint64_t checksum,
                                                                int64_t row_end) {
  const ChunkKey key = KeyOf(address);
  if (auto hit = cache_index_.find(key); hit != cache_index_.end()) {
    cache_.splice(cache_.begin(), cache_, hit->second);
    cache_.front().row_end = row_end;
    // Another stream sharing the chunk may have found it damaged since this one read it: its
    // bytes must not leave now, not even for the client to check.
    if (cache_.front().chunk->corrupt()) return cache_.front().chunk->Verify();
    return cache_.front().chunk;
  }
  // Got ahead by PrefetchBatch (its position counted then): usually the next one, in order.
  std::optional<absl::StatusOr<std::shared_ptr<StreamChunk>>> prefetched;
  for (size_t p = prefetch_next_; p < prefetched_.size() && p < prefetch_next_ + 16; ++p) {
    if (prefetch_taken_[p] || KeyOf(prefetched_[p].address) != key) continue;
    prefetched = std::move(prefetched_[p].result);
    prefetch_taken_[p] = 1;
    while (prefetch_next_ < prefetched_.size() && prefetch_taken_[prefetch_next_]) {
      ++prefetch_next_;
    }
    break;
  }
  std::shared_ptr<StreamChunk> chunk;
  if (prefetched) {
    if (!prefetched->ok()) return prefetched->status();
    chunk = **std::move(prefetched);
  } else {
    auto shared = chunks_->Get(address, checksum, member_ ? member_->cohort() : nullptr, this);
    if (!shared.ok()) return shared.status();
    chunk = *std::move(shared);
    if (member_) member_->Advanced(static_cast<int64_t>(chunk->data->bytes().size()));
  }
  cache_.push_front({key, chunk, row_end});
  cache_index_[key] = cache_.begin();
  cache_bytes_ += static_cast<int64_t>(chunk->data->bytes().size());
  while (cache_bytes_ > options_.chunk_cache_bytes && cache_.size() > 1) {
    cache_bytes_ -= static_cast<int64_t>(cache_.back().chunk->data->bytes().size());
    cache_index_.erase(cache_.back().key);
    cache_.pop_back();
  }
  return chunk;
}

void FetchStream::DropConsumedChunks(uint32_t tensor, int64_t first_row) {
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (it->key.first >> 32 == tensor && it->row_end > first_row) {
      ++it;
      continue;
    }
    cache_bytes_ -= static_cast<int64_t>(it->chunk->data->bytes().size());
    cache_index_.erase(it->key);
    it = cache_.erase(it);
  }
}

absl::Status FetchStream::ResolveSources() {
  if (sources_tensor_ == tensor_) return absl::OkStatus();
  while (ahead_next_ < ahead_count_ && ahead_[ahead_next_].tensor < tensor_) ++ahead_next_;
  if (ahead_next_ < ahead_count_ && ahead_[ahead_next_].tensor == tensor_) {
    AheadSources& a = ahead_[ahead_next_++];
    std::swap(sources_, a.sources);  // both keep their storage
    source_count_ = a.count;
    sources_tensor_ = tensor_;
    return absl::OkStatus();
  }
  sources_tensor_ = std::numeric_limits<size_t>::max();  // until every op is resolved
  CKPT_RETURN_IF_ERROR(ResolveSourcesInto(tensor_, &sources_, &source_count_));
  sources_tensor_ = tensor_;
  return absl::OkStatus();
}

void FetchStream::PrefetchBatch() {
  ReleasePrefetched();
  const uint64_t data_id = checkpoint_->manifest.data_id();
  int count = 0;
  int64_t batch_bytes = 0;
  for (size_t k = tensor_; k < plan_->tensors.size() && count < batch_tensors_; ++k) {
    // The tensors BatchPiece will take (the same conditions).
    const TensorPlan& t = plan_->tensors[k];
    const int64_t bytes = TensorBytes(t);
    if (!Batchable(bytes) || (count > 0 && batch_bytes + bytes > options_.max_message_bytes) ||
        (count > 0 && options_.direct_batches && layout_->tensors[k].direct)) {
      break;
    }
    batch_bytes += bytes;
    ++count;
    if (t.dtype == DType::kStr) continue;  // raw chunks, got as their bands come
    if (ahead_count_ == ahead_.size()) ahead_.emplace_back();
    AheadSources& a = ahead_[ahead_count_];
    if (!ResolveSourcesInto(k, &a.sources, &a.count).ok()) break;  // the band reports it
    a.tensor = k;
    ++ahead_count_;
    const records::TensorRecord& r = Record(t);
    // As CollectPieces asks for them for a band of the whole tensor.
    for (size_t j = 0; j < a.count; ++j) {
      const Source& s = a.sources[j];
      if (!IntersectInto(s.region, t.dst_box, &part_)) continue;
      local_ = part_;
      ShiftInPlace(&local_, s.blob_lo, -1);
      s.grid.ChunksOverlapping(local_, &overlapping_);
      for (int64_t chunk : overlapping_) {
        if (chunk >= s.blob->chunk_checksums_size()) break;  // the band reports it
        prefetched_.push_back(
            {{data_id, r.tensor_index(), s.blob->blob_index(), static_cast<uint32_t>(chunk)},
             s.blob->chunk_checksums(static_cast<int>(chunk)),
             absl::StatusOr<std::shared_ptr<StreamChunk>>()});
      }
    }
  }
  if (prefetched_.empty()) return;
  chunks_->GetMany(std::span<SharedChunks::Request>(prefetched_),
                   member_ ? member_->cohort() : nullptr, this);
  prefetch_taken_.assign(prefetched_.size(), 0);
  int64_t bytes = 0;
  for (const SharedChunks::Request& q : prefetched_) {
    if (q.result.ok()) bytes += static_cast<int64_t>((*q.result)->data->bytes().size());
  }
  if (member_ && bytes > 0) member_->Advanced(bytes);
}

void FetchStream::ReleasePrefetched() {
  prefetched_.clear();
  prefetch_taken_.clear();
  prefetch_next_ = 0;
  ahead_count_ = 0;
  ahead_next_ = 0;
}

absl::Status FetchStream::ResolveSourcesInto(size_t tensor, std::vector<Source>* sources,
                                             size_t* count) {
  const TensorPlan& t = plan_->tensors[tensor];
  const records::TensorRecord& r = Record(t);
  // The Source objects are kept from tensor to tensor (*count of them in use), so that their
  // vectors keep their storage: many small tensors would otherwise allocate all of it again for
  // each.
  if (sources->size() < t.ops.size()) sources->resize(t.ops.size());
  size_t& n = *count;
  n = 0;
  for (const CopyOp& op : t.ops) {
    Source& s = (*sources)[n];
    s.region.lo.resize(op.extent.size());
    s.region.hi.resize(op.extent.size());
    for (size_t i = 0; i < op.extent.size(); ++i) {
      s.region.lo[i] = op.src_box.lo[i] + op.src_offset[i];
      s.region.hi[i] = s.region.lo[i] + op.extent[i];
    }
    s.blob = BlobFor(r, op);
    if (!s.blob) {
      return Annotate(absl::InternalError(absl::StrCat(
          "no stored slice for source box ", op.src_box.ToString(), " of rank ", op.src_rank)));
    }
    const auto& lo = s.blob->box_lo();
    const auto& hi = s.blob->box_hi();
    s.blob_lo.assign(lo.begin(), lo.end());
    blob_shape_.resize(static_cast<size_t>(lo.size()));
    for (int i = 0; i < lo.size() && i < hi.size(); ++i) blob_shape_[i] = hi[i] - lo[i];
    blob_tile_.assign(s.blob->tile().begin(), s.blob->tile().end());
    if (hi.size() != lo.size()) {
      return Annotate(absl::DataLossError(absl::StrCat(
          "a stored slice records a box of ", lo.size(), " and ", hi.size(), " coordinates")));
    }
    if (absl::Status st = s.grid.Reset(blob_shape_, blob_tile_, ElementBits(t.dtype)); !st.ok()) {
      return Annotate(absl::DataLossError(st.message()));
    }
    ++n;
  }
  return absl::OkStatus();
}

void FetchStream::ReleasePieces() {
  for (size_t k = 0; k < piece_count_; ++k) pieces_[k].chunk.reset();
  piece_count_ = 0;
}

absl::Status FetchStream::CollectPieces(const Box& band_box) {
  const TensorPlan& t = plan_->tensors[tensor_];
  const records::TensorRecord& r = Record(t);
  const uint64_t data_id = checkpoint_->manifest.data_id();
  ReleasePieces();
  for (size_t k = 0; k < source_count_; ++k) {
    const Source& s = sources_[k];
    if (!IntersectInto(s.region, band_box, &part_)) continue;
    local_ = part_;
    ShiftInPlace(&local_, s.blob_lo, -1);
    s.grid.ChunksOverlapping(local_, &overlapping_);
    for (int64_t chunk : overlapping_) {
      if (chunk >= s.blob->chunk_checksums_size()) {
        return Annotate(
            absl::DataLossError(absl::StrCat("manifest lists ", s.blob->chunk_checksums_size(),
                                             " chunks, chunk ", chunk, " needed")));
      }
      if (piece_count_ == pieces_.size()) pieces_.emplace_back();
      Piece& p = pieces_[piece_count_];
      s.grid.ChunkBox(chunk, &p.chunk_box);
      ShiftInPlace(&p.chunk_box, s.blob_lo, +1);
      auto data =
          Chunk({data_id, r.tensor_index(), s.blob->blob_index(), static_cast<uint32_t>(chunk)},
                s.blob->chunk_checksums(chunk),
                p.chunk_box.hi.empty() ? std::numeric_limits<int64_t>::max() : p.chunk_box.hi[0]);
      if (!data.ok()) return Annotate(data.status());
      const size_t size = (*data)->data->bytes().size();
      if (static_cast<int64_t>(size) != s.grid.ChunkBytes(chunk)) {
        return Annotate(absl::DataLossError(absl::StrCat(
            "chunk ", chunk, " has ", size, " bytes, expected ", s.grid.ChunkBytes(chunk))));
      }
      IntersectInto(p.chunk_box, part_, &p.region);  // the chunk overlaps the part
      p.chunk = *std::move(data);
      ++piece_count_;
    }
  }
  return absl::OkStatus();
}

absl::Status FetchStream::BuildStrBand(const TensorPlan& t, const records::TensorRecord& r) {
  // Raw bytes, one stored chunk at a time.
  if (t.ops.empty()) {
    tensor_done_ = true;
    return absl::OkStatus();
  }
  const records::BlobRecord* b = BlobFor(r, t.ops[0]);
  if (!b) return Annotate(absl::InternalError("no stored copy for the chosen source rank"));
  if (next_chunk_ >= b->chunk_checksums_size()) {
    tensor_done_ = true;
    return absl::OkStatus();
  }
  auto data = Chunk({checkpoint_->manifest.data_id(), r.tensor_index(), b->blob_index(),
                     static_cast<uint32_t>(next_chunk_)},
                    b->chunk_checksums(next_chunk_));
  if (!data.ok()) return Annotate(data.status());
  band_.push_back(ChunkSegment(*data, 0, (*data)->data->bytes().size()));
  band_left_ = static_cast<int64_t>((*data)->data->bytes().size());
  ++next_chunk_;
  return absl::OkStatus();
}

bool FetchStream::NextBandRows(const TensorPlan& t, Box* band_box, int64_t* row_bytes) {
  const size_t rank = t.dst_box.lo.size();
  if (rank == 0) {  // a scalar: one band of one element
    if (next_row_ > 0) {
      tensor_done_ = true;
      return false;
    }
    next_row_ = 1;
    return true;
  }
  const int64_t local_rows = t.dst_box.hi[0] - t.dst_box.lo[0];
  if (next_row_ >= local_rows) {
    tensor_done_ = true;
    return false;
  }
  // The elements of one row: the tensor's bytes were sized when it was planned, so the product
  // does not overflow.
  int64_t row_elements = 1;
  for (size_t i = 1; i < rank; ++i) row_elements *= t.dst_box.hi[i] - t.dst_box.lo[i];
  *row_bytes = std::max<int64_t>(1, *ByteSizeOf(t.dtype, row_elements));
  const int64_t rows =
      std::clamp<int64_t>(options_.band_bytes / *row_bytes, 1, local_rows - next_row_);
  band_box->lo[0] = t.dst_box.lo[0] + next_row_;
  band_box->hi[0] = band_box->lo[0] + rows;
  next_row_ += rows;
  return true;
}

bool FetchStream::WidenToChunkEnds(const TensorPlan& t, std::span<const Piece> pieces,
                                   int64_t row_bytes, int64_t max_bytes, Box* band_box) {
  int64_t end = band_box->hi[0];
  for (const Piece& p : pieces) end = std::max(end, p.chunk_box.hi[0]);
  end = std::min(end, t.dst_box.hi[0]);
  if (end <= band_box->hi[0] || (end - band_box->lo[0]) * row_bytes > max_bytes) return false;
  next_row_ += end - band_box->hi[0];
  band_box->hi[0] = end;
  return true;
}

void FetchStream::EndAtChunkBoundary(std::span<const Piece> pieces, Box* band_box) {
  if (pieces.back().chunk_box.hi[0] <= band_box->hi[0]) return;  // ends at a boundary already
  for (size_t i = pieces.size() - 1; i-- > 0;) {
    if (pieces[i].region.hi[0] == pieces[i].chunk_box.hi[0]) {
      band_.resize(i + 1);
      next_row_ -= band_box->hi[0] - pieces[i].region.hi[0];
      band_box->hi[0] = pieces[i].region.hi[0];
      return;
    }
  }
}

absl::Status FetchStream::CutTiles(const TensorPlan& t, const Box& band_box,
                                   std::span<const Piece> pieces, int64_t band_bytes) {
  for (const Piece& p : pieces) {
    if (p.region == p.chunk_box) {
      band_.push_back(ChunkSegment(p.chunk, 0, p.chunk->data->bytes().size()));
    } else {
      CKPT_RETURN_IF_ERROR(Verify(*p.chunk));
      const auto size = static_cast<size_t>(*ByteSizeOf(t.dtype, *p.region.Volume()));
      std::shared_ptr<char[]> cut(new char[size]);
      CKPT_RETURN_IF_ERROR(CopyBoxRegion(t.dtype, p.chunk->data->bytes().data(), p.chunk_box,
                                         cut.get(), p.region, p.region));
      band_.push_back({std::shared_ptr<const void>(cut, cut.get()),
                       std::string_view(cut.get(), size), std::nullopt, nullptr});
    }
    band_tiles_.push_back(Shift(p.region, t.dst_box.lo, -1));
  }
  band_rows_ = band_box.extent(0);
  band_left_ = band_bytes;
  return absl::OkStatus();
}

absl::Status FetchStream::AssembleBand(const TensorPlan& t, const Box& band_box,
                                       std::span<const Piece> pieces, int64_t band_bytes) {
  // The plan's regions tile the destination box exactly, so every byte is written (checked by
  // the caller: the buffer is uninitialised).
  std::shared_ptr<char[]> buffer(new char[static_cast<size_t>(band_bytes)]);
  for (const Piece& p : pieces) {
    CKPT_RETURN_IF_ERROR(Verify(*p.chunk));
    CKPT_RETURN_IF_ERROR(CopyBoxRegion(t.dtype, p.chunk->data->bytes().data(), p.chunk_box,
                                       buffer.get(), band_box, p.region));
  }
  band_.push_back({std::shared_ptr<const void>(buffer, buffer.get()),
                   std::string_view(buffer.get(), static_cast<size_t>(band_bytes)), std::nullopt,
                   nullptr});
  band_left_ = band_bytes;
  return absl::OkStatus();
}

absl::Status FetchStream::BuildBand() {
  const TensorPlan& t = plan_->tensors[tensor_];
  const records::TensorRecord& r = Record(t);
  // Chunks nothing from here on needs are released now rather than when the LRU is full: their
  // memory (with segment files, their mapped windows) goes back sooner.
  DropConsumedChunks(r.tensor_index(), t.dst_box.lo.empty() ? std::numeric_limits<int64_t>::min()
                                                            : t.dst_box.lo[0] + next_row_);
  band_.clear();
  band_tiles_.clear();
  band_left_ = 0;
  band_segment_ = 0;
  band_offset_ = 0;
  if (t.dtype == DType::kStr) return BuildStrBand(t, r);

  // A member, so that its vectors keep their storage from band to band.
  Box& band_box = band_box_;
  band_box.lo.assign(t.dst_box.lo.begin(), t.dst_box.lo.end());
  band_box.hi.assign(t.dst_box.hi.begin(), t.dst_box.hi.end());
  int64_t row_bytes = 1;
  if (!NextBandRows(t, &band_box, &row_bytes)) return absl::OkStatus();  // the tensor is done
  const bool scalar = t.dst_box.lo.empty();

  CKPT_RETURN_IF_ERROR(ResolveSources());
  // pieces_ let go of their chunks whichever way this returns: a band's chunks are then held by
  // the band's segments and the stream's cache only.
  absl::Cleanup release = [this] { ReleasePieces(); };
  CKPT_RETURN_IF_ERROR(CollectPieces(band_box));
  std::span<Piece> pieces(pieces_.data(), piece_count_);
  // Tiles (FetchReader::kClient) are sent for bands of whole-byte elements that a stack of rows
  // of chunks cannot supply; a band of them holds at most 16 messages' worth.
  const bool may_tile = tiles_ && !scalar && ElementBits(t.dtype) % 8 == 0;
  const int64_t max_tiled_bytes = 16 * options_.max_message_bytes;
  bool referenced = ReferenceChunks(t.dtype, band_box, pieces, &band_);
  // Otherwise the band extends to the end of the chunks it cuts (within what a band of tiles may
  // hold), so that they go whole, neither copied nor hashed here.
  if (!referenced && may_tile && pieces.size() > 1 &&
      WidenToChunkEnds(t, pieces, row_bytes, max_tiled_bytes, &band_box)) {
    CKPT_RETURN_IF_ERROR(CollectPieces(band_box));
    pieces = std::span<Piece>(pieces_.data(), piece_count_);
    referenced = ReferenceChunks(t.dtype, band_box, pieces, &band_);
  }
  if (referenced) {
    // pieces are now in row order, one per segment.
    if (!scalar) EndAtChunkBoundary(pieces, &band_box);
    band_left_ = *ByteSizeOf(t.dtype, *band_box.Volume());
    return absl::OkStatus();
  }

  const int64_t band_bytes = *ByteSizeOf(t.dtype, *band_box.Volume());
  // Tiles: the pieces as they are stored, for the client to assemble (whole chunks unhashed and
  // uncopied; parts of chunks verified and cut out). Each must fit one message. Bands of one
  // huge row can be far larger than band_bytes: those are assembled here.
  bool tiles = may_tile && pieces.size() > 1 && band_bytes <= max_tiled_bytes;
  int64_t covered = 0;
  for (const Piece& p : pieces) {
    const int64_t volume = *p.region.Volume();
    covered += volume;
    tiles = tiles && *ByteSizeOf(t.dtype, volume) <= options_.max_message_bytes;
  }
  if (covered != *band_box.Volume()) {
    return Annotate(absl::InternalError(absl::StrCat("the re-shard plan covers ", covered, " of ",
                                                     *band_box.Volume(), " elements of rows ",
                                                     band_box.ToString())));
  }
  if (tiles) return CutTiles(t, band_box, pieces, band_bytes);
  return AssembleBand(t, band_box, pieces, band_bytes);
}

absl::StatusOr<bool> FetchStream::Next(v1::FetchResponse* out) {
  FetchPiece piece;
  CKPT_ASSIGN_OR_RETURN(bool more, NextPiece(&piece, FetchReader::kInProcess));
  if (!more) return false;
  if (piece.segments.empty()) {
    *out = std::move(piece.message);
    return true;
  }
  out->Clear();
  std::string* bytes = out->mutable_data()->mutable_data();
  bytes->reserve(static_cast<size_t>(piece.data_bytes));
  for (const DataSegment& s : piece.segments) bytes->append(s.bytes);
  return true;
}

void FetchStream::SummaryPiece(FetchPiece* out) const {
  v1::FetchPlanSummary* s = out->message.mutable_summary();
  s->set_tensor_count(static_cast<int64_t>(plan_->tensors.size()));
  s->set_total_bytes(total_bytes_);
  for (int64_t r : plan_->source_ranks) s->add_source_ranks(r);
  for (const std::string& w : plan_->warnings) s->add_warnings(w);
}

void FetchStream::StartTensor() {
  next_row_ = 0;
  next_chunk_ = 0;
  tensor_done_ = false;
  band_.clear();
  band_tiles_.clear();
  band_left_ = 0;
}

void FetchStream::HeaderPiece(const TensorPlan& t, FetchPiece* out) {
  StartTensor();
  FillHeader(t, out->message.mutable_tensor());
}

void FetchStream::FillHeader(const TensorPlan& t, v1::FetchTensorHeader* h) const {
  h->set_name(t.name);
  h->set_dtype(std::string(DTypeName(t.dtype)));
  for (int64_t d : t.dst_box.shape()) h->add_local_shape(d);
  for (int64_t d : t.global_shape) h->add_global_shape(d);
  for (int64_t v : t.dst_box.lo) h->add_box_lo(v);
  for (int64_t v : t.dst_box.hi) h->add_box_hi(v);
  h->set_total_bytes(TensorBytes(t));
  h->set_verbatim(t.kind == TensorKind::kVerbatim);
}

void FetchStream::AppendHeader(const TensorPlan& t, std::string* out) const {
  AppendBatchTensorHeader(t.name, DTypeName(t.dtype), t.dst_box, t.global_shape, TensorBytes(t),
                          t.kind == TensorKind::kVerbatim, out);
}

void FetchStream::TilePiece(FetchPiece* out) {
  // Whole tiles, up to max_message_bytes (at least one), each a part of its own: a whole stored
  // chunk with its stored checksum (the client verifies it), a cut-out region (of a verified
  // chunk) hashed here.
  while (band_segment_ < band_.size()) {
    const DataSegment& s = band_[band_segment_];
    const auto size = static_cast<int64_t>(s.bytes.size());
    if (!out->segments.empty() && out->data_bytes + size > options_.max_message_bytes) break;
    out->segments.push_back(s);
    out->parts.push_back({size, s.stored_checksum ? *s.stored_checksum : Checksum(s.bytes)});
    const Box& tile = band_tiles_[band_segment_];
    out->tile_box.insert(out->tile_box.end(), tile.lo.begin(), tile.lo.end());
    out->tile_box.insert(out->tile_box.end(), tile.hi.begin(), tile.hi.end());
    out->data_bytes += size;
    ++band_segment_;
  }
  out->band_rows = band_rows_;
  band_left_ -= out->data_bytes;
  if (band_left_ == 0) {
    band_.clear();
    band_tiles_.clear();
  }
  bytes_produced_ += out->data_bytes;
}

absl::Status FetchStream::DataPiece(FetchReader reader, FetchPiece* out) {
  // A large whole chunk on its own, with its stored checksum; otherwise up to max_message_bytes
  // of the band, as views of its segments.
  const DataSegment& head = band_[band_segment_];
  if (band_offset_ == 0 && head.stored_checksum &&
      static_cast<int64_t>(head.bytes.size()) >= options_.whole_chunk_message_bytes &&
      static_cast<int64_t>(head.bytes.size()) <= options_.max_message_bytes) {
    out->segments.push_back(head);
    out->data_bytes = static_cast<int64_t>(head.bytes.size());
    if (reader == FetchReader::kClient) {
      out->parts.push_back({out->data_bytes, *head.stored_checksum});  // the client verifies
    } else {
      CKPT_RETURN_IF_ERROR(Verify(*head.chunk));
    }
    ++band_segment_;
    band_left_ -= out->data_bytes;
    if (band_left_ == 0) band_.clear();
    bytes_produced_ += out->data_bytes;
    return absl::OkStatus();
  }
  int64_t want = std::min(band_left_, options_.max_message_bytes);
  while (want > 0) {
    const DataSegment& s = band_[band_segment_];
    const size_t n = std::min<size_t>(s.bytes.size() - band_offset_, static_cast<size_t>(want));
    out->segments.push_back({s.owner, s.bytes.substr(band_offset_, n),
                             n == s.bytes.size() ? s.stored_checksum : std::nullopt, s.chunk});
    want -= static_cast<int64_t>(n);
    out->data_bytes += static_cast<int64_t>(n);
    band_offset_ += n;
    if (band_offset_ == s.bytes.size()) {
      ++band_segment_;
      band_offset_ = 0;
    }
  }
  band_left_ -= out->data_bytes;
  if (band_left_ == 0) band_.clear();  // drop references the message does not hold
  CKPT_RETURN_IF_ERROR(ChecksumMessage(reader, out));
  bytes_produced_ += out->data_bytes;
  return absl::OkStatus();
}

absl::StatusOr<bool> FetchStream::NextPiece(FetchPiece* out, FetchReader reader) {
  absl::StatusOr<bool> more = ProducePiece(out, reader);
  // A stream that has produced everything, or failed, reads nothing more: it leaves its cohort
  // and pace group now, not when its call ends (after the last messages drain and the status
  // goes out). A worker fetching a job's ranks one after another then never finds its previous
  // rank's stream still in the group, which would make the two a gathering job.
  if (!more.ok() || !*more) member_.reset();
  return more;
}

absl::StatusOr<bool> FetchStream::ProducePiece(FetchPiece* out, FetchReader reader) {
  out->message.Clear();
  out->batch_headers.clear();
  out->segments.clear();
  out->parts.clear();
  out->data_bytes = 0;
  out->tile_box.clear();
  out->band_rows = 0;
  tiles_ = reader == FetchReader::kClient;
  if (member_) member_->Touch();
  if (!summary_sent_) {
    summary_sent_ = true;
    SummaryPiece(out);
    return true;
  }
  while (tensor_ < plan_->tensors.size()) {
    if (!header_sent_) {
      const TensorPlan& t = plan_->tensors[tensor_];
      if (reader == FetchReader::kClient && Batchable(TensorBytes(t))) {
        CKPT_RETURN_IF_ERROR(BatchPiece(out));
        return true;
      }
      header_sent_ = true;
      HeaderPiece(t, out);
      return true;
    }
    if (band_left_ == 0 && !tensor_done_) CKPT_RETURN_IF_ERROR(BuildBand());
    if (band_left_ > 0 && !band_tiles_.empty()) {
      TilePiece(out);
      return true;
    }
    if (band_left_ > 0) {
      CKPT_RETURN_IF_ERROR(DataPiece(reader, out));
      return true;
    }
    if (tensor_done_) {
      ++tensor_;
      header_sent_ = false;
    }
  }
  return false;
}

}  // namespace ckpt
