#include "client/ckptctl/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ckpt {
namespace {

struct Unit {
  const char* name;
  double bytes;
};
constexpr Unit kUnits[] = {{"B", 1.0},
                           {"KiB", 1024.0},
                           {"MiB", 1024.0 * 1024},
                           {"GiB", 1024.0 * 1024 * 1024},
                           {"TiB", 1024.0 * 1024 * 1024 * 1024}};

const Unit& UnitFor(double bytes) {
  size_t i = 0;
  while (i + 1 < std::size(kUnits) && bytes >= kUnits[i + 1].bytes) ++i;
  return kUnits[i];
}

std::string InUnit(double bytes, const Unit& unit) {
  if (unit.bytes == 1.0) return absl::StrCat(static_cast<int64_t>(bytes));
  return absl::StrFormat("%.1f", bytes / unit.bytes);
}

// FormatSeconds up to 99 hours; ">99h" beyond, where a precise figure means nothing.
std::string FormatEta(double seconds) {
  if (std::ceil(seconds) >= 100 * 3600) return ">99h";
  return FormatSeconds(seconds);
}

}  // namespace

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(std::max<int64_t>(bytes, 0));
  const Unit& unit = UnitFor(b);
  return absl::StrCat(InUnit(b, unit), " ", unit.name);
}

std::string FormatSeconds(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(std::max(seconds, 0.0)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

std::string FormatUtcTime(int64_t unix_seconds) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

std::string FormatProgressLine(int64_t done_bytes, int64_t total_bytes, double bytes_per_second,
                               int bar_width) {
  done_bytes = std::max<int64_t>(done_bytes, 0);
  std::string line;
  if (total_bytes > 0) {
    done_bytes = std::min(done_bytes, total_bytes);
    const double fraction = static_cast<double>(done_bytes) / static_cast<double>(total_bytes);
    const int filled =
        std::clamp(static_cast<int>(std::lround(fraction * bar_width)), 0, bar_width);
    // Truncated, unlike the bar, so that 100% means done.
    const int percent = static_cast<int>(fraction * 100.0);
    // Both amounts in the total's unit, so they read as a fraction ("12.3/27.0 MiB").
    const Unit& unit = UnitFor(static_cast<double>(total_bytes));
    absl::StrAppend(&line, "[", std::string(filled, '#'), std::string(bar_width - filled, '.'),
                    "] ", percent, "%  ", InUnit(static_cast<double>(done_bytes), unit), "/",
                    InUnit(static_cast<double>(total_bytes), unit), " ", unit.name);
  } else {
    absl::StrAppend(&line, FormatBytes(done_bytes));
  }
  if (bytes_per_second > 0) {
    absl::StrAppend(&line, "  ", FormatBytes(static_cast<int64_t>(bytes_per_second)), "/s");
  }
  if (total_bytes > 0) {
    const int64_t left = total_bytes - done_bytes;
    if (left == 0) {
      absl::StrAppend(&line, "  ETA 0s");
    } else if (bytes_per_second > 0) {
      absl::StrAppend(&line, "  ETA ", FormatEta(static_cast<double>(left) / bytes_per_second));
    } else {
      absl::StrAppend(&line, "  ETA --");
    }
  }
  return line;
}

absl::StatusOr<ProgressMode> ParseProgressMode(std::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "bar") return ProgressMode::kBar;
  if (text == "plain") return ProgressMode::kPlain;
  if (text == "none") return ProgressMode::kNone;
  return absl::InvalidArgumentError(
      absl::StrCat("--progress must be auto, bar, plain or none, got \"",
                   absl::string_view(text.data(), text.size()), "\""));
}

ProgressMode ResolveProgressMode(ProgressMode mode) {
  if (mode != ProgressMode::kAuto) return mode;
  return ::isatty(STDERR_FILENO) == 1 ? ProgressMode::kBar : ProgressMode::kPlain;
}

ProgressReporter::ProgressReporter(ProgressOptions options)
    : out_(options.out != nullptr ? options.out : &std::cerr),
      enabled_(ResolveProgressMode(options.mode) != ProgressMode::kNone),
      bar_(ResolveProgressMode(options.mode) == ProgressMode::kBar),
      min_interval_(bar_ ? options.min_interval : options.plain_interval),
      start_(absl::Now()) {
  // Plain lines start one interval into the transfer: a short one prints none.
  if (!bar_) last_draw_ = start_;
}

ProgressReporter::~ProgressReporter() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!finished_ && drawn_width_ > 0) {
    *out_ << "\r" << std::string(drawn_width_, ' ') << "\r" << std::flush;
  }
}

void ProgressReporter::Update(int64_t done_bytes, int64_t total_bytes) {
  if (!enabled_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  done_ = done_bytes;
  total_ = total_bytes;
  const absl::Time now = absl::Now();
  if (now - last_draw_ >= min_interval_) DrawLocked(now);
}

void ProgressReporter::Done() {
  if (!enabled_ || !bar_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  DrawLocked(absl::Now());
  *out_ << "\n" << std::flush;
  finished_ = true;
}

void ProgressReporter::Clear() {
  if (!enabled_ || !bar_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return;
  if (drawn_width_ > 0) *out_ << "\r" << std::string(drawn_width_, ' ') << "\r" << std::flush;
  drawn_width_ = 0;
  finished_ = true;
}

ProgressFn ProgressReporter::Callback() {
  return [this](int64_t done, int64_t total) { Update(done, total); };
}

void ProgressReporter::DrawLocked(absl::Time now) {
  const double seconds = absl::ToDoubleSeconds(now - start_);
  // The rate is meaningless in the first instants of a transfer (it would show GiB/s).
  const double rate = seconds >= 0.2 ? static_cast<double>(done_) / seconds : 0.0;
  std::string line = FormatProgressLine(done_, total_, rate);
  if (!bar_) {
    *out_ << "progress: " << line << "\n" << std::flush;
    last_draw_ = now;
    return;
  }
  const size_t width = line.size();
  // Pad over the remains of a longer previous line ("ETA 1m05s" -> "ETA 9s").
  if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
  *out_ << "\r" << line << std::flush;
  drawn_width_ = std::max(width, drawn_width_);
  last_draw_ = now;
}

}  // namespace ckpt
