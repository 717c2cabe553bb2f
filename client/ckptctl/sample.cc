#include "client/ckptctl/sample.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/ckpt_format.h"
#include "core/reshard.h"
#include "core/status_macros.h"
#include "storage/file_stream.h"

namespace ckpt {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t NameHash(const std::string& name, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Appends the bytes of one row run [flat, flat + count) to `out`.
void AppendRun(uint64_t name_hash, int64_t flat, int64_t count, int elem_bytes, std::string* out) {
  for (int64_t e = 0; e < count; ++e) {
    const uint64_t v = Mix(name_hash + static_cast<uint64_t>(flat + e) * 0x2545F4914F6CDD1Dull);
    for (int b = 0; b < elem_bytes; ++b) out->push_back(static_cast<char>((v >> (8 * b)) & 0xff));
  }
}

Layout Map(std::vector<int32_t> map, std::vector<int32_t> stages, int64_t opt_size = 0) {
  Layout l;
  l.dev_matrix = {2, 2};
  for (int32_t m : map) l.tensor_map.push_back(m < 0 ? std::vector<int32_t>{} : std::vector<int32_t>{m});
  l.stages = std::move(stages);
  if (opt_size != 0) {
    l.opt_shard_size = opt_size;
    l.opt_shard_step = 1;
  }
  return l;
}

}  // namespace

uint8_t SampleByte(const std::string& name, int64_t flat, int byte, uint64_t seed) {
  const uint64_t v = Mix(NameHash(name, seed) + static_cast<uint64_t>(flat) * 0x2545F4914F6CDD1Dull);
  return static_cast<uint8_t>((v >> (8 * byte)) & 0xff);
}

std::string SampleSlice(const std::string& name, DType dtype, const Shape& global,
                        const Box& box, uint64_t seed) {
  Shape g = global;
  Box b = box;
  int elem_bytes = ElementBits(dtype) / 8;
  if (ElementBits(dtype) == 4) {  // Int4: generate the packed bytes directly
    g.back() /= 2;
    b.lo.back() /= 2;
    b.hi.back() /= 2;
    elem_bytes = 1;
  }
  std::string out;
  const uint64_t h = NameHash(name, seed);
  const size_t rank = g.size();
  if (rank == 0) {
    AppendRun(h, 0, 1, elem_bytes, &out);
    return out;
  }
  if (b.empty()) return out;
  out.reserve(static_cast<size_t>(*b.Volume()) * elem_bytes);
  // One run of the last dim per step over the outer dims.
  const int64_t run = b.extent(rank - 1);
  std::vector<int64_t> idx = b.lo;
  std::vector<int64_t> outer_hi = b.hi;
  outer_hi[rank - 1] = b.lo[rank - 1] + 1;
  do {
    int64_t flat = 0;
    for (size_t i = 0; i < rank; ++i) flat = flat * g[i] + idx[i];
    AppendRun(h, flat, run, elem_bytes, &out);
  } while (NextIndex(idx, b.lo, outer_hi));
  return out;
}

namespace {

absl::Status WriteScalars(CkptWriter& writer) {
  const int32_t step = 10;
  CKPT_RETURN_IF_ERROR(writer.WriteTensor(
      "global_step", DType::kInt32, {}, std::string_view(reinterpret_cast<const char*>(&step), 4)));
  const float lr = 0.001f;
  return writer.WriteTensor("learning_rate", DType::kFloat32, {},
                            std::string_view(reinterpret_cast<const char*>(&lr), 4));
}

}  // namespace

absl::Status WriteShardedSample(const Strategy& strategy, const std::vector<SampleTensor>& tensors,
                                const std::string& dir, const SampleOptions& options) {
  for (int64_t g = 0; g < strategy.world_size(); ++g) {
    const int32_t stage = static_cast<int32_t>(g / strategy.devices_per_stage());
    const int64_t local = g % strategy.devices_per_stage();
    const std::string rank_dir = absl::StrCat(dir, "/rank_", g);
    std::error_code ec;
    std::filesystem::create_directories(rank_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", rank_dir, ": ", ec.message()));
    CKPT_ASSIGN_OR_RETURN(auto sink, AtomicFileSink::Create(rank_dir + "/" + options.file_name));
    CkptWriter writer(sink.get());
    for (const SampleTensor& t : tensors) {
      const StrategyParam* p = strategy.Find(t.name);
      // Optimizer states share their weight's layout (strategies usually omit them).
      std::string weight;
      if (!p && IsOptimizerStateName(t.name, &weight)) p = strategy.Find(weight);
      Box box = Box::Whole(t.global_shape);
      if (p) {
        if (std::find(p->layout.stages.begin(), p->layout.stages.end(), stage) ==
            p->layout.stages.end()) {
          continue;
        }
        CKPT_RETURN_IF_ERROR(p->layout.Validate(t.global_shape));
        CKPT_ASSIGN_OR_RETURN(box, p->layout.SliceBox(t.global_shape, local));
      }
      const std::string bytes = SampleSlice(t.name, t.dtype, t.global_shape, box, options.seed);
      CKPT_RETURN_IF_ERROR(writer.WriteTensor(t.name, t.dtype, box.shape(), bytes));
    }
    if (options.verbatim_scalars) CKPT_RETURN_IF_ERROR(WriteScalars(writer));
    CKPT_RETURN_IF_ERROR(writer.Finish());
    CKPT_RETURN_IF_ERROR(sink->Commit());
  }
  return absl::OkStatus();
}

absl::Status WriteWholeSample(const std::vector<SampleTensor>& tensors, const std::string& file,
                              const SampleOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto sink, AtomicFileSink::Create(file));
  CkptWriter writer(sink.get());
  for (const SampleTensor& t : tensors) {
    const Box box = Box::Whole(t.global_shape);
    CKPT_RETURN_IF_ERROR(writer.WriteTensor(
        t.name, t.dtype, t.global_shape,
        SampleSlice(t.name, t.dtype, t.global_shape, box, options.seed)));
  }
  if (options.verbatim_scalars) CKPT_RETURN_IF_ERROR(WriteScalars(writer));
  CKPT_RETURN_IF_ERROR(writer.Finish());
  return sink->Commit();
}

Strategy DemoSourceStrategy() {
  std::map<std::string, StrategyParam> params;
  params["embedding.word_embedding.embedding_table"].layout = Map({0, -1}, {0, 1});
  params["layers.0.attention.dense.weight"].layout = Map({0, -1}, {0});
  params["layers.0.attention.dense.bias"].layout = Map({0}, {0});
  params["layers.0.output.weight"].layout = Map({-1, 0}, {0});
  params["layers.0.norm.gamma"].layout = Map({-1}, {0});
  params["layers.1.attention.dense.weight"].layout = Map({1, 0}, {1});
  params["layers.1.ffn.weight"].layout = Map({0, -1}, {1}, /*opt_size=*/2);
  params["layers.1.norm.gamma"].layout = Map({-1}, {1});
  return *Strategy::Create(std::move(params), 2);
}

std::vector<SampleTensor> DemoTensors() {
  return {
      {"embedding.word_embedding.embedding_table", DType::kFloat32, {96, 24}},
      {"layers.0.attention.dense.weight", DType::kBFloat16, {48, 24}},
      {"layers.0.attention.dense.bias", DType::kFloat32, {48}},
      {"layers.0.output.weight", DType::kFloat16, {48, 24}},
      {"layers.0.norm.gamma", DType::kFloat32, {24}},
      {"adam_m.layers.0.attention.dense.weight", DType::kFloat32, {48, 24}},
      {"layers.1.attention.dense.weight", DType::kFloat32, {48, 24}},
      {"layers.1.ffn.weight", DType::kFloat32, {48, 24}},
      {"layers.1.norm.gamma", DType::kFloat32, {24}},
  };
}

Strategy DemoDestinationStrategy() {
  auto l = [](std::vector<int32_t> map) {
    Layout x;
    x.dev_matrix = {3};
    for (int32_t m : map) x.tensor_map.push_back(m < 0 ? std::vector<int32_t>{} : std::vector<int32_t>{m});
    return x;
  };
  std::map<std::string, StrategyParam> params;
  params["embedding.word_embedding.embedding_table"].layout = l({0, -1});
  params["layers.0.attention.dense.weight"].layout = l({0, -1});
  params["layers.0.attention.dense.bias"].layout = l({0});
  params["layers.0.output.weight"].layout = l({-1, 0});
  params["layers.0.norm.gamma"].layout = l({-1});
  params["layers.1.attention.dense.weight"].layout = l({-1, 0});
  params["layers.1.ffn.weight"].layout = l({0, -1});
  params["layers.1.norm.gamma"].layout = l({-1});
  return *Strategy::Create(std::move(params), 1);
}

}  // namespace ckpt
