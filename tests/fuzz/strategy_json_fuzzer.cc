// Fuzz target: the json strategy parser (core/strategy.h, ParseStrategy with StrategyFormat::kJson)
// on arbitrary bytes. A strategy it accepts must serialize to both formats and parse back;
// a crash, an assertion or undefined behaviour is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "core/strategy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto strategy = ckpt::ParseStrategy(bytes, ckpt::StrategyFormat::kJson);
  if (!strategy.ok()) return 0;
  for (ckpt::StrategyFormat format : {ckpt::StrategyFormat::kBinary, ckpt::StrategyFormat::kJson}) {
    auto again = ckpt::ParseStrategy(ckpt::SerializeStrategy(*strategy, format), format);
    // What was accepted once must survive its own export.
    if (!again.ok()) abort();
  }
  return 0;
}
