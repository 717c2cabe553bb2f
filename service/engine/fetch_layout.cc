#include "service/engine/fetch_layout.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "core/chunk_grid.h"
#include "service/engine/fetch_stream.h"
#include "service/engine/loaded_checkpoint.h"

namespace ckpt {
namespace {

// The manifest record of plan tensor `t` (as FetchStream::Record), or null.
const records::TensorRecord* RecordOf(const LoadedCheckpoint& checkpoint, const TensorPlan& t) {
  const records::CheckpointManifest& m = checkpoint.manifest;
  if (t.catalog_index >= 0 && t.catalog_index < m.tensors_size()) {
    const records::TensorRecord& r = m.tensors(static_cast<int>(t.catalog_index));
    if (r.name() == t.name) return &r;
  }
  auto it = checkpoint.tensor_by_name.find(t.name);
  return it == checkpoint.tensor_by_name.end() ? nullptr : &m.tensors(it->second);
}

// Scratch of DirectRefs, kept from tensor to tensor.
struct Scratch {
  ChunkGrid grid;
  Shape blob_shape, blob_tile;
  Box region, part, local, chunk_box, piece;
  std::vector<int64_t> overlapping;
  struct Piece {
    int64_t row_lo = 0, row_hi = 0;
    FetchLayout::ChunkRef ref;
  };
  std::vector<Piece> pieces;
};

// Appends the chunk ranges that are `t`'s bytes (`bytes` of them) to `refs` and returns true when
// the tensor is direct (see the file comment of fetch_layout.h); otherwise returns false, `refs`
// possibly extended (the caller truncates it).
bool DirectRefs(uint64_t data_id, const records::TensorRecord& r, const TensorPlan& t,
                int64_t bytes, Scratch& s, std::vector<FetchLayout::ChunkRef>* refs) {
  const size_t rank = t.dst_box.lo.size();
  if (t.dst_box.hi.size() != rank) return false;
  int64_t row_bytes = 0;
  if (rank > 0) {
    int64_t row_elements = 1;
    for (size_t i = 1; i < rank; ++i) row_elements *= t.dst_box.hi[i] - t.dst_box.lo[i];
    const int64_t row_bits = row_elements * ElementBits(t.dtype);
    if (row_bits % 8 != 0) return false;
    row_bytes = row_bits / 8;
  }
  s.pieces.clear();
  for (const CopyOp& op : t.ops) {
    if (op.src_box.lo.size() != rank || op.src_offset.size() != rank || op.extent.size() != rank) {
      return false;
    }
    s.region.lo.resize(rank);
    s.region.hi.resize(rank);
    for (size_t i = 0; i < rank; ++i) {
      s.region.lo[i] = op.src_box.lo[i] + op.src_offset[i];
      s.region.hi[i] = s.region.lo[i] + op.extent[i];
    }
    const records::BlobRecord* blob = FindBlob(r, op);
    if (blob == nullptr || blob->box_lo_size() != static_cast<int>(rank) ||
        blob->box_hi_size() != static_cast<int>(rank)) {
      return false;
    }
    s.blob_shape.resize(rank);
    for (size_t i = 0; i < rank; ++i) {
      s.blob_shape[i] = blob->box_hi(static_cast<int>(i)) - blob->box_lo(static_cast<int>(i));
    }
    s.blob_tile.assign(blob->tile().begin(), blob->tile().end());
    if (!s.grid.Reset(s.blob_shape, s.blob_tile, ElementBits(t.dtype)).ok()) return false;
    if (!IntersectInto(s.region, t.dst_box, &s.part)) continue;
    s.local = s.part;
    for (size_t i = 0; i < rank; ++i) {
      s.local.lo[i] -= blob->box_lo(static_cast<int>(i));
      s.local.hi[i] -= blob->box_lo(static_cast<int>(i));
    }
    s.grid.ChunksOverlapping(s.local, &s.overlapping);
    for (int64_t chunk : s.overlapping) {
      if (chunk >= blob->chunk_checksums_size()) return false;
      s.grid.ChunkBox(chunk, &s.chunk_box);
      for (size_t i = 0; i < rank; ++i) {
        s.chunk_box.lo[i] += blob->box_lo(static_cast<int>(i));
        s.chunk_box.hi[i] += blob->box_lo(static_cast<int>(i));
      }
      if (!IntersectInto(s.chunk_box, s.part, &s.piece)) return false;
      // Whole rows of the tensor's box that are whole rows of the chunk.
      for (size_t i = 1; i < rank; ++i) {
        if (s.piece.lo[i] != t.dst_box.lo[i] || s.piece.hi[i] != t.dst_box.hi[i] ||
            s.chunk_box.lo[i] != t.dst_box.lo[i] || s.chunk_box.hi[i] != t.dst_box.hi[i]) {
          return false;
        }
      }
      const int64_t chunk_bytes = s.grid.ChunkBytes(chunk);
      Scratch::Piece p;
      int64_t offset = 0;
      int64_t length = chunk_bytes;
      if (rank > 0) {
        p.row_lo = s.piece.lo[0];
        p.row_hi = s.piece.hi[0];
        offset = (s.piece.lo[0] - s.chunk_box.lo[0]) * row_bytes;
        length = (s.piece.hi[0] - s.piece.lo[0]) * row_bytes;
      }
      constexpr int64_t kMax = std::numeric_limits<uint32_t>::max();
      if (chunk_bytes > kMax || offset < 0 || length <= 0 || offset + length > chunk_bytes) {
        return false;
      }
      p.ref.address = {data_id, r.tensor_index(), blob->blob_index(), static_cast<uint32_t>(chunk)};
      p.ref.checksum = blob->chunk_checksums(static_cast<int>(chunk));
      p.ref.offset = static_cast<uint32_t>(offset);
      p.ref.length = static_cast<uint32_t>(length);
      p.ref.chunk_bytes = static_cast<uint32_t>(chunk_bytes);
      s.pieces.push_back(p);
    }
  }
  if (s.pieces.empty()) return false;
  if (rank == 0 && s.pieces.size() != 1) return false;
  std::sort(s.pieces.begin(), s.pieces.end(),
            [](const Scratch::Piece& a, const Scratch::Piece& b) { return a.row_lo < b.row_lo; });
  // The pieces stack into the box's rows without a gap or an overlap, and hold its bytes.
  int64_t next = rank == 0 ? 0 : t.dst_box.lo[0];
  int64_t total = 0;
  for (const Scratch::Piece& p : s.pieces) {
    if (p.row_lo != next) return false;
    next = p.row_hi;
    total += p.ref.length;
  }
  if ((rank > 0 && next != t.dst_box.hi[0]) || total != bytes) return false;
  for (const Scratch::Piece& p : s.pieces) refs->push_back(p.ref);
  return true;
}

}  // namespace

const records::BlobRecord* FindBlob(const records::TensorRecord& r, const CopyOp& op) {
  if (r.sharded()) {
    // Blobs of sharded tensors are sorted by cell: where every cell has one (the usual case),
    // cell i is blob i, found without a search.
    if (op.src_box_id >= 0 && op.src_box_id < r.blobs_size() &&
        r.blobs(static_cast<int>(op.src_box_id)).cell() == op.src_box_id) {
      return &r.blobs(static_cast<int>(op.src_box_id));
    }
    auto it = std::lower_bound(
        r.blobs().begin(), r.blobs().end(), op.src_box_id,
        [](const records::BlobRecord& b, int64_t cell) { return b.cell() < cell; });
    return it != r.blobs().end() && it->cell() == op.src_box_id ? &*it : nullptr;
  }
  for (const records::BlobRecord& b : r.blobs()) {
    if (std::binary_search(b.holders().begin(), b.holders().end(), op.src_rank)) return &b;
  }
  return nullptr;
}

FetchLayout BuildFetchLayout(const LoadedCheckpoint& checkpoint, const RankPlan& plan,
                             int64_t max_tensor_bytes) {
  FetchLayout out;
  out.max_tensor_bytes = max_tensor_bytes;
  out.tensors.resize(plan.tensors.size());
  const uint64_t data_id = checkpoint.manifest.data_id();
  Scratch scratch;
  for (size_t k = 0; k < plan.tensors.size(); ++k) {
    const TensorPlan& t = plan.tensors[k];
    FetchLayout::Tensor& lt = out.tensors[k];
    const records::TensorRecord* r = RecordOf(checkpoint, t);
    if (r == nullptr || t.dtype == DType::kStr) continue;
    auto volume = t.dst_box.Volume();
    if (!volume.ok()) continue;
    auto bytes = ByteSizeOf(t.dtype, *volume);
    if (!bytes.ok()) continue;
    lt.bytes = *bytes;
    if (lt.bytes <= 0 || lt.bytes > max_tensor_bytes) continue;
    const size_t refs_before = out.refs.size();
    if (!DirectRefs(data_id, *r, t, lt.bytes, scratch, &out.refs) ||
        out.refs.size() > std::numeric_limits<uint32_t>::max() ||
        out.headers.size() > std::numeric_limits<uint32_t>::max() / 2) {
      out.refs.resize(refs_before);
      continue;
    }
    lt.direct = true;
    lt.first_ref = static_cast<uint32_t>(refs_before);
    lt.ref_count = static_cast<uint32_t>(out.refs.size() - refs_before);
    lt.header_offset = static_cast<uint32_t>(out.headers.size());
    AppendBatchTensorHeader(t.name, DTypeName(t.dtype), t.dst_box, t.global_shape, lt.bytes,
                            t.kind == TensorKind::kVerbatim, &out.headers);
    lt.header_length = static_cast<uint32_t>(out.headers.size() - lt.header_offset);
  }
  out.refs.shrink_to_fit();
  out.headers.shrink_to_fit();
  return out;
}

namespace {

// The entry of `kept` (most recently used last) for `plan` that `match` accepts, made the most
// recent; null when there is none. Entries whose plan is gone are dropped first.
template <typename Entry, typename Match>
Entry* FindRecent(std::vector<Entry>& kept, const std::shared_ptr<const RankPlan>& plan,
                  Match match) {
  std::erase_if(kept, [](const Entry& e) { return e.plan.expired(); });
  for (auto it = kept.begin(); it != kept.end(); ++it) {
    if (it->plan.lock() == plan && match(*it)) {
      std::rotate(it, it + 1, kept.end());
      return &kept.back();
    }
  }
  return nullptr;
}

// Adds `entry` as the most recent, dropping the least recent beyond `max` entries.
template <typename Entry>
void AddRecent(std::vector<Entry>& kept, Entry entry, size_t max) {
  kept.push_back(std::move(entry));
  if (kept.size() > max) kept.erase(kept.begin());
}

}  // namespace

std::shared_ptr<const FetchLayout> FetchLayoutCache::Get(
    const LoadedCheckpoint& checkpoint, const std::shared_ptr<const RankPlan>& plan,
    int64_t max_tensor_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const Kept* k = FindRecent(kept_, plan, [&](const Kept& k) {
        return k.layout->max_tensor_bytes == max_tensor_bytes;
      })) {
    return k->layout;
  }
  // Built under the lock: the streams of one plan starting together (replicas) wait for one
  // build rather than each building it.
  auto layout =
      std::make_shared<const FetchLayout>(BuildFetchLayout(checkpoint, *plan, max_tensor_bytes));
  AddRecent(kept_, Kept{plan, layout}, kMaxKept);
  return layout;
}

int64_t FetchLayoutCache::TotalBytes(const std::shared_ptr<const RankPlan>& plan,
                                     absl::FunctionRef<int64_t()> compute) {
  std::lock_guard<std::mutex> lock(mu_);
  if (const Total* t = FindRecent(totals_, plan, [](const Total&) { return true; })) {
    return t->bytes;
  }
  // Under the lock, as layouts are: replicas starting together sum it once.
  const int64_t bytes = compute();
  AddRecent(totals_, Total{plan, bytes}, kMaxKept);
  return bytes;
}

}  // namespace ckpt
