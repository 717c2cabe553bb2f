#include "storage/internal/segment_store_support.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "spdlog/spdlog.h"

namespace ckpt::segment_store_internal {
namespace {

constexpr char kLoggerName[] = "storage";

}  // namespace

absl::Status FromRocks(const rocksdb::Status& status, std::string_view doing) {
  if (status.ok()) return absl::OkStatus();
  const std::string text = status.ToString();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (status.IsNoSpace() ||
      (status.IsIOError() && text.find("No space left on device") != std::string::npos)) {
    code = absl::StatusCode::kResourceExhausted;
  } else if (status.IsCorruption()) {
    code = absl::StatusCode::kDataLoss;
  } else if (status.IsNotFound()) {
    code = absl::StatusCode::kNotFound;
  }
  return absl::Status(code, absl::StrCat(Sv(doing), ": ", text));
}

std::shared_ptr<spdlog::logger> StoreLog() {
  if (auto logger = spdlog::get(kLoggerName)) return logger;
  // The service may register its own "storage" logger (sinks, format) before opening the store;
  // otherwise inherit the default logger's sinks.
  auto logger = spdlog::default_logger()->clone(kLoggerName);
  try {
    spdlog::register_logger(logger);
  } catch (const spdlog::spdlog_ex&) {
    // Registered concurrently by another thread: use that one.
    if (auto existing = spdlog::get(kLoggerName)) return existing;
  }
  return logger;
}

}  // namespace ckpt::segment_store_internal
