// ckptctl's JSON output: one style for every command's --json. Each result is one compact JSON
// value on one line (a stream of them, one per line, for `jobs watch` and `transform --wait`);
// keys are snake_case and mirror proto/ckpt.proto's field names; sizes are exact byte counts
// as JSON integers (never strings, never rounded); times are Unix seconds (`*_unix`); enum values
// are their short upper-case names ("SUCCEEDED", "sharded"). docs/ckptctl.md shows each shape.
#ifndef CKPT_CLIENT_CKPTCTL_OUTPUT_H_
#define CKPT_CLIENT_CKPTCTL_OUTPUT_H_

#include <ostream>
#include <string>
#include <vector>

#include "ckpt.pb.h"
#include "client/client.h"
#include "nlohmann/json.hpp"

namespace ckpt {

// Writes `value` as one line (compact JSON, then '\n').
void PrintJsonLine(const nlohmann::json& value, std::ostream& out);

nlohmann::json StrategyInfoJson(const v1::StrategyInfo& info);
nlohmann::json CheckpointInfoJson(const v1::CheckpointInfo& info);
// {"checkpoint": CheckpointInfoJson, "tensors": [{"name", "dtype", "global_shape", "kind",
// "layout", "stored_slices", "stored_bytes"}]}.
nlohmann::json DescribeJson(const v1::DescribeCheckpointResponse& response);
// {"tensor_count", "total_bytes", "source_ranks", "warnings"}.
nlohmann::json FetchPlanJson(const v1::FetchPlanSummary& summary);
// Every field of the job: id, state, checkpoint_id, destination_strategy, target {kind,
// new_checkpoint_id | export_dir (+ ranks, prefix) | merged_file}, progress {...}, reason,
// attempts, owner (the submitting principal), submitted_unix, started_unix, finished_unix (0 when
// not yet), percent (null before the job knows its size).
nlohmann::json JobJson(const v1::Job& job);
nlohmann::json UploadSummaryJson(const UploadSummary& summary);
nlohmann::json ExportSummaryJson(const std::string& checkpoint_id,
                                 const std::string& destination_strategy,
                                 const ExportSummary& summary);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_OUTPUT_H_
