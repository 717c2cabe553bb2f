// The service's logic without gRPC: strategies, uploads, checkpoints, fetch planning and
// dependencies over a CheckpointStore. The RPC layer (service/rpc) is a thin adapter over it.
#ifndef CKPT_SERVICE_ENGINE_MANAGER_H_
#define CKPT_SERVICE_ENGINE_MANAGER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ckpt.pb.h"
#include "core/reshard.h"
#include "core/strategy.h"
#include "service/engine/fetch_stream.h"
#include "service/engine/loaded_checkpoint.h"
#include "service/engine/shared_chunks.h"
#include "service/engine/single_flight.h"
#include "service/engine/upload_session.h"
#include "storage/checkpoint_store.h"

namespace ckpt {

struct ManagerOptions {
  UploadOptions upload;
  FetchOptions fetch;
  // Uploads with no active stream and no progress for this long are discarded.
  absl::Duration upload_idle_timeout = absl::Minutes(30);
  // Planned fetches (checkpoint × destination strategy × filters) kept for reuse.
  size_t plan_cache_entries = 64;
  // Planned ranks of those kept for reuse (the data-parallel replicas of a rank, and every
  // later fetch of it, start without planning it again), least recent dropped first beyond
  // this estimate of their memory: part of ckptd's memory bound. 0 keeps none.
  int64_t rank_plan_cache_bytes = int64_t{64} << 20;
  // Recently read chunks kept for other fetch streams that need them (SharedChunks): part of
  // ckptd's memory bound. 0 keeps none (streams reading a chunk at the same time still share
  // it).
  int64_t shared_chunk_cache_bytes = int64_t{64} << 20;
  // A fetch stream that makes no progress for this long while the other members of its cohort
  // wait for it is left behind (SharedChunks): they go on, and it reads for itself.
  absl::Duration replica_straggler_bound = absl::Seconds(3);
  // Chunks smaller than this that a stream alone in ckptd reads are not kept for streams that
  // open after it (SharedChunks' lone ring): they cost about as much to keep as to read again.
  int64_t lone_ring_min_chunk_bytes = SharedChunks::kLoneRingMinBytes;
};

// What the store holds, for statistics.
struct StoredSummary {
  // Committed checkpoints and the bytes they store (CheckpointInfo::stored_bytes summed).
  int64_t checkpoints = 0;
  int64_t stored_bytes = 0;
  // Checkpoints being uploaded (not yet committed).
  int64_t pending_uploads = 0;
};

// Thread-safe. Does not own the store.
class CheckpointManager {
 public:
  CheckpointManager(CheckpointStore* store, ManagerOptions options);

  // --- strategies ---
  absl::StatusOr<v1::StrategyInfo> PutStrategy(const std::string& name, const std::string& content,
                                               v1::StrategyFormat format, bool overwrite);
  absl::StatusOr<std::shared_ptr<const Strategy>> GetStrategy(const std::string& name);
  absl::StatusOr<std::vector<v1::StrategyInfo>> ListStrategies();
  absl::Status DeleteStrategy(const std::string& name);
  static v1::StrategyInfo InfoOf(const std::string& name, const Strategy& strategy);

  // --- uploads ---
  // Opens the stream of one source rank (creating the pending checkpoint on first use).
  absl::StatusOr<std::unique_ptr<RankUpload>> BeginUpload(const v1::UploadHeader& header);
  // Discards pending uploads idle for longer than the timeout. Returns how many.
  int ExpireIdleUploads();
  // Hands the heap memory that finished uploads of many slices freed back to the kernel
  // (ReleaseMarkedFreeHeapMemory), once no upload is in progress; ckptd's maintenance calls it
  // after ExpireIdleUploads. True when memory was released.
  bool ReleaseFreedUploadMemory();
  // Forget a pending checkpoint once committed.
  void OnUploadFinished(const std::string& checkpoint_id);

  // --- checkpoints ---
  absl::StatusOr<std::vector<v1::CheckpointInfo>> ListCheckpoints();
  absl::StatusOr<v1::DescribeCheckpointResponse> DescribeCheckpoint(const std::string& id);
  // Deletes a committed checkpoint, or discards an upload in progress under that id.
  absl::Status DeleteCheckpoint(const std::string& id);

  // --- serving ---
  absl::StatusOr<std::unique_ptr<FetchStream>> OpenFetch(const v1::FetchRequest& request);
  absl::StatusOr<v1::RankDependenciesResponse> RankDependencies(
      const v1::RankDependenciesRequest& request);

  // The store's checkpoints and bytes, and the pending uploads, now. Cheap enough for every
  // metrics scrape: it lists the checkpoint ids (an index scan) and reads a manifest only for a
  // checkpoint it has not sized before (committed checkpoints never change; sizes are forgotten
  // when a checkpoint is deleted).
  absl::StatusOr<StoredSummary> Summarize();

  CheckpointStore* store() const { return store_; }
  // The read-once layer every fetch stream reads stored chunks through.
  SharedChunks* shared_chunks() { return &shared_chunks_; }
  // Planned ranks kept now (ManagerOptions::rank_plan_cache_bytes), and their estimated bytes.
  std::pair<size_t, int64_t> rank_plans_kept();

 private:
  absl::StatusOr<std::shared_ptr<const LoadedCheckpoint>> LoadCheckpoint(const std::string& id);
  absl::StatusOr<std::shared_ptr<const Resharder>> Planner(
      const v1::FetchRequest& request, std::shared_ptr<const LoadedCheckpoint> ckpt);
  // Planner's steps: the kept planner of `key` (null when none; `generation`, when not null, gets
  // the cache generation), and a new one, kept unless the cache generation moved past
  // `generation` while it was made.
  std::shared_ptr<const Resharder> KeptPlanner(const std::string& key, uint64_t* generation);
  absl::StatusOr<std::shared_ptr<const Resharder>> NewPlanner(
      const v1::FetchRequest& request, const LoadedCheckpoint& ckpt,
      const std::shared_ptr<const Strategy>& dst, const std::string& key, uint64_t generation);
  v1::CheckpointInfo InfoOf(const LoadedCheckpoint& ckpt) const;
  void InvalidatePlans();

  CheckpointStore* const store_;
  const ManagerOptions options_;
  SharedChunks shared_chunks_;

  std::mutex mu_;
  std::map<std::string, std::shared_ptr<PendingCheckpoint>> pending_;
  std::map<std::string, std::shared_ptr<const Strategy>> strategies_;           // decoded cache
  std::map<std::string, std::shared_ptr<const LoadedCheckpoint>> checkpoints_;  // decoded cache
  // Plan cache: key -> planner; a plain list (small) with most recent at the back.
  std::vector<std::pair<std::string, std::shared_ptr<const Resharder>>> plans_;
  // Planned ranks of the cached planners, most recent at the back, within
  // options_.rank_plan_cache_bytes (rank_plan_bytes_ in all). A planner is matched by owner, so
  // a planner that was dropped and one allocated at its address are never confused.
  struct PlannedRank {
    std::weak_ptr<const Resharder> planner;
    int64_t rank = 0;
    std::shared_ptr<const RankPlan> plan;
    size_t fingerprint = 0;  // of the tensors and boxes it delivers (cohorts)
    int64_t bytes = 0;       // estimate
  };
  std::vector<PlannedRank> rank_plans_;  // guarded by mu_
  int64_t rank_plan_bytes_ = 0;          // guarded by mu_
  // `rank` of `planner`: from rank_plans_, or planned now and kept there.
  absl::StatusOr<PlannedRank> PlanRank(const std::shared_ptr<const Resharder>& planner,
                                       int64_t rank);
  std::optional<PlannedRank> KeptRankPlan(const std::shared_ptr<const Resharder>& planner,
                                          int64_t rank);
  absl::StatusOr<PlannedRank> NewRankPlan(const std::shared_ptr<const Resharder>& planner,
                                          int64_t rank);

  // Loads and plans that concurrent requests share (single_flight.h): the streams of a job
  // starting together decode a manifest or a strategy, and plan a destination or a rank, once,
  // rather than once each at the same moment. Loads are keyed by name and cache generation (a
  // request after a deletion or a replacement does not join a load begun before it), plans by
  // what they are made from.
  template <typename T>
  using LoadFlights = SingleFlight<std::pair<std::string, uint64_t>, std::shared_ptr<const T>>;
  LoadFlights<LoadedCheckpoint> checkpoint_loads_;
  LoadFlights<Strategy> strategy_loads_;
  SingleFlight<std::string, std::shared_ptr<const Resharder>> planner_builds_;
  SingleFlight<std::pair<const void*, int64_t>, PlannedRank> rank_plan_builds_;
  // Moved on (under mu_) whenever a cached checkpoint, strategy or plan is dropped or replaced.
  // A load or plan that began before then is returned to its callers but not cached, so that a
  // checkpoint deleted, or a strategy replaced, while it was being loaded is not served later.
  uint64_t cache_generation_ = 0;
  // `name` from `cache`, or loaded by `load` (once for the requests that arrive together, through
  // `flights`) and kept there unless the cache generation moved on meanwhile.
  template <typename T>
  absl::StatusOr<std::shared_ptr<const T>> LoadOnce(
      std::map<std::string, std::shared_ptr<const T>>& cache, LoadFlights<T>& flights,
      const std::string& name, absl::FunctionRef<absl::StatusOr<std::shared_ptr<const T>>()> load);

  // Summarize()'s stored bytes by checkpoint id; summary_mu_ is taken before mu_.
  std::mutex summary_mu_;
  std::map<std::string, int64_t> stored_bytes_;
};

// Validates an id or name: 1-200 characters of [A-Za-z0-9._-], not starting with '.' or '-'.
absl::Status ValidateName(const std::string& what, const std::string& name);

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_MANAGER_H_
