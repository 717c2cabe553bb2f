#include "tests/bench/bench_common.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace ckpt::bench {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int64_t SizeBytes(double size_gib) { return static_cast<int64_t>(size_gib * kGiB); }

absl::StatusOr<Strategy> StrategyByName(const BenchSpec& spec, const std::string& name) {
  if (name == kSourceName) return SourceStrategy(spec);
  if (name == kThreeName) return ThreeRankStrategy(spec);
  if (name == kColumnName) return ColumnStrategy(spec);
  if (name == kPlainName) return PlainStrategy(spec);
  if (name == kStormName) return StormStrategy(spec);
  return absl::InvalidArgumentError(absl::StrCat("unknown bench strategy ", name));
}

std::string PatternBytes(size_t n, uint32_t seed) {
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<char>((i + seed) * 2654435761u >> 13);
  return bytes;
}

}  // namespace ckpt::bench
