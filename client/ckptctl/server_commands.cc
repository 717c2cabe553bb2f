#include "client/ckptctl/server_commands.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "client/ckptctl/offline_commands.h"
#include "core/absl_compat.h"
#include "core/box.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

std::string Created(int64_t unix_seconds) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::FromUnixSeconds(unix_seconds),
                          absl::UTCTimeZone());
}

template <typename Ints>
std::string Bracketed(const Ints& values) {
  return absl::StrCat("[", absl::StrJoin(values, ", "), "]");
}

// Prints each distinct warning once: every rank of an upload tends to report the same verbatim
// parameters, and repeating them N times hides anything else.
void PrintWarnings(const std::vector<std::string>& warnings, std::ostream& err) {
  std::set<std::string> seen;
  for (const std::string& w : warnings) {
    if (seen.insert(w).second) err << "warning: " << w << "\n";
  }
}

// Runs `body` with a progress line that is finished on success and erased on failure, so that
// the caller's one-line error message starts on a clean line.
template <typename Body>
auto WithProgress(const ProgressOptions& options, Body body) -> decltype(body(ProgressFn())) {
  ProgressReporter reporter(options);
  auto result = body(reporter.enabled() ? reporter.Callback() : ProgressFn());
  if (result.ok()) {
    reporter.Done();
  } else {
    reporter.Clear();
  }
  return result;
}

// ---------------------------------------------------------------- jobs

// A job's reason on one line: the caller's error output is one line per failure.
std::string OneLine(std::string_view text) {
  std::string out(text);
  std::replace(out.begin(), out.end(), '\n', ' ');
  std::replace(out.begin(), out.end(), '\r', ' ');
  return out;
}

std::string DescribeTarget(const v1::SubmitTransformRequest& request) {
  const v1::TransformTarget& target = request.target();
  switch (target.output_case()) {
    case v1::TransformTarget::kNewCheckpointId:
      return absl::StrCat("checkpoint ", target.new_checkpoint_id(), " (destination strategy ",
                          request.destination_strategy(), ")");
    case v1::TransformTarget::kExportDir: {
      std::string details = absl::StrCat("destination strategy ", request.destination_strategy());
      if (target.ranks_size() > 0) {
        std::vector<int64_t> ranks(target.ranks().begin(), target.ranks().end());
        std::sort(ranks.begin(), ranks.end());
        absl::StrAppend(&details, ", ranks ", FormatRankList(ranks));
      }
      if (!target.prefix().empty() && target.prefix() != kDefaultRankFilePrefix) {
        absl::StrAppend(&details, ", prefix ", target.prefix());
      }
      return absl::StrCat("export ", target.export_dir(), " (", details, ")");
    }
    case v1::TransformTarget::kMergedFile:
      return absl::StrCat("merged file ", target.merged_file());
    case v1::TransformTarget::OUTPUT_NOT_SET:
      break;
  }
  return "(no target)";
}

// Whole percent done (bytes, else tensors), or nullopt before the job knows its size.
std::optional<int> JobPercent(const v1::Job& job) {
  if (job.state() == v1::JOB_STATE_SUCCEEDED) return 100;
  const v1::JobProgress& p = job.progress();
  int64_t done = p.bytes_done();
  int64_t total = p.bytes_total();
  if (total <= 0) {
    done = p.tensors_done();
    total = p.tensors_total();
  }
  if (total <= 0) return std::nullopt;
  // Truncated, so that 100% means done.
  return static_cast<int>(std::clamp<int64_t>(done, 0, total) * 100 / total);
}

std::string PercentText(const v1::Job& job) {
  const std::optional<int> percent = JobPercent(job);
  return percent ? absl::StrCat(*percent, "%") : "-";
}

// "2s", "1m05s", "3h07m".
std::string FormatSeconds(double seconds) {
  const int64_t s = static_cast<int64_t>(std::ceil(std::max(seconds, 0.0)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
}

// "12/40 tensors, 1/3 ranks, 12.3 KiB/48.0 KiB".
std::string ProgressCounts(const v1::JobProgress& p) {
  return absl::StrCat(p.tensors_done(), "/", p.tensors_total(), " tensors, ", p.ranks_done(), "/",
                      p.ranks_total(), " ranks, ", FormatBytes(p.bytes_done()), "/",
                      FormatBytes(p.bytes_total()));
}

// Shows a watched job's progress: a bar redrawn in place on a terminal, or plain lines (at most
// one per interval, plus every state change) on the command's output. Not thread-safe (WatchJob
// calls back on the caller's thread).
class JobDisplay {
 public:
  JobDisplay(const JobWaitOptions& options, std::ostream& out)
      : live_(options.live.value_or(::isatty(STDERR_FILENO) == 1)),
        terminal_(options.terminal != nullptr ? options.terminal : &std::cerr),
        out_(&out),
        interval_(options.line_interval) {}
  ~JobDisplay() { Clear(); }
  JobDisplay(const JobDisplay&) = delete;
  JobDisplay& operator=(const JobDisplay&) = delete;

  void Update(const v1::Job& job) {
    // The final state is reported by the caller, not as progress.
    if (IsTerminalJobState(job.state())) return;
    const absl::Time now = absl::Now();
    if (live_) {
      if (now - last_draw_ < absl::Milliseconds(100) && job.state() == last_state_) return;
      Draw(LiveLine(job));
    } else {
      const bool changed = job.state() != last_state_;
      const bool moved = job.progress().SerializeAsString() != last_progress_;
      if (!changed && !(moved && now - last_draw_ >= interval_)) return;
      *out_ << PlainLine(job) << "\n" << std::flush;
      last_progress_ = job.progress().SerializeAsString();
    }
    last_state_ = job.state();
    last_draw_ = now;
  }

  // After success: the bar stays, showing the final state.
  void Done(const v1::Job& job) {
    if (!live_ || drawn_width_ == 0) return;
    Draw(LiveLine(job));
    *terminal_ << "\n" << std::flush;
    drawn_width_ = 0;
  }

  // Erases the bar (after a failure, so that the error starts on a clean line).
  void Clear() {
    if (!live_ || drawn_width_ == 0) return;
    *terminal_ << "\r" << std::string(drawn_width_, ' ') << "\r" << std::flush;
    drawn_width_ = 0;
  }

 private:
  static std::string LiveLine(const v1::Job& job) {
    const v1::JobProgress& p = job.progress();
    if (job.state() != v1::JOB_STATE_RUNNING && job.state() != v1::JOB_STATE_SUCCEEDED) {
      return absl::StrCat("job ", job.id(), " ", JobStateName(job.state()));
    }
    const int64_t done =
        job.state() == v1::JOB_STATE_SUCCEEDED ? p.bytes_total() : p.bytes_done();
    return absl::StrCat(FormatProgressLine(done, p.bytes_total(), p.bytes_per_second()), "  ",
                        p.tensors_done(), "/", p.tensors_total(), " tensors  ", p.ranks_done(),
                        "/", p.ranks_total(), " ranks");
  }

  static std::string PlainLine(const v1::Job& job) {
    const v1::JobProgress& p = job.progress();
    std::string line = absl::StrCat("job ", job.id(), " ", JobStateName(job.state()));
    if (job.state() != v1::JOB_STATE_RUNNING) return line;
    absl::StrAppend(&line, " ", PercentText(job), ": ", ProgressCounts(p));
    if (p.bytes_per_second() > 0) {
      absl::StrAppend(&line, ", ", FormatBytes(static_cast<int64_t>(p.bytes_per_second())),
                      "/s");
    }
    if (p.eta_seconds() > 0) absl::StrAppend(&line, ", ETA ", FormatSeconds(p.eta_seconds()));
    if (job.attempts() > 1) absl::StrAppend(&line, " (attempt ", job.attempts(), ")");
    return line;
  }

  void Draw(std::string line) {
    const size_t width = line.size();
    // Pad over the remains of a longer previous line.
    if (width < drawn_width_) line.append(drawn_width_ - width, ' ');
    *terminal_ << "\r" << line << std::flush;
    drawn_width_ = std::max(width, drawn_width_);
  }

  const bool live_;
  std::ostream* const terminal_;
  std::ostream* const out_;
  const absl::Duration interval_;
  absl::Time last_draw_ = absl::InfinitePast();
  v1::JobState last_state_ = v1::JOB_STATE_UNSPECIFIED;
  std::string last_progress_;
  size_t drawn_width_ = 0;
};

// Prints a finished job's outcome; ABORTED / CANCELLED with its reason when it did not succeed.
absl::Status ReportOutcome(const v1::Job& job, std::ostream& out) {
  const std::string reason = OneLine(job.reason());
  switch (job.state()) {
    case v1::JOB_STATE_SUCCEEDED: {
      const v1::JobProgress& p = job.progress();
      out << "job " << job.id() << " SUCCEEDED: " << job.request().checkpoint_id() << " -> "
          << DescribeTarget(job.request()) << ": " << p.ranks_total() << " ranks, "
          << p.tensors_total() << " tensors, " << FormatBytes(p.bytes_total());
      if (job.started_unix() > 0 && job.finished_unix() >= job.started_unix()) {
        out << " in " << FormatSeconds(static_cast<double>(job.finished_unix() - job.started_unix()));
      }
      if (job.attempts() > 1) out << " (" << job.attempts() << " attempts)";
      out << "\n";
      return absl::OkStatus();
    }
    case v1::JOB_STATE_FAILED:
      return absl::AbortedError(absl::StrCat("job ", job.id(), " failed: ",
                                              reason.empty() ? "(no reason given)" : reason));
    case v1::JOB_STATE_CANCELLED:
      return absl::CancelledError(absl::StrCat("job ", job.id(), " was cancelled",
                                               reason.empty() ? "" : ": ", reason));
    default:
      break;
  }
  return absl::InternalError(absl::StrCat("job ", job.id(), " has not finished (",
                                          JobStateName(job.state()), ")"));
}

// Watches `job_id` until it ends, showing progress; then ReportOutcome.
absl::Status WaitForJob(CkptClient& client, const std::string& job_id,
                        const JobWaitOptions& options, std::ostream& out) {
  JobDisplay display(options, out);
  absl::StatusOr<v1::Job> job =
      client.WatchJob(job_id, [&display](const v1::Job& j) { display.Update(j); });
  if (!job.ok()) {
    display.Clear();
    if (job.status().code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(absl::StrCat(
          job.status().message(), " (the job may still be running: ckptctl jobs watch ", job_id,
          ")"));
    }
    return job.status();
  }
  if (job->state() == v1::JOB_STATE_SUCCEEDED) {
    display.Done(*job);
  } else {
    display.Clear();
  }
  return ReportOutcome(*job, out);
}

absl::StatusOr<std::vector<int64_t>> ParseRanksOption(const std::optional<std::string>& ranks) {
  if (!ranks.has_value()) return std::vector<int64_t>();
  absl::StatusOr<std::vector<int64_t>> parsed = ParseRankList(*ranks);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--ranks: ", parsed.status().message()));
  }
  return parsed;
}

}  // namespace

// ---------------------------------------------------------------- strategies

absl::Status RunStrategyPut(CkptClient& client, const std::string& name, const std::string& path,
                            bool overwrite, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::StrategyInfo info, client.PutStrategyFile(name, path, overwrite));
  out << "registered strategy " << info.name() << " from " << path << ": "
      << info.parameter_count() << " parameters, " << info.devices_per_stage()
      << " devices per stage, " << info.stage_count() << " stage(s), " << info.world_size()
      << " ranks\n";
  return absl::OkStatus();
}

absl::Status RunStrategyGet(CkptClient& client, const std::string& name, bool json,
                            std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(RemoteStrategy remote, client.GetStrategy(name));
  PrintStrategy(remote.strategy, remote.info.name(), json, out);
  return absl::OkStatus();
}

absl::Status RunStrategyList(CkptClient& client, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::StrategyInfo> strategies, client.ListStrategies());
  for (const v1::StrategyInfo& s : strategies) {
    out << s.name() << "  parameters=" << s.parameter_count()
        << "  devices_per_stage=" << s.devices_per_stage() << "  stages=" << s.stage_count()
        << "  world_size=" << s.world_size() << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunStrategyRemove(CkptClient& client, const std::string& name, std::ostream& out) {
  CKPT_RETURN_IF_ERROR(client.DeleteStrategy(name));
  out << "deleted strategy " << name << "\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------- upload

absl::Status RunUpload(CkptClient& client, const UploadCommand& command, std::ostream& out,
                       std::ostream& err) {
  const bool by_dir = !command.dir.empty();
  const bool by_file = !command.file.empty();
  if (by_dir == by_file) {
    return absl::InvalidArgumentError(
        "upload needs either --strategy NAME --dir DIR or --file FULL.ckpt");
  }
  if (by_dir && command.source_strategy.empty()) {
    return absl::InvalidArgumentError("upload --dir needs --strategy NAME");
  }
  if (by_file && !command.source_strategy.empty()) {
    return absl::InvalidArgumentError(
        "upload --file takes no --strategy (a whole-tensor checkpoint has none)");
  }
  if (command.parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--parallel must be at least 1, got ", command.parallel));
  }

  UploadSummary summary;
  if (by_dir) {
    CKPT_ASSIGN_OR_RETURN(summary, WithProgress(command.progress, [&](ProgressFn progress) {
                            return client.UploadDirectory(command.checkpoint_id,
                                                          command.source_strategy, command.dir,
                                                          {command.parallel}, std::move(progress));
                          }));
  } else {
    CKPT_ASSIGN_OR_RETURN(v1::UploadResponse response,
                          WithProgress(command.progress, [&](ProgressFn progress) {
                            return client.UploadWholeFile(command.checkpoint_id, command.file,
                                                          std::move(progress));
                          }));
    RankUploadResult rank;
    rank.file = command.file;
    std::error_code ec;
    const uintmax_t size = std::filesystem::file_size(command.file, ec);
    rank.file_bytes = ec ? 0 : static_cast<int64_t>(size);
    rank.response = std::move(response);
    summary.checkpoint_id = command.checkpoint_id;
    summary.committed = rank.response.committed();
    summary.ranks_received = rank.response.ranks_received();
    summary.ranks_total = rank.response.ranks_total();
    summary.file_bytes = rank.file_bytes;
    summary.bytes_stored = rank.response.bytes_stored();
    summary.ranks.push_back(std::move(rank));
  }

  std::vector<std::string> warnings;
  for (const RankUploadResult& r : summary.ranks) {
    out << "uploaded rank " << r.rank << " from " << r.file << ": " << r.file_bytes
        << " bytes, " << r.response.bytes_stored() << " stored\n";
    warnings.insert(warnings.end(), r.response.warnings().begin(), r.response.warnings().end());
  }
  PrintWarnings(warnings, err);
  if (summary.committed) {
    out << "committed checkpoint " << summary.checkpoint_id << ": " << summary.ranks_total
        << " ranks, " << summary.file_bytes << " bytes uploaded, " << summary.bytes_stored
        << " bytes stored\n";
  } else {
    // Possible when another client uploads other ranks of the same checkpoint.
    out << "checkpoint " << summary.checkpoint_id << " not committed yet: "
        << summary.ranks_received << " of " << summary.ranks_total << " ranks received\n";
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- fetch

absl::Status RunFetch(CkptClient& client, const FetchCommand& command, std::ostream& out,
                      std::ostream& err) {
  if (command.merged == !command.destination_strategy.empty()) {
    return absl::InvalidArgumentError(
        "fetch needs either --dst-strategy NAME --rank R or --merged");
  }
  if (!command.merged && !command.rank) {
    return absl::InvalidArgumentError("fetch --dst-strategy needs --rank R");
  }
  if (command.merged && command.rank) {
    return absl::InvalidArgumentError("fetch --merged takes no --rank");
  }
  if (command.out_path.empty()) return absl::InvalidArgumentError("fetch needs --out FILE");

  v1::FetchRequest request;
  request.set_checkpoint_id(command.checkpoint_id);
  if (command.merged) {
    request.set_merged(true);
  } else {
    request.set_destination_strategy(command.destination_strategy);
    request.set_rank(*command.rank);
  }
  for (const std::string& glob : command.include) request.add_include(glob);
  for (const std::string& glob : command.exclude) request.add_exclude(glob);
  request.set_strict(command.strict);

  CKPT_ASSIGN_OR_RETURN(v1::FetchPlanSummary summary,
                        WithProgress(command.progress, [&](ProgressFn progress) {
                          return client.FetchToFile(request, command.out_path,
                                                    std::move(progress));
                        }));
  PrintWarnings({summary.warnings().begin(), summary.warnings().end()}, err);
  out << "fetched " << summary.tensor_count() << " tensors (" << summary.total_bytes()
      << " bytes) from source ranks " << Bracketed(summary.source_ranks()) << " into "
      << command.out_path << "\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------- dependencies

absl::Status RunRemoteDeps(CkptClient& client, const std::string& checkpoint_id,
                           const std::string& destination_strategy, std::optional<int64_t> rank,
                           bool all, bool json, std::ostream& out) {
  if (destination_strategy.empty()) {
    return absl::InvalidArgumentError("deps CKPT needs --dst-strategy NAME");
  }
  if (rank.has_value() == all) return absl::InvalidArgumentError("deps needs --rank R or --all");
  v1::RankDependenciesRequest request;
  request.set_checkpoint_id(checkpoint_id);
  request.set_destination_strategy(destination_strategy);
  if (rank) {
    request.set_rank(*rank);
  } else {
    request.set_all(true);
  }
  CKPT_ASSIGN_OR_RETURN(v1::RankDependenciesResponse response, client.RankDependencies(request));
  if (rank && response.ranks_size() != 1) {
    return absl::InternalError(absl::StrCat("ckptd answered ", response.ranks_size(),
                                            " ranks for a one-rank dependency query"));
  }
  std::vector<std::pair<int64_t, std::vector<int64_t>>> deps;
  for (const v1::RankSources& r : response.ranks()) {
    deps.emplace_back(r.rank(),
                      std::vector<int64_t>(r.source_ranks().begin(), r.source_ranks().end()));
  }
  PrintDeps(deps, /*as_list=*/all, json, out);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- checkpoints

absl::Status RunList(CkptClient& client, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> checkpoints, client.ListCheckpoints());
  for (const v1::CheckpointInfo& c : checkpoints) {
    out << c.id() << "  source_strategy="
        << (c.source_strategy().empty() ? "-" : c.source_strategy())
        << "  ranks=" << c.ranks() << "  tensors=" << c.tensor_count()
        << "  stored_bytes=" << c.stored_bytes() << "  created=" << Created(c.created_unix())
        << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunDescribe(CkptClient& client, const std::string& checkpoint_id, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::DescribeCheckpointResponse response,
                        client.DescribeCheckpoint(checkpoint_id));
  const v1::CheckpointInfo& info = response.info();
  out << "checkpoint " << info.id() << ": source strategy "
      << (info.source_strategy().empty() ? "(none, whole tensors)" : info.source_strategy())
      << ", "
      << info.ranks() << " ranks, " << info.tensor_count() << " tensors, "
      << info.logical_bytes() << " logical bytes, " << info.stored_bytes()
      << " stored bytes, created " << Created(info.created_unix()) << "\n";
  size_t name_width = 4;
  size_t dtype_width = 5;
  size_t shape_width = 5;
  std::vector<std::string> shapes;
  for (const v1::TensorDescription& t : response.tensors()) {
    shapes.push_back(ShapeToString(Shape(t.global_shape().begin(), t.global_shape().end())));
    name_width = std::max(name_width, t.name().size());
    dtype_width = std::max(dtype_width, t.dtype().size());
    shape_width = std::max(shape_width, shapes.back().size());
  }
  auto pad = [](const std::string& s, size_t width) {
    return s + std::string(width - s.size() + 2, ' ');
  };
  for (int i = 0; i < response.tensors_size(); ++i) {
    const v1::TensorDescription& t = response.tensors(i);
    out << "  " << pad(t.name(), name_width) << pad(t.dtype(), dtype_width)
        << pad(shapes[i], shape_width)
        << (t.kind() == v1::TENSOR_KIND_VERBATIM ? "verbatim" : "sharded ")
        << "  slices=" << t.stored_slices() << "  stored_bytes=" << t.stored_bytes();
    if (!t.layout().empty()) out << "  " << t.layout();
    out << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunRemove(CkptClient& client, const std::string& checkpoint_id, std::ostream& out) {
  CKPT_RETURN_IF_ERROR(client.DeleteCheckpoint(checkpoint_id));
  out << "deleted checkpoint " << checkpoint_id << "\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------- rank lists

absl::StatusOr<std::vector<int64_t>> ParseRankList(std::string_view list) {
  auto error = [list](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid rank list \"", Sv(list), "\": ", Sv(why),
        " (expected comma-separated ranks and ranges, e.g. 0,2,5-7)"));
  };
  // One rank: decimal digits only, so "-1", "+1", "0x3" and "1.5" are refused.
  auto parse_rank = [&](std::string_view text) -> absl::StatusOr<int64_t> {
    if (text.empty()) return error("a range needs a rank on both sides of '-'");
    if (!std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return error(absl::StrCat("\"", Sv(text), "\" is not a rank (ranks are 0 or more)"));
    }
    int64_t value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size() || value > kMaxListedRank) {
      return error(absl::StrCat("rank ", Sv(text), " is too large (at most ", kMaxListedRank, ")"));
    }
    return value;
  };

  if (absl::StripAsciiWhitespace(absl::string_view(list.data(), list.size())).empty()) {
    return error("it is empty");
  }
  std::vector<int64_t> ranks;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(list.data(), list.size()), ',')) {
    const absl::string_view stripped = absl::StripAsciiWhitespace(raw);
    const std::string_view item(stripped.data(), stripped.size());
    if (item.empty()) return error("it has an empty item");
    if (item.front() == '-') {
      return error(absl::StrCat("\"", Sv(item), "\": ranks cannot be negative"));
    }
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      CKPT_ASSIGN_OR_RETURN(const int64_t rank, parse_rank(item));
      ranks.push_back(rank);
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(const int64_t first, parse_rank(item.substr(0, dash)));
    CKPT_ASSIGN_OR_RETURN(const int64_t last, parse_rank(item.substr(dash + 1)));
    if (last < first) {
      return error(absl::StrCat("range ", Sv(item), " is reversed (write ", last, "-", first, ")"));
    }
    for (int64_t r = first; r <= last; ++r) ranks.push_back(r);
    if (static_cast<int64_t>(ranks.size()) > kMaxListedRank + 1) {
      return error("it lists more ranks than exist");  // only via overlapping ranges
    }
  }
  std::sort(ranks.begin(), ranks.end());
  const auto duplicate = std::adjacent_find(ranks.begin(), ranks.end());
  if (duplicate != ranks.end()) {
    return error(absl::StrCat("rank ", *duplicate, " is listed more than once"));
  }
  return ranks;
}

std::string FormatRankList(const std::vector<int64_t>& ranks) {
  std::vector<std::string> items;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    items.push_back(j == i ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j]));
    i = j + 1;
  }
  return absl::StrJoin(items, ",");
}

// ---------------------------------------------------------------- jobs

std::string FormatJobLine(const v1::Job& job) {
  std::string line = absl::StrCat(job.id(), "  ", JobStateName(job.state()), "  ",
                                  job.request().checkpoint_id(), " -> ",
                                  DescribeTarget(job.request()), "  ", PercentText(job));
  if (job.attempts() > 1) absl::StrAppend(&line, "  attempts=", job.attempts());
  if ((job.state() == v1::JOB_STATE_FAILED || job.state() == v1::JOB_STATE_CANCELLED) &&
      !job.reason().empty()) {
    absl::StrAppend(&line, "  reason: ", OneLine(job.reason()));
  }
  return line;
}

absl::Status RunTransform(CkptClient& client, const TransformCommand& command, std::ostream& out) {
  const bool to_checkpoint = !command.new_checkpoint_id.empty();
  const bool to_dir = !command.export_dir.empty();
  const bool to_file = !command.merged_file.empty();
  if (to_checkpoint + to_dir + to_file != 1) {
    return absl::InvalidArgumentError(
        "transform needs exactly one of --as NEW_CKPT, --export-dir DIR or --merged-file FILE");
  }
  if (to_file && !command.destination_strategy.empty()) {
    return absl::InvalidArgumentError(
        "transform --merged-file takes no --dst-strategy (every tensor is written whole)");
  }
  if (!to_file && command.destination_strategy.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("transform ", to_dir ? "--export-dir" : "--as",
                                                   " needs --dst-strategy NAME"));
  }
  if (!to_dir && (command.ranks.has_value() || !command.prefix.empty())) {
    return absl::InvalidArgumentError("--ranks and --prefix apply to --export-dir only");
  }
  // The paths are opened by the server: a relative one would silently mean its working directory.
  if (to_dir && !std::filesystem::path(command.export_dir).is_absolute()) {
    return absl::InvalidArgumentError("--export-dir must be an absolute path on the server");
  }
  if (to_file && !std::filesystem::path(command.merged_file).is_absolute()) {
    return absl::InvalidArgumentError("--merged-file must be an absolute path on the server");
  }
  CKPT_ASSIGN_OR_RETURN(const std::vector<int64_t> ranks, ParseRanksOption(command.ranks));

  v1::SubmitTransformRequest request;
  request.set_job_id(command.job_id);
  request.set_checkpoint_id(command.checkpoint_id);
  request.set_destination_strategy(command.destination_strategy);
  v1::TransformTarget* target = request.mutable_target();
  if (to_checkpoint) {
    target->set_new_checkpoint_id(command.new_checkpoint_id);
  } else if (to_dir) {
    target->set_export_dir(command.export_dir);
    target->mutable_ranks()->Assign(ranks.begin(), ranks.end());
    target->set_prefix(command.prefix);
  } else {
    target->set_merged_file(command.merged_file);
  }

  CKPT_ASSIGN_OR_RETURN(v1::SubmitTransformResponse response, client.SubmitTransform(request));
  const v1::Job& job = response.job();
  if (response.created()) {
    out << "submitted job " << job.id() << ": " << command.checkpoint_id << " -> "
        << DescribeTarget(request) << "\n";
  } else {
    out << "job " << job.id() << " already exists with this request ("
        << JobStateName(job.state()) << "): " << job.request().checkpoint_id() << " -> "
        << DescribeTarget(job.request()) << "\n";
  }
  out.flush();
  if (!command.wait) return absl::OkStatus();
  return WaitForJob(client, job.id(), command.wait_options, out);
}

absl::Status RunJobsList(CkptClient& client, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, client.ListJobs());
  for (const v1::Job& job : jobs) out << FormatJobLine(job) << "\n";
  return absl::OkStatus();
}

absl::Status RunJobGet(CkptClient& client, const std::string& job_id, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::Job job, client.GetJob(job_id));
  const v1::JobProgress& p = job.progress();
  auto when = [](int64_t unix_seconds) {
    return unix_seconds > 0 ? Created(unix_seconds) : std::string("-");
  };
  out << "job " << job.id() << ": " << JobStateName(job.state()) << "\n"
      << "  source:    " << job.request().checkpoint_id() << "\n"
      << "  target:    " << DescribeTarget(job.request()) << "\n"
      << "  progress:  " << PercentText(job) << " (" << ProgressCounts(p) << ")\n";
  if (job.state() == v1::JOB_STATE_RUNNING && p.bytes_per_second() > 0) {
    out << "  rate:      " << FormatBytes(static_cast<int64_t>(p.bytes_per_second())) << "/s";
    if (p.eta_seconds() > 0) out << ", ETA " << FormatSeconds(p.eta_seconds());
    out << "\n";
  }
  out << "  submitted: " << when(job.submitted_unix()) << "\n"
      << "  started:   " << when(job.started_unix()) << "\n"
      << "  finished:  " << when(job.finished_unix()) << "\n"
      << "  attempts:  " << job.attempts() << "\n";
  if (!job.reason().empty()) out << "  reason:    " << OneLine(job.reason()) << "\n";
  return absl::OkStatus();
}

absl::Status RunJobWatch(CkptClient& client, const std::string& job_id,
                         const JobWaitOptions& options, std::ostream& out) {
  return WaitForJob(client, job_id, options, out);
}

absl::Status RunJobCancel(CkptClient& client, const std::string& job_id, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::Job job, client.CancelJob(job_id));
  switch (job.state()) {
    case v1::JOB_STATE_CANCELLED:
      out << "cancelled job " << job.id() << "\n";
      break;
    case v1::JOB_STATE_SUCCEEDED:
    case v1::JOB_STATE_FAILED:
      out << "job " << job.id() << " had already ended (" << JobStateName(job.state())
          << "); nothing to cancel\n";
      break;
    default:
      // The server stops the job at its next check; its output is removed then.
      out << "cancelling job " << job.id() << " (" << JobStateName(job.state()) << ")\n";
      break;
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- client-side export

absl::Status RunExport(CkptClient& client, const ExportCommand& command, std::ostream& out,
                       std::ostream& err) {
  if (command.destination_strategy.empty()) {
    return absl::InvalidArgumentError("export needs --dst-strategy NAME");
  }
  if (command.dir.empty()) return absl::InvalidArgumentError("export needs --dir DIR");
  if (command.parallel < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--parallel must be at least 1, got ", command.parallel));
  }
  CKPT_RETURN_IF_ERROR(ValidateRankFilePrefix(command.prefix));
  CKPT_ASSIGN_OR_RETURN(const std::vector<int64_t> ranks, ParseRanksOption(command.ranks));
  CKPT_ASSIGN_OR_RETURN(ExportSummary summary,
                        WithProgress(command.progress, [&](ProgressFn progress) {
                          return client.ExportRanks(command.checkpoint_id,
                                                    command.destination_strategy, command.dir,
                                                    ranks, command.prefix, command.parallel,
                                                    std::move(progress));
                        }));
  std::vector<std::string> warnings;
  for (const RankExportResult& r : summary.ranks) {
    out << "exported rank " << r.rank << ": " << r.summary.tensor_count() << " tensors ("
        << r.summary.total_bytes() << " bytes) from source ranks "
        << Bracketed(r.summary.source_ranks()) << " into " << r.file << "\n";
    warnings.insert(warnings.end(), r.summary.warnings().begin(), r.summary.warnings().end());
  }
  PrintWarnings(warnings, err);
  out << "exported " << command.checkpoint_id << " to destination strategy "
      << command.destination_strategy << ": "
      << summary.ranks.size() << " ranks, " << summary.tensors << " tensors, " << summary.bytes
      << " bytes into " << summary.dir << "\n";
  return absl::OkStatus();
}

}  // namespace ckpt
