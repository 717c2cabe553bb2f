// Writes the seed corpora of the fuzz targets (tests/fuzz) from `ckptctl sample` output and, when
// present, the MindSpore fixtures, both read in place:
//   ckpt_fuzz_seeds SAMPLE_DIR FIXTURES_DIR OUT_DIR
// OUT_DIR/<target>/ gets, for ckpt_decode, every .ckpt; for strategy_binary and strategy_json,
// every strategy in its own format and converted to the other; for upload, the sample's rank
// files (and its whole-tensor file) as UploadRequest streams, one per rank and one of all ranks
// (plain, and with small tensors batched); for fetch_wire, each sample file as the FetchResponse
// stream a server sends for it, in rows and, for matrices, as a band of two tiles, each also to a
// visitor lending its memory (the mode byte's bits, fetch_wire_fuzzer.cc). Stream inputs are
// records (fuzz_streams.h).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ckpt.pb.h"
#include "core/checksum.h"
#include "core/ckpt_format.h"
#include "core/dtype.h"
#include "core/strategy.h"
#include "storage/file_stream.h"
#include "tests/fuzz/fuzz_streams.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMaxFileBytes = int64_t{64} << 20;

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / name, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string Read(const fs::path& path) {
  auto bytes = ReadWholeFile(path.string(), kMaxFileBytes);
  if (!bytes.ok()) {
    fprintf(stderr, "ckpt_fuzz_seeds: %s\n", std::string(bytes.status().message()).c_str());
    exit(1);
  }
  return *bytes;
}

// A seed name from a path: its parent directory and file name.
std::string SeedName(const fs::path& path) {
  return absl::StrCat(path.parent_path().filename().string(), "_", path.filename().string());
}

// The upload stream of one rank file. `batched`: tensors of at most 1 KiB go whole in batch
// messages (UploadTensorBatch, as the client library sends small tensors), the others as header
// and data messages.
void AppendUpload(const std::string& id, const std::string& strategy, int64_t rank,
                  const std::vector<CkptTensor>& tensors, std::string* out, bool batched = false) {
  v1::UploadRequest header;
  header.mutable_header()->set_checkpoint_id(id);
  header.mutable_header()->set_source_strategy(strategy);
  header.mutable_header()->set_rank(rank);
  fuzz::AppendRecord(header.SerializeAsString(), out);
  v1::UploadRequest batch;
  auto flush = [&] {
    if (batch.batch().tensors_size() > 0) fuzz::AppendRecord(batch.SerializeAsString(), out);
    batch.Clear();
  };
  for (const CkptTensor& t : tensors) {
    if (batched && t.data.size() <= 1024) {
      v1::UploadTensor* whole = batch.mutable_batch()->add_tensors();
      whole->mutable_header()->set_name(t.name);
      whole->mutable_header()->set_dtype(std::string(DTypeName(t.dtype)));
      for (int64_t d : t.dims) whole->mutable_header()->add_dims(d);
      whole->mutable_header()->set_total_bytes(static_cast<int64_t>(t.data.size()));
      whole->set_data(t.data);
      continue;
    }
    flush();
    v1::UploadRequest tensor;
    tensor.mutable_tensor()->set_name(t.name);
    tensor.mutable_tensor()->set_dtype(std::string(DTypeName(t.dtype)));
    for (int64_t d : t.dims) tensor.mutable_tensor()->add_dims(d);
    tensor.mutable_tensor()->set_total_bytes(static_cast<int64_t>(t.data.size()));
    fuzz::AppendRecord(tensor.SerializeAsString(), out);
    for (size_t at = 0; at < t.data.size(); at += 96) {
      v1::UploadRequest data;
      data.set_data(t.data.substr(at, 96));
      fuzz::AppendRecord(data.SerializeAsString(), out);
    }
  }
  flush();
}

// One data message of parts of `bytes` (each at most `part` bytes) with their checksums.
v1::FetchResponse DataMessage(const std::string& bytes, size_t part) {
  v1::FetchResponse message;
  v1::FetchData* data = message.mutable_data();
  data->set_data(bytes);
  for (size_t at = 0; at < bytes.size(); at += part) {
    const std::string piece = bytes.substr(at, part);
    data->add_part_bytes(piece.size());
    data->add_part_checksums(Checksum(piece));
  }
  return message;
}

// The fetch stream of `tensors`; with `tiles`, matrices come as one band of two column halves.
// The leading mode byte (fetch_wire_fuzzer.cc) asks for recomputed checksums in tile streams.
std::string FetchStream(const std::vector<CkptTensor>& tensors, bool tiles) {
  std::string out(1, tiles ? '\x01' : '\x00');
  v1::FetchResponse summary;
  int64_t total = 0;
  for (const CkptTensor& t : tensors) total += static_cast<int64_t>(t.data.size());
  summary.mutable_summary()->set_tensor_count(static_cast<int64_t>(tensors.size()));
  summary.mutable_summary()->set_total_bytes(total);
  fuzz::AppendRecord(summary.SerializeAsString(), &out);
  for (const CkptTensor& t : tensors) {
    v1::FetchResponse header;
    v1::FetchTensorHeader* h = header.mutable_tensor();
    h->set_name(t.name);
    h->set_dtype(std::string(DTypeName(t.dtype)));
    const Shape shape = t.shape();
    for (int64_t d : shape) {
      h->add_local_shape(d);
      h->add_global_shape(d);
      h->add_box_lo(0);
      h->add_box_hi(d);
    }
    h->set_total_bytes(static_cast<int64_t>(t.data.size()));
    fuzz::AppendRecord(header.SerializeAsString(), &out);
    if (t.data.empty()) continue;
    const int64_t rows = shape.size() == 2 ? shape[0] : 0;
    const int64_t cols = shape.size() == 2 ? shape[1] : 0;
    if (!tiles || t.dtype == DType::kStr || rows < 1 || cols < 2) {
      for (size_t at = 0; at < t.data.size(); at += 200) {
        fuzz::AppendRecord(DataMessage(t.data.substr(at, 200), 64).SerializeAsString(), &out);
      }
      continue;
    }
    // Tiles: columns [0, half) and [half, cols) of every row, each row-major.
    const size_t element = t.data.size() / static_cast<size_t>(rows * cols);
    const int64_t half = cols / 2;
    v1::FetchResponse message;
    v1::FetchData* data = message.mutable_data();
    std::string bytes;
    for (auto [lo, hi] : {std::pair{int64_t{0}, half}, {half, cols}}) {
      std::string tile;
      for (int64_t r = 0; r < rows; ++r) {
        tile += t.data.substr(static_cast<size_t>(r * cols + lo) * element,
                              static_cast<size_t>(hi - lo) * element);
      }
      bytes += tile;
      data->add_part_bytes(tile.size());
      data->add_part_checksums(Checksum(tile));
      for (int64_t v : {int64_t{0}, lo, rows, hi}) data->add_tile_box(v);
    }
    data->set_data(bytes);
    data->set_band_rows(rows);
    fuzz::AppendRecord(message.SerializeAsString(), &out);
  }
  return out;
}

// Every .ckpt under `dir` (sorted, so that the corpus is the same from run to run).
std::vector<fs::path> CkptFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".ckpt") {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

void AddStrategy(const fs::path& out, const std::string& name, const std::string& bytes,
                 StrategyFormat format) {
  Write(out / (format == StrategyFormat::kJson ? "strategy_json" : "strategy_binary"), name, bytes);
  auto strategy = ParseStrategy(bytes, format);
  if (!strategy.ok()) return;
  Write(out / "strategy_binary", name + ".as_binary",
        SerializeStrategy(*strategy, StrategyFormat::kBinary));
  Write(out / "strategy_json", name + ".as_json",
        SerializeStrategy(*strategy, StrategyFormat::kJson));
}

int Main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: ckpt_fuzz_seeds SAMPLE_DIR FIXTURES_DIR OUT_DIR\n");
    return 2;
  }
  const fs::path sample = argv[1], fixtures = argv[2], out = argv[3];
  std::vector<fs::path> dirs = {sample};
  if (fs::is_directory(fixtures)) {
    dirs.push_back(fixtures);
  } else {
    printf("ckpt_fuzz_seeds: no MindSpore fixtures at %s; seeding from the sample only\n",
           fixtures.c_str());
  }
  std::string all_ranks;
  std::string all_ranks_batched;
  for (const fs::path& dir : dirs) {
    for (const fs::path& file : CkptFiles(dir)) {
      const std::string bytes = Read(file);
      const std::string name = SeedName(file);
      auto tensors = DecodeCkpt(bytes);
      if (!tensors.ok()) {
        // A strategy file (MindSpore names them .ckpt too) or a deliberately corrupt fixture:
        // still a decoder seed, and a strategy seed when it parses as one.
        Write(out / "ckpt_decode", name, bytes);
        if (ParseStrategy(bytes, StrategyFormat::kBinary).ok()) {
          AddStrategy(out, name, bytes, StrategyFormat::kBinary);
        }
        continue;
      }
      Write(out / "ckpt_decode", name, bytes);
      Write(out / "fetch_wire", name + ".rows", FetchStream(*tensors, false));
      Write(out / "fetch_wire", name + ".tiles", FetchStream(*tensors, true));
      // The same streams to a visitor that lends each tensor's memory (mode bit 2).
      for (const bool tiles : {false, true}) {
        std::string lent = FetchStream(*tensors, tiles);
        lent[0] = static_cast<char>(lent[0] | 2);
        Write(out / "fetch_wire", name + (tiles ? ".tiles.lent" : ".rows.lent"), lent);
      }
      // Sample rank files sit in rank_<r>/ and belong to the "demo" strategy of the upload
      // target; any other file is uploaded as a whole-tensor checkpoint.
      const std::string parent = file.parent_path().filename().string();
      std::string stream;
      if (dir == sample && parent.rfind("rank_", 0) == 0) {
        const int64_t rank = std::stoll(parent.substr(5));
        AppendUpload("ck", "demo", rank, *tensors, &stream);
        AppendUpload("all", "demo", rank, *tensors, &all_ranks);
        AppendUpload("batched", "demo", rank, *tensors, &all_ranks_batched, /*batched=*/true);
      } else {
        AppendUpload("whole", "", 0, *tensors, &stream);
      }
      Write(out / "upload", name, stream);
    }
  }
  if (!all_ranks.empty()) Write(out / "upload", "all_ranks", all_ranks);
  if (!all_ranks_batched.empty()) Write(out / "upload", "all_ranks_batched", all_ranks_batched);
  for (const auto& entry : fs::directory_iterator(sample)) {
    if (entry.path().extension() == ".json") {
      AddStrategy(out, entry.path().filename().string(), Read(entry.path()), StrategyFormat::kJson);
    }
  }
  for (const char* target :
       {"ckpt_decode", "strategy_binary", "strategy_json", "upload", "fetch_wire"}) {
    size_t n = 0;
    if (fs::is_directory(out / target)) {
      for (const auto& entry : fs::directory_iterator(out / target)) n += entry.is_regular_file();
    }
    printf("ckpt_fuzz_seeds: %zu seeds for %s\n", n, target);
  }
  return 0;
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) { return ckpt::Main(argc, argv); }
