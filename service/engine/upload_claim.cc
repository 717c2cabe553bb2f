// RankUpload's header checks and slice claiming (upload_session.h): a tensor header checked on
// its own, then its slice recorded in the pending checkpoint under its lock.
#include <algorithm>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/names.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "service/engine/upload_session.h"
#include "service/engine/upload_session_internal.h"

namespace ckpt {

using upload_internal::AddHolder;
using upload_internal::kMaxDims;
using upload_internal::SetBox;
using upload_internal::StagesString;
using upload_internal::StorageBits;

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

}  // namespace ckpt
