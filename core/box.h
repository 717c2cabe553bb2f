// Axis-aligned boxes of a global tensor: every slice a rank stores is one
// (docs/design.md, "Model" and "Re-sharding").
#ifndef CKPT_CORE_BOX_H_
#define CKPT_CORE_BOX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt {

using Shape = std::vector<int64_t>;

// Overflow-checked arithmetic on element and byte counts. INVALID_ARGUMENT naming `what`.
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, std::string_view what);
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, std::string_view what);
// Product of all dims (1 for a scalar); rejects negative dims and overflow.
absl::StatusOr<int64_t> NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);

// Per-dim half-open ranges [lo[i], hi[i]). A rank-0 box is the single element of a scalar.
// Value type; not thread-safe to mutate concurrently.
struct Box {
  std::vector<int64_t> lo;
  std::vector<int64_t> hi;

  static Box Whole(const Shape& shape);

  size_t rank() const { return lo.size(); }
  int64_t extent(size_t dim) const { return hi[dim] - lo[dim]; }
  Shape shape() const;
  bool empty() const;  // some dim has hi <= lo
  // Number of elements, overflow-checked.
  absl::StatusOr<int64_t> Volume() const;
  bool Contains(const Box& other) const;
  // "[lo0:hi0, lo1:hi1]".
  std::string ToString() const;

  friend bool operator==(const Box& a, const Box& b) = default;
  friend auto operator<=>(const Box& a, const Box& b) = default;
};

// Steps `index` to the next point of the box [lo, hi) in row-major order (last dim fastest);
// returns false, with `index` back at `lo`, after the last point. Start with index = lo.
bool NextIndex(std::vector<int64_t>& index, const std::vector<int64_t>& lo,
               const std::vector<int64_t>& hi);

// The common part of two boxes of equal rank, or nullopt when they do not overlap.
std::optional<Box> Intersect(const Box& a, const Box& b);
// The same into `*out`, reusing its storage (hot loops): false, `*out` unspecified, when the
// boxes do not overlap or differ in rank.
bool IntersectInto(const Box& a, const Box& b, Box* out);

}  // namespace ckpt

#endif  // CKPT_CORE_BOX_H_
