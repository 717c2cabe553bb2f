// Progress display for long transfers (ckptctl upload / fetch / export): one line on stderr,
// redrawn in place, only when stderr is a terminal so that scripts and logs get no control
// characters. Also the byte, duration and time formats of ckptctl's output.
#ifndef CKPT_CLIENT_CKPTCTL_PROGRESS_H_
#define CKPT_CLIENT_CKPTCTL_PROGRESS_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>

#include "absl/time/time.h"
#include "client/client.h"

namespace ckpt {

// "[#####.....] 45%  12.3/27.0 MiB  8.1 MiB/s  ETA 2s". `total_bytes` <= 0 means unknown: no bar
// or ETA. `bytes_per_second` <= 0 means no rate yet (ETA "--"). Pure, for tests.
std::string FormatProgressLine(int64_t done_bytes, int64_t total_bytes, double bytes_per_second,
                               int bar_width = 10);

// "12.3 MiB" style, in the largest binary unit not above `bytes` (B, KiB, MiB, GiB, TiB).
std::string FormatBytes(int64_t bytes);

// "2s", "1m05s", "3h07m": `seconds` rounded up (negative counts as 0), precise enough to plan
// around, short enough for one line.
std::string FormatSeconds(double seconds);

// "2024-05-01T12:00:00Z": a Unix time in UTC.
std::string FormatUtcTime(int64_t unix_seconds);

struct ProgressOptions {
  // Where the line goes. Default std::cerr.
  std::ostream* out = nullptr;
  // Draw at all. Default (nullopt): when stderr (fd 2) is a terminal.
  std::optional<bool> enabled;
  // Minimum time between redraws; the final state is always drawn. Default 100 ms.
  absl::Duration min_interval = absl::Milliseconds(100);
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
