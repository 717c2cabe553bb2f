// RankUpload::Finish and the commit (upload_session.h): the rank's completeness and replica
// checks, and for the last rank the checkpoint's completeness check and its manifest, written
// from the pending checkpoint's flat records.
#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt_records.pb.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"
#include "service/engine/stored_strategy.h"
#include "service/engine/upload_session.h"
#include "service/engine/upload_session_internal.h"

namespace ckpt {
namespace {

using upload_internal::AddHolder;
using upload_internal::StagesString;

// Protobuf's wire format, written field by field in field-number order with proto3's rules
// (scalars equal to 0 and empty repeated fields left out, repeated scalars packed), so that the
// bytes are those protobuf's own serializer gives for the same record (upload_session_test
// checks this). Field numbers are those of proto/ckpt_records.proto.
class Wire {
 public:
  explicit Wire(std::string* out) : out_(out) {}

  static size_t VarintSize(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
      v >>= 7;
      ++n;
    }
    return n;
  }
  void Varint(uint64_t v) {
    while (v >= 0x80) {
      out_->push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    out_->push_back(static_cast<char>(v));
  }
  void Tag(int field, int wire_type) { Varint(static_cast<uint64_t>(field) << 3 | wire_type); }
  // A varint field (int64, uint64, uint32, bool, enum), left out when 0.
  void Int(int field, int64_t v) {
    if (v == 0) return;
    Tag(field, 0);
    Varint(static_cast<uint64_t>(v));
  }
  // A string or bytes field, left out when empty unless `always` (an element of a repeated one).
  void Bytes(int field, std::string_view v, bool always = false) {
    if (v.empty() && !always) return;
    Tag(field, 2);
    Varint(v.size());
    out_->append(v);
  }
  // A packed repeated int64 field.
  template <typename Range>
  void PackedInts(int field, const Range& values) {
    if (values.empty()) return;
    size_t size = 0;
    for (auto v : values) size += VarintSize(static_cast<uint64_t>(static_cast<int64_t>(v)));
    Tag(field, 2);
    Varint(size);
    for (auto v : values) Varint(static_cast<uint64_t>(static_cast<int64_t>(v)));
  }
  // A packed repeated fixed64 field.
  template <typename Range>
  void PackedFixed64(int field, const Range& values) {
    if (values.empty()) return;
    Tag(field, 2);
    Varint(values.size() * 8);
    for (uint64_t v : values) {
      char bytes[8];
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(v >> (8 * i));
      out_->append(bytes, 8);
    }
  }

 private:
  std::string* out_;
};

// The stored form (EncodeStoredStrategy's strategy_binary) of the strategies the latest commits
// used, kept while their strategy objects live: every checkpoint uploaded with one registered
// strategy shares its object (CheckpointManager keeps it), so it is encoded once rather than at
// every commit. Thread-safe.
std::shared_ptr<const std::string> StoredFormOf(const std::shared_ptr<const Strategy>& strategy) {
  struct Entry {
    std::weak_ptr<const Strategy> strategy;
    std::shared_ptr<const std::string> binary;
  };
  constexpr size_t kEntries = 2;
  static std::mutex mu;
  static auto* const entries = new std::vector<Entry>();  // most recent first; never destroyed
  std::lock_guard<std::mutex> lock(mu);
  std::erase_if(*entries, [](const Entry& e) { return e.strategy.expired(); });
  for (size_t i = 0; i < entries->size(); ++i) {
    // An unexpired entry whose object is at the same address is this object: `strategy` keeps
    // it alive, so no other object can have taken its place.
    if ((*entries)[i].strategy.lock() == strategy) {
      std::rotate(entries->begin(), entries->begin() + static_cast<std::ptrdiff_t>(i),
                  entries->begin() + static_cast<std::ptrdiff_t>(i) + 1);
      return entries->front().binary;
    }
  }
  records::StrategyRecord record;
  EncodeStoredStrategy(*strategy, &record);
  auto binary = std::make_shared<const std::string>(std::move(*record.mutable_strategy_binary()));
  entries->insert(entries->begin(), {strategy, binary});
  if (entries->size() > kEntries) entries->pop_back();
  return binary;
}

}  // namespace

std::string PendingCheckpoint::SerializeManifest() {
  std::vector<Tensor*> order;
  order.reserve(tensors_.size());
  for (const auto& [name, t] : tensors_) order.push_back(t.get());
  std::sort(order.begin(), order.end(), [](const Tensor* a, const Tensor* b) {
    return std::tie(a->first_rank, a->position) < std::tie(b->first_rank, b->position);
  });
  std::shared_ptr<const std::string> stored_strategy;
  if (strategy_) stored_strategy = StoredFormOf(strategy_);

  // records::CheckpointManifest, its TensorRecords and their BlobRecords, each nested record
  // written into a buffer of its own (reused) and then copied behind its length.
  size_t slice_count = 0;
  for (const Tensor* t : order) slice_count += t->slices.size();
  std::string out;
  out.reserve((stored_strategy ? stored_strategy->size() : 0) + 64 * order.size() +
              96 * slice_count);
  std::string tensor_bytes;
  std::string blob_bytes;
  Wire m(&out);
  m.Bytes(1, id_);
  m.Bytes(2, strategy_name_);
  m.Int(4, world_size());
  m.Int(5, static_cast<int64_t>(data_id_));
  std::vector<const Slice*> slices;
  Box box;
  for (const Tensor* t : order) {
    tensor_bytes.clear();
    Wire tw(&tensor_bytes);
    tw.Bytes(1, t->name);
    tw.Bytes(2, DTypeName(t->dtype));
    tw.PackedInts(3, t->global);
    tw.Int(4, t->layout != nullptr);
    // A sharded tensor's cells by cell; a verbatim tensor's variants in the order stored.
    slices.clear();
    for (const Slice& s : t->slices) slices.push_back(&s);
    if (t->layout) {
      std::sort(slices.begin(), slices.end(),
                [](const Slice* a, const Slice* b) { return a->cell < b->cell; });
    }
    for (const Slice* s : slices) {
      blob_bytes.clear();
      Wire b(&blob_bytes);
      b.Int(1, s->cell);
      if (t->layout) {
        t->CellBoxOf(s->cell, &box);
      } else {
        box.lo.assign(t->global.size(), 0);
        box.hi.assign(t->global.begin(), t->global.end());
      }
      b.PackedInts(2, box.lo);
      b.PackedInts(3, box.hi);
      if (!t->layout) {
        b.PackedInts(4, s->tile);
      } else if (s->total_bytes > 0 && t->cell_chunks) {
        b.PackedInts(4, t->cell_chunks->tile());
      }
      b.PackedFixed64(5, s->checksums);
      b.PackedInts(6, s->holders);
      b.Int(7, static_cast<uint32_t>(s->cell));
      b.Int(8, s->total_bytes);
      tw.Bytes(5, blob_bytes, /*always=*/true);
    }
    tw.Int(6, t->tensor_index);
    m.Bytes(6, tensor_bytes, /*always=*/true);
  }
  m.Int(7, absl::ToUnixSeconds(absl::Now()));
  for (int64_t r = 0; r < world_size(); ++r) {
    auto it = source_files_.find(r);
    m.Bytes(8, it == source_files_.end() ? std::string_view() : it->second, /*always=*/true);
  }
  m.Int(9, records::CHUNK_CHECKSUM_XXH3_64);
  if (stored_strategy) m.Bytes(10, *stored_strategy);
  return out;
}

absl::Status RankUpload::CheckStageSentLocked() const {
  const Strategy* s = pending_->strategy_.get();
  if (!s) return absl::OkStatus();
  // Every parameter this rank sent under its own name is one of its stage's: when there are as
  // many as the stage holds, none is missing. Otherwise the first missing one is named.
  if (params_sent_ == pending_->stage_params_[static_cast<size_t>(stage_)]) {
    return absl::OkStatus();
  }
  for (const auto& [name, param] : s->params()) {
    if (!std::count(param.layout.stages.begin(), param.layout.stages.end(), stage_)) continue;
    auto it = pending_->tensors_.find(name);
    if (it == pending_->tensors_.end() || !Sent(it->second->tensor_index)) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), " (pipeline stage ", stage_, ") did not send parameter ", name,
          ", which the strategy places in stages ", StagesString(param.layout.stages)));
    }
  }
  return absl::OkStatus();
}

absl::Status RankUpload::VerifyReplicasLocked(std::unique_lock<std::mutex>& lock) {
  for (const Verification& v : verifications_) {
    // The tensor stays while this rank holds it; the cell goes if the rank writing it fails.
    PendingCheckpoint::Tensor& t = *v.tensor;
    auto ready = [&] {
      const PendingCheckpoint::Slice* s = t.FindCell(v.cell);
      return s == nullptr || s->state == PendingCheckpoint::BlobState::kDone;
    };
    if (!pending_->cv_.wait_for(lock, absl::ToChronoSeconds(pending_->options_.replica_wait),
                                ready)) {
      return absl::DeadlineExceededError(absl::StrCat(
          Where(), ": timed out waiting for the rank uploading the same slice of ", t.name));
    }
    PendingCheckpoint::Slice* s = t.FindCell(v.cell);
    if (s == nullptr) {
      return absl::AbortedError(absl::StrCat(Where(), ": the rank uploading the same slice ",
                                             t.CellBoxOf(v.cell).ToString(), " of ", t.name,
                                             " failed; upload this rank again"));
    }
    if (!std::equal(s->checksums.begin(), s->checksums.end(), v.checksums.begin(),
                    v.checksums.end())) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter ", t.name, ": rank ", rank_, "'s copy of slice ",
                       t.CellBoxOf(v.cell).ToString(), " differs from rank ", s->owner_rank,
                       "'s (replicated slices must be identical)"));
    }
    AddHolder(s->holders, rank_);
  }
  return absl::OkStatus();
}

absl::Status RankUpload::CommitLocked() {
  // Every slice of every sharded tensor must have arrived.
  for (const auto& [name, t] : pending_->tensors_) {
    if (!t->layout) continue;
    if (static_cast<int64_t>(t->slices.size()) != t->cell_count) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", Sv(name), ": only ",
                                                     t->slices.size(), " of ", t->cell_count,
                                                     " distinct slices were received"));
    }
  }
  CKPT_RETURN_IF_ERROR(pending_->store_->CommitCheckpoint(
      pending_->id_, pending_->SerializeManifest(), pending_->data_id_));
  pending_->committed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<v1::UploadResponse> RankUpload::Finish() {
  CKPT_RETURN_IF_ERROR(CheckNotFailed());
  if (current_) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), ": stream ended after ",
                                                   current_->received, " of ", current_->total,
                                                   " bytes of tensor ", Sv(current_->name)));
  }
  if (tensors_sent_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(),
                     " sent no tensors: a checkpoint rank with zero tensors (such as an empty or "
                     "0-byte .ckpt file) is refused"));
  }
  std::unique_lock<std::mutex> lock(pending_->mu_);
  CKPT_RETURN_IF_ERROR(CheckStageSentLocked());
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
