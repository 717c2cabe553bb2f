#include "client/ckptctl/server_commands.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/offline_commands.h"
#include "client/ckptctl/output.h"
#include "client/ckptctl/progress.h"
#include "client/ckptctl/rank_list.h"
#include "core/box.h"
#include "core/rank_files.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

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

}  // namespace

// ---------------------------------------------------------------- strategies

absl::Status RunStrategyPut(CkptClient& client, const std::string& name, const std::string& path,
                            bool overwrite, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::StrategyInfo info, client.PutStrategyFile(name, path, overwrite));
  if (json) {
    PrintJsonLine({{"registered", StrategyInfoJson(info)}, {"path", path}}, out);
    return absl::OkStatus();
  }
  out << "registered strategy " << info.name() << " from " << path << ": " << info.parameter_count()
      << " parameters, " << info.devices_per_stage() << " devices per stage, " << info.stage_count()
      << " stage(s), " << info.world_size() << " ranks\n";
  return absl::OkStatus();
}

absl::Status RunStrategyGet(CkptClient& client, const std::string& name, bool json,
                            std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(RemoteStrategy remote, client.GetStrategy(name));
  PrintStrategy(remote.strategy, remote.info.name(), json, out);
  return absl::OkStatus();
}

absl::Status RunStrategyList(CkptClient& client, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::StrategyInfo> strategies, client.ListStrategies());
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::StrategyInfo& s : strategies) list.push_back(StrategyInfoJson(s));
    PrintJsonLine(list, out);
    return absl::OkStatus();
  }
  for (const v1::StrategyInfo& s : strategies) {
    out << s.name() << "  parameters=" << s.parameter_count()
        << "  devices_per_stage=" << s.devices_per_stage() << "  stages=" << s.stage_count()
        << "  world_size=" << s.world_size() << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunStrategyRemove(CkptClient& client, const std::string& name, bool json,
                               std::ostream& out) {
  CKPT_RETURN_IF_ERROR(client.DeleteStrategy(name));
  if (json) {
    PrintJsonLine({{"deleted_strategy", name}}, out);
    return absl::OkStatus();
  }
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
    CKPT_ASSIGN_OR_RETURN(
        v1::UploadResponse response, WithProgress(command.progress, [&](ProgressFn progress) {
          return client.UploadWholeFile(command.checkpoint_id, command.file, std::move(progress));
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
    if (!command.json) {
      out << "uploaded rank " << r.rank << " from " << r.file << ": " << FormatBytes(r.file_bytes)
          << ", " << FormatBytes(r.response.bytes_stored()) << " stored\n";
    }
    warnings.insert(warnings.end(), r.response.warnings().begin(), r.response.warnings().end());
  }
  PrintWarnings(warnings, err);
  if (command.json) {
    PrintJsonLine(UploadSummaryJson(summary), out);
  } else if (summary.committed) {
    out << "committed checkpoint " << summary.checkpoint_id << ": " << summary.ranks_total
        << " ranks, " << FormatBytes(summary.file_bytes) << " uploaded, "
        << FormatBytes(summary.bytes_stored) << " stored\n";
  } else {
    // Possible when another client uploads other ranks of the same checkpoint.
    out << "checkpoint " << summary.checkpoint_id
        << " not committed yet: " << summary.ranks_received << " of " << summary.ranks_total
        << " ranks received\n";
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
                          return client.FetchToFile(request, command.out_path, std::move(progress));
                        }));
  PrintWarnings({summary.warnings().begin(), summary.warnings().end()}, err);
  // Nothing but the file's bytes on standard output when the file goes there.
  std::ostream& report = OutputDescriptor(command.out_path) == 1 ? err : out;
  if (command.json) {
    nlohmann::json j = FetchPlanJson(summary);
    j["checkpoint_id"] = command.checkpoint_id;
    j["out"] = command.out_path;
    PrintJsonLine(j, report);
    return absl::OkStatus();
  }
  report << "fetched " << summary.tensor_count() << " tensors ("
         << FormatBytes(summary.total_bytes()) << ") from source ranks "
         << Bracketed(summary.source_ranks()) << " into "
         << (command.out_path == "-" ? std::string("standard output") : command.out_path) << "\n";
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

absl::Status RunList(CkptClient& client, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> checkpoints, client.ListCheckpoints());
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const v1::CheckpointInfo& c : checkpoints) list.push_back(CheckpointInfoJson(c));
    PrintJsonLine(list, out);
    return absl::OkStatus();
  }
  for (const v1::CheckpointInfo& c : checkpoints) {
    out << c.id()
        << "  source_strategy=" << (c.source_strategy().empty() ? "-" : c.source_strategy())
        << "  ranks=" << c.ranks() << "  tensors=" << c.tensor_count()
        << "  stored=" << FormatBytes(c.stored_bytes())
        << "  created=" << FormatUtcTime(c.created_unix()) << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunDescribe(CkptClient& client, const std::string& checkpoint_id, bool json,
                         std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::DescribeCheckpointResponse response,
                        client.DescribeCheckpoint(checkpoint_id));
  if (json) {
    PrintJsonLine(DescribeJson(response), out);
    return absl::OkStatus();
  }
  const v1::CheckpointInfo& info = response.info();
  out << "checkpoint " << info.id() << ": source strategy "
      << (info.source_strategy().empty() ? "(none, whole tensors)" : info.source_strategy()) << ", "
      << info.ranks() << " ranks, " << info.tensor_count() << " tensors, "
      << FormatBytes(info.logical_bytes()) << " logical, " << FormatBytes(info.stored_bytes())
      << " stored, created " << FormatUtcTime(info.created_unix()) << "\n";
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
        << "  slices=" << t.stored_slices() << "  stored=" << FormatBytes(t.stored_bytes());
    if (!t.layout().empty()) out << "  " << t.layout();
    out << "\n";
  }
  return absl::OkStatus();
}

absl::Status RunRemove(CkptClient& client, const std::string& checkpoint_id, bool json,
                       std::ostream& out) {
  CKPT_RETURN_IF_ERROR(client.DeleteCheckpoint(checkpoint_id));
  if (json) {
    PrintJsonLine({{"deleted_checkpoint", checkpoint_id}}, out);
    return absl::OkStatus();
  }
  out << "deleted checkpoint " << checkpoint_id << "\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------- health

absl::Status RunHealth(CkptClient& client, const std::string& service, bool json,
                       std::ostream& out) {
  absl::StatusOr<std::string> answer = client.CheckHealth(service);
  // A service the server does not (yet) report on is not serving it: the unavailable class too.
  if (answer.status().code() == absl::StatusCode::kNotFound) {
    return absl::UnavailableError(answer.status().message());
  }
  CKPT_ASSIGN_OR_RETURN(const std::string status, std::move(answer));
  if (status != "SERVING") {
    // The unavailable class: a caller waiting for the server retries it.
    return absl::UnavailableError(
        absl::StrCat("ckptd at ", client.address(), " reports ", status,
                     service.empty() ? std::string() : absl::StrCat(" for service ", service)));
  }
  if (json) {
    PrintJsonLine({{"server", client.address()}, {"service", service}, {"status", status}}, out);
  } else {
    out << client.address() << (service.empty() ? "" : " ") << service << ": " << status << "\n";
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
  CKPT_ASSIGN_OR_RETURN(
      ExportSummary summary, WithProgress(command.progress, [&](ProgressFn progress) {
        return client.ExportRanks(command.checkpoint_id, command.destination_strategy, command.dir,
                                  ranks, command.prefix, command.parallel, std::move(progress));
      }));
  std::vector<std::string> warnings;
  for (const RankExportResult& r : summary.ranks) {
    if (!command.json) {
      out << "exported rank " << r.rank << ": " << r.summary.tensor_count() << " tensors ("
          << FormatBytes(r.summary.total_bytes()) << ") from source ranks "
          << Bracketed(r.summary.source_ranks()) << " into " << r.file << "\n";
    }
    warnings.insert(warnings.end(), r.summary.warnings().begin(), r.summary.warnings().end());
  }
  PrintWarnings(warnings, err);
  if (command.json) {
    PrintJsonLine(ExportSummaryJson(command.checkpoint_id, command.destination_strategy, summary),
                  out);
    return absl::OkStatus();
  }
  out << "exported " << command.checkpoint_id << " to destination strategy "
      << command.destination_strategy << ": " << summary.ranks.size() << " ranks, "
      << summary.tensors << " tensors, " << FormatBytes(summary.bytes) << " into " << summary.dir
      << "\n";
  return absl::OkStatus();
}

// ---------------------------------------------------------------- stats

namespace {

// `ckptctl stats --json`: every field of `s` in one object, sizes in exact bytes.
nlohmann::ordered_json StatsJson(const v1::ServerStats& s) {
  nlohmann::ordered_json j;
  j["version"] = s.version();
  j["uptime_seconds"] = s.uptime_seconds();
  j["checkpoints"] = s.checkpoints();
  j["checkpoint_stored_bytes"] = s.checkpoint_stored_bytes();
  j["disk_free_bytes"] = s.disk_free_bytes();
  j["fetch_streams"] = s.fetch_streams();
  j["fetch_bytes_sent"] = s.fetch_bytes_sent();
  j["fetch_bytes_in_flight"] = s.fetch_bytes_in_flight();
  j["fetch_chunks_shared"] = {{"read_in_flight", s.fetch_chunks_joined()},
                              {"other_stream", s.fetch_chunks_live()},
                              {"cache", s.fetch_chunks_cached()}};
  j["fetch_cache_bytes"] = s.fetch_cache_bytes();
  j["fetch_cache_pinned_bytes"] = s.fetch_cache_pinned_bytes();
  j["fetch_cache_evicted_for_pins"] = s.fetch_cache_evicted_for_pins();
  j["upload_streams"] = s.upload_streams();
  j["pending_uploads"] = s.pending_uploads();
  j["upload_bytes_received"] = s.upload_bytes_received();
  j["jobs"] = {{"queued", s.jobs_queued()},
               {"running", s.jobs_running()},
               {"succeeded", s.jobs_succeeded()},
               {"failed", s.jobs_failed()},
               {"cancelled", s.jobs_cancelled()}};
  j["job_bytes_written"] = s.job_bytes_written();
  j["store_bytes_read"] = s.store_bytes_read();
  j["store_chunks_read"] = s.store_chunks_read();
  j["store_bytes_copied"] = s.store_bytes_copied();
  j["store_bytes_written"] = s.store_bytes_written();
  j["store_chunks_written"] = s.store_chunks_written();
  j["store_mapped_bytes"] = s.store_mapped_bytes();
  j["data_loss_rpcs"] = s.data_loss_rpcs();
  j["data_loss_jobs"] = s.data_loss_jobs();
  j["rss_bytes"] = s.rss_bytes();
  j["peak_rss_bytes"] = s.peak_rss_bytes();
  return j;
}

}  // namespace

absl::Status RunStats(CkptClient& client, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(v1::ServerStats s, client.GetStats());
  if (json) {
    PrintJsonLine(StatsJson(s), out);
    return absl::OkStatus();
  }
  // "  label         value", the values aligned.
  auto line = [&out](std::string_view label, const std::string& value) {
    out << "  " << label << std::string(label.size() < 14 ? 14 - label.size() : 1, ' ') << value
        << "\n";
  };
  const int64_t up = static_cast<int64_t>(s.uptime_seconds());
  const std::string uptime = up >= 86400  ? absl::StrCat(up / 86400, "d ", up % 86400 / 3600, "h")
                             : up >= 3600 ? absl::StrCat(up / 3600, "h ", up % 3600 / 60, "m")
                             : up >= 60   ? absl::StrCat(up / 60, "m ", up % 60, "s")
                                          : absl::StrCat(up, "s");
  out << "ckptd " << s.version() << ", up " << uptime << "\n";
  out << "store\n";
  line("checkpoints",
       absl::StrCat(s.checkpoints(), " (", FormatBytes(s.checkpoint_stored_bytes()), " stored)"));
  line("disk free", s.disk_free_bytes() < 0 ? "unknown" : FormatBytes(s.disk_free_bytes()));
  line("read", absl::StrCat(FormatBytes(s.store_bytes_read()), " in ", s.store_chunks_read(),
                            " chunks (", FormatBytes(s.store_bytes_copied()), " as copies)"));
  line("written", absl::StrCat(FormatBytes(s.store_bytes_written()), " in ",
                               s.store_chunks_written(), " chunks"));
  line("mapped now", FormatBytes(s.store_mapped_bytes()));
  out << "fetch\n";
  line("open streams", absl::StrCat(s.fetch_streams()));
  line("sent", FormatBytes(s.fetch_bytes_sent()));
  line("queued now", FormatBytes(s.fetch_bytes_in_flight()));
  line("shared reads",
       absl::StrCat(s.fetch_chunks_joined() + s.fetch_chunks_live() + s.fetch_chunks_cached(),
                    " chunk(s) served from another stream's read (", s.fetch_chunks_cached(),
                    " from the cache)"));
  line("cache now", absl::StrCat(FormatBytes(s.fetch_cache_bytes()), " (",
                                 FormatBytes(s.fetch_cache_pinned_bytes()), " of mappings held)"));
  out << "upload\n";
  line("open streams",
       absl::StrCat(s.upload_streams(), " (", s.pending_uploads(), " checkpoint(s) in progress)"));
  line("received", FormatBytes(s.upload_bytes_received()));
  out << "jobs\n";
  line("by state", absl::StrCat("queued=", s.jobs_queued(), " running=", s.jobs_running(),
                                " succeeded=", s.jobs_succeeded(), " failed=", s.jobs_failed(),
                                " cancelled=", s.jobs_cancelled()));
  line("written", FormatBytes(s.job_bytes_written()));
  out << "health\n";
  line("data loss", absl::StrCat(s.data_loss_rpcs(), " RPC(s), ", s.data_loss_jobs(), " job(s)"));
  line("memory", absl::StrCat(FormatBytes(s.rss_bytes()), " resident (peak ",
                              FormatBytes(s.peak_rss_bytes()), ")"));
  return absl::OkStatus();
}

}  // namespace ckpt
