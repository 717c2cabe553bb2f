// RankUpload::Finish and the commit (upload_session.h): the rank's completeness and replica
// checks, and for the last rank the checkpoint's completeness check and its manifest.
#include <algorithm>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "service/engine/stored_strategy.h"
#include "service/engine/upload_session.h"
#include "service/engine/upload_session_internal.h"

namespace ckpt {

using upload_internal::AddHolder;
using upload_internal::StagesString;

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
