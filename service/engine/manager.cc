#include "service/engine/manager.h"

#include <fnmatch.h>

#include <algorithm>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ckpt_records.pb.h"
#include "core/names.h"
#include "core/status_macros.h"
#include "service/engine/stored_strategy.h"
#include "service/engine/upload_memory.h"

namespace ckpt {
namespace {

bool MatchesAny(const google::protobuf::RepeatedPtrField<std::string>& globs,
                std::string_view name) {
  const std::string n(name);
  for (const std::string& g : globs) {
    if (fnmatch(g.c_str(), n.c_str(), 0) == 0) return true;
  }
  return false;
}

}  // namespace

absl::Status ValidateName(const std::string& what, const std::string& name) {
  const bool ok_chars = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
  if (name.empty() || name.size() > 200 || !ok_chars || name[0] == '.' || name[0] == '-') {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", EscapeForLog(name),
                     "\" is invalid: use 1-200 characters of [A-Za-z0-9._-], not starting "
                     "with '.' or '-'"));
  }
  return absl::OkStatus();
}

CheckpointManager::CheckpointManager(CheckpointStore* store, ManagerOptions options)
    : store_(store),
      options_(std::move(options)),
      shared_chunks_(store, options_.shared_chunk_cache_bytes, options_.replica_straggler_bound,
                     options_.lone_ring_min_chunk_bytes) {}

v1::StrategyInfo CheckpointManager::InfoOf(const std::string& name, const Strategy& s) {
  v1::StrategyInfo info;
  info.set_name(name);
  info.set_parameter_count(static_cast<int64_t>(s.params().size()));
  info.set_devices_per_stage(s.devices_per_stage());
  info.set_stage_count(s.stage_count());
  info.set_world_size(s.world_size());
  return info;
}

absl::StatusOr<v1::StrategyInfo> CheckpointManager::PutStrategy(const std::string& name,
                                                                const std::string& content,
                                                                v1::StrategyFormat format,
                                                                bool overwrite) {
  CKPT_RETURN_IF_ERROR(ValidateName("strategy name", name));
  auto parsed =
      ParseStrategy(content, format == v1::STRATEGY_FORMAT_JSON ? StrategyFormat::kJson
                                                                : StrategyFormat::kBinary);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("strategy ", name, ": ", parsed.status().message()));
  }
  records::StrategyRecord record;
  record.set_name(name);
  EncodeStoredStrategy(*parsed, &record);
  record.set_created_unix(absl::ToUnixSeconds(absl::Now()));
  CKPT_RETURN_IF_ERROR(store_->PutStrategy(name, record.SerializeAsString(), overwrite));
  auto shared = std::make_shared<const Strategy>(*std::move(parsed));
  {
    std::lock_guard<std::mutex> lock(mu_);
    strategies_[name] = shared;
    ++cache_generation_;  // a load of the replaced one that is under way must not cache it
  }
  InvalidatePlans();
  return InfoOf(name, *shared);
}

absl::StatusOr<std::shared_ptr<const Strategy>> CheckpointManager::GetStrategy(
    const std::string& name) {
  return LoadOnce<Strategy>(
      strategies_, strategy_loads_, name, [&]() -> absl::StatusOr<std::shared_ptr<const Strategy>> {
        CKPT_ASSIGN_OR_RETURN(std::string bytes, store_->GetStrategy(name));
        records::StrategyRecord record;
        if (!record.ParseFromString(bytes)) {
          return absl::DataLossError(absl::StrCat("stored strategy ", name, " does not parse"));
        }
        absl::StatusOr<Strategy> s =
            DecodeStoredStrategy(record.strategy_binary(), record.strategy_json());
        if (!s.ok()) {
          return absl::DataLossError(
              absl::StrCat("stored strategy ", name, ": ", s.status().message()));
        }
        return std::make_shared<const Strategy>(*std::move(s));
      });
}

template <typename T>
absl::StatusOr<std::shared_ptr<const T>> CheckpointManager::LoadOnce(
    std::map<std::string, std::shared_ptr<const T>>& cache, LoadFlights<T>& flights,
    const std::string& name, absl::FunctionRef<absl::StatusOr<std::shared_ptr<const T>>()> load) {
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache.find(name); it != cache.end()) return it->second;
    generation = cache_generation_;
  }
  // Requests arriving together load it once; one arriving after it was deleted or replaced does
  // not join a load that began before.
  return flights.Do({name, generation}, [&]() -> absl::StatusOr<std::shared_ptr<const T>> {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = cache.find(name); it != cache.end()) return it->second;
    }
    absl::StatusOr<std::shared_ptr<const T>> loaded = load();
    if (!loaded.ok()) return loaded.status();
    std::lock_guard<std::mutex> lock(mu_);
    // Not cached when it was deleted or replaced meanwhile: a later request must not find it.
    if (generation == cache_generation_) cache[name] = *loaded;
    return loaded;
  });
}

absl::StatusOr<std::vector<v1::StrategyInfo>> CheckpointManager::ListStrategies() {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> names, store_->ListStrategies());
  std::vector<v1::StrategyInfo> out;
  for (const std::string& name : names) {
    auto s = GetStrategy(name);
    if (s.status().code() == absl::StatusCode::kNotFound) continue;  // deleted meanwhile
    CKPT_RETURN_IF_ERROR(s.status());
    out.push_back(InfoOf(name, **s));
  }
  return out;
}

absl::Status CheckpointManager::DeleteStrategy(const std::string& name) {
  CKPT_RETURN_IF_ERROR(store_->DeleteStrategy(name));
  {
    std::lock_guard<std::mutex> lock(mu_);
    strategies_.erase(name);
    ++cache_generation_;
  }
  InvalidatePlans();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RankUpload>> CheckpointManager::BeginUpload(
    const v1::UploadHeader& header) {
  CKPT_RETURN_IF_ERROR(ValidateName("checkpoint id", header.checkpoint_id()));
  const std::string& id = header.checkpoint_id();
  // Lookups that do I/O happen before taking the lock.
  auto existing = store_->GetManifest(id);
  if (existing.ok()) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", id, " already exists"));
  }
  if (existing.status().code() != absl::StatusCode::kNotFound) return existing.status();
  std::shared_ptr<const Strategy> strategy;
  if (!header.source_strategy().empty()) {
    CKPT_ASSIGN_OR_RETURN(strategy, GetStrategy(header.source_strategy()));
  }

  // A retry that arrives while the server still drops the rank's previous stream waits for it
  // here, outside mu_ (RankUpload::Start refuses a rank another stream holds).
  std::shared_ptr<PendingCheckpoint> current;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = pending_.find(id); it != pending_.end()) current = it->second;
  }
  if (current) current->AwaitRankRelease(header.rank());

  std::shared_ptr<PendingCheckpoint> abandoned;
  absl::StatusOr<std::unique_ptr<RankUpload>> upload;
  {
    // Finding (or creating) the pending checkpoint and registering this rank on it happen under
    // one lock, so that a concurrent rank never sees a pending checkpoint without its creator.
    std::lock_guard<std::mutex> lock(mu_);
    std::shared_ptr<PendingCheckpoint> pending;
    if (auto it = pending_.find(id); it != pending_.end() && !it->second->committed()) {
      if (it->second->Abandoned()) {
        // Every earlier stream failed before any rank completed: start afresh (possibly with
        // another strategy) instead of holding the id until the idle timeout.
        abandoned = it->second;
        pending_.erase(it);
      } else {
        pending = it->second;
      }
    }
    if (!pending) {
      CKPT_ASSIGN_OR_RETURN(uint64_t data_id, store_->BeginData());
      pending = std::make_shared<PendingCheckpoint>(id, header.source_strategy(), strategy, data_id,
                                                    store_, options_.upload);
      pending_[id] = pending;
    }
    // Every rank stream of one checkpoint must name the same strategy.
    if (header.source_strategy() != pending->strategy_name()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", header.rank(), " names source strategy \"", header.source_strategy(),
          "\" but checkpoint ", id, " is being uploaded with source strategy \"",
          pending->strategy_name(), "\""));
    }
    upload = RankUpload::Start(pending, header.rank(), header.source_file());
  }
  if (abandoned) (void)store_->DiscardData(abandoned->data_id());
  return upload;
}

void CheckpointManager::OnUploadFinished(const std::string& checkpoint_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pending_.find(checkpoint_id);
  if (it != pending_.end() && it->second->committed()) pending_.erase(it);
}

bool CheckpointManager::ReleaseFreedUploadMemory() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!pending_.empty()) return false;
  }
  return ReleaseMarkedFreeHeapMemory();
}

int CheckpointManager::ExpireIdleUploads() {
  std::vector<std::shared_ptr<PendingCheckpoint>> expired;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const absl::Time cutoff = absl::Now() - options_.upload_idle_timeout;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second->committed()) {
        it = pending_.erase(it);
      } else if (it->second->IdleSince(cutoff)) {
        expired.push_back(it->second);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const auto& p : expired) (void)store_->DiscardData(p->data_id());
  return static_cast<int>(expired.size());
}

absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> CheckpointManager::LoadCheckpoint(
    const std::string& id) {
  // The workers of a job starting together decode the manifest once.
  return LoadOnce<LoadedCheckpoint>(
      checkpoints_, checkpoint_loads_, id,
      [&]() -> absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> {
        CKPT_ASSIGN_OR_RETURN(std::string bytes, store_->GetManifest(id));
        auto loaded = LoadedCheckpoint::Decode(bytes);
        if (!loaded.ok()) {
          return absl::Status(loaded.status().code(),
                              absl::StrCat("checkpoint ", id, ": ", loaded.status().message()));
        }
        return *std::move(loaded);
      });
}

v1::CheckpointInfo CheckpointManager::InfoOf(const LoadedCheckpoint& c) const {
  const records::CheckpointManifest& m = c.manifest;
  v1::CheckpointInfo info;
  info.set_id(m.id());
  info.set_source_strategy(m.strategy_name());
  info.set_ranks(m.world_size());
  info.set_tensor_count(m.tensors_size());
  int64_t logical = 0, stored = 0;
  for (int i = 0; i < m.tensors_size(); ++i) {
    const TensorInfo& t = c.catalog[i];
    logical += t.dtype == DType::kStr ? m.tensors(i).blobs(0).total_bytes()
                                      : *ByteSizeOf(t.dtype, *NumElements(t.global_shape));
    for (const auto& b : m.tensors(i).blobs()) stored += b.total_bytes();
  }
  info.set_logical_bytes(logical);
  info.set_stored_bytes(stored);
  info.set_created_unix(m.created_unix());
  return info;
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> CheckpointManager::ListCheckpoints() {
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> ids, store_->ListCheckpoints());
  std::vector<v1::CheckpointInfo> out;
  for (const std::string& id : ids) {
    auto c = LoadCheckpoint(id);
    if (c.status().code() == absl::StatusCode::kNotFound) continue;
    CKPT_RETURN_IF_ERROR(c.status());
    out.push_back(InfoOf(**c));
  }
  return out;
}

absl::StatusOr<StoredSummary> CheckpointManager::Summarize() {
  std::lock_guard<std::mutex> summary_lock(summary_mu_);
  CKPT_ASSIGN_OR_RETURN(std::vector<std::string> ids, store_->ListCheckpoints());
  std::map<std::string, int64_t> bytes;
  StoredSummary out;
  for (const std::string& id : ids) {
    auto known = stored_bytes_.find(id);
    if (known == stored_bytes_.end()) {
      auto c = LoadCheckpoint(id);
      if (c.status().code() == absl::StatusCode::kNotFound) continue;  // deleted meanwhile
      CKPT_RETURN_IF_ERROR(c.status());
      known = stored_bytes_.emplace(id, InfoOf(**c).stored_bytes()).first;
    }
    bytes.insert(*known);
    ++out.checkpoints;
    out.stored_bytes += known->second;
  }
  stored_bytes_ = std::move(bytes);  // forgets checkpoints deleted since
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, pending] : pending_) {
    if (!pending->committed()) ++out.pending_uploads;
  }
  return out;
}

absl::StatusOr<v1::DescribeCheckpointResponse> CheckpointManager::DescribeCheckpoint(
    const std::string& id) {
  CKPT_ASSIGN_OR_RETURN(auto c, LoadCheckpoint(id));
  v1::DescribeCheckpointResponse out;
  *out.mutable_info() = InfoOf(*c);
  for (int i = 0; i < c->manifest.tensors_size(); ++i) {
    const records::TensorRecord& t = c->manifest.tensors(i);
    v1::TensorDescription* d = out.add_tensors();
    d->set_name(t.name());
    d->set_dtype(t.dtype());
    *d->mutable_global_shape() = t.global_shape();
    d->set_kind(t.sharded() ? v1::TENSOR_KIND_SHARDED : v1::TENSOR_KIND_VERBATIM);
    if (t.sharded() && c->strategy) {
      if (const Layout* l = ResolveLayout(*c->strategy, t.name(), true))
        d->set_layout(l->ToString());
    }
    d->set_stored_slices(t.blobs_size());
    int64_t stored = 0;
    for (const auto& b : t.blobs()) stored += b.total_bytes();
    d->set_stored_bytes(stored);
  }
  return out;
}

absl::Status CheckpointManager::DeleteCheckpoint(const std::string& id) {
  // Summarize() never sees the id half deleted, nor keeps its size for a later checkpoint of the
  // same id.
  std::lock_guard<std::mutex> summary_lock(summary_mu_);
  stored_bytes_.erase(id);
  absl::Status deleted = store_->DeleteCheckpoint(id);
  if (deleted.code() == absl::StatusCode::kNotFound) {
    // Not committed: an upload in progress (or one whose client gave up) is discarded, so that
    // it can be started again at once. Streams still writing to it fail.
    std::shared_ptr<PendingCheckpoint> pending;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = pending_.find(id); it != pending_.end() && !it->second->committed()) {
        pending = it->second;
        pending_.erase(it);
      }
    }
    if (pending) return store_->DiscardData(pending->data_id());
  }
  CKPT_RETURN_IF_ERROR(deleted);
  std::optional<uint64_t> data_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = checkpoints_.find(id); it != checkpoints_.end()) {
      data_id = it->second->manifest.data_id();
      checkpoints_.erase(it);
    }
    ++cache_generation_;  // a load under way must not cache it again
  }
  // Chunks of a checkpoint that was read were read after it was loaded: without it loaded, none
  // are cached. Dropping them lets the store give their space (and mappings) back now.
  if (data_id) shared_chunks_.ForgetData(*data_id);
  InvalidatePlans();
  return absl::OkStatus();
}

void CheckpointManager::InvalidatePlans() {
  std::lock_guard<std::mutex> lock(mu_);
  plans_.clear();
  rank_plans_.clear();
  rank_plan_bytes_ = 0;
  ++cache_generation_;
}

namespace {

// What a planned rank holds, roughly: its tensors' plans with their names, shapes and boxes, and
// their copy ops (once per geometry: tensors of one geometry share them).
int64_t EstimatedBytes(const RankPlan& plan) {
  int64_t bytes = sizeof(RankPlan);
  absl::flat_hash_set<const CopyOp*> ops;
  for (const TensorPlan& t : plan.tensors) {
    const auto dims = static_cast<int64_t>(t.global_shape.size());
    bytes += static_cast<int64_t>(sizeof(TensorPlan) + t.name.capacity()) + 3 * dims * 8;
    if (!t.ops.empty() && ops.insert(t.ops.begin()).second) {
      bytes += static_cast<int64_t>(t.ops.size()) *
               (static_cast<int64_t>(sizeof(CopyOp)) + 5 * dims * 8);
    }
  }
  for (const std::string& w : plan.warnings) bytes += static_cast<int64_t>(w.capacity());
  return bytes + static_cast<int64_t>(plan.source_ranks.size()) * 8;
}

bool SamePlanner(const std::weak_ptr<const Resharder>& a,
                 const std::shared_ptr<const Resharder>& b) {
  return !a.owner_before(b) && !b.owner_before(a);
}

}  // namespace

absl::StatusOr<CheckpointManager::PlannedRank> CheckpointManager::PlanRank(
    const std::shared_ptr<const Resharder>& planner, int64_t rank) {
  if (std::optional<PlannedRank> kept = KeptRankPlan(planner, rank)) return *kept;
  // The replicas of a rank starting together plan it once (SingleFlight). The planner is held
  // by every caller, so its address names it for as long as the planning runs.
  return rank_plan_builds_.Do({planner.get(), rank}, [&]() -> absl::StatusOr<PlannedRank> {
    if (std::optional<PlannedRank> kept = KeptRankPlan(planner, rank)) return *kept;
    return NewRankPlan(planner, rank);
  });
}

std::optional<CheckpointManager::PlannedRank> CheckpointManager::KeptRankPlan(
    const std::shared_ptr<const Resharder>& planner, int64_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = rank_plans_.begin(); it != rank_plans_.end(); ++it) {
    if (it->rank == rank && SamePlanner(it->planner, planner)) {
      PlannedRank found = *it;
      std::rotate(it, it + 1, rank_plans_.end());  // most recent at the back
      return found;
    }
  }
  return std::nullopt;
}

absl::StatusOr<CheckpointManager::PlannedRank> CheckpointManager::NewRankPlan(
    const std::shared_ptr<const Resharder>& planner, int64_t rank) {
  CKPT_ASSIGN_OR_RETURN(RankPlan plan, planner->Plan(rank));
  PlannedRank planned;
  planned.planner = planner;
  planned.rank = rank;
  // Streams of this checkpoint whose plans deliver the same boxes of the same tensors (the
  // data-parallel replicas of a rank) read the same chunks: they form one cohort, for which the
  // shared layer keeps a chunk until each has taken it.
  planned.fingerprint = absl::HashOf(plan.tensors.size());
  for (const TensorPlan& t : plan.tensors) {
    planned.fingerprint = absl::HashOf(planned.fingerprint, t.name, t.dst_box.lo, t.dst_box.hi);
  }
  planned.bytes = EstimatedBytes(plan);
  planned.plan = std::make_shared<const RankPlan>(std::move(plan));
  if (planned.bytes > options_.rank_plan_cache_bytes) return planned;
  std::lock_guard<std::mutex> lock(mu_);
  // Another stream may have planned the same rank meanwhile: keep one.
  for (const PlannedRank& kept : rank_plans_) {
    if (kept.rank == rank && SamePlanner(kept.planner, planner)) return planned;
  }
  // Ranks of planners the plan cache has dropped are not asked for again.
  std::erase_if(rank_plans_, [this](const PlannedRank& kept) {
    if (!kept.planner.expired()) return false;
    rank_plan_bytes_ -= kept.bytes;
    return true;
  });
  rank_plans_.push_back(planned);
  rank_plan_bytes_ += planned.bytes;
  size_t drop = 0;
  while (rank_plan_bytes_ > options_.rank_plan_cache_bytes && drop < rank_plans_.size()) {
    rank_plan_bytes_ -= rank_plans_[drop++].bytes;
  }
  rank_plans_.erase(rank_plans_.begin(), rank_plans_.begin() + static_cast<ptrdiff_t>(drop));
  return planned;
}

std::pair<size_t, int64_t> CheckpointManager::rank_plans_kept() {
  std::lock_guard<std::mutex> lock(mu_);
  return {rank_plans_.size(), rank_plan_bytes_};
}

absl::StatusOr<std::shared_ptr<const Resharder>> CheckpointManager::Planner(
    const v1::FetchRequest& request, std::shared_ptr<const LoadedCheckpoint> ckpt) {
  // The patterns become part of a cached plan's key (plan_cache_entries of them are kept) and are
  // matched against every tensor name: bounded in number and length.
  constexpr int kMaxPatterns = 256;
  constexpr size_t kMaxPatternBytes = 1024;
  if (request.include_size() + request.exclude_size() > kMaxPatterns) {
    return absl::InvalidArgumentError(
        absl::StrCat("fetch has ", request.include_size() + request.exclude_size(),
                     " include and exclude patterns; at most ", kMaxPatterns, " are accepted"));
  }
  for (const auto* patterns : {&request.include(), &request.exclude()}) {
    for (const std::string& p : *patterns) {
      CKPT_RETURN_IF_ERROR(ValidatePrintableName("include/exclude pattern", p, kMaxPatternBytes));
    }
  }
  std::shared_ptr<const Strategy> dst;
  if (!request.merged()) {
    if (request.destination_strategy().empty()) {
      return absl::InvalidArgumentError("fetch needs a destination strategy or merged");
    }
    CKPT_ASSIGN_OR_RETURN(dst, GetStrategy(request.destination_strategy()));
  }
  const std::string key =
      absl::StrCat(request.checkpoint_id(), "\x1f",
                   request.merged() ? "\x01merged" : request.destination_strategy(), "\x1f",
                   absl::StrJoin(request.include(), "\x1e"), "\x1f",
                   absl::StrJoin(request.exclude(), "\x1e"), "\x1f", request.strict());
  uint64_t generation = 0;
  if (std::shared_ptr<const Resharder> kept = KeptPlanner(key, &generation)) return kept;
  // The workers of a job starting together plan its destination once (SingleFlight). Only
  // requests with the same loaded checkpoint and destination (held by each of them while the
  // planning runs, so their addresses name them) share it.
  const std::string flight =
      absl::StrCat(key, "\x1f", absl::Hex(ckpt.get()), "\x1f", absl::Hex(dst.get()));
  return planner_builds_.Do(flight, [&]() -> absl::StatusOr<std::shared_ptr<const Resharder>> {
    if (std::shared_ptr<const Resharder> kept = KeptPlanner(key, nullptr)) return kept;
    return NewPlanner(request, *ckpt, dst, key, generation);
  });
}

std::shared_ptr<const Resharder> CheckpointManager::KeptPlanner(const std::string& key,
                                                                uint64_t* generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation) *generation = cache_generation_;
  for (auto it = plans_.begin(); it != plans_.end(); ++it) {
    if (it->first == key) {
      auto planner = it->second;
      std::rotate(it, it + 1, plans_.end());  // most recent at the back
      return planner;
    }
  }
  return nullptr;
}

absl::StatusOr<std::shared_ptr<const Resharder>> CheckpointManager::NewPlanner(
    const v1::FetchRequest& request, const LoadedCheckpoint& ckpt,
    const std::shared_ptr<const Strategy>& dst, const std::string& key, uint64_t generation) {
  PlanOptions options;
  options.strict = request.strict();
  const auto include = request.include();
  const auto exclude = request.exclude();
  if (!include.empty() || !exclude.empty()) {
    options.select = [include, exclude](std::string_view name) {
      return (include.empty() || MatchesAny(include, name)) && !MatchesAny(exclude, name);
    };
  }
  auto planner = Resharder::Create(ckpt.strategy, dst, ckpt.catalog, options);
  if (!planner.ok()) {
    return absl::Status(
        planner.status().code(),
        absl::StrCat("checkpoint ", request.checkpoint_id(), ": ", planner.status().message()));
  }
  auto shared = std::make_shared<const Resharder>(*std::move(planner));
  std::lock_guard<std::mutex> lock(mu_);
  // Not kept when a strategy or checkpoint changed meanwhile (InvalidatePlans).
  if (generation != cache_generation_) return shared;
  plans_.emplace_back(key, shared);
  if (plans_.size() > options_.plan_cache_entries) plans_.erase(plans_.begin());
  return shared;
}

absl::StatusOr<std::unique_ptr<FetchStream>> CheckpointManager::OpenFetch(
    const v1::FetchRequest& request) {
  CKPT_ASSIGN_OR_RETURN(auto ckpt, LoadCheckpoint(request.checkpoint_id()));
  CKPT_ASSIGN_OR_RETURN(auto planner, Planner(request, ckpt));
  CKPT_ASSIGN_OR_RETURN(PlannedRank planned,
                        PlanRank(planner, request.merged() ? 0 : request.rank()));
  // The streams of one job (this checkpoint for one destination and the same filters) pace
  // together, so that the chunks they share are read once (SharedChunks).
  size_t job = absl::HashOf(request.merged(), request.destination_strategy(), request.strict());
  for (const std::string& f : request.include()) job = absl::HashOf(job, 1, f);
  for (const std::string& f : request.exclude()) job = absl::HashOf(job, 2, f);
  const int64_t ranks = request.merged() ? 1 : std::min<int64_t>(planner->dst_world(), 1 << 20);
  std::unique_ptr<CohortMember> member = shared_chunks_.JoinCohort(
      absl::StrCat(ckpt->manifest.data_id(), "/", planned.fingerprint),
      absl::StrCat(ckpt->manifest.data_id(), "/", job), static_cast<int>(ranks));
  FetchOptions options = options_.fetch;
  options.batches = request.accept_batches();
  return std::make_unique<FetchStream>(std::move(ckpt), std::move(planned.plan), &shared_chunks_,
                                       options, std::move(member));
}

absl::StatusOr<v1::RankDependenciesResponse> CheckpointManager::RankDependencies(
    const v1::RankDependenciesRequest& request) {
  if (request.destination_strategy().empty()) {
    return absl::InvalidArgumentError("dependencies need a destination strategy");
  }
  CKPT_ASSIGN_OR_RETURN(auto dst, GetStrategy(request.destination_strategy()));
  std::shared_ptr<const Resharder> planner;
  if (request.source_case() == v1::RankDependenciesRequest::kCheckpointId) {
    CKPT_ASSIGN_OR_RETURN(auto ckpt, LoadCheckpoint(request.checkpoint_id()));
    v1::FetchRequest as_fetch;
    as_fetch.set_checkpoint_id(request.checkpoint_id());
    as_fetch.set_destination_strategy(request.destination_strategy());
    CKPT_ASSIGN_OR_RETURN(planner, Planner(as_fetch, ckpt));
  } else if (request.source_case() == v1::RankDependenciesRequest::kSourceStrategy) {
    CKPT_ASSIGN_OR_RETURN(auto src, GetStrategy(request.source_strategy()));
    CKPT_ASSIGN_OR_RETURN(Resharder r, Resharder::CreateFromLayouts(src, dst));
    planner = std::make_shared<const Resharder>(std::move(r));
  } else {
    return absl::InvalidArgumentError("dependencies need a checkpoint id or a source strategy");
  }
  v1::RankDependenciesResponse out;
  if (request.ranks_case() == v1::RankDependenciesRequest::kAll) {
    CKPT_ASSIGN_OR_RETURN(auto all, planner->AllSourceRanks());
    for (size_t r = 0; r < all.size(); ++r) {
      v1::RankSources* rs = out.add_ranks();
      rs->set_rank(static_cast<int64_t>(r));
      for (int64_t s : all[r]) rs->add_source_ranks(s);
    }
  } else if (request.ranks_case() == v1::RankDependenciesRequest::kRank) {
    CKPT_ASSIGN_OR_RETURN(auto ranks, planner->SourceRanks(request.rank()));
    v1::RankSources* rs = out.add_ranks();
    rs->set_rank(request.rank());
    for (int64_t s : ranks) rs->add_source_ranks(s);
  } else {
    return absl::InvalidArgumentError("dependencies need a rank or all");
  }
  return out;
}

}  // namespace ckpt
