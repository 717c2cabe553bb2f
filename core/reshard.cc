#include "core/reshard.h"

#include <algorithm>
#include <numeric>
#include <queue>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/absl_compat.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

constexpr std::string_view kOptimizerPrefixes[] = {"adam_m.", "adam_v.", "moments.",
                                                   "accu_grads."};

// One side of a re-shard: a strategy, or (null) a single rank holding every tensor whole.
struct Side {
  std::shared_ptr<const Strategy> strategy;

  int64_t devices() const { return strategy ? strategy->devices_per_stage() : 1; }
  int32_t stages() const { return strategy ? strategy->stage_count() : 1; }
  int64_t world() const { return devices() * stages(); }
  const Layout* Find(std::string_view name, bool inherit) const {
    return strategy ? ResolveLayout(*strategy, name, inherit) : nullptr;
  }
  std::vector<int32_t> AllStages() const {
    std::vector<int32_t> s(stages());
    std::iota(s.begin(), s.end(), 0);
    return s;
  }
};

// The geometry shared by every tensor with the same (source layout, source holders, destination
// layout, global shape): the grids, and for each source cell the interned set of global ranks
// holding it.
struct Geometry {
  Shape global;
  Layout src;
  Layout dst;
  std::vector<int64_t> src_grid;
  std::vector<int64_t> dst_grid;
  std::vector<int32_t> cell_holders;  // source cell id -> holder-set id
};

// Enumerates the source cells of a geometry that overlap a destination box, in row-major order of
// source cells (= ascending destination position). Keeps its index buffers between calls.
class OverlapWalker {
 public:
  // Calls fn(src_cell, src_cell_id) for every overlapping source cell; none when the tensor has
  // no elements.
  template <typename Fn>
  void ForEach(const Geometry& g, const Box& dst_box, Fn&& fn) {
    if (std::count(g.global.begin(), g.global.end(), 0) > 0) return;
    // Overlapping source blocks per dim: [lo_block_, end_block_).
    const size_t rank = g.global.size();
    lo_block_.resize(rank);
    end_block_.resize(rank);
    for (size_t i = 0; i < rank; ++i) {
      const int64_t block = g.global[i] / g.src_grid[i];
      lo_block_[i] = dst_box.lo[i] / block;
      end_block_[i] = (dst_box.hi[i] - 1) / block + 1;
    }
    idx_ = lo_block_;
    do {
      int64_t id = 0;
      for (size_t i = 0; i < rank; ++i) id = id * g.src_grid[i] + idx_[i];
      fn(idx_, id);
    } while (NextIndex(idx_, lo_block_, end_block_));
  }

 private:
  std::vector<int64_t> lo_block_, end_block_, idx_;
};

struct Entry {
  std::string name;
  DType dtype = DType::kFloat32;
  TensorKind kind = TensorKind::kResharded;
  int32_t geometry = 0;
  std::vector<int32_t> dst_stages;  // destination stages receiving it
  int64_t catalog_index = -1;       // TensorPlan::catalog_index
};

// Destination parameter that the checkpoint does not have.
struct Missing {
  std::string name;
  std::vector<int32_t> stages;
};

int64_t Lcm(int64_t a, int64_t b) { return a / std::gcd(a, b) * b; }

std::string GeometryKey(const Shape& global, const Layout& src, const Layout& dst,
                        const std::vector<int64_t>* holders) {
  std::string key = absl::StrCat(ShapeToString(global), "|", src.ToString(), "|",
                                 src.OptShardFactor(), "|", dst.ToString(), "|",
                                 dst.OptShardFactor());
  if (holders) absl::StrAppend(&key, "|h", absl::StrJoin(*holders, ","));
  return key;
}

bool Contains(const std::vector<int32_t>& v, int32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

const Layout* ResolveLayout(const Strategy& strategy, std::string_view name,
                            bool inherit_optimizer_layouts) {
  if (const StrategyParam* p = strategy.Find(name)) return &p->layout;
  std::string weight;
  if (inherit_optimizer_layouts && IsOptimizerStateName(name, &weight)) {
    if (const StrategyParam* p = strategy.Find(weight)) return &p->layout;
  }
  return nullptr;
}

bool IsOptimizerStateName(std::string_view name, std::string* weight) {
  for (std::string_view prefix : kOptimizerPrefixes) {
    if (name.size() > prefix.size() && name.substr(0, prefix.size()) == prefix) {
      if (weight) *weight = std::string(name.substr(prefix.size()));
      return true;
    }
  }
  return false;
}

struct Resharder::Impl {
  Side src;
  Side dst;
  PlanOptions options;
  std::vector<Geometry> geometries;
  std::vector<Entry> entries;  // output order
  std::vector<Missing> missing;
  std::vector<std::vector<int64_t>> holder_sets;
  absl::flat_hash_map<std::vector<int64_t>, int32_t> holder_set_ids;
  absl::flat_hash_map<std::string, int32_t> geometry_ids;
  // Destination stage -> the distinct geometries of the entries it receives, in order of first
  // appearance (so that an error is the one planning the rank's tensors would report first).
  std::vector<std::vector<int32_t>> stage_geometries;
  int32_t InternHolders(std::vector<int64_t> ranks) {
    std::sort(ranks.begin(), ranks.end());
    auto [it, inserted] = holder_set_ids.emplace(ranks, static_cast<int32_t>(holder_sets.size()));
    if (inserted) holder_sets.push_back(std::move(ranks));
    return it->second;
  }

  // Adds (or reuses) a geometry. `holders` overrides the source holders of a replicated source
  // (a tensor without a source layout lives whole in those ranks' files).
  int32_t AddGeometry(const Shape& global, const Layout& src_layout, const Layout& dst_layout,
                      const std::vector<int64_t>* holders) {
    std::string key = GeometryKey(global, src_layout, dst_layout, holders);
    if (auto it = geometry_ids.find(key); it != geometry_ids.end()) return it->second;
    Geometry g;
    g.global = global;
    g.src = src_layout;
    g.dst = dst_layout;
    g.src_grid = src_layout.Grid(global.size());
    g.dst_grid = dst_layout.Grid(global.size());
    int64_t cells = 1;
    for (int64_t c : g.src_grid) cells *= c;
    if (holders) {
      g.cell_holders.assign(cells, InternHolders(*holders));
    } else {
      std::vector<std::vector<int64_t>> per_cell(cells);
      const int64_t devices = src.devices();
      for (int64_t r = 0; r < devices; ++r) {
        std::vector<int64_t> cell = *src_layout.CellOf(r, global.size());
        int64_t id = 0;
        for (size_t i = 0; i < cell.size(); ++i) id = id * g.src_grid[i] + cell[i];
        for (int32_t s : src_layout.stages) per_cell[id].push_back(s * devices + r);
      }
      g.cell_holders.reserve(cells);
      for (auto& ranks : per_cell) g.cell_holders.push_back(InternHolders(std::move(ranks)));
    }
    geometries.push_back(std::move(g));
    const int32_t id = static_cast<int32_t>(geometries.size() - 1);
    geometry_ids.emplace(std::move(key), id);
    return id;
  }

  const Layout* SrcLayout(std::string_view name) const {
    return src.Find(name, options.inherit_optimizer_layouts);
  }
  const Layout* DstLayout(std::string_view name) const {
    return dst.Find(name, options.inherit_optimizer_layouts);
  }

  bool Selected(std::string_view name) const { return !options.select || options.select(name); }

  // OUT_OF_RANGE for a rank outside the destination world; NOT_FOUND when its stage receives a
  // parameter the checkpoint does not have.
  absl::Status CheckRank(int64_t dst_rank) const {
    if (dst_rank < 0 || dst_rank >= dst.world()) {
      return absl::OutOfRangeError(absl::StrCat(
          "destination rank ", dst_rank, " is outside the destination world of ", dst.world(),
          " ranks (", dst.devices(), " devices x ", dst.stages(),
          dst.stages() == 1 ? " stage)" : " stages)"));
    }
    const int32_t stage = static_cast<int32_t>(dst_rank / dst.devices());
    for (const Missing& m : missing) {
      if (Contains(m.stages, stage)) {
        return absl::NotFoundError(absl::StrCat(
            "destination parameter ", m.name, " (pipeline stage ", stage,
            ") is not in the checkpoint; exclude it to fetch the rest"));
      }
    }
    return absl::OkStatus();
  }

  // Replaces `sets` by the distinct holder sets the rank needs, sorted. Tensors sharing a
  // geometry need the same source cells, so each distinct geometry of the rank's stage is walked
  // once (stage_geometries) instead of once per tensor: the union, hence the result, is the same
  // as walking every tensor.
  absl::Status NeededHolderSets(int64_t dst_rank, std::vector<int32_t>& sets) const {
    CKPT_RETURN_IF_ERROR(CheckRank(dst_rank));
    const int32_t stage = static_cast<int32_t>(dst_rank / dst.devices());
    const int64_t local = dst_rank % dst.devices();
    sets.clear();
    OverlapWalker walker;
    for (int32_t id : stage_geometries[stage]) {
      const Geometry& g = geometries[id];
      CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> dst_cell, g.dst.CellOf(local, g.global.size()));
      walker.ForEach(g, CellBox(g.global, g.dst_grid, dst_cell),
                     [&](const std::vector<int64_t>&, int64_t cell) {
                       sets.push_back(g.cell_holders[cell]);
                     });
    }
    std::sort(sets.begin(), sets.end());
    sets.erase(std::unique(sets.begin(), sets.end()), sets.end());
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<int64_t>> CoverOf(const std::vector<int32_t>& sets) const {
    std::vector<std::vector<int64_t>> pieces;
    pieces.reserve(sets.size());
    for (int32_t s : sets) pieces.push_back(holder_sets[s]);
    return ChooseCover(pieces);
  }

  absl::Status AddCatalogEntries(std::vector<TensorInfo> tensors);
  // AddCatalogEntries' checks of one tensor: its holders are source ranks, its shape is the one
  // the source strategy records, and both layouts accept it.
  absl::Status CheckCatalogTensor(const TensorInfo& t, const Layout* src_layout,
                                  const Layout* dst_layout) const;
  // The entry of one checked catalog tensor held by `holders` (every source rank when it lists
  // none): how it is delivered, to which stages, with which geometry.
  absl::StatusOr<Entry> CatalogEntry(const TensorInfo& t, const Layout* src_layout,
                                     const Layout* dst_layout,
                                     const std::vector<int64_t>& holders);
  absl::Status AddLayoutOnlyEntries();

  // Fills stage_geometries once every entry is added.
  void IndexStages() {
    stage_geometries.assign(dst.stages(), {});
    absl::flat_hash_set<std::pair<int32_t, int32_t>> seen;  // (stage, geometry)
    for (const Entry& e : entries) {
      for (int32_t stage : e.dst_stages) {
        if (seen.insert({stage, e.geometry}).second) stage_geometries[stage].push_back(e.geometry);
      }
    }
  }
};

absl::Status Resharder::Impl::AddCatalogEntries(std::vector<TensorInfo> tensors) {
  absl::flat_hash_set<std::string> seen;
  std::vector<Entry> verbatim;
  for (size_t index = 0; index < tensors.size(); ++index) {
    const TensorInfo& t = tensors[index];
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, " appears twice in the checkpoint"));
    }
    if (!Selected(t.name)) continue;
    const Layout* src_layout = SrcLayout(t.name);
    const Layout* dst_layout = DstLayout(t.name);
    CKPT_RETURN_IF_ERROR(CheckCatalogTensor(t, src_layout, dst_layout));
    std::vector<int64_t> all_src;
    if (t.holders.empty()) {
      all_src.resize(src.world());
      std::iota(all_src.begin(), all_src.end(), 0);
    }
    const std::vector<int64_t>& holders = t.holders.empty() ? all_src : t.holders;
    CKPT_ASSIGN_OR_RETURN(Entry entry, CatalogEntry(t, src_layout, dst_layout, holders));
    entry.catalog_index = static_cast<int64_t>(index);
    if (entry.kind == TensorKind::kVerbatim) {
      verbatim.push_back(std::move(entry));
    } else {
      entries.push_back(std::move(entry));
    }
  }
  for (Entry& e : verbatim) entries.push_back(std::move(e));

  if (dst.strategy) {
    for (const auto& [name, param] : dst.strategy->params()) {
      if (!seen.contains(name) && Selected(name)) {
        missing.push_back({name, param.layout.stages});
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Resharder::Impl::CheckCatalogTensor(const TensorInfo& t, const Layout* src_layout,
                                                 const Layout* dst_layout) const {
  for (int64_t h : t.holders) {
    if (h < 0 || h >= src.world()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": source rank ", h,
                                                     " is outside the source world of ",
                                                     src.world()));
    }
  }
  if (const StrategyParam* p = src.strategy ? src.strategy->Find(t.name) : nullptr;
      p && p->tensor_shape && *p->tensor_shape != t.global_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", t.name, ": the source strategy records shape ",
        ShapeToString(*p->tensor_shape), " but the checkpoint holds ",
        ShapeToString(t.global_shape)));
  }
  if (src_layout) {
    if (auto s = src_layout->Validate(t.global_shape); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("parameter ", t.name, ": source layout: ",
                                                 s.message()));
    }
  }
  if (dst_layout) {
    if (auto s = dst_layout->Validate(t.global_shape); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("parameter ", t.name,
                                                 ": destination layout: ", s.message()));
    }
  }
  // Whole-tensor sources: validate the shape the same way (dims >= 1, sizes fit).
  return NumElements(t.global_shape).status();
}

absl::StatusOr<Entry> Resharder::Impl::CatalogEntry(
    const TensorInfo& t, const Layout* src_layout, const Layout* dst_layout,
    const std::vector<int64_t>& holders) {
  const size_t rank = t.global_shape.size();
  Entry entry;
  entry.name = t.name;
  entry.dtype = t.dtype;
  const Layout src_used = src_layout ? *src_layout : ReplicatedLayout(rank, 1, {0});
  const std::vector<int64_t>* holder_override = src_layout ? nullptr : &holders;
  if (!dst.strategy) {
    // Merged output: one rank receives every tensor whole.
    entry.kind = (src_layout || !src.strategy) ? TensorKind::kResharded : TensorKind::kVerbatim;
    if (!src.strategy && rank == 0) entry.kind = TensorKind::kVerbatim;
    entry.dst_stages = {0};
    entry.geometry =
        AddGeometry(t.global_shape, src_used, ReplicatedLayout(rank, 1, {0}), holder_override);
  } else if (dst_layout) {
    entry.kind = TensorKind::kResharded;
    entry.dst_stages = dst_layout->stages;
    entry.geometry = AddGeometry(t.global_shape, src_used, *dst_layout, holder_override);
  } else {
    entry.dst_stages = dst.AllStages();
    if (src_layout) {
      if (options.strict) {
        return absl::FailedPreconditionError(absl::StrCat(
            "parameter ", t.name, " is laid out in the source strategy but not in the "
            "destination strategy; refusing to deliver it whole (strict mode)"));
      }
      entry.kind = TensorKind::kWhole;
    } else {
      entry.kind = TensorKind::kVerbatim;
    }
    entry.geometry = AddGeometry(t.global_shape, src_used,
                                 ReplicatedLayout(rank, dst.devices(), entry.dst_stages),
                                 holder_override);
  }
  return entry;
}

absl::Status Resharder::Impl::AddLayoutOnlyEntries() {
  if (!dst.strategy) return absl::OkStatus();  // merged: every tensor from wherever it lives
  if (!src.strategy) {
    // A single whole-tensor source: every destination rank reads rank 0 (MindSpore returns [0]).
    for (const auto& [name, param] : dst.strategy->params()) {
      if (!Selected(name)) continue;
      Entry entry;
      entry.name = name;
      entry.dst_stages = param.layout.stages;
      const size_t rank = param.layout.tensor_map.size();
      Shape global = param.layout.Grid(rank);
      std::vector<int64_t> holders = {0};
      entry.geometry =
          AddGeometry(global, ReplicatedLayout(rank, 1, {0}), param.layout, &holders);
      entries.push_back(std::move(entry));
    }
    return absl::OkStatus();
  }
  for (const auto& [name, param] : src.strategy->params()) {
    if (!Selected(name)) continue;
    const Layout* dst_layout = DstLayout(name);
    if (!dst_layout) continue;
    const Layout& src_layout = param.layout;
    const size_t rank = src_layout.tensor_map.size();
    if (dst_layout->tensor_map.size() != rank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter ", name, ": source tensor_map ", src_layout.TensorMapString(), " has ",
          rank, " dims but destination tensor_map ", dst_layout->TensorMapString(), " has ",
          dst_layout->tensor_map.size()));
    }
    // Uniform splits make the overlap structure scale-free: any shape divisible by both grids
    // gives the same source cells per destination cell.
    const std::vector<int64_t> sg = src_layout.Grid(rank), dg = dst_layout->Grid(rank);
    Shape global(rank);
    for (size_t i = 0; i < rank; ++i) global[i] = Lcm(sg[i], dg[i]);
    // Opt-shard sizes of -1 resolve against the replica group; Validate checks the rest.
    if (auto s = src_layout.Validate(global); !s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("parameter ", name, ": source layout: ", s.message()));
    }
    if (auto s = dst_layout->Validate(global); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("parameter ", name,
                                                 ": destination layout: ", s.message()));
    }
    Entry entry;
    entry.name = name;
    entry.dst_stages = dst_layout->stages;
    entry.geometry = AddGeometry(global, src_layout, *dst_layout, nullptr);
    entries.push_back(std::move(entry));
  }
  return absl::OkStatus();
}

Resharder::Resharder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Resharder::~Resharder() = default;
Resharder::Resharder(Resharder&&) noexcept = default;
Resharder& Resharder::operator=(Resharder&&) noexcept = default;

absl::StatusOr<Resharder> Resharder::Create(std::shared_ptr<const Strategy> src,
                                            std::shared_ptr<const Strategy> dst,
                                            std::vector<TensorInfo> tensors,
                                            PlanOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->src.strategy = std::move(src);
  impl->dst.strategy = std::move(dst);
  impl->options = std::move(options);
  CKPT_RETURN_IF_ERROR(impl->AddCatalogEntries(std::move(tensors)));
  impl->IndexStages();
  return Resharder(std::move(impl));
}

absl::StatusOr<Resharder> Resharder::CreateFromLayouts(std::shared_ptr<const Strategy> src,
                                                       std::shared_ptr<const Strategy> dst,
                                                       PlanOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->src.strategy = std::move(src);
  impl->dst.strategy = std::move(dst);
  impl->options = std::move(options);
  CKPT_RETURN_IF_ERROR(impl->AddLayoutOnlyEntries());
  impl->IndexStages();
  return Resharder(std::move(impl));
}

int64_t Resharder::src_world() const { return impl_->src.world(); }
int64_t Resharder::dst_world() const { return impl_->dst.world(); }

absl::StatusOr<RankPlan> Resharder::Plan(int64_t dst_rank) const {
  std::vector<int32_t> sets;
  CKPT_RETURN_IF_ERROR(impl_->NeededHolderSets(dst_rank, sets));  // checks the rank too
  RankPlan plan;
  plan.dst_rank = dst_rank;
  CKPT_ASSIGN_OR_RETURN(plan.source_ranks, impl_->CoverOf(sets));
  absl::flat_hash_set<int64_t> cover(plan.source_ranks.begin(), plan.source_ranks.end());
  const Side& dst = impl_->dst;
  const int32_t stage = static_cast<int32_t>(dst_rank / dst.devices());
  const int64_t local = dst_rank % dst.devices();
  // The destination box and the copy ops depend on the tensor's geometry only (and the cover,
  // the same for the whole plan): they are planned once per geometry and copied into each of
  // its tensors, which for checkpoints of many tensors of a few shapes is most of the work.
  struct Planned {
    bool done = false;
    Box dst_box;
    CopyOps ops;
  };
  std::vector<Planned> planned(impl_->geometries.size());
  OverlapWalker walker;
  for (const Entry& entry : impl_->entries) {
    if (!Contains(entry.dst_stages, stage)) continue;
    const Geometry& g = impl_->geometries[entry.geometry];
    Planned& p = planned[entry.geometry];
    if (!p.done) {
      CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> dst_cell, g.dst.CellOf(local, g.global.size()));
      p.dst_box = CellBox(g.global, g.dst_grid, dst_cell);
      std::vector<CopyOp> ops;
      walker.ForEach(g, p.dst_box, [&](const std::vector<int64_t>& src_cell, int64_t cell_id) {
        CopyOp op;
        op.src_box_id = cell_id;
        for (int64_t r : impl_->holder_sets[g.cell_holders[cell_id]]) {
          if (cover.contains(r)) {
            op.src_rank = r;
            break;
          }
        }
        op.src_box = CellBox(g.global, g.src_grid, src_cell);
        const Box region = *Intersect(op.src_box, p.dst_box);
        const size_t rank = region.rank();
        op.src_offset.resize(rank);
        op.dst_offset.resize(rank);
        for (size_t i = 0; i < rank; ++i) {
          op.src_offset[i] = region.lo[i] - op.src_box.lo[i];
          op.dst_offset[i] = region.lo[i] - p.dst_box.lo[i];
        }
        op.extent = region.shape();
        ops.push_back(std::move(op));
      });
      p.ops = CopyOps(std::move(ops));
      p.done = true;
    }
    TensorPlan& t = plan.tensors.emplace_back();
    t.name = entry.name;
    t.dtype = entry.dtype;
    t.kind = entry.kind;
    t.global_shape = g.global;
    t.dst_box = p.dst_box;
    t.ops = p.ops;
    t.catalog_index = entry.catalog_index;
  }
  for (const TensorPlan& t : plan.tensors) {
    if (t.kind == TensorKind::kWhole) {
      plan.warnings.push_back(absl::StrCat("parameter ", t.name,
                                           " is not in the destination strategy; delivered whole ",
                                           ShapeToString(t.global_shape)));
    }
  }
  return plan;
}

absl::StatusOr<std::vector<int64_t>> Resharder::SourceRanks(int64_t dst_rank) const {
  std::vector<int32_t> sets;
  CKPT_RETURN_IF_ERROR(impl_->NeededHolderSets(dst_rank, sets));
  return impl_->CoverOf(sets);
}

absl::StatusOr<std::vector<std::vector<int64_t>>> Resharder::AllSourceRanks() const {
  // Many destination ranks need the same holder sets (replicas); solve each distinct need once.
  absl::flat_hash_map<std::vector<int32_t>, std::vector<int64_t>> memo;
  std::vector<std::vector<int64_t>> out(dst_world());
  std::vector<int32_t> sets;  // reused: only a new need is copied into the memo
  for (int64_t r = 0; r < dst_world(); ++r) {
    CKPT_RETURN_IF_ERROR(impl_->NeededHolderSets(r, sets));
    auto it = memo.find(sets);
    if (it == memo.end()) {
      CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> cover, impl_->CoverOf(sets));
      it = memo.emplace(sets, std::move(cover)).first;
    }
    out[r] = it->second;
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> ChooseCover(
    const std::vector<std::vector<int64_t>>& input) {
  // Normalise: each piece's holders sorted and distinct (a rank listed twice counts once).
  std::vector<std::vector<int64_t>> pieces = input;
  absl::flat_hash_map<int64_t, std::vector<int32_t>> held;  // rank -> pieces it holds
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (pieces[p].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("piece ", p, " is held by no rank"));
    }
    std::sort(pieces[p].begin(), pieces[p].end());
    pieces[p].erase(std::unique(pieces[p].begin(), pieces[p].end()), pieces[p].end());
    for (int64_t r : pieces[p]) held[r].push_back(static_cast<int32_t>(p));
  }
  // Greedy maximum coverage with a lazy max-heap of (uncovered count, -rank): ties to the lowest
  // rank.
  absl::flat_hash_map<int64_t, int64_t> uncovered_count;
  std::priority_queue<std::pair<int64_t, int64_t>> heap;
  for (const auto& [r, ps] : held) {
    uncovered_count[r] = static_cast<int64_t>(ps.size());
    heap.push({static_cast<int64_t>(ps.size()), -r});
  }
  std::vector<bool> covered(pieces.size(), false);
  size_t remaining = pieces.size();
  std::vector<int64_t> chosen;
  while (remaining > 0) {
    if (heap.empty()) return absl::InternalError("set cover ran out of candidate ranks");
    auto [count, neg_rank] = heap.top();
    heap.pop();
    const int64_t r = -neg_rank;
    const int64_t current = uncovered_count[r];
    if (current != count) {
      if (current > 0) heap.push({current, neg_rank});
      continue;
    }
    chosen.push_back(r);
    for (int32_t p : held[r]) {
      if (covered[p]) continue;
      covered[p] = true;
      --remaining;
      for (int64_t h : pieces[p]) --uncovered_count[h];
    }
  }
  // Drop ranks made redundant by later picks, highest first, so ties keep the lowest ranks.
  std::vector<int32_t> cover_count(pieces.size(), 0);
  for (int64_t r : chosen) {
    for (int32_t p : held[r]) ++cover_count[p];
  }
  std::sort(chosen.begin(), chosen.end(), std::greater<>());
  std::vector<int64_t> kept;
  for (int64_t r : chosen) {
    const auto& ps = held[r];
    const bool redundant =
        std::all_of(ps.begin(), ps.end(), [&](int32_t p) { return cover_count[p] >= 2; });
    if (redundant) {
      for (int32_t p : ps) --cover_count[p];
    } else {
      kept.push_back(r);
    }
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace ckpt
