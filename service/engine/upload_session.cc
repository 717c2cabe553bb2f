#include "service/engine/upload_session.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/absl_compat.h"
#include "core/checksum.h"
#include "core/names.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "service/engine/stored_strategy.h"
#include "service/engine/upload_memory.h"

namespace ckpt {
namespace {

constexpr int kMaxDims = 64;

// Element bits and shape under which a tensor's bytes are chunked: str values are raw bytes.
int StorageBits(DType dtype) { return dtype == DType::kStr ? 8 : ElementBits(dtype); }
std::string StagesString(const std::vector<int32_t>& stages) {
  return absl::StrCat("[", absl::StrJoin(stages, ", "), "]");
}

// Keeps the holders sorted and distinct.
void AddHolder(records::BlobRecord* record, int64_t rank) {
  auto* holders = record->mutable_holders();
  auto at = std::lower_bound(holders->begin(), holders->end(), rank);
  if (at != holders->end() && *at == rank) return;
  const auto index = at - holders->begin();
  holders->Add(rank);
  std::rotate(holders->begin() + index, holders->end() - 1, holders->end());
}

void RemoveHolder(records::BlobRecord* record, int64_t rank) {
  auto* holders = record->mutable_holders();
  holders->erase(std::remove(holders->begin(), holders->end(), rank), holders->end());
}

// True when `box` has shape `shape` (Box::shape() without building it).
bool BoxHasShape(const Box& box, const Shape& shape) {
  if (box.rank() != shape.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (box.extent(i) != shape[i]) return false;
  }
  return true;
}

void SetBox(records::BlobRecord* record, const Box& box) {
  record->mutable_box_lo()->Assign(box.lo.begin(), box.lo.end());
  record->mutable_box_hi()->Assign(box.hi.begin(), box.hi.end());
}

}  // namespace

PendingCheckpoint::PendingCheckpoint(std::string id, std::string strategy_name,
                                     std::shared_ptr<const Strategy> strategy, uint64_t data_id,
                                     CheckpointStore* store, UploadOptions options)
    : id_(std::move(id)),
      strategy_name_(std::move(strategy_name)),
      strategy_(std::move(strategy)),
      data_id_(data_id),
      store_(store),
      options_(std::move(options)),
      last_activity_(absl::Now()) {}

PendingCheckpoint::~PendingCheckpoint() {
  int64_t slices = 0;
  for (const auto& [name, t] : tensors_) {
    slices += static_cast<int64_t>(t->cells.size() + t->variants.size());
  }
  tensors_.clear();
  source_files_.clear();
  arena_.Reset();  // the records, before the heap is trimmed
  if (slices >= kTrimAfterSlices) ReleaseFreeHeapMemory();
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

void PendingCheckpoint::ReleaseRank(int64_t rank) {
  for (auto it = tensors_.begin(); it != tensors_.end();) {
    Tensor& t = *it->second;
    t.ranks.erase(rank);
    for (auto c = t.cells.begin(); c != t.cells.end();) {
      // A slice this rank was still writing is incomplete: drop the claim (a retry writes the
      // same chunk addresses again). Completed slices stay: their bytes and checksums are valid.
      if (c->second.owner_rank == rank && c->second.state == BlobState::kWriting) {
        c = t.cells.erase(c);
      } else {
        RemoveHolder(c->second.record, rank);
        ++c;
      }
    }
    for (auto v = t.variants.begin(); v != t.variants.end();) {
      RemoveHolder(v->record, rank);
      if (v->record->holders().empty()) {
        v = t.variants.erase(v);
      } else {
        ++v;
      }
    }
    if (t.ranks.empty()) {
      tensors_.erase(it++);
    } else {
      ++it;
    }
  }
  source_files_.erase(rank);
  active_.erase(rank);
  cv_.notify_all();
}

std::string PendingCheckpoint::SerializeManifest() {
  records::CheckpointManifest m;
  m.set_id(id_);
  m.set_strategy_name(strategy_name_);
  if (strategy_) EncodeStoredStrategy(*strategy_, &m);
  m.set_world_size(world_size());
  m.set_data_id(data_id_);
  m.set_chunk_checksum(records::CHUNK_CHECKSUM_XXH3_64);
  m.set_created_unix(absl::ToUnixSeconds(absl::Now()));
  std::vector<Tensor*> order;
  order.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) order.push_back(t.get());
  std::sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) {
    return std::tie(a->first_rank, a->position) < std::tie(b->first_rank, b->position);
  });
  // The tensors' and blobs' records (on arena_) are lent to the manifest rather than copied (a
  // checkpoint of many small tensors has hundreds of thousands of them), and taken back once it is
  // serialised: the manifest, not on the arena, must not free them.
  auto for_each_blob = [](Tensor& t, auto&& fn) {
    for (auto& [cell, blob] : t.cells) fn(blob.record);
    for (Blob& blob : t.variants) fn(blob.record);
  };
  for (Tensor* t : order) {
    records::TensorRecord* r = t->record;
    for_each_blob(*t,
                  [r](records::BlobRecord* b) { r->mutable_blobs()->UnsafeArenaAddAllocated(b); });
    m.mutable_tensors()->UnsafeArenaAddAllocated(r);
  }
  for (int64_t r = 0; r < world_size(); ++r) {
    auto it = source_files_.find(r);
    m.add_source_files(it == source_files_.end() ? "" : it->second);
  }
  std::string bytes = m.SerializeAsString();
  for (Tensor* t : order) {
    auto* blobs = t->record->mutable_blobs();
    while (!blobs->empty()) blobs->UnsafeArenaReleaseLast();
  }
  while (!m.tensors().empty()) m.mutable_tensors()->UnsafeArenaReleaseLast();
  return bytes;
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
  pending_->ReleaseRank(rank_);
}

std::string RankUpload::Where() const {
  return absl::StrCat("checkpoint ", pending_->id_, " rank ", rank_);
}

absl::Status RankUpload::CheckHeader(const v1::UploadTensorHeader& h, Current* cur,
                                     Shape* local) const {
  const std::string& name = h.name();
  // The context of an error is built only for a name that is refused.
  if (absl::Status valid = ValidatePrintableName("tensor name", name); !valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat(Where(), ": ", valid.message()));
  }
  if (sent_.contains(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": tensor ", name, " appears twice in the rank's file"));
  }
  auto dtype_or = ParseDType(h.dtype());
  if (!dtype_or.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": tensor ", name, ": ", dtype_or.status().message()));
  }
  const DType dtype = *dtype_or;
  if (h.dims_size() > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": tensor ", name, " has ",
                                                   h.dims_size(), " dims (max ", kMaxDims, ")"));
  }
  local->assign(h.dims().begin(), h.dims().end());
  for (int64_t d : *local) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": tensor ", name, " has shape ",
                                                     ShapeToString(*local),
                                                     " with a negative dim"));
    }
  }
  // MindSpore's reader treats dims [0] (and every str value) as a scalar.
  if (dtype == DType::kStr || *local == Shape{0}) local->clear();
  const int64_t total = h.total_bytes();
  if (dtype == DType::kStr) {
    if (total < 0 || total % 4 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), ": str tensor ", name, " has ", total,
                                                     " bytes; UTF-32 needs a multiple of 4"));
    }
  } else {
    auto elements = NumElements(*local);
    if (!elements.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), ": tensor ", name, ": ", elements.status().message()));
    }
    auto bytes = ByteSizeOf(dtype, *elements);
    if (!bytes.ok() || *bytes != total) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), ": tensor ", name, " announces ", total, " bytes but ",
                       Sv(DTypeName(dtype)), " ", ShapeToString(*local), " needs ",
                       bytes.ok() ? absl::StrCat(*bytes) : std::string(bytes.status().message())));
    }
  }
  cur->name = name;
  cur->dtype = dtype;
  cur->total = total;
  return absl::OkStatus();
}

absl::StatusOr<Shape> RankUpload::GlobalShape(const std::string& name, const Layout* layout,
                                              const Shape& local) const {
  if (!layout) return local;
  if (!std::count(layout->stages.begin(), layout->stages.end(), stage_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", name, ": rank ", rank_, " is in pipeline stage ", stage_,
                     " but the strategy places it in stages ", StagesString(layout->stages)));
  }
  auto g = layout->GlobalShapeFromLocal(local);
  absl::Status valid = g.ok() ? layout->Validate(*g) : g.status();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", name, ": rank ", rank_, " holds shape ", ShapeToString(local),
                     ", which does not fit layout ", layout->ToString(), ": ", valid.message()));
  }
  return *std::move(g);
}

absl::Status RankUpload::AddTensorLocked(const Layout* layout, const Shape& local, Current* cur) {
  const std::string& name = cur->name;
  auto& slot = pending_->tensors_[name];
  const bool first = slot == nullptr;
  if (first) {
    slot = std::make_unique<PendingCheckpoint::Tensor>();
    slot->record = google::protobuf::Arena::CreateMessage<records::TensorRecord>(&pending_->arena_);
    slot->record->set_name(name);
    slot->record->set_dtype(std::string(DTypeName(cur->dtype)));
    slot->record->set_tensor_index(pending_->next_tensor_index_++);
    slot->dtype = cur->dtype;
    slot->first_rank = rank_;
    slot->position = position_;
  }
  PendingCheckpoint::Tensor& t = *slot;
  cur->tensor = &t;
  if (t.dtype != cur->dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", name, ": rank ", rank_, " has dtype ", Sv(DTypeName(cur->dtype)),
                     " but earlier ranks sent ", Sv(DTypeName(t.dtype))));
  }
  if (rank_ < t.first_rank) {
    t.first_rank = rank_;
    t.position = position_;
  }
  // The global shape is worked out once per tensor: another rank holding a slice of the same
  // shape (every rank of an even split does) only has its pipeline stage checked.
  const bool known = !first && layout && t.known_local == local &&
                     std::count(layout->stages.begin(), layout->stages.end(), stage_);
  absl::StatusOr<Shape> worked_out;
  if (!known) worked_out = GlobalShape(name, layout, local);
  if (!known && !worked_out.ok()) {
    if (first) pending_->tensors_.erase(name);
    return worked_out.status();
  }
  const Shape& global = known ? t.global : *worked_out;  // read in place, not copied
  if (!first) {
    const auto& known_dims = t.record->global_shape();
    if (!std::equal(known_dims.begin(), known_dims.end(), global.begin(), global.end())) {
      const Shape earlier(known_dims.begin(), known_dims.end());
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", name, ": rank ", rank_, " holds shape ", ShapeToString(local),
          layout ? absl::StrCat(" (global ", ShapeToString(global), ")") : std::string(),
          " but earlier ranks imply global shape ", ShapeToString(earlier)));
    }
  } else {
    for (int64_t d : global) t.record->add_global_shape(d);
    t.record->set_sharded(layout != nullptr);
    t.global = global;
    if (layout) {
      t.layout = layout;
      t.known_local = local;
      t.cell_grid = layout->Grid(global.size());
    }
  }
  t.ranks.insert(rank_);
  cur->tensor_index = t.record->tensor_index();
  if (layout) {
    ClaimCellLocked(t, *layout, global, cur);
  } else {
    ClaimVariantLocked(t, global, cur);
  }
  return absl::OkStatus();
}

void RankUpload::ClaimCellLocked(PendingCheckpoint::Tensor& t, const Layout& layout,
                                 const Shape& global, Current* cur) {
  const std::vector<int64_t>& grid = t.cell_grid;
  const std::vector<int64_t> cell = *layout.CellOf(local_rank_, global.size());
  int64_t id = 0;
  for (size_t i = 0; i < cell.size(); ++i) id = id * grid[i] + cell[i];
  cur->cell = id;
  cur->blob_index = static_cast<uint32_t>(id);
  cur->box = CellBox(global, grid, cell);
  // The chunk grid of a cell, made once per tensor (cells of an even split share their shape)
  // and never changed afterwards, so BeginTensor reads it without the lock.
  if (!t.cell_chunks && cur->total > 0) {
    auto chunks =
        ChunkGrid::Make(cur->box.shape(), StorageBits(cur->dtype), pending_->options_.chunk_grid);
    if (chunks.ok()) t.cell_chunks = *std::move(chunks);
  }
  cur->grid = t.cell_chunks ? &*t.cell_chunks : nullptr;
  if (t.cells.contains(id)) {
    cur->mode = Mode::kVerify;  // a replica: its bytes must equal the stored copy
    return;
  }
  PendingCheckpoint::Blob blob = pending_->NewBlob();
  blob.owner_rank = rank_;
  blob.record->set_cell(id);
  blob.record->set_blob_index(cur->blob_index);
  SetBox(blob.record, cur->box);
  t.cells.emplace(id, std::move(blob));
  cur->mode = Mode::kWrite;
}

void RankUpload::ClaimVariantLocked(PendingCheckpoint::Tensor& t, const Shape& global,
                                    Current* cur) {
  cur->box = Box::Whole(global);
  if (cur->total <= pending_->options_.verbatim_dedupe_bytes) {
    cur->mode = Mode::kBuffer;  // compared with the other ranks' copies when complete
    return;
  }
  cur->mode = Mode::kWrite;
  cur->blob_index = t.next_blob_index++;
  PendingCheckpoint::Blob blob = pending_->NewBlob();
  blob.owner_rank = rank_;
  blob.record->set_cell(cur->blob_index);
  blob.record->set_blob_index(cur->blob_index);
  SetBox(blob.record, cur->box);
  AddHolder(blob.record, rank_);
  t.variants.push_back(std::move(blob));
}

absl::Status RankUpload::PrepareTensor(const v1::UploadTensorHeader& h, Prepared* p) const {
  p->cur = Current();
  CKPT_RETURN_IF_ERROR(CheckHeader(h, &p->cur, &p->local));
  Current& cur = p->cur;
  // Checked before anything is claimed or allocated for the tensor: a header only declares a size.
  const int64_t limit = pending_->options_.max_upload_bytes;
  if (cur.total > limit - bytes_announced_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Where(), ": tensor ", cur.name, " announces ", cur.total, " bytes, which with the ",
        bytes_announced_, " bytes of the tensors before it exceeds the per-upload limit of ", limit,
        " bytes (ckptd --max-upload-gib)"));
  }
  p->layout = pending_->strategy_ ? ResolveLayout(*pending_->strategy_, cur.name, true) : nullptr;
  if (p->layout && cur.dtype == DType::kStr) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": str tensor ", cur.name, " cannot have a layout in the strategy"));
  }
  return absl::OkStatus();
}

absl::Status RankUpload::BeginTensor(Current cur, const std::string_view* whole) {
  if (cur.total > 0) {
    // The tensor's cell grid when the slice has its shape (every cell of an even split), read
    // in place; otherwise a grid of the slice's own.
    const bool shared_grid =
        cur.grid != nullptr && cur.dtype != DType::kStr && BoxHasShape(cur.box, cur.grid->shape());
    std::optional<ChunkGrid> own;
    if (!shared_grid) {
      const Shape storage = cur.dtype == DType::kStr ? Shape{cur.total} : cur.box.shape();
      auto made = ChunkGrid::Make(storage, StorageBits(cur.dtype), pending_->options_.chunk_grid);
      if (!made.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(Where(), ": tensor ", cur.name, ": ", made.status().message()));
      }
      own.emplace(*std::move(made));
    }
    const ChunkGrid& grid = shared_grid ? *cur.grid : *own;
    cur.tile = grid.tile();
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
      current_ = std::move(cur);
      return FinishTensor();
    }
    cur.chunker.emplace(shared_grid ? grid : *std::move(own));
  }
  current_ = std::move(cur);
  if (current_->total == 0) return FinishTensor();
  return absl::OkStatus();
}

absl::Status RankUpload::StartTensor(const v1::UploadTensorHeader& h) {
  if (current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": tensor ", current_->name, " got ",
                                                   current_->received, " of ", current_->total,
                                                   " bytes before the next tensor header"));
  }
  Prepared p;
  CKPT_RETURN_IF_ERROR(PrepareTensor(h, &p));
  {
    std::lock_guard<std::mutex> lock(pending_->mu_);
    pending_->last_activity_ = absl::Now();
    CKPT_RETURN_IF_ERROR(AddTensorLocked(p.layout, p.local, &p.cur));
  }
  const std::string name = p.cur.name;
  const int64_t total = p.cur.total;
  CKPT_RETURN_IF_ERROR(BeginTensor(std::move(p.cur), nullptr));
  sent_.insert(name);
  bytes_announced_ += total;
  ++position_;
  return absl::OkStatus();
}

absl::Status RankUpload::Append(std::string_view data) {
  if (!current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": data before a tensor header"));
  }
  Current& c = *current_;
  if (static_cast<int64_t>(data.size()) > c.total - c.received) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), ": tensor ", c.name, " sends more than the announced ", c.total, " bytes"));
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
  BandChunker& chunker = *current_->chunker;
  while (!data.empty()) {
    data.remove_prefix(chunker.Add(data));
    if (chunker.full()) CKPT_RETURN_IF_ERROR(FlushBand());
  }
  return absl::OkStatus();
}

absl::Status RankUpload::FlushBand() {
  Current& c = *current_;
  BandChunker& chunker = *c.chunker;
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
  if (chunker.band() + 1 < chunker.bands()) chunker.Start(chunker.band() + 1);
  return absl::OkStatus();
}

absl::Status RankUpload::StoreVerbatim() {
  Current& c = *current_;
  // Chunk and checksum the buffered value without writing, then write only if no identical copy
  // is stored yet.
  std::vector<uint64_t> checksums;
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
  PendingCheckpoint::Tensor* t = nullptr;
  {
    std::unique_lock<std::mutex> lock(pending_->mu_);
    t = pending_->tensors_.at(c.name).get();
    // One rank at a time stores a new copy of a tensor, so that a rank finishing the same value
    // meanwhile finds that copy below instead of storing the value again.
    pending_->cv_.wait(lock, [t] { return !t->storing_variant; });
    for (PendingCheckpoint::Blob& v : t->variants) {
      if (v.state == PendingCheckpoint::BlobState::kDone &&
          std::equal(v.record->chunk_checksums().begin(), v.record->chunk_checksums().end(),
                     checksums.begin(), checksums.end())) {
        AddHolder(v.record, rank_);
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
  PendingCheckpoint::Blob blob = pending_->NewBlob();
  blob.owner_rank = rank_;
  blob.state = PendingCheckpoint::BlobState::kDone;
  blob.record->set_cell(c.blob_index);
  blob.record->set_blob_index(c.blob_index);
  SetBox(blob.record, c.box);
  for (int64_t v : c.tile) blob.record->add_tile(v);
  for (uint64_t x : c.checksums) blob.record->add_chunk_checksums(x);
  blob.record->set_total_bytes(c.total);
  AddHolder(blob.record, rank_);
  t->variants.push_back(std::move(blob));
  return absl::OkStatus();
}

absl::Status RankUpload::FinishTensor() {
  Current& c = *current_;
  if (c.mode == Mode::kBuffer) {
    CKPT_RETURN_IF_ERROR(StoreVerbatim());
  } else if (c.mode == Mode::kVerify) {
    verifications_.push_back({c.name, c.cell, std::move(c.checksums), c.box});
  } else {
    WrittenSlice slice;
    slice.tensor = c.tensor;
    slice.name = std::move(c.name);
    slice.cell = c.cell;
    slice.blob_index = c.blob_index;
    slice.tile = std::move(c.tile);
    slice.checksums = std::move(c.checksums);
    slice.total = c.total;
    if (batching_) {
      batch_slices_.push_back(std::move(slice));  // complete once EndBatch stored its chunks
    } else {
      std::lock_guard<std::mutex> lock(pending_->mu_);
      CKPT_RETURN_IF_ERROR(MarkWrittenLocked(slice));
      pending_->last_activity_ = absl::Now();
      pending_->cv_.notify_all();
    }
  }
  current_.reset();
  return absl::OkStatus();
}

absl::Status RankUpload::MarkWrittenLocked(const WrittenSlice& slice) {
  PendingCheckpoint::Tensor& t = *slice.tensor;
  PendingCheckpoint::Blob* blob = nullptr;
  if (t.layout) {
    blob = &t.cells.at(slice.cell);
  } else {
    for (auto& v : t.variants) {
      if (v.record->blob_index() == slice.blob_index) blob = &v;
    }
  }
  if (!blob) return absl::InternalError(absl::StrCat("lost the slice of ", slice.name));
  blob->record->mutable_tile()->Assign(slice.tile.begin(), slice.tile.end());
  blob->record->mutable_chunk_checksums()->Assign(slice.checksums.begin(), slice.checksums.end());
  blob->record->set_total_bytes(slice.total);
  AddHolder(blob->record, rank_);
  blob->state = PendingCheckpoint::BlobState::kDone;
  return absl::OkStatus();
}

absl::Status RankUpload::CheckStageSent() const {
  const Strategy* s = pending_->strategy_.get();
  if (!s) return absl::OkStatus();
  for (const auto& [name, param] : s->params()) {
    if (std::count(param.layout.stages.begin(), param.layout.stages.end(), stage_) &&
        !sent_.contains(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), " (pipeline stage ", stage_, ") did not send parameter ", name,
          ", which the strategy places in stages ", StagesString(param.layout.stages)));
    }
  }
  return absl::OkStatus();
}

absl::Status RankUpload::VerifyReplicasLocked(std::unique_lock<std::mutex>& lock) {
  for (const Verification& v : verifications_) {
    auto ready = [&] {
      auto t = pending_->tensors_.find(v.name);
      if (t == pending_->tensors_.end()) return true;
      auto c = t->second->cells.find(v.cell);
      return c == t->second->cells.end() || c->second.state == PendingCheckpoint::BlobState::kDone;
    };
    if (!pending_->cv_.wait_for(lock, absl::ToChronoSeconds(pending_->options_.replica_wait),
                                ready)) {
      return absl::DeadlineExceededError(absl::StrCat(
          Where(), ": timed out waiting for the rank uploading the same slice of ", v.name));
    }
    auto t = pending_->tensors_.find(v.name);
    auto c = t == pending_->tensors_.end() ? decltype(t->second->cells.end()){}
                                           : t->second->cells.find(v.cell);
    if (t == pending_->tensors_.end() || c == t->second->cells.end()) {
      return absl::AbortedError(absl::StrCat(Where(), ": the rank uploading the same slice ",
                                             v.box.ToString(), " of ", v.name,
                                             " failed; upload this rank again"));
    }
    const auto& stored = c->second.record->chunk_checksums();
    if (!std::equal(stored.begin(), stored.end(), v.checksums.begin(), v.checksums.end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", v.name, ": rank ", rank_, "'s copy of slice ", v.box.ToString(),
          " differs from rank ", c->second.owner_rank, "'s (replicated slices must be identical)"));
    }
    AddHolder(c->second.record, rank_);
  }
  return absl::OkStatus();
}

absl::Status RankUpload::CommitLocked() {
  // Every slice of every sharded tensor must have arrived.
  for (const auto& [name, t] : pending_->tensors_) {
    if (!t->layout) continue;
    int64_t cells = 1;
    for (int64_t g : t->cell_grid) cells *= g;
    if (static_cast<int64_t>(t->cells.size()) != cells) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", name, ": only ", t->cells.size(),
                                                     " of ", cells,
                                                     " distinct slices were received"));
    }
  }
  CKPT_RETURN_IF_ERROR(pending_->store_->CommitCheckpoint(
      pending_->id_, pending_->SerializeManifest(), pending_->data_id_));
  pending_->committed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<v1::UploadResponse> RankUpload::Finish() {
  if (current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": stream ended after ",
                                                   current_->received, " of ", current_->total,
                                                   " bytes of tensor ", current_->name));
  }
  if (sent_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(),
                     " sent no tensors: a checkpoint rank with zero tensors (such as an empty or "
                     "0-byte .ckpt file) is refused"));
  }
  CKPT_RETURN_IF_ERROR(CheckStageSent());
  std::unique_lock<std::mutex> lock(pending_->mu_);
  // Replicas: wait until the rank that writes the same slice is done, then compare checksums.
  CKPT_RETURN_IF_ERROR(VerifyReplicasLocked(lock));
  pending_->received_.insert(rank_);
  pending_->active_.erase(rank_);
  pending_->last_activity_ = absl::Now();
  pending_->cv_.notify_all();
  v1::UploadResponse response;
  response.set_checkpoint_id(pending_->id_);
  response.set_ranks_received(static_cast<int64_t>(pending_->received_.size()));
  response.set_ranks_total(pending_->world_size());
  response.set_bytes_stored(bytes_stored_);
  for (const std::string& w : warnings_) response.add_warnings(w);
  if (static_cast<int64_t>(pending_->received_.size()) == pending_->world_size()) {
    if (absl::Status s = CommitLocked(); !s.ok()) {
      pending_->received_.erase(rank_);
      return s;
    }
    response.set_committed(true);
  }
  finished_ = true;
  return response;
}

}  // namespace ckpt
