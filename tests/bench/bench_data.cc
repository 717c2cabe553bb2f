#include "tests/bench/bench_data.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/ckpt_format.h"
#include "core/status_macros.h"
#include "storage/file_stream.h"

namespace ckpt::bench {
namespace {

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t NameSeed(const std::string& name) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
  return Mix(h);
}

uint64_t BlockKey(uint64_t seed, int64_t row, int64_t block) {
  return Mix(seed ^ (static_cast<uint64_t>(row) * 0xD6E8FEB86659FD93ull) ^
             (static_cast<uint64_t>(block + 1) * 0xA0761D6478BD642Full));
}

Layout MakeLayout(std::vector<int64_t> dev_matrix, std::vector<int32_t> map, int64_t opt_size = 0) {
  Layout l;
  l.dev_matrix = std::move(dev_matrix);
  for (int32_t m : map) {
    l.tensor_map.push_back(m < 0 ? std::vector<int32_t>{} : std::vector<int32_t>{m});
  }
  if (opt_size != 0) {
    l.opt_shard_size = opt_size;
    l.opt_shard_step = 1;
  }
  return l;
}

Strategy MakeStrategy(const BenchSpec& spec, const Layout& row_layout, const Layout& opt_layout) {
  std::map<std::string, StrategyParam> params;
  for (const BenchTensor& t : spec.tensors) {
    StrategyParam& p = params[t.name];
    p.layout = t.opt_sharded ? opt_layout : row_layout;
    p.tensor_shape = t.shape();
  }
  auto s = Strategy::Create(std::move(params), 1);
  if (!s.ok()) {
    // The layouts above are fixed and the shapes built to fit them: a failure is a bench bug.
    fprintf(stderr, "ckpt_bench: bad built-in strategy: %s\n", s.status().ToString().c_str());
    std::abort();
  }
  return *std::move(s);
}

absl::Status WriteRank(const BenchSpec& spec, const Strategy& source, int64_t rank,
                       const std::string& dir) {
  const std::string rank_dir = absl::StrCat(dir, "/rank_", rank);
  std::error_code ec;
  std::filesystem::create_directories(rank_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", rank_dir, ": ", ec.message()));
  CKPT_ASSIGN_OR_RETURN(auto sink, AtomicFileSink::Create(rank_dir + "/" + kRankFileName));
  CkptWriter writer(sink.get());
  std::string buffer;
  for (const BenchTensor& t : spec.tensors) {
    const StrategyParam* p = source.Find(t.name);
    if (p == nullptr) return absl::InternalError(absl::StrCat("no layout for ", t.name));
    const int64_t local = rank % source.devices_per_stage();
    CKPT_ASSIGN_OR_RETURN(Box box, p->layout.SliceBox(t.shape(), local));
    const int64_t seg = (box.hi[1] - box.lo[1]) * t.element_bytes;
    const int64_t total = seg * (box.hi[0] - box.lo[0]);
    CKPT_RETURN_IF_ERROR(writer.BeginTensor(t.name, t.dtype, box.shape(), total));
    const int64_t rows_per_piece = std::max<int64_t>(1, (int64_t{1} << 20) / seg);
    for (int64_t r = box.lo[0]; r < box.hi[0]; r += rows_per_piece) {
      const int64_t n = std::min(rows_per_piece, box.hi[0] - r);
      buffer.resize(static_cast<size_t>(n * seg));
      for (int64_t i = 0; i < n; ++i) {
        FillRow(t, r + i, box.lo[1] * t.element_bytes, box.hi[1] * t.element_bytes,
                buffer.data() + i * seg);
      }
      CKPT_RETURN_IF_ERROR(writer.Append(buffer));
    }
  }
  // Verbatim scalars, as a training job saves them (copied unchanged by every transform).
  const int32_t step = 1000;
  CKPT_RETURN_IF_ERROR(writer.WriteTensor(
      "global_step", DType::kInt32, {}, std::string_view(reinterpret_cast<const char*>(&step), 4)));
  const float lr = 0.0001f;
  CKPT_RETURN_IF_ERROR(writer.WriteTensor("learning_rate", DType::kFloat32, {},
                                          std::string_view(reinterpret_cast<const char*>(&lr), 4)));
  CKPT_RETURN_IF_ERROR(writer.Finish());
  return sink->Commit();
}

BenchTensor MakeTensor(std::string name, bool opt_sharded, int64_t kind, int64_t rows,
                       int64_t cols) {
  static constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  static constexpr int kBytes[] = {4, 2, 2};
  BenchTensor t;
  t.opt_sharded = opt_sharded;
  t.name = std::move(name);
  t.dtype = kDTypes[kind % 3];
  t.element_bytes = kBytes[kind % 3];
  t.cols = cols;
  t.rows = rows;
  t.seed = NameSeed(t.name);
  auto pattern = std::make_shared<std::array<uint64_t, 512>>();
  for (size_t w = 0; w < pattern->size(); ++w) {
    (*pattern)[w] = Mix(t.seed + (w + 1) * 0x9E3779B97F4A7C15ull);
  }
  t.pattern = std::move(pattern);
  return t;
}

void AddTensor(BenchSpec* spec, BenchTensor t) {
  spec->total_bytes += t.bytes();
  spec->index.emplace(t.name, spec->tensors.size());
  spec->tensors.push_back(std::move(t));
}

}  // namespace

const BenchTensor* BenchSpec::Find(const std::string& name) const {
  auto it = index.find(name);
  return it == index.end() ? nullptr : &tensors[it->second];
}

std::string BenchSpec::Describe() const {
  std::map<std::string, int> by_dtype;
  int64_t largest = 0;
  for (const BenchTensor& t : tensors) {
    ++by_dtype[std::string(DTypeName(t.dtype))];
    largest = std::max(largest, t.bytes());
  }
  std::string out = absl::StrCat(tensors.size(), " tensors (");
  bool first = true;
  for (const auto& [name, n] : by_dtype) {
    absl::StrAppend(&out, first ? "" : ", ", name, " x", n);
    first = false;
  }
  absl::StrAppend(&out, absl::StrFormat("; largest %.1f MiB), %.3f GiB",
                                        static_cast<double>(largest) / (1 << 20),
                                        static_cast<double>(total_bytes) / (1 << 30)));
  return out;
}

BenchSpec MakeSpec(int64_t size_bytes) {
  const int64_t target =
      std::clamp<int64_t>(size_bytes / 64, int64_t{128} << 10, int64_t{48} << 20);
  int64_t count = std::max<int64_t>(8, (size_bytes + target / 2) / target);
  count += count % 2;
  static constexpr int64_t kCols[] = {4096, 2048, 5120, 3072};
  BenchSpec spec;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = i / 2;
    const bool opt = (i % 2) == 1;
    BenchTensor t = MakeTensor(absl::StrFormat("%s.%03d.weight", opt ? "opt" : "row", i), opt, k, 0,
                               kCols[k % 4]);
    const int64_t rows = (target / t.row_bytes() + 12) / 24 * 24;
    t.rows = std::max<int64_t>(24, rows);
    AddTensor(&spec, std::move(t));
  }
  return spec;
}

BenchSpec MakeManySpec(int64_t size_bytes, int64_t count) {
  count = std::max<int64_t>(200, count + count % 2);
  const int64_t large_count = count / 100;
  static constexpr int64_t kSmallCols[] = {8, 16, 32, 64};
  BenchSpec spec;
  std::vector<int64_t> large;  // positions of the large tensors, sized once the small are known
  for (int64_t i = 0; i < count; ++i) {
    const int64_t k = i / 2;
    const bool opt = (i % 2) == 1;
    std::string name = absl::StrFormat("%s.%05d.weight", opt ? "opt" : "row", i);
    if (i % 100 == 50) {
      large.push_back(i);
      spec.tensors.push_back(MakeTensor(std::move(name), opt, k, 24, 1024));
    } else {
      spec.tensors.push_back(MakeTensor(std::move(name), opt, k, 24, kSmallCols[(k / 3) % 4]));
    }
  }
  int64_t small_bytes = 0;
  for (const BenchTensor& t : spec.tensors) small_bytes += t.bytes();
  const int64_t per_large =
      std::max<int64_t>(0, size_bytes - small_bytes) / std::max<int64_t>(1, large_count);
  for (int64_t i : large) {
    BenchTensor& t = spec.tensors[static_cast<size_t>(i)];
    t.rows = std::max<int64_t>(24, (per_large / t.row_bytes() + 12) / 24 * 24);
  }
  // Every tensor's bytes still differ from every other's (the row keys depend on its seed), but
  // the tensors share kManyPatterns patterns: 4 KiB of pattern per tensor would make the sampled
  // checks of a fetch of 20,000 of them a cache miss each, a per-tensor cost the harness would
  // add to the client's CPU that the large-tensor case does not pay.
  constexpr size_t kManyPatterns = 64;
  for (size_t i = kManyPatterns; i < spec.tensors.size(); ++i) {
    spec.tensors[i].pattern = spec.tensors[i % kManyPatterns].pattern;
  }
  std::vector<BenchTensor> tensors = std::move(spec.tensors);
  spec.tensors.clear();
  for (BenchTensor& t : tensors) AddTensor(&spec, std::move(t));
  return spec;
}

Strategy SourceStrategy(const BenchSpec& spec) {
  return MakeStrategy(spec, MakeLayout({8}, {0, -1}), MakeLayout({4, 2}, {1, -1}, 2));
}

Strategy ThreeRankStrategy(const BenchSpec& spec) {
  const Layout rows = MakeLayout({3}, {0, -1});
  return MakeStrategy(spec, rows, rows);
}

Strategy SixRankStrategy(const BenchSpec& spec) {
  const Layout rows = MakeLayout({6}, {0, -1});
  return MakeStrategy(spec, rows, rows);
}

Strategy ColumnStrategy(const BenchSpec& spec) {
  const Layout cols = MakeLayout({8}, {-1, 0});
  return MakeStrategy(spec, cols, cols);
}

Strategy StormStrategy(const BenchSpec& spec) {
  return MakeStrategy(spec, MakeLayout({8, 8}, {-1, 0}), MakeLayout({8, 8}, {0, -1}));
}

Strategy PlainStrategy(const BenchSpec& spec) {
  return MakeStrategy(spec, MakeLayout({8}, {0, -1}), MakeLayout({4, 2}, {1, -1}));
}

void FillRow(const BenchTensor& t, int64_t row, int64_t byte_lo, int64_t byte_hi, char* out) {
  if (byte_hi <= byte_lo) return;
  thread_local std::vector<uint64_t> scratch;
  const int64_t w0 = byte_lo >> 3;
  const int64_t w1 = (byte_hi + 7) >> 3;
  scratch.resize(static_cast<size_t>(w1 - w0));
  const uint64_t* p = t.pattern->data();
  uint64_t* s = scratch.data();
  for (int64_t w = w0; w < w1;) {
    const int64_t block = w >> 9;
    const int64_t end = std::min(w1, (block + 1) << 9);
    const uint64_t key = BlockKey(t.seed, row, block);
    for (; w < end; ++w) s[w - w0] = p[w & 511] ^ key;
  }
  std::memcpy(out, reinterpret_cast<const char*>(s) + (byte_lo & 7),
              static_cast<size_t>(byte_hi - byte_lo));
}

std::string SliceBytes(const BenchTensor& t, const Box& box) {
  const int64_t seg = (box.hi[1] - box.lo[1]) * t.element_bytes;
  std::string out(static_cast<size_t>(seg * (box.hi[0] - box.lo[0])), '\0');
  for (int64_t r = box.lo[0]; r < box.hi[0]; ++r) {
    FillRow(t, r, box.lo[1] * t.element_bytes, box.hi[1] * t.element_bytes,
            out.data() + (r - box.lo[0]) * seg);
  }
  return out;
}

uint8_t ExpectedByte(const BenchTensor& t, int64_t row, int64_t byte_in_row) {
  const int64_t w = byte_in_row >> 3;
  const uint64_t word = (*t.pattern)[w & 511] ^ BlockKey(t.seed, row, w >> 9);
  return static_cast<uint8_t>(word >> (8 * (byte_in_row & 7)));
}

absl::StatusOr<int64_t> WriteSourceCheckpoint(const BenchSpec& spec, const Strategy& source,
                                              const std::string& dir, int threads) {
  const int64_t world = source.world_size();
  std::atomic<int64_t> next{0};
  std::vector<absl::Status> errors(static_cast<size_t>(world));
  std::vector<std::thread> pool;
  for (int i = 0; i < std::max(1, threads); ++i) {
    pool.emplace_back([&] {
      for (int64_t r = next++; r < world; r = next++) {
        errors[static_cast<size_t>(r)] = WriteRank(spec, source, r, dir);
      }
    });
  }
  for (auto& th : pool) th.join();
  int64_t bytes = 0;
  for (int64_t r = 0; r < world; ++r) {
    CKPT_RETURN_IF_ERROR(errors[static_cast<size_t>(r)]);
    bytes += static_cast<int64_t>(
        std::filesystem::file_size(absl::StrCat(dir, "/rank_", r, "/", kRankFileName)));
  }
  return bytes;
}

absl::Status SliceChecker::Check(int64_t slice_offset, uint8_t got) {
  const Box& box = *box_;
  const int64_t seg = (box.hi[1] - box.lo[1]) * tensor_->element_bytes;
  const int64_t row = box.lo[0] + slice_offset / seg;
  const int64_t byte = box.lo[1] * tensor_->element_bytes + slice_offset % seg;
  const uint8_t want = ExpectedByte(*tensor_, row, byte);
  if (got != want) {
    return absl::InternalError(absl::StrFormat(
        "wrong byte in %s slice %s: global row %d byte %d is 0x%02x, expected 0x%02x",
        tensor_->name, box.ToString(), row, byte, got, want));
  }
  ++checked_;
  return absl::OkStatus();
}

absl::Status SliceChecker::Feed(std::string_view piece) {
  const int64_t n = static_cast<int64_t>(piece.size());
  if (n > 0) {
    const auto at = [&](int64_t i) { return static_cast<uint8_t>(piece[static_cast<size_t>(i)]); };
    CKPT_RETURN_IF_ERROR(Check(offset_, at(0)));
    CKPT_RETURN_IF_ERROR(Check(offset_ + n / 2, at(n / 2)));
    CKPT_RETURN_IF_ERROR(Check(offset_ + n - 1, at(n - 1)));
    // One run at a position that moves from piece to piece, 256 bytes per MiB of the piece (up
    // to 256): the client hands over pieces of any size, so the checks stay in proportion.
    const int64_t run = std::min<int64_t>(n, std::clamp<int64_t>(n >> 12, 1, 256));
    const int64_t start = static_cast<int64_t>(Mix(static_cast<uint64_t>(offset_)) %
                                               static_cast<uint64_t>(n - run + 1));
    for (int64_t i = start; i < start + run; ++i) CKPT_RETURN_IF_ERROR(Check(offset_ + i, at(i)));
  }
  offset_ += n;
  return absl::OkStatus();
}

}  // namespace ckpt::bench
