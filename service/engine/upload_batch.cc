// RankUpload's batch path (upload_session.h): runs of whole small tensors, their headers checked
// and their slices claimed together, their chunks stored with one PutChunks.
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "service/engine/upload_session.h"

namespace ckpt {

void RankUpload::BeginBatch() { batching_ = true; }

absl::Status RankUpload::EndBatch() {
  CKPT_RETURN_IF_ERROR(CheckNotFailed());
  return Refuse(DoEndBatch());
}

absl::Status RankUpload::AddBatch(const std::vector<BatchTensor>& tensors) {
  CKPT_RETURN_IF_ERROR(CheckNotFailed());
  return Refuse(DoAddBatch(tensors));
}

absl::Status RankUpload::DoEndBatch() {
  batching_ = false;
  if (current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": tensor ", Sv(current_->name),
                                                   " is incomplete at the end of a batch"));
  }
  absl::Status stored = absl::OkStatus();
  if (!batch_writes_.empty()) {
    size_t begin = 0;
    for (size_t i = 0; i < batch_writes_.size(); ++i) {
      if (batch_ends_[i] == kBorrowedBytes) continue;  // a view of the caller's bytes
      batch_writes_[i].bytes = std::string_view(batch_bytes_).substr(begin, batch_ends_[i] - begin);
      begin = batch_ends_[i];
    }
    stored = pending_->store_->PutChunks(batch_writes_);
  }
  batch_writes_.clear();
  batch_ends_.clear();
  // Capacity is kept for the next batch, up to a bound (a batch holds at most a data message's
  // bytes, so this is a bound on what one stream keeps).
  if (batch_bytes_.capacity() > (size_t{2} << 20)) {
    std::string().swap(batch_bytes_);
  } else {
    batch_bytes_.clear();
  }
  if (!stored.ok()) {
    batch_slices_.clear();  // left unclaimed-on-failure: the caller ends the upload
    return stored;
  }
  std::lock_guard<std::mutex> lock(pending_->mu_);
  absl::Status marked = absl::OkStatus();
  for (WrittenSlice& slice : batch_slices_) {
    marked = MarkWrittenLocked(slice);
    if (!marked.ok()) break;
  }
  batch_slices_.clear();
  pending_->last_activity_ = absl::Now();
  pending_->cv_.notify_all();
  return marked;
}

absl::Status RankUpload::DoAddBatch(const std::vector<BatchTensor>& tensors) {
  if (current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": a tensor batch came while tensor ",
                                                   Sv(current_->name), "'s bytes were still due"));
  }
  const size_t n = tensors.size();
  if (prepared_.size() < n) prepared_.resize(n);
  // Every header on its own, in order, and every tensor whole.
  for (size_t i = 0; i < n; ++i) {
    const BatchTensor& t = tensors[i];
    Prepared& p = prepared_[i];
    CKPT_RETURN_IF_ERROR(PrepareTensor(*t.header, &p));
    if (static_cast<int64_t>(t.data.size()) != p.cur.total) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), ": batched tensor ", Sv(p.cur.name), " carries ", t.data.size(),
                       " of its ", p.cur.total, " bytes (a batch holds whole tensors)"));
    }
    bytes_announced_ += p.cur.total;
  }
  // Every slice claimed under one lock (a tensor named twice in the batch is refused there, as
  // across batches).
  {
    std::lock_guard<std::mutex> lock(pending_->mu_);
    pending_->last_activity_ = absl::Now();
    for (size_t i = 0; i < n; ++i) {
      Prepared& p = prepared_[i];
      CKPT_RETURN_IF_ERROR(AddTensorLocked(p.local, &p.cur));
      ++position_;
    }
  }
  // The bytes; the slices this rank writes are stored together at EndBatch. An error fails the
  // upload and drops what the batch collected (Refuse).
  BeginBatch();
  for (size_t i = 0; i < n; ++i) {
    const std::string_view data = tensors[i].data;
    CKPT_RETURN_IF_ERROR(BeginTensor(std::move(prepared_[i].cur), &data));
    if (current_) CKPT_RETURN_IF_ERROR(DoAppend(data));
  }
  return DoEndBatch();
}

}  // namespace ckpt
