#include "client/ckptctl/job_commands.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ckptctl/output.h"
#include "client/ckptctl/progress.h"
#include "client/ckptctl/rank_list.h"
#include "core/rank_files.h"
#include "core/status_macros.h"

namespace ckpt {
namespace {

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
      : live_(!options.json && !options.quiet &&
              options.live.value_or(::isatty(STDERR_FILENO) == 1)),
        quiet_(options.quiet),
        json_(options.json),
        terminal_(options.terminal != nullptr ? options.terminal : &std::cerr),
        out_(&out),
        interval_(options.line_interval) {}
  ~JobDisplay() { Clear(); }
  JobDisplay(const JobDisplay&) = delete;
  JobDisplay& operator=(const JobDisplay&) = delete;

  void Update(const v1::Job& job) {
    if (json_) {
      PrintJsonLine(JobJson(job), *out_);
      out_->flush();
      return;
    }
    // The final state is reported by the caller, not as progress.
    if (quiet_ || IsTerminalJobState(job.state())) return;
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
    const int64_t done = job.state() == v1::JOB_STATE_SUCCEEDED ? p.bytes_total() : p.bytes_done();
    return absl::StrCat(FormatProgressLine(done, p.bytes_total(), p.bytes_per_second()), "  ",
                        p.tensors_done(), "/", p.tensors_total(), " tensors  ", p.ranks_done(), "/",
                        p.ranks_total(), " ranks");
  }

  static std::string PlainLine(const v1::Job& job) {
    const v1::JobProgress& p = job.progress();
    std::string line = absl::StrCat("job ", job.id(), " ", JobStateName(job.state()));
    if (job.state() != v1::JOB_STATE_RUNNING) return line;
    absl::StrAppend(&line, " ", PercentText(job), ": ", ProgressCounts(p));
    if (p.bytes_per_second() > 0) {
      absl::StrAppend(&line, ", ", FormatBytes(static_cast<int64_t>(p.bytes_per_second())), "/s");
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
  const bool quiet_;
  const bool json_;
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
        out << " in "
            << FormatSeconds(static_cast<double>(job.finished_unix() - job.started_unix()));
      }
      if (job.attempts() > 1) out << " (" << job.attempts() << " attempts)";
      out << "\n";
      return absl::OkStatus();
    }
    case v1::JOB_STATE_FAILED:
      return absl::AbortedError(absl::StrCat(
          "job ", job.id(), " failed: ", reason.empty() ? "(no reason given)" : reason));
    case v1::JOB_STATE_CANCELLED:
      return absl::CancelledError(
          absl::StrCat("job ", job.id(), " was cancelled", reason.empty() ? "" : ": ", reason));
    default:
      break;
  }
  return absl::InternalError(
      absl::StrCat("job ", job.id(), " has not finished (", JobStateName(job.state()), ")"));
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
      return absl::UnavailableError(
          absl::StrCat(job.status().message(),
                       " (the job may still be running: ckptctl jobs watch ", job_id, ")"));
    }
    return job.status();
  }
  if (job->state() == v1::JOB_STATE_SUCCEEDED) {
    display.Done(*job);
  } else {
    display.Clear();
  }
  // In JSON the final state was the last line; a failure still sets the exit status.
  std::ostringstream discarded;
  return ReportOutcome(*job, options.json ? discarded : out);
}

}  // namespace

std::string FormatJobLine(const v1::Job& job) {
  std::string line =
      absl::StrCat(job.id(), "  ", JobStateName(job.state()), "  ", job.request().checkpoint_id(),
                   " -> ", DescribeTarget(job.request()), "  ", PercentText(job));
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
    return absl::InvalidArgumentError(
        absl::StrCat("transform ", to_dir ? "--export-dir" : "--as", " needs --dst-strategy NAME"));
  }
  if (!to_dir && (command.ranks.has_value() || !command.prefix.empty())) {
    return absl::InvalidArgumentError("--ranks and --prefix apply to --export-dir only");
  }
  // The paths are opened by the server: a relative one would silently mean its working directory.
  // The paths are the server's to judge (relative to its --export-root): sent as given.
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
  if (command.json) {
    PrintJsonLine({{"job_id", job.id()}, {"created", response.created()}, {"job", JobJson(job)}},
                  out);
  } else if (response.created()) {
    out << "submitted job " << job.id() << ": " << command.checkpoint_id << " -> "
        << DescribeTarget(request) << "\n";
  } else {
    out << "job " << job.id() << " already exists with this request (" << JobStateName(job.state())
        << "): " << job.request().checkpoint_id() << " -> " << DescribeTarget(job.request())
        << "\n";
  }
  out.flush();
  if (!command.wait) return absl::OkStatus();
  return WaitForJob(client, job.id(), command.wait_options, out);
}

absl::Status RunJobsList(CkptClient& client, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::Job> jobs, client.ListJobs());
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::Job& job : jobs) list.push_back(JobJson(job));
    PrintJsonLine(list, out);
    return absl::OkStatus();
  }
  for (const v1::Job& job : jobs) out << FormatJobLine(job) << "\n";
  return absl::OkStatus();
}

absl::Status RunJobGet(CkptClient& client, const std::string& job_id, bool json,
                       std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::Job job, client.GetJob(job_id));
  if (json) {
    PrintJsonLine(JobJson(job), out);
    return absl::OkStatus();
  }
  const v1::JobProgress& p = job.progress();
  auto when = [](int64_t unix_seconds) {
    return unix_seconds > 0 ? FormatUtcTime(unix_seconds) : std::string("-");
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

absl::Status RunJobCancel(CkptClient& client, const std::string& job_id, bool json,
                          std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::Job job, client.CancelJob(job_id));
  if (json) {
    PrintJsonLine(JobJson(job), out);
    return absl::OkStatus();
  }
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

absl::Status RunJobRemove(CkptClient& client, const std::string& job_id, bool json,
                          std::ostream& out) {
  CKPT_RETURN_IF_ERROR(client.DeleteJob(job_id));
  if (json) {
    PrintJsonLine({{"deleted_job", job_id}}, out);
  } else {
    out << "removed job " << job_id << "\n";
  }
  return absl::OkStatus();
}

}  // namespace ckpt
