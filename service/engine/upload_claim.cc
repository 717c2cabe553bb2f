// RankUpload's header checks and slice claiming (upload_session.h): a tensor header checked on
// its own, then its slice recorded in the pending checkpoint under its lock.
#include <algorithm>
#include <memory>
#include <string>
#include <string_view>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/names.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "service/engine/upload_session.h"
#include "service/engine/upload_session_internal.h"

namespace ckpt {
namespace {

using upload_internal::kMaxDims;
using upload_internal::StagesString;
using upload_internal::StorageBits;

// True when `name` is 1 to kMaxNameBytes bytes of printable ASCII: then ValidatePrintableName
// accepts it, and the byte-by-byte UTF-8 decoding can be skipped.
bool PlainPrintableAscii(std::string_view name) {
  if (name.empty() || name.size() > kMaxNameBytes) return false;
  for (char c : name) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20 || b > 0x7e) return false;
  }
  return true;
}

}  // namespace

PendingCheckpoint::Slice* PendingCheckpoint::Tensor::FindCell(int64_t cell) {
  int32_t slot = -1;
  if (!dense_slots.empty()) {
    if (cell >= 0 && cell < static_cast<int64_t>(dense_slots.size())) slot = dense_slots[cell];
  } else if (auto it = sparse_slots.find(cell); it != sparse_slots.end()) {
    slot = it->second;
  }
  return slot < 0 ? nullptr : &slices[slot];
}

PendingCheckpoint::Slice& PendingCheckpoint::Tensor::AddCell(int64_t cell) {
  const auto slot = static_cast<int32_t>(slices.size());
  if (!dense_slots.empty()) {
    dense_slots[cell] = slot;
  } else {
    sparse_slots[cell] = slot;
  }
  Slice& s = slices.emplace_back();
  s.cell = cell;
  return s;
}

PendingCheckpoint::Slice* PendingCheckpoint::Tensor::FindVariant(int64_t blob_index) {
  for (Slice& v : slices) {
    if (v.cell == blob_index) return &v;
  }
  return nullptr;
}

void PendingCheckpoint::Tensor::EraseSlice(size_t i) {
  if (!layout) {
    slices.erase(slices.begin() + static_cast<std::ptrdiff_t>(i));
    return;
  }
  auto set_slot = [this](int64_t cell, int32_t slot) {
    if (!dense_slots.empty()) {
      dense_slots[cell] = slot;
    } else if (slot < 0) {
      sparse_slots.erase(cell);
    } else {
      sparse_slots[cell] = slot;
    }
  };
  set_slot(slices[i].cell, -1);
  if (i + 1 != slices.size()) {
    slices[i] = std::move(slices.back());
    set_slot(slices[i].cell, static_cast<int32_t>(i));
  }
  slices.pop_back();
}

Shape PendingCheckpoint::Tensor::CellShape() const {
  Shape shape(global.size());
  for (size_t i = 0; i < global.size(); ++i) shape[i] = global[i] / cell_grid[i];
  return shape;
}

void PendingCheckpoint::Tensor::CellBoxOf(int64_t cell, Box* box) const {
  box->lo.resize(global.size());
  box->hi.resize(global.size());
  for (size_t i = global.size(); i-- > 0;) {
    const int64_t block = global[i] / cell_grid[i];
    box->lo[i] = cell % cell_grid[i] * block;
    box->hi[i] = box->lo[i] + block;
    cell /= cell_grid[i];
  }
}

Box PendingCheckpoint::Tensor::CellBoxOf(int64_t cell) const {
  Box box;
  CellBoxOf(cell, &box);
  return box;
}

const ChunkGrid* PendingCheckpoint::CellGrid(const Shape& shape, int elem_bits) {
  std::pair<Shape, int> key(shape, elem_bits);
  if (auto it = cell_grids_.find(key); it != cell_grids_.end()) return &it->second;
  auto made = ChunkGrid::Make(shape, elem_bits, options_.chunk_grid);
  if (!made.ok()) return nullptr;  // BeginTensor reports it
  return &cell_grids_.emplace(std::move(key), *std::move(made)).first->second;
}

absl::Status RankUpload::CheckHeader(const v1::UploadTensorHeader& h, Current* cur,
                                     Shape* local) const {
  const std::string& name = h.name();
  // The context of an error is built only for a name that is refused.
  if (!PlainPrintableAscii(name)) {
    if (absl::Status valid = ValidatePrintableName("tensor name", name); !valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat(Where(), ": ", valid.message()));
    }
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
  if (dtype == DType::kStr || (local->size() == 1 && (*local)[0] == 0)) local->clear();
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

absl::StatusOr<Shape> RankUpload::GlobalShape(std::string_view name, const Layout* layout,
                                              const Shape& local) const {
  if (!layout) return local;
  if (!std::count(layout->stages.begin(), layout->stages.end(), stage_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter ", Sv(name), ": rank ", rank_, " is in pipeline stage ", stage_,
                     " but the strategy places it in stages ", StagesString(layout->stages)));
  }
  auto g = layout->GlobalShapeFromLocal(local);
  absl::Status valid = g.ok() ? layout->Validate(*g) : g.status();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", Sv(name), ": rank ", rank_, " holds shape ", ShapeToString(local),
        ", which does not fit layout ", layout->ToString(), ": ", valid.message()));
  }
  return *std::move(g);
}

absl::Status RankUpload::AddTensorLocked(const Shape& local, Current* cur) {
  auto& tensors = pending_->tensors_;
  auto it = tensors.find(cur->name);
  const bool first = it == tensors.end();
  PendingCheckpoint::Tensor* found = first ? nullptr : it->second.get();
  if (found && Sent(found->tensor_index)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": tensor ", Sv(cur->name), " appears twice in the rank's file"));
  }
  // The layout is looked up in the strategy once per tensor, when it is first seen.
  const Layout* layout = found ? found->layout : nullptr;
  const StrategyParam* param = nullptr;
  if (!found && pending_->strategy_) {
    param = pending_->strategy_->Find(cur->name);
    layout = param ? &param->layout : ResolveLayout(*pending_->strategy_, cur->name, true);
  }
  if (layout && cur->dtype == DType::kStr) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": str tensor ", Sv(cur->name),
                                                   " cannot have a layout in the strategy"));
  }
  if (found && found->dtype != cur->dtype) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", Sv(cur->name), ": rank ", rank_, " has dtype ", Sv(DTypeName(cur->dtype)),
        " but earlier ranks sent ", Sv(DTypeName(found->dtype))));
  }
  // The global shape is worked out once per tensor: another rank holding a slice of the same
  // shape (every rank of an even split does) only has its pipeline stage checked.
  const bool known = found && layout && found->known_local == local &&
                     std::count(layout->stages.begin(), layout->stages.end(), stage_);
  absl::StatusOr<Shape> worked_out;
  if (!known) {
    worked_out = GlobalShape(cur->name, layout, local);
    if (!worked_out.ok()) return worked_out.status();
  }
  if (found && !known && found->global != *worked_out) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameter ", Sv(cur->name), ": rank ", rank_, " holds shape ", ShapeToString(local),
        layout ? absl::StrCat(" (global ", ShapeToString(*worked_out), ")") : std::string(),
        " but earlier ranks imply global shape ", ShapeToString(found->global)));
  }
  if (first) {
    found = NewTensorLocked(*cur, layout, param != nullptr, local, *std::move(worked_out));
  }
  PendingCheckpoint::Tensor& t = *found;
  if (rank_ < t.first_rank) {
    t.first_rank = rank_;
    t.position = position_;
  }
  cur->name = t.name;
  cur->tensor = &t;
  cur->tensor_index = t.tensor_index;
  if (layout) {
    CKPT_RETURN_IF_ERROR(ClaimCellLocked(t, cur));
  } else {
    ClaimVariantLocked(t, cur);
  }
  if (t.tensor_index >= sent_.size()) sent_.resize(pending_->next_tensor_index_, false);
  sent_[t.tensor_index] = true;
  ++tensors_sent_;
  if (t.strategy_param) ++params_sent_;
  ++t.rank_count;
  return absl::OkStatus();
}

PendingCheckpoint::Tensor* RankUpload::NewTensorLocked(const Current& cur, const Layout* layout,
                                                       bool strategy_param, const Shape& local,
                                                       Shape global) {
  auto made = std::make_unique<PendingCheckpoint::Tensor>();
  PendingCheckpoint::Tensor* t = made.get();
  t->name = std::string(cur.name);
  t->dtype = cur.dtype;
  t->tensor_index = pending_->next_tensor_index_++;
  t->first_rank = rank_;
  t->position = position_;
  t->global = std::move(global);
  t->strategy_param = strategy_param;
  if (layout) {
    t->layout = layout;
    t->known_local = local;
    t->cell_grid = layout->Grid(t->global.size());
    t->cell_count = 1;
    for (int64_t g : t->cell_grid) t->cell_count *= g;
    if (t->cell_count <= PendingCheckpoint::kDenseCells) {
      t->dense_slots.assign(t->cell_count, -1);
    }
    t->slices.reserve(std::min<int64_t>(t->cell_count, 16));
  }
  pending_->tensors_.emplace(std::string_view(t->name), std::move(made));
  return t;
}

absl::Status RankUpload::ClaimCellLocked(PendingCheckpoint::Tensor& t, Current* cur) {
  absl::InlinedVector<int64_t, 8> cell(t.global.size());
  if (absl::Status s = t.layout->CellInto(local_rank_, absl::MakeSpan(cell)); !s.ok()) {
    return absl::InternalError(absl::StrCat("parameter ", t.name, ": ", s.message()));
  }
  int64_t id = 0;
  for (size_t i = 0; i < cell.size(); ++i) id = id * t.cell_grid[i] + cell[i];
  cur->cell = id;
  cur->blob_index = static_cast<uint32_t>(id);
  // The chunk grid of a cell, looked up once per tensor (every cell of a layout has the same
  // shape) and never changed afterwards, so BeginTensor reads it without the lock.
  if (!t.cell_chunks && cur->total > 0) {
    t.cell_chunks = pending_->CellGrid(t.CellShape(), StorageBits(cur->dtype));
  }
  cur->grid = t.cell_chunks;
  if (t.FindCell(id) != nullptr) {
    cur->mode = Mode::kVerify;  // a replica: its bytes must equal the stored copy
    return absl::OkStatus();
  }
  t.AddCell(id).owner_rank = static_cast<int32_t>(rank_);
  cur->mode = Mode::kWrite;
  return absl::OkStatus();
}

void RankUpload::ClaimVariantLocked(PendingCheckpoint::Tensor& t, Current* cur) {
  if (cur->total <= pending_->options_.verbatim_dedupe_bytes) {
    cur->mode = Mode::kBuffer;  // compared with the other ranks' copies when complete
    return;
  }
  cur->mode = Mode::kWrite;
  cur->blob_index = t.next_blob_index++;
  PendingCheckpoint::Slice& v = t.slices.emplace_back();
  v.cell = cur->blob_index;
  v.owner_rank = static_cast<int32_t>(rank_);
  v.holders.push_back(static_cast<int32_t>(rank_));
}

absl::Status RankUpload::PrepareTensor(const v1::UploadTensorHeader& h, Prepared* p) const {
  p->cur = Current();
  CKPT_RETURN_IF_ERROR(CheckHeader(h, &p->cur, &p->local));
  const Current& cur = p->cur;
  // Checked before anything is claimed or allocated for the tensor: a header only declares a size.
  const int64_t limit = pending_->options_.max_upload_bytes;
  if (cur.total > limit - bytes_announced_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        Where(), ": tensor ", Sv(cur.name), " announces ", cur.total, " bytes, which with the ",
        bytes_announced_, " bytes of the tensors before it exceeds the per-upload limit of ", limit,
        " bytes (ckptd --max-upload-gib)"));
  }
  return absl::OkStatus();
}

}  // namespace ckpt
