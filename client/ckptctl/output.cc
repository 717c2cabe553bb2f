#include "client/ckptctl/output.h"

#include <algorithm>
#include <cstdint>
#include <set>

namespace ckpt {
namespace {

template <typename Repeated>
nlohmann::json Array(const Repeated& values) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& v : values) out.push_back(v);
  return out;
}

nlohmann::json TargetJson(const v1::TransformTarget& target) {
  nlohmann::json out;
  switch (target.output_case()) {
    case v1::TransformTarget::kNewCheckpointId:
      out["kind"] = "checkpoint";
      out["new_checkpoint_id"] = target.new_checkpoint_id();
      break;
    case v1::TransformTarget::kExportDir:
      out["kind"] = "export";
      out["export_dir"] = target.export_dir();
      out["ranks"] = Array(target.ranks());
      out["prefix"] = target.prefix();
      break;
    case v1::TransformTarget::kMergedFile:
      out["kind"] = "merged_file";
      out["merged_file"] = target.merged_file();
      break;
    case v1::TransformTarget::OUTPUT_NOT_SET:
      out["kind"] = nullptr;
      break;
  }
  return out;
}

}  // namespace

void PrintJsonLine(const nlohmann::json& value, std::ostream& out) { out << value.dump() << "\n"; }

nlohmann::json StrategyInfoJson(const v1::StrategyInfo& info) {
  return {{"name", info.name()},
          {"parameter_count", info.parameter_count()},
          {"devices_per_stage", info.devices_per_stage()},
          {"stage_count", info.stage_count()},
          {"world_size", info.world_size()}};
}

nlohmann::json CheckpointInfoJson(const v1::CheckpointInfo& info) {
  return {{"id", info.id()},
          {"source_strategy", info.source_strategy()},
          {"ranks", info.ranks()},
          {"tensor_count", info.tensor_count()},
          {"logical_bytes", info.logical_bytes()},
          {"stored_bytes", info.stored_bytes()},
          {"created_unix", info.created_unix()}};
}

nlohmann::json DescribeJson(const v1::DescribeCheckpointResponse& response) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const v1::TensorDescription& t : response.tensors()) {
    tensors.push_back({{"name", t.name()},
                       {"dtype", t.dtype()},
                       {"global_shape", Array(t.global_shape())},
                       {"kind", t.kind() == v1::TENSOR_KIND_VERBATIM ? "verbatim" : "sharded"},
                       {"layout", t.layout()},
                       {"stored_slices", t.stored_slices()},
                       {"stored_bytes", t.stored_bytes()}});
  }
  return {{"checkpoint", CheckpointInfoJson(response.info())}, {"tensors", std::move(tensors)}};
}

nlohmann::json FetchPlanJson(const v1::FetchPlanSummary& summary) {
  return {{"tensor_count", summary.tensor_count()},
          {"total_bytes", summary.total_bytes()},
          {"source_ranks", Array(summary.source_ranks())},
          {"warnings", Array(summary.warnings())}};
}

nlohmann::json JobJson(const v1::Job& job) {
  const v1::JobProgress& p = job.progress();
  nlohmann::json percent = nullptr;
  if (job.state() == v1::JOB_STATE_SUCCEEDED) {
    percent = 100;
  } else {
    int64_t done = p.bytes_done();
    int64_t total = p.bytes_total();
    if (total <= 0) {
      done = p.tensors_done();
      total = p.tensors_total();
    }
    if (total > 0) percent = std::clamp<int64_t>(done, 0, total) * 100 / total;
  }
  return {{"id", job.id()},
          {"state", JobStateName(job.state())},
          {"checkpoint_id", job.request().checkpoint_id()},
          {"destination_strategy", job.request().destination_strategy()},
          {"target", TargetJson(job.request().target())},
          {"progress",
           {{"tensors_done", p.tensors_done()},
            {"tensors_total", p.tensors_total()},
            {"bytes_done", p.bytes_done()},
            {"bytes_total", p.bytes_total()},
            {"ranks_done", p.ranks_done()},
            {"ranks_total", p.ranks_total()},
            {"bytes_per_second", p.bytes_per_second()},
            {"eta_seconds", p.eta_seconds()}}},
          {"percent", percent},
          {"reason", job.reason()},
          {"attempts", job.attempts()},
          {"owner", job.owner()},
          {"submitted_unix", job.submitted_unix()},
          {"started_unix", job.started_unix()},
          {"finished_unix", job.finished_unix()}};
}

nlohmann::json UploadSummaryJson(const UploadSummary& summary) {
  nlohmann::json ranks = nlohmann::json::array();
  std::set<std::string> warnings;
  for (const RankUploadResult& r : summary.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"file", r.file},
                     {"file_bytes", r.file_bytes},
                     {"stored_bytes", r.response.bytes_stored()}});
    warnings.insert(r.response.warnings().begin(), r.response.warnings().end());
  }
  return {{"checkpoint_id", summary.checkpoint_id},
          {"committed", summary.committed},
          {"ranks_received", summary.ranks_received},
          {"ranks_total", summary.ranks_total},
          {"file_bytes", summary.file_bytes},
          {"stored_bytes", summary.bytes_stored},
          {"ranks", std::move(ranks)},
          {"warnings", warnings}};
}

nlohmann::json ExportSummaryJson(const std::string& checkpoint_id,
                                 const std::string& destination_strategy,
                                 const ExportSummary& summary) {
  nlohmann::json ranks = nlohmann::json::array();
  std::set<std::string> warnings;
  for (const RankExportResult& r : summary.ranks) {
    ranks.push_back({{"rank", r.rank},
                     {"file", r.file},
                     {"tensor_count", r.summary.tensor_count()},
                     {"total_bytes", r.summary.total_bytes()},
                     {"source_ranks", Array(r.summary.source_ranks())}});
    warnings.insert(r.summary.warnings().begin(), r.summary.warnings().end());
  }
  return {{"checkpoint_id", checkpoint_id},
          {"destination_strategy", destination_strategy},
          {"dir", summary.dir},
          {"tensor_count", summary.tensors},
          {"total_bytes", summary.bytes},
          {"ranks", std::move(ranks)},
          {"warnings", warnings}};
}

}  // namespace ckpt
