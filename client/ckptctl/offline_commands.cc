#include "client/ckptctl/offline_commands.h"

#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ckptctl/progress.h"
#include "client/ckptctl/sample.h"
#include "client/strategy_files.h"
#include "core/ckpt_format.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "storage/file_stream.h"

namespace ckpt {

absl::Status RunInspect(const std::string& path, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(auto source, FileByteSource::Open(path));
  CkptReader reader(source.get());
  struct Row {
    std::string name, dtype;
    std::vector<int64_t> dims;
    int64_t bytes = 0;
    int chunks = 0;
  };
  std::vector<Row> rows;
  // Values of one tensor arrive as consecutive chunks; sum them without joining.
  while (true) {
    auto value = reader.NextValue();
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat(path, ": ", value.status().message()));
    }
    if (!value->has_value()) break;
    const CkptTensor& v = **value;
    if (!rows.empty() && rows.back().name == v.name) {
      rows.back().bytes += static_cast<int64_t>(v.data.size());
      ++rows.back().chunks;
      continue;
    }
    rows.push_back(
        {v.name, std::string(DTypeName(v.dtype)), v.dims, static_cast<int64_t>(v.data.size()), 1});
  }
  int64_t total = 0;
  for (const Row& r : rows) total += r.bytes;
  if (json) {
    nlohmann::json j = nlohmann::json::array();
    for (const Row& r : rows) {
      j.push_back({{"name", r.name},
                   {"dtype", r.dtype},
                   {"shape", r.dims},
                   {"bytes", r.bytes},
                   {"chunks", r.chunks}});
    }
    out << nlohmann::json{{"file", path},
                          {"tensors", j},
                          {"total_bytes", total},
                          {"crc_trailer", reader.had_crc_trailer()}}
               .dump()
        << "\n";
    return absl::OkStatus();
  }
  size_t width = 4;
  for (const Row& r : rows) width = std::max(width, r.name.size());
  out << std::string("NAME") << std::string(width - 4 + 2, ' ')
      << "DTYPE     SHAPE            SIZE\n";
  for (const Row& r : rows) {
    std::string shape = ShapeToString(r.dims);
    out << r.name << std::string(width - r.name.size() + 2, ' ') << r.dtype
        << std::string(r.dtype.size() < 10 ? 10 - r.dtype.size() : 1, ' ') << shape
        << std::string(shape.size() < 17 ? 17 - shape.size() : 1, ' ') << FormatBytes(r.bytes)
        << (r.chunks > 1 ? absl::StrCat(" (", r.chunks, " chunks)") : "") << "\n";
  }
  out << rows.size() << " tensors, " << FormatBytes(total)
      << (reader.had_crc_trailer() ? ", crc_num trailer verified" : "") << "\n";
  return absl::OkStatus();
}

void PrintStrategy(const Strategy& s, std::string_view label, bool json, std::ostream& out) {
  if (json) {
    // The strategy file itself, indented as MindSpore writes it (a document to save and edit,
    // not a result object).
    out << nlohmann::json::parse(SerializeStrategy(s, StrategyFormat::kJson)).dump(2) << "\n";
    return;
  }
  out << "strategy " << label << ": " << s.params().size() << " parameters, "
      << s.devices_per_stage() << " devices per stage, " << s.stage_count() << " stage(s), "
      << s.world_size() << " ranks\n";
  for (const auto& [name, p] : s.params()) {
    out << "  " << name << "  " << p.layout.ToString();
    if (p.tensor_shape) out << " shape=" << ShapeToString(*p.tensor_shape);
    out << "\n";
  }
}

absl::Status RunStrategyShow(const std::string& path, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(Strategy s, LoadStrategyPath(path));
  PrintStrategy(s, path, json, out);
  return absl::OkStatus();
}

absl::Status RunStrategyMerge(const std::vector<std::string>& inputs, const std::string& out_path,
                              bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(std::vector<StrategyFile> files, ReadStrategyFiles(inputs));
  CKPT_ASSIGN_OR_RETURN(Strategy merged, MergeStageStrategies(files));
  CKPT_RETURN_IF_ERROR(WriteStrategyFile(merged, out_path));
  if (json) {
    out << nlohmann::json{{"out", out_path},
                          {"files", files.size()},
                          {"parameter_count", merged.params().size()},
                          {"stage_count", merged.stage_count()}}
               .dump()
        << "\n";
    return absl::OkStatus();
  }
  out << "merged " << files.size() << " files into " << out_path << ": " << merged.params().size()
      << " parameters, " << merged.stage_count() << " stages\n";
  return absl::OkStatus();
}

void PrintDeps(const std::vector<std::pair<int64_t, std::vector<int64_t>>>& deps, bool as_list,
               bool json, std::ostream& out) {
  if (json) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& [rank, ranks] : deps)
      list.push_back({{"rank", rank}, {"source_ranks", ranks}});
    out << (as_list ? list : list.at(0)).dump() << "\n";
    return;
  }
  for (const auto& [rank, ranks] : deps) {
    out << "rank " << rank << ": " << absl::StrJoin(ranks, " ") << "\n";
  }
}

absl::Status RunLocalDeps(const std::string& src_path, const std::string& dst_path,
                          std::optional<int64_t> rank, bool json, std::ostream& out) {
  CKPT_ASSIGN_OR_RETURN(Strategy src, LoadStrategyPath(src_path));
  CKPT_ASSIGN_OR_RETURN(Strategy dst, LoadStrategyPath(dst_path));
  CKPT_ASSIGN_OR_RETURN(Resharder planner, Resharder::CreateFromLayouts(
                                               std::make_shared<const Strategy>(std::move(src)),
                                               std::make_shared<const Strategy>(std::move(dst))));
  std::vector<std::pair<int64_t, std::vector<int64_t>>> deps;
  if (rank) {
    CKPT_ASSIGN_OR_RETURN(std::vector<int64_t> ranks, planner.SourceRanks(*rank));
    deps.emplace_back(*rank, std::move(ranks));
  } else {
    CKPT_ASSIGN_OR_RETURN(auto all, planner.AllSourceRanks());
    for (size_t r = 0; r < all.size(); ++r) deps.emplace_back(r, std::move(all[r]));
  }
  PrintDeps(deps, !rank.has_value(), json, out);
  return absl::OkStatus();
}

absl::Status RunSample(const std::string& dir, bool json, std::ostream& out) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));
  const Strategy src = DemoSourceStrategy();
  const Strategy dst = DemoDestinationStrategy();
  CKPT_RETURN_IF_ERROR(WriteStrategyFile(src, dir + "/src_strategy.ckpt"));
  CKPT_RETURN_IF_ERROR(WriteStrategyFile(dst, dir + "/dst_strategy.json"));
  SampleOptions options;
  CKPT_RETURN_IF_ERROR(WriteShardedSample(src, DemoTensors(), dir + "/checkpoint", options));
  CKPT_RETURN_IF_ERROR(WriteWholeSample(DemoTensors(), dir + "/whole.ckpt", options));
  if (json) {
    out << nlohmann::json{{"dir", dir},
                          {"src_strategy", dir + "/src_strategy.ckpt"},
                          {"dst_strategy", dir + "/dst_strategy.json"},
                          {"checkpoint_dir", dir + "/checkpoint"},
                          {"whole_checkpoint", dir + "/whole.ckpt"},
                          {"source_ranks", src.world_size()},
                          {"destination_ranks", dst.world_size()}}
               .dump()
        << "\n";
    return absl::OkStatus();
  }
  out << "wrote " << dir << "/src_strategy.ckpt (" << src.world_size()
      << " ranks: " << src.devices_per_stage() << " devices x " << src.stage_count()
      << (src.stage_count() == 1 ? " stage), " : " stages), ") << dir << "/dst_strategy.json ("
      << dst.world_size() << " ranks), " << dir << "/checkpoint/rank_<r>/" << options.file_name
      << " and " << dir << "/whole.ckpt\n";
  return absl::OkStatus();
}

}  // namespace ckpt
