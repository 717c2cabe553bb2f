#include "storage/internal/segment_store_support.h"

#include <cstdarg>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/names.h"
#include "spdlog/spdlog.h"

namespace ckpt::segment_store_internal {
namespace {

constexpr char kLoggerName[] = "storage";

class RocksDbLogger final : public rocksdb::Logger {
 public:
  RocksDbLogger() : rocksdb::Logger(rocksdb::InfoLogLevel::DEBUG_LEVEL) {}

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    spdlog::level::level_enum to = spdlog::level::debug;
    if (level >= rocksdb::InfoLogLevel::ERROR_LEVEL &&
        level != rocksdb::InfoLogLevel::HEADER_LEVEL) {
      to = spdlog::level::err;
    } else if (level == rocksdb::InfoLogLevel::WARN_LEVEL) {
      to = spdlog::level::warn;
    }
    const std::shared_ptr<spdlog::logger> log = StoreLog();
    if (!log->should_log(to)) return;
    va_list copy;
    va_copy(copy, ap);
    const int n = std::vsnprintf(nullptr, 0, format, copy);
    va_end(copy);
    if (n < 0) return;
    std::string text(static_cast<size_t>(n) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), format, ap);
    text.resize(static_cast<size_t>(n));
    log->log(to, "event=rocksdb msg=\"{}\"", EscapeForLog(text));
  }
};

}  // namespace

std::shared_ptr<rocksdb::Logger> NewRocksDbLogger() { return std::make_shared<RocksDbLogger>(); }

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
