// ckptctl subcommands that work on local files only (no server). Each writes its normal output
// to `out` and returns an error status for the caller to print as one line.
#ifndef CKPT_CLIENT_CKPTCTL_OFFLINE_COMMANDS_H_
#define CKPT_CLIENT_CKPTCTL_OFFLINE_COMMANDS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "core/strategy.h"

namespace ckpt {

// `ckptctl inspect FILE.ckpt [--json]`: tensors with dtype, shape and size (exact bytes in
// JSON), streaming (large tensors are never held whole).
absl::Status RunInspect(const std::string& path, bool json, std::ostream& out);

// `ckptctl strategy show PATH [--json]`.
absl::Status RunStrategyShow(const std::string& path, bool json, std::ostream& out);

// Prints `strategy` as `strategy show` does: a summary line naming it `label` and one line per
// parameter, or with `json` its MindSpore JSON form. Shared with `strategy get`.
void PrintStrategy(const Strategy& strategy, std::string_view label, bool json, std::ostream& out);

// `ckptctl strategy merge FILES_OR_DIR... --out FILE[.json]`.
absl::Status RunStrategyMerge(const std::vector<std::string>& inputs, const std::string& out_path,
                              bool json, std::ostream& out);

// `ckptctl deps --src-strategy FILE --dst-strategy FILE (--rank R | --all) [--json]`.
absl::Status RunLocalDeps(const std::string& src_path, const std::string& dst_path,
                          std::optional<int64_t> rank, bool json, std::ostream& out);

// Prints dependency lists: {"rank": R, "source_ranks": [..]} / a list of those, or text lines.
void PrintDeps(const std::vector<std::pair<int64_t, std::vector<int64_t>>>& deps, bool as_list,
               bool json, std::ostream& out);

// `ckptctl sample DIR`: writes the demo strategies and checkpoints (see client/ckptctl/sample.h).
absl::Status RunSample(const std::string& dir, bool json, std::ostream& out);

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_OFFLINE_COMMANDS_H_
