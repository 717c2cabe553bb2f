#include "service/engine/stored_strategy.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ckpt {

absl::StatusOr<Strategy> DecodeStoredStrategy(std::string_view binary, std::string_view json) {
  absl::StatusOr<Strategy> s = binary.empty() ? ParseStrategy(json, StrategyFormat::kJson)
                                              : ParseStrategy(binary, StrategyFormat::kBinary);
  if (!s.ok()) {
    return absl::DataLossError(absl::StrCat("its ", binary.empty() ? "JSON" : "binary",
                                            " strategy does not parse: ", s.status().message()));
  }
  return s;
}

}  // namespace ckpt
