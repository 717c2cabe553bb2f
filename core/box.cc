#include "core/box.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "absl/strings/str_join.h"

namespace ckpt {

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b, std::string_view what) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " overflows int64 (", a, " * ", b, ")"));
  }
  return out;
}

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b, std::string_view what) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(what), " overflows int64 (", a, " + ", b, ")"));
  }
  return out;
}

absl::StatusOr<int64_t> NumElements(const Shape& shape) {
  int64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has a negative dim ", i));
    }
    int64_t next;
    if (__builtin_mul_overflow(n, shape[i], &next)) {  // the message is built only on overflow
      return CheckedMul(n, shape[i], absl::StrCat("element count of shape ", ShapeToString(shape)));
    }
    n = next;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

Box Box::Whole(const Shape& shape) {
  Box b;
  b.lo.assign(shape.size(), 0);
  b.hi = shape;
  return b;
}

Shape Box::shape() const {
  Shape s(lo.size());
  for (size_t i = 0; i < lo.size(); ++i) s[i] = hi[i] - lo[i];
  return s;
}

bool Box::empty() const {
  for (size_t i = 0; i < lo.size(); ++i) {
    if (hi[i] <= lo[i]) return true;
  }
  return false;
}

absl::StatusOr<int64_t> Box::Volume() const {
  if (empty()) return 0;
  int64_t n = 1;  // every extent is positive here
  for (size_t i = 0; i < lo.size(); ++i) {
    if (__builtin_mul_overflow(n, hi[i] - lo[i], &n)) return NumElements(shape());  // the error
  }
  return n;
}

bool Box::Contains(const Box& other) const {
  if (other.rank() != rank()) return false;
  for (size_t i = 0; i < lo.size(); ++i) {
    if (other.lo[i] < lo[i] || other.hi[i] > hi[i]) return false;
  }
  return true;
}

std::string Box::ToString() const {
  std::string out = "[";
  for (size_t i = 0; i < lo.size(); ++i) {
    absl::StrAppend(&out, i ? ", " : "", lo[i], ":", hi[i]);
  }
  out += "]";
  return out;
}

bool NextIndex(std::vector<int64_t>& index, const std::vector<int64_t>& lo,
               const std::vector<int64_t>& hi) {
  for (size_t d = index.size(); d-- > 0;) {
    if (++index[d] < hi[d]) return true;
    index[d] = lo[d];
  }
  return false;
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  Box out;
  if (!IntersectInto(a, b, &out)) return std::nullopt;
  return out;
}

bool IntersectInto(const Box& a, const Box& b, Box* out) {
  if (a.rank() != b.rank()) return false;
  out->lo.resize(a.rank());
  out->hi.resize(a.rank());
  for (size_t i = 0; i < a.rank(); ++i) {
    out->lo[i] = std::max(a.lo[i], b.lo[i]);
    out->hi[i] = std::min(a.hi[i], b.hi[i]);
    if (out->hi[i] <= out->lo[i]) return false;
  }
  return true;
}

}  // namespace ckpt
