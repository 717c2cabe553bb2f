// Strategies as the store keeps them (records::StrategyRecord, records::CheckpointManifest): in
// MindSpore's JSON form, which every version of ckptd reads, and in its binary form
// (ParallelStrategyMap), which parses several times faster and is preferred where present.
#ifndef CKPT_SERVICE_ENGINE_STORED_STRATEGY_H_
#define CKPT_SERVICE_ENGINE_STORED_STRATEGY_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "core/strategy.h"

namespace ckpt {

// The binary form when the record has one, else the JSON form. DATA_LOSS naming the form that
// does not parse.
absl::StatusOr<Strategy> DecodeStoredStrategy(std::string_view binary, std::string_view json);

// Sets both forms of `strategy` on a record with strategy_json and strategy_binary fields
// (records::StrategyRecord, records::CheckpointManifest).
template <typename Record>
void EncodeStoredStrategy(const Strategy& strategy, Record* record) {
  record->set_strategy_json(SerializeStrategy(strategy, StrategyFormat::kJson));
  record->set_strategy_binary(SerializeStrategy(strategy, StrategyFormat::kBinary));
}

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_STORED_STRATEGY_H_
