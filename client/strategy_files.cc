#include "client/strategy_files.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "storage/file_stream.h"

namespace ckpt {
namespace fs = std::filesystem;

absl::StatusOr<std::vector<StrategyFile>> ReadStrategyFiles(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const std::string& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<std::string> in_dir;
      for (const auto& entry : fs::directory_iterator(p, ec)) {
        if (entry.is_regular_file()) in_dir.push_back(entry.path().string());
      }
      if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", p, ": ", ec.message()));
      if (in_dir.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("directory ", p, " holds no strategy files"));
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else {
      files.push_back(p);
    }
  }
  std::vector<StrategyFile> out;
  for (const std::string& f : files) {
    CKPT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(f, kMaxStrategyFileBytes));
    out.push_back({f, std::move(bytes)});
  }
  return out;
}

absl::StatusOr<Strategy> LoadStrategyPath(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    CKPT_ASSIGN_OR_RETURN(std::vector<StrategyFile> files, ReadStrategyFiles({path}));
    return MergeStageStrategies(files);
  }
  CKPT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path, kMaxStrategyFileBytes));
  auto strategy = ParseStrategy(bytes, StrategyFormatForPath(path));
  if (!strategy.ok()) {
    return absl::Status(strategy.status().code(),
                        absl::StrCat(path, ": ", strategy.status().message()));
  }
  return strategy;
}

absl::Status WriteStrategyFile(const Strategy& strategy, const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(auto sink, AtomicFileSink::Create(path));
  CKPT_RETURN_IF_ERROR(sink->Write(SerializeStrategy(strategy, StrategyFormatForPath(path))));
  return sink->Commit();
}

}  // namespace ckpt
