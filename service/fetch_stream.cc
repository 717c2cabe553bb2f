#include "service/fetch_stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/chunk_grid.h"
#include "core/status_macros.h"
#include "core/strided_copy.h"

namespace ckpt {
namespace {

Box BoxOf(const records::BlobRecord& b) {
  return Box{{b.box_lo().begin(), b.box_lo().end()}, {b.box_hi().begin(), b.box_hi().end()}};
}

Box Shift(const Box& box, const std::vector<int64_t>& by, int sign) {
  Box out = box;
  for (size_t i = 0; i < by.size(); ++i) {
    out.lo[i] += sign * by[i];
    out.hi[i] += sign * by[i];
  }
  return out;
}

}  // namespace

FetchStream::FetchStream(std::shared_ptr<const LoadedCheckpoint> checkpoint, RankPlan plan,
                         CheckpointStore* store, FetchOptions options)
    : checkpoint_(std::move(checkpoint)),
      plan_(std::move(plan)),
      store_(store),
      options_(options) {
  for (const TensorPlan& t : plan_.tensors) total_bytes_ += TensorBytes(t);
}

const records::TensorRecord& FetchStream::Record(const TensorPlan& t) const {
  return checkpoint_->manifest.tensors(checkpoint_->tensor_by_name.at(t.name));
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
  if (r.sharded()) {
    // Blobs of sharded tensors are sorted by cell.
    auto it = std::lower_bound(r.blobs().begin(), r.blobs().end(), op.src_box_id,
                               [](const records::BlobRecord& b, int64_t cell) { return b.cell() < cell; });
    return it != r.blobs().end() && it->cell() == op.src_box_id ? &*it : nullptr;
  }
  for (const records::BlobRecord& b : r.blobs()) {
    if (std::binary_search(b.holders().begin(), b.holders().end(), op.src_rank)) return &b;
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<ChunkData>> FetchStream::Chunk(const ChunkAddress& address,
                                                              uint64_t checksum) {
  const uint64_t hi = (uint64_t{address.tensor} << 32) | address.blob;
  const uint64_t lo = address.chunk;
  for (auto it = cache_.begin(); it != cache_.end(); ++it) {
    if (it->key_hi == hi && it->key_lo == lo) {
      cache_.splice(cache_.begin(), cache_, it);
      return cache_.front().data;
    }
  }
  auto read = store_->ReadChunk(address, checksum);
  if (!read.ok()) return read.status();
  std::shared_ptr<ChunkData> data(std::move(*read));
  const int64_t size = static_cast<int64_t>(data->bytes().size());
  cache_.push_front({hi, lo, data});
  cache_bytes_ += size;
  while (cache_bytes_ > options_.chunk_cache_bytes && cache_.size() > 1) {
    cache_bytes_ -= static_cast<int64_t>(cache_.back().data->bytes().size());
    cache_.pop_back();
  }
  return data;
}

absl::Status FetchStream::BuildBand() {
  const TensorPlan& t = plan_.tensors[tensor_];
  const records::TensorRecord& r = Record(t);
  const uint64_t data_id = checkpoint_->manifest.data_id();
  auto where = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("checkpoint ", checkpoint_->manifest.id(),
                                               " tensor ", t.name, ": ", s.message()));
  };
  band_.clear();
  band_pos_ = 0;
  if (t.dtype == DType::kStr) {
    // Raw bytes, one stored chunk at a time.
    if (t.ops.empty()) {
      tensor_done_ = true;
      return absl::OkStatus();
    }
    const records::BlobRecord* b = BlobFor(r, t.ops[0]);
    if (!b) return where(absl::InternalError("no stored copy for the chosen source rank"));
    if (next_chunk_ >= b->chunk_xxh64_size()) {
      tensor_done_ = true;
      return absl::OkStatus();
    }
    auto data = Chunk({data_id, r.tensor_index(), b->blob_index(), static_cast<uint32_t>(next_chunk_)},
                      b->chunk_xxh64(next_chunk_));
    if (!data.ok()) return where(data.status());
    band_.assign((*data)->bytes());
    ++next_chunk_;
    return absl::OkStatus();
  }

  const Shape local = t.dst_box.shape();
  Box band_box = t.dst_box;
  if (!local.empty()) {
    if (next_row_ >= local[0]) {
      tensor_done_ = true;
      return absl::OkStatus();
    }
    Shape row_shape(local.begin() + 1, local.end());
    const int64_t row_bytes = std::max<int64_t>(1, *ByteSizeOf(t.dtype, *NumElements(row_shape)));
    const int64_t rows = std::clamp<int64_t>(options_.band_bytes / row_bytes, 1, local[0] - next_row_);
    band_box.lo[0] = t.dst_box.lo[0] + next_row_;
    band_box.hi[0] = band_box.lo[0] + rows;
    next_row_ += rows;
  } else {
    if (next_row_ > 0) {
      tensor_done_ = true;
      return absl::OkStatus();
    }
    next_row_ = 1;
  }
  band_.assign(static_cast<size_t>(*ByteSizeOf(t.dtype, *band_box.Volume())), '\0');
  for (const CopyOp& op : t.ops) {
    Box region;
    region.lo.resize(op.extent.size());
    region.hi.resize(op.extent.size());
    for (size_t i = 0; i < op.extent.size(); ++i) {
      region.lo[i] = op.src_box.lo[i] + op.src_offset[i];
      region.hi[i] = region.lo[i] + op.extent[i];
    }
    const std::optional<Box> part = Intersect(region, band_box);
    if (!part) continue;
    const records::BlobRecord* b = BlobFor(r, op);
    if (!b) {
      return where(absl::InternalError(absl::StrCat("no stored slice for source box ",
                                                    op.src_box.ToString(), " of rank ",
                                                    op.src_rank)));
    }
    const Box blob_box = BoxOf(*b);
    auto grid = ChunkGrid::FromTile(blob_box.shape(), {b->tile().begin(), b->tile().end()},
                                    ElementBits(t.dtype));
    if (!grid.ok()) return where(absl::DataLossError(grid.status().message()));
    for (int64_t chunk : grid->ChunksOverlapping(Shift(*part, blob_box.lo, -1))) {
      if (chunk >= b->chunk_xxh64_size()) {
        return where(absl::DataLossError(absl::StrCat("manifest lists ", b->chunk_xxh64_size(),
                                                      " chunks, chunk ", chunk, " needed")));
      }
      auto data = Chunk({data_id, r.tensor_index(), b->blob_index(), static_cast<uint32_t>(chunk)},
                        b->chunk_xxh64(chunk));
      if (!data.ok()) return where(data.status());
      const Box chunk_box = Shift(grid->ChunkBox(chunk), blob_box.lo, +1);
      if (static_cast<int64_t>((*data)->bytes().size()) != grid->ChunkBytes(chunk)) {
        return where(absl::DataLossError(absl::StrCat("chunk ", chunk, " has ",
                                                      (*data)->bytes().size(), " bytes, expected ",
                                                      grid->ChunkBytes(chunk))));
      }
      const Box sub = *Intersect(chunk_box, *part);
      CKPT_RETURN_IF_ERROR(CopyBoxRegion(t.dtype, (*data)->bytes().data(), chunk_box,
                                         band_.data(), band_box, sub));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> FetchStream::Next(v1::FetchResponse* out) {
  out->Clear();
  if (!summary_sent_) {
    summary_sent_ = true;
    v1::FetchPlanSummary* s = out->mutable_summary();
    s->set_tensor_count(static_cast<int64_t>(plan_.tensors.size()));
    s->set_total_bytes(total_bytes_);
    for (int64_t r : plan_.source_ranks) s->add_source_ranks(r);
    for (const std::string& w : plan_.warnings) s->add_warnings(w);
    return true;
  }
  while (tensor_ < plan_.tensors.size()) {
    const TensorPlan& t = plan_.tensors[tensor_];
    if (!header_sent_) {
      header_sent_ = true;
      next_row_ = 0;
      next_chunk_ = 0;
      tensor_done_ = false;
      band_.clear();
      band_pos_ = 0;
      v1::FetchTensorHeader* h = out->mutable_tensor();
      h->set_name(t.name);
      h->set_dtype(std::string(DTypeName(t.dtype)));
      for (int64_t d : t.dst_box.shape()) h->add_local_shape(d);
      for (int64_t d : t.global_shape) h->add_global_shape(d);
      for (int64_t v : t.dst_box.lo) h->add_box_lo(v);
      for (int64_t v : t.dst_box.hi) h->add_box_hi(v);
      h->set_total_bytes(TensorBytes(t));
      h->set_verbatim(t.kind == TensorKind::kVerbatim);
      return true;
    }
    if (band_pos_ >= band_.size() && !tensor_done_) {
      CKPT_RETURN_IF_ERROR(BuildBand());
    }
    if (band_pos_ < band_.size()) {
      const size_t n = std::min<size_t>(band_.size() - band_pos_, options_.max_message_bytes);
      v1::FetchData* d = out->mutable_data();
      d->set_data(band_.data() + band_pos_, n);
      d->set_xxh64(ChunkChecksum(d->data()));
      band_pos_ += n;
      bytes_produced_ += static_cast<int64_t>(n);
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
