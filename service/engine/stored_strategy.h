// Strategies as the store keeps them (records::StrategyRecord, records::CheckpointManifest): in
// MindSpore's binary form (ParallelStrategyMap, with each parameter's global shape in ckptd's
// extension field), which parses several times faster than the JSON form and is a fifth of its
// size. Records of stores first written in format 1 may hold the JSON form alone; they load too.
#ifndef CKPT_SERVICE_ENGINE_STORED_STRATEGY_H_
#define CKPT_SERVICE_ENGINE_STORED_STRATEGY_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "core/strategy.h"

namespace ckpt {

// The binary form when the record has one, else the JSON form. DATA_LOSS naming the form that
// does not parse.
absl::StatusOr<Strategy> DecodeStoredStrategy(std::string_view binary, std::string_view json);

// Sets the stored form of `strategy` on a record with strategy_json and strategy_binary fields
// (records::StrategyRecord, records::CheckpointManifest): the binary form; strategy_json is left
// empty. Every ckptd that opens a store of format 2 reads the binary form.
template <typename Record>
void EncodeStoredStrategy(const Strategy& strategy, Record* record) {
  record->clear_strategy_json();
  record->set_strategy_binary(SerializeStrategy(strategy, StrategyFormat::kBinary));
}

}  // namespace ckpt

#endif  // CKPT_SERVICE_ENGINE_STORED_STRATEGY_H_
