// The benchmark's checkpoint: tensor list, strategies and a fast deterministic byte generator.
//
// Every byte of every global tensor is a pure function of (tensor seed, row, byte within the row):
// the row is cut into 8-byte words, word w of row r is P[w mod 512] XOR K(r, w / 512), where P is
// a 4 KiB pattern (per tensor, or shared by several) and K a hash of the tensor's seed, the row
// and the 4 KiB block. Filling is a word-wise XOR (fast enough for checkpoints of GiBs, unlike the
// per-element hash of ckptctl's sample generator), and any single byte can be recomputed to check
// a fetched slice without keeping the global tensor. A misplaced row, column band or 4 KiB block
// changes the expected bytes.
#ifndef CKPT_TESTS_BENCH_BENCH_DATA_H_
#define CKPT_TESTS_BENCH_BENCH_DATA_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/box.h"
#include "core/dtype.h"
#include "core/strategy.h"

namespace ckpt::bench {

// One 2-D tensor of the benchmark checkpoint. Value type.
struct BenchTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  int element_bytes = 4;
  // Optimizer-sharded at the source ("opt.*"), else a plain 8-way row split ("row.*").
  bool opt_sharded = false;
  uint64_t seed = 0;
  // P: from the seed, or shared with other tensors (MakeManySpec, the growth case's tensors)
  std::shared_ptr<const std::array<uint64_t, 512>> pattern;

  Shape shape() const { return {rows, cols}; }
  int64_t row_bytes() const { return cols * element_bytes; }
  int64_t bytes() const { return rows * row_bytes(); }
};

// The whole checkpoint. Deterministic in the requested size.
struct BenchSpec {
  std::vector<BenchTensor> tensors;
  int64_t total_bytes = 0;  // sum of the global tensors' bytes
  // Name -> index into `tensors`, filled by the Make*Spec functions (Find is looked up once per
  // delivered tensor, so it must not be linear in a checkpoint of tens of thousands of tensors).
  std::unordered_map<std::string, size_t> index;

  const BenchTensor* Find(const std::string& name) const;
  std::string Describe() const;  // "64 tensors (Float32 x22, ...), 2.00 GiB"
};

// About `size_bytes` of 2-D tensors (a few tens of MiB each at the default 2 GiB; at least 8 and
// never below 24 rows): Float32, BFloat16 and Float16; half "row.NNN.weight" (8-way row split),
// half "opt.NNN.weight" (4-way row split, optimizer-sharded 2 ways). Rows are multiples of 24 and
// columns of 8, so every destination below divides them.
BenchSpec MakeSpec(int64_t size_bytes);

// `count` 2-D tensors (even, at least 200), for the many-tensors case: every 100th a large one
// (the large ones share what the small ones leave of `size_bytes`, at least 24 rows of 1024
// columns each), the others small (24 rows of 8 to 64 columns: 384 bytes to 6 KiB), in the dtypes
// and the row/opt alternation of MakeSpec. Named "row.NNNNN.weight" / "opt.NNNNN.weight". The
// tensors share 64 patterns (P above), so that checking sampled bytes of each of thousands of
// tensors does not touch 4 KiB of pattern per tensor.
BenchSpec MakeManySpec(int64_t size_bytes, int64_t count);

// 8 source ranks, one stage: row.* dev_matrix [8] map [0,-1]; opt.* dev_matrix [4,2] map [1,-1]
// with opt_weight_shard_size 2 (step 1).
Strategy SourceStrategy(const BenchSpec& spec);
// 3 ranks, every tensor row-split (dev_matrix [3], map [0,-1]).
Strategy ThreeRankStrategy(const BenchSpec& spec);
// 6 ranks, every tensor row-split (dev_matrix [6], map [0,-1]).
Strategy SixRankStrategy(const BenchSpec& spec);
// 8 ranks, every tensor column-split (dev_matrix [8], map [-1,0]).
Strategy ColumnStrategy(const BenchSpec& spec);
// The source layouts without the optimizer shard (what inference loads).
Strategy PlainStrategy(const BenchSpec& spec);
// 64 ranks: dev_matrix [8, 8], data-parallel replicas (outer axis, splitting nothing) of 8
// tensor-parallel groups (inner axis): row.* split by columns (map [-1,0]), opt.* by rows
// (map [0,-1]). Ranks r and r + 8k hold the same slices.
Strategy StormStrategy(const BenchSpec& spec);

// Bytes [byte_lo, byte_hi) of global row `row` of `t`, into `out`.
void FillRow(const BenchTensor& t, int64_t row, int64_t byte_lo, int64_t byte_hi, char* out);
// The row-major bytes of `box` (global coordinates) of `t`.
std::string SliceBytes(const BenchTensor& t, const Box& box);
// One expected byte: global row, byte within the row.
uint8_t ExpectedByte(const BenchTensor& t, int64_t row, int64_t byte_in_row);

// The rank file name inside DIR/rank_<r>/.
inline constexpr char kRankFileName[] = "bench-1_1.ckpt";
// Writes DIR/rank_<r>/bench-1_1.ckpt for every rank of `source` (MindSpore layout: every
// tensor's local slice in spec order, then the verbatim scalars global_step and learning_rate),
// `threads` ranks at a time. Returns the bytes written.
absl::StatusOr<int64_t> WriteSourceCheckpoint(const BenchSpec& spec, const Strategy& source,
                                              const std::string& dir, int threads);

// Checks sampled bytes of one delivered slice against the generator. Feed the slice's bytes in
// order, in any pieces; every piece gets a few single bytes and one run (of up to 256 bytes, in
// proportion to its size) checked. Not thread-safe.
class SliceChecker {
 public:
  // `tensor` and `box` (the slice's, in global coordinates) must outlive the checker.
  SliceChecker(const BenchTensor* tensor, const Box* box) : tensor_(tensor), box_(box) {}
  // INTERNAL naming the tensor, global row and byte on the first mismatch.
  absl::Status Feed(std::string_view piece);
  int64_t bytes_checked() const { return checked_; }
  int64_t offset() const { return offset_; }

 private:
  absl::Status Check(int64_t slice_offset, uint8_t got);

  const BenchTensor* tensor_;
  const Box* box_;
  int64_t offset_ = 0;
  int64_t checked_ = 0;
};

}  // namespace ckpt::bench

#endif  // CKPT_TESTS_BENCH_BENCH_DATA_H_
