#include "service/engine/upload_session.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/checksum.h"
#include "core/names.h"
#include "core/status_macros.h"
#include "service/engine/upload_memory.h"
#include "service/engine/upload_session_internal.h"

namespace ckpt {

using upload_internal::AddHolder;
using upload_internal::RemoveHolder;
using upload_internal::StorageBits;

PendingCheckpoint::PendingCheckpoint(std::string id, std::string strategy_name,
                                     std::shared_ptr<const Strategy> strategy, uint64_t data_id,
                                     CheckpointStore* store, UploadOptions options)
    : id_(std::move(id)),
      strategy_name_(std::move(strategy_name)),
      strategy_(std::move(strategy)),
      data_id_(data_id),
      store_(store),
      options_(std::move(options)),
      last_activity_(absl::Now()) {
  if (strategy_) {
    stage_params_.assign(static_cast<size_t>(strategy_->stage_count()), 0);
    for (const auto& [name, param] : strategy_->params()) {
      for (int32_t stage : param.layout.stages) ++stage_params_[static_cast<size_t>(stage)];
    }
  }
}

PendingCheckpoint::~PendingCheckpoint() {
  int64_t slices = 0;
  for (const auto& [name, t] : tensors_) slices += static_cast<int64_t>(t->slices.size());
  tensors_.clear();
  source_files_.clear();
  if (slices >= kTrimAfterSlices) MarkFreeHeapMemoryForRelease();
}

int64_t PendingCheckpoint::world_size() const { return strategy_ ? strategy_->world_size() : 1; }

bool PendingCheckpoint::IdleSince(absl::Time cutoff) const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_.empty() && last_activity_ < cutoff;
}

bool PendingCheckpoint::Abandoned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return active_.empty() && received_.empty() && !committed_;
}

void PendingCheckpoint::AwaitRankRelease(int64_t rank) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.rank_release_wait),
               [&] { return !active_.contains(rank); });
}

bool PendingCheckpoint::committed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return committed_;
}

void PendingCheckpoint::ReleaseRank(int64_t rank, const std::vector<bool>& sent) {
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    Tensor& t = *it->second;
    if (t.tensor_index < sent.size() && sent[t.tensor_index]) --t.rank_count;
    for (size_t i = t.slices.size(); i-- > 0;) {
      Slice& s = t.slices[i];
      RemoveHolder(s.holders, rank);
      if (t.layout ? s.owner_rank == rank && s.state == BlobState::kWriting : s.holders.empty()) {
        // A cell this rank was still writing is incomplete: drop the claim (a retry writes the
        // same chunk addresses again); completed cells stay, their bytes and checksums valid. A
        // variant goes with its last holder.
        t.EraseSlice(i);
      }
    }
    if (t.rank_count == 0) {
      tensors_.erase(it++);
    } else {
      ++it;
    }
  }
  source_files_.erase(rank);
  active_.erase(rank);
  cv_.notify_all();
}

absl::StatusOr<std::unique_ptr<RankUpload>> RankUpload::Start(
    std::shared_ptr<PendingCheckpoint> pending, int64_t rank, std::string source_file) {
  if (!source_file.empty()) {
    CKPT_RETURN_IF_ERROR(ValidatePrintableName("source file name", source_file));
  }
  {
    std::lock_guard<std::mutex> lock(pending->mu_);
    const int64_t world = pending->world_size();
    if (rank < 0 || rank >= world) {
      return absl::OutOfRangeError(
          absl::StrCat("rank ", rank, " is outside the source world of ", world, " ranks",
                       pending->strategy_ ? absl::StrCat(" of strategy ", pending->strategy_name_)
                                          : " (a whole-tensor checkpoint has one rank, 0)"));
    }
    if (pending->committed_) {
      return absl::AlreadyExistsError(
          absl::StrCat("checkpoint ", pending->id_, " is already complete"));
    }
    if (pending->received_.contains(rank)) {
      return absl::AlreadyExistsError(
          absl::StrCat("rank ", rank, " of checkpoint ", pending->id_, " was already received"));
    }
    if (pending->active_.contains(rank)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank, " of checkpoint ", pending->id_, " is being uploaded by another stream"));
    }
    pending->active_.insert(rank);
    pending->source_files_[rank] = std::move(source_file);
    pending->last_activity_ = absl::Now();
  }
  return std::unique_ptr<RankUpload>(new RankUpload(std::move(pending), rank));
}

RankUpload::RankUpload(std::shared_ptr<PendingCheckpoint> pending, int64_t rank)
    : pending_(std::move(pending)),
      rank_(rank),
      stage_(pending_->strategy_
                 ? static_cast<int32_t>(rank / pending_->strategy_->devices_per_stage())
                 : 0),
      local_rank_(pending_->strategy_ ? rank % pending_->strategy_->devices_per_stage() : 0) {}

RankUpload::~RankUpload() {
  if (finished_) return;
  std::lock_guard<std::mutex> lock(pending_->mu_);
  pending_->ReleaseRank(rank_, sent_);
}

std::string RankUpload::Where() const {
  return absl::StrCat("checkpoint ", pending_->id_, " rank ", rank_);
}

absl::Status RankUpload::BeginTensor(Current cur, const std::string_view* whole) {
  if (cur.total > 0) {
    // A sharded slice is cut by its tensor's cell grid, read in place; a verbatim value by a
    // grid of its own (str values: raw bytes), whose tile its record keeps.
    const bool shared_grid = cur.grid != nullptr;
    std::optional<ChunkGrid> own;
    if (!shared_grid) {
      const PendingCheckpoint::Tensor& t = *cur.tensor;
      const Shape storage = cur.dtype == DType::kStr ? Shape{cur.total}
                            : t.layout               ? t.CellShape()
                                                     : t.global;
      auto made = ChunkGrid::Make(storage, StorageBits(cur.dtype), pending_->options_.chunk_grid);
      if (!made.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(), ": tensor ", Sv(cur.name), ": ", made.status().message()));
      }
      own.emplace(*std::move(made));
      cur.tile = own->tile();
    }
    const ChunkGrid& grid = shared_grid ? *cur.grid : *own;
    if (whole != nullptr && batching_ && cur.mode != Mode::kBuffer && grid.chunk_count() == 1 &&
        static_cast<int64_t>(whole->size()) == cur.total) {
      // The slice is one chunk and all of its bytes are here: checksummed, and (when this rank
      // writes it) queued for EndBatch as a view of them, without a chunker or a copy.
      cur.received = cur.total;
      bytes_received_ += cur.total;
      cur.checksums.push_back(Checksum(*whole));
      if (cur.mode == Mode::kWrite) {
        batch_writes_.push_back({{pending_->data_id_, cur.tensor_index, cur.blob_index, 0},
                                 *whole,
                                 static_cast<uint32_t>(rank_),
                                 /*sole_chunk=*/true});
        batch_ends_.push_back(kBorrowedBytes);
        bytes_stored_ += cur.total;
      }
      return CompleteSlice(cur);
    }
    cur.chunker.emplace(shared_grid ? grid : *std::move(own));
    cur.in_place =
        cur.mode == Mode::kWrite && !batching_ && pending_->options_.column_group_bytes > 0;
  }
  current_ = std::move(cur);
  if (current_->total == 0) return FinishTensor();
  if (current_->in_place) current_->next_band = 0;
  return absl::OkStatus();
}

absl::Status RankUpload::StartTensor(const v1::UploadTensorHeader& h) {
  CKPT_RETURN_IF_ERROR(CheckNotFailed());
  return Refuse(DoStartTensor(h));
}

absl::Status RankUpload::Append(std::string_view data) {
  CKPT_RETURN_IF_ERROR(CheckNotFailed());
  return Refuse(DoAppend(data));
}

absl::Status RankUpload::CheckNotFailed() const {
  if (failed_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(Where(), ": the upload failed at an earlier message (", failed_.message(), ")"));
}

absl::Status RankUpload::Refuse(absl::Status s) {
  if (s.ok() || !failed_.ok()) return s;
  failed_ = s;
  // No more bytes come: the room reserved for them goes back (unreferenced).
  if (current_) current_->reservation.reset();
  batching_ = false;
  batch_writes_.clear();
  batch_ends_.clear();
  batch_slices_.clear();
  return s;
}

absl::Status RankUpload::DoStartTensor(const v1::UploadTensorHeader& h) {
  if (current_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": tensor ", Sv(current_->name), " got ", current_->received, " of ",
                     current_->total, " bytes before the next tensor header"));
  }
  Prepared p;
  CKPT_RETURN_IF_ERROR(PrepareTensor(h, &p));
  {
    std::lock_guard<std::mutex> lock(pending_->mu_);
    pending_->last_activity_ = absl::Now();
    CKPT_RETURN_IF_ERROR(AddTensorLocked(p.local, &p.cur));
  }
  const int64_t total = p.cur.total;
  CKPT_RETURN_IF_ERROR(BeginTensor(std::move(p.cur), nullptr));
  bytes_announced_ += total;
  ++position_;
  return absl::OkStatus();
}

absl::Status RankUpload::DoAppend(std::string_view data) {
  if (!current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": data before a tensor header"));
  }
  Current& c = *current_;
  if (static_cast<int64_t>(data.size()) > c.total - c.received) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), ": tensor ", Sv(c.name), " sends more than the announced ", c.total, " bytes"));
  }
  c.received += static_cast<int64_t>(data.size());
  bytes_received_ += static_cast<int64_t>(data.size());
  if (c.mode == Mode::kBuffer) {
    c.value.append(data);
  } else {
    CKPT_RETURN_IF_ERROR(ChunkBands(data));
  }
  if (c.received == c.total) return FinishTensor();
  return absl::OkStatus();
}

absl::Status RankUpload::ChunkBands(std::string_view data) {
  Current& c = *current_;
  BandChunker& chunker = *c.chunker;
  while (!data.empty()) {
    if (c.next_band >= 0) {
      // A band's room is reserved once its first byte is here: a declared size costs nothing.
      const int64_t band = c.next_band;
      c.next_band = -1;
      CKPT_RETURN_IF_ERROR(StartBand(band));
    }
    data.remove_prefix(chunker.Add(data));
    if (chunker.full()) CKPT_RETURN_IF_ERROR(FlushBand());
  }
  return absl::OkStatus();
}

absl::Status RankUpload::StartBand(int64_t band) {
  Current& c = *current_;
  BandChunker& chunker = *c.chunker;
  if (c.in_place && (c.reservation == nullptr || band >= c.group_end)) {
    CKPT_RETURN_IF_ERROR(ReserveGroup(band));
  }
  if (c.reservation == nullptr) {
    // Not in place, or a band larger than a group: into the chunker's buffers, which grow with
    // the bytes that arrive (a declared shape alone costs no memory), written band by band.
    chunker.Start(band);
    return absl::OkStatus();
  }
  // The group's chunks are reserved column band by column band: chunk k of band b is
  // k * bands + (b - group_begin).
  const int64_t bands = c.group_end - c.group_begin;
  band_places_.clear();
  for (int64_t k = 0; k < chunker.chunks_per_band(); ++k) {
    band_places_.push_back(
        c.reservation->places(static_cast<size_t>(k * bands + (band - c.group_begin))));
  }
  chunker.StartInPlace(band, band_places_);
  return absl::OkStatus();
}

absl::Status RankUpload::ReserveGroup(int64_t band) {
  Current& c = *current_;
  const BandChunker& chunker = *c.chunker;
  const ChunkGrid& grid = chunker.grid();
  const int64_t per_band = chunker.chunks_per_band();
  // Bands while they fit in the group's bytes; none when the first is larger (StartBand then cuts
  // it into the chunker's buffers, which grow only with the bytes that arrive).
  int64_t end = band;
  int64_t bytes = 0;
  while (end < chunker.bands()) {
    int64_t band_bytes = 0;
    for (int64_t k = 0; k < per_band; ++k) band_bytes += grid.ChunkBytes(end * per_band + k);
    if (bytes + band_bytes > pending_->options_.column_group_bytes) break;
    bytes += band_bytes;
    ++end;
  }
  c.reservation.reset();  // the last group's, committed
  if (end == band) return absl::OkStatus();
  const bool sole = chunker.bands() == 1 && per_band == 1;
  group_spaces_.clear();
  for (int64_t k = 0; k < per_band; ++k) {
    for (int64_t b = band; b < end; ++b) {
      const int64_t index = b * per_band + k;
      group_spaces_.push_back(
          {{pending_->data_id_, c.tensor_index, c.blob_index, static_cast<uint32_t>(index)},
           grid.ChunkBytes(index),
           static_cast<uint32_t>(rank_),
           sole});
    }
  }
  CKPT_ASSIGN_OR_RETURN(c.reservation, pending_->store_->ReserveChunks(group_spaces_));
  c.group_begin = band;
  c.group_end = end;
  c.group_bytes = bytes;
  return absl::OkStatus();
}

absl::Status RankUpload::FlushBand() {
  Current& c = *current_;
  BandChunker& chunker = *c.chunker;
  if (chunker.in_place()) {
    for (int64_t k = 0; k < chunker.chunks_per_band(); ++k) {
      c.checksums.push_back(Checksum(chunker.places(k)));
    }
    const int64_t next = chunker.band() + 1;
    if (next == c.group_end) {
      CKPT_RETURN_IF_ERROR(c.reservation->Commit());
      bytes_stored_ += c.group_bytes;
      c.reservation.reset();
    }
    if (next < chunker.bands()) c.next_band = next;
    return absl::OkStatus();
  }
  std::vector<ChunkWrite>& writes = band_writes_;
  writes.clear();
  const bool sole = chunker.bands() == 1 && chunker.chunks_per_band() == 1;
  for (int64_t k = 0; k < chunker.chunks_per_band(); ++k) {
    const std::string_view bytes = chunker.chunk(k);
    c.checksums.push_back(Checksum(bytes));
    if (c.mode == Mode::kWrite || c.mode == Mode::kBuffer) {
      writes.push_back({{pending_->data_id_, c.tensor_index, c.blob_index,
                         static_cast<uint32_t>(chunker.ChunkIndex(k))},
                        bytes,
                        static_cast<uint32_t>(rank_),
                        sole});
    }
  }
  if (!writes.empty()) {
    if (batching_ && c.mode == Mode::kWrite) {
      // The chunker's band is reused: the bytes are kept until EndBatch stores them.
      for (ChunkWrite& w : writes) {
        batch_bytes_.append(w.bytes);
        batch_ends_.push_back(batch_bytes_.size());
        batch_writes_.push_back(w);
      }
    } else {
      CKPT_RETURN_IF_ERROR(pending_->store_->PutChunks(writes));
    }
    for (const ChunkWrite& w : writes) bytes_stored_ += static_cast<int64_t>(w.bytes.size());
  }
  if (chunker.band() + 1 < chunker.bands()) {
    if (c.in_place) {
      c.next_band = chunker.band() + 1;
    } else {
      chunker.Start(chunker.band() + 1);
    }
  }
  return absl::OkStatus();
}

absl::Status RankUpload::StoreVerbatim() {
  Current& c = *current_;
  // Chunk and checksum the buffered value without writing, then write only if no identical copy
  // is stored yet.
  Checksums checksums;
  if (c.chunker) {
    BandChunker& chunker = *c.chunker;
    std::string_view rest = c.value;
    for (int64_t band = 0; band < chunker.bands(); ++band) {
      chunker.Start(band);
      rest.remove_prefix(chunker.Add(rest));
      for (int64_t k = 0; k < chunker.chunks_per_band(); ++k) {
        checksums.push_back(Checksum(chunker.chunk(k)));
      }
    }
    chunker.Start(0);
  }
  // The tensor stays in tensors_ while this rank holds it (ReleaseRank runs on this thread).
  PendingCheckpoint::Tensor* t = c.tensor;
  {
    std::unique_lock<std::mutex> lock(pending_->mu_);
    // One rank at a time stores a new copy of a tensor, so that a rank finishing the same value
    // meanwhile finds that copy below instead of storing the value again.
    pending_->cv_.wait(lock, [t] { return !t->storing_variant; });
    for (PendingCheckpoint::Slice& v : t->slices) {
      if (v.state == PendingCheckpoint::BlobState::kDone &&
          std::equal(v.checksums.begin(), v.checksums.end(), checksums.begin(), checksums.end())) {
        AddHolder(v.holders, rank_);
        return absl::OkStatus();
      }
    }
    c.blob_index = t->next_blob_index++;
    t->storing_variant = true;
  }
  // Write it as a new variant through the band path.
  c.checksums.clear();
  const absl::Status written = c.chunker ? ChunkBands(c.value) : absl::OkStatus();
  std::lock_guard<std::mutex> lock(pending_->mu_);
  t->storing_variant = false;
  pending_->cv_.notify_all();
  CKPT_RETURN_IF_ERROR(written);
  PendingCheckpoint::Slice& v = t->slices.emplace_back();
  v.cell = c.blob_index;
  v.owner_rank = static_cast<int32_t>(rank_);
  v.state = PendingCheckpoint::BlobState::kDone;
  v.tile = c.tile;
  v.checksums = std::move(c.checksums);
  v.total_bytes = c.total;
  v.holders.push_back(static_cast<int32_t>(rank_));
  return absl::OkStatus();
}

absl::Status RankUpload::FinishTensor() {
  CKPT_RETURN_IF_ERROR(CompleteSlice(*current_));
  current_.reset();
  return absl::OkStatus();
}

absl::Status RankUpload::CompleteSlice(Current& c) {
  if (c.mode == Mode::kBuffer) return StoreVerbatim();
  if (c.mode == Mode::kVerify) {
    verifications_.push_back({c.tensor, c.cell, std::move(c.checksums)});
    return absl::OkStatus();
  }
  WrittenSlice slice;
  slice.tensor = c.tensor;
  slice.cell = c.tensor->layout ? c.cell : c.blob_index;
  slice.tile = std::move(c.tile);
  slice.checksums = std::move(c.checksums);
  slice.total = c.total;
  if (batching_) {
    batch_slices_.push_back(std::move(slice));  // complete once EndBatch stored its chunks
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(pending_->mu_);
  CKPT_RETURN_IF_ERROR(MarkWrittenLocked(slice));
  pending_->last_activity_ = absl::Now();
  pending_->cv_.notify_all();
  return absl::OkStatus();
}

absl::Status RankUpload::MarkWrittenLocked(WrittenSlice& slice) {
  PendingCheckpoint::Tensor& t = *slice.tensor;
  PendingCheckpoint::Slice* s = t.layout ? t.FindCell(slice.cell) : t.FindVariant(slice.cell);
  if (!s) return absl::InternalError(absl::StrCat("lost the slice of ", t.name));
  if (!t.layout) s->tile = std::move(slice.tile);
  s->checksums = std::move(slice.checksums);
  s->total_bytes = slice.total;
  AddHolder(s->holders, rank_);
  s->state = PendingCheckpoint::BlobState::kDone;
  return absl::OkStatus();
}

}  // namespace ckpt
