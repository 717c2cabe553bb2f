// Progress display for long transfers (ckptctl upload / fetch / export) on stderr: a bar redrawn
// in place on a terminal, or plain lines every few seconds for logs (CI), or nothing (--progress
// auto|bar|plain|none). Also the byte, duration and time formats of ckptctl's human output.
#ifndef CKPT_CLIENT_CKPTCTL_PROGRESS_H_
#define CKPT_CLIENT_CKPTCTL_PROGRESS_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace ckpt {

// "[#####.....] 45%  12.3/27.0 MiB  8.1 MiB/s  ETA 2s". `total_bytes` <= 0 means unknown: no bar
// or ETA. `bytes_per_second` <= 0 means no rate yet (ETA "--"). Pure, for tests.
std::string FormatProgressLine(int64_t done_bytes, int64_t total_bytes, double bytes_per_second,
                               int bar_width = 10);

// The one size format of ckptctl's human output: "512 B", "12.3 KiB", "1.0 MiB", "3.5 GiB",
// "2.0 TiB": the largest binary unit not above `bytes`, one decimal (whole bytes below 1 KiB).
// JSON output carries exact byte counts instead.
std::string FormatBytes(int64_t bytes);

// "2s", "1m05s", "3h07m": `seconds` rounded up (negative counts as 0), precise enough to plan
// around, short enough for one line.
std::string FormatSeconds(double seconds);

// "2024-05-01T12:00:00Z": a Unix time in UTC.
std::string FormatUtcTime(int64_t unix_seconds);

// --progress: kAuto is kBar when stderr is a terminal, else kPlain.
enum class ProgressMode { kAuto, kBar, kPlain, kNone };
// "auto", "bar", "plain", "none"; INVALID_ARGUMENT otherwise.
absl::StatusOr<ProgressMode> ParseProgressMode(std::string_view text);
// `mode` with kAuto decided by whether stderr (fd 2) is a terminal.
ProgressMode ResolveProgressMode(ProgressMode mode);

struct ProgressOptions {
  // Where the progress goes. Default std::cerr.
  std::ostream* out = nullptr;
  // kBar: one line redrawn in place; kPlain: a line every plain_interval (none for transfers
  // shorter than that); kNone: nothing. Default kAuto (see ResolveProgressMode).
  ProgressMode mode = ProgressMode::kAuto;
  // kBar: minimum time between redraws; the final state is always drawn. Default 100 ms.
  absl::Duration min_interval = absl::Milliseconds(100);
  // kPlain: time between lines. Default 5 s.
  absl::Duration plain_interval = absl::Seconds(5);
};

// Draws the progress of one transfer. Thread-safe: several upload threads may call Update
// concurrently. The line is finished by Done() (final state + newline) or erased by Clear() (so an
// error message starts on a clean line); the destructor clears an unfinished line.
class ProgressReporter {
 public:
  explicit ProgressReporter(ProgressOptions options = {});
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  bool enabled() const { return enabled_; }

  // Records the transfer state; redraws when the last draw is older than min_interval.
  void Update(int64_t done_bytes, int64_t total_bytes);
  // Draws the final state and ends the line.
  void Done();
  // Erases the line (after a failure).
  void Clear();

  // A ProgressFn forwarding to Update; valid while this reporter lives.
  ProgressFn Callback();

 private:
  void DrawLocked(absl::Time now);  // mu_ held

  std::ostream* const out_;
  const bool enabled_;
  const bool bar_;  // else plain lines
  const absl::Duration min_interval_;
  const absl::Time start_;

  std::mutex mu_;
  int64_t done_ = 0;
  int64_t total_ = 0;
  absl::Time last_draw_ = absl::InfinitePast();
  size_t drawn_width_ = 0;  // characters of the line on screen; 0 when none
  bool finished_ = false;
};

}  // namespace ckpt

#endif  // CKPT_CLIENT_CKPTCTL_PROGRESS_H_
