#include "core/strided_copy.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

absl::Status CheckRegion(const char* which, const Shape& shape,
                         const std::vector<int64_t>& offset, const Shape& extent) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (offset[i] < 0 || extent[i] < 0 || offset[i] > shape[i] ||
        extent[i] > shape[i] - offset[i]) {
      return absl::InvalidArgumentError(absl::StrCat(
          which, " region dim ", i, " [", offset[i], ", ", offset[i] + extent[i],
          ") leaves the array of shape ", ShapeToString(shape)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyRegion(const char* src, const Shape& src_shape,
                        const std::vector<int64_t>& src_offset, char* dst, const Shape& dst_shape,
                        const std::vector<int64_t>& dst_offset, const Shape& extent,
                        int64_t elem_bytes) {
  const size_t rank = extent.size();
  if (src_shape.size() != rank || dst_shape.size() != rank || src_offset.size() != rank ||
      dst_offset.size() != rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "strided copy rank mismatch: extent has ", rank, " dims, source ", src_shape.size(),
        ", destination ", dst_shape.size()));
  }
  if (elem_bytes < 1) return absl::InvalidArgumentError("element size must be >= 1 byte");
  if (auto s = CheckRegion("source", src_shape, src_offset, extent); !s.ok()) return s;
  if (auto s = CheckRegion("destination", dst_shape, dst_offset, extent); !s.ok()) return s;
  if (rank == 0) {
    std::memcpy(dst, src, elem_bytes);
    return absl::OkStatus();
  }
  for (int64_t e : extent) {
    if (e == 0) return absl::OkStatus();
  }

  // Byte strides of both arrays.
  std::vector<int64_t> src_stride(rank), dst_stride(rank);
  src_stride[rank - 1] = dst_stride[rank - 1] = elem_bytes;
  for (size_t i = rank - 1; i-- > 0;) {
    src_stride[i] = src_stride[i + 1] * src_shape[i + 1];
    dst_stride[i] = dst_stride[i + 1] * dst_shape[i + 1];
  }
  // Coalesce trailing dims that are whole in both arrays into one contiguous run: dims
  // [outer, rank) are copied by one memcpy of run_bytes.
  size_t outer = rank - 1;
  int64_t run_bytes = extent[rank - 1] * elem_bytes;
  while (outer > 0 && extent[outer] == src_shape[outer] && extent[outer] == dst_shape[outer]) {
    --outer;
    run_bytes *= extent[outer];
  }

  int64_t src_pos = 0, dst_pos = 0;
  for (size_t i = 0; i < rank; ++i) {
    src_pos += src_offset[i] * src_stride[i];
    dst_pos += dst_offset[i] * dst_stride[i];
  }
  // Odometer over dims [0, outer).
  std::vector<int64_t> index(outer, 0);
  while (true) {
    std::memcpy(dst + dst_pos, src + src_pos, run_bytes);
    size_t d = outer;
    while (d > 0) {
      --d;
      if (++index[d] < extent[d]) {
        src_pos += src_stride[d];
        dst_pos += dst_stride[d];
        break;
      }
      src_pos -= (extent[d] - 1) * src_stride[d];
      dst_pos -= (extent[d] - 1) * dst_stride[d];
      index[d] = 0;
      if (d == 0) return absl::OkStatus();
    }
    if (outer == 0) return absl::OkStatus();
  }
}

absl::Status CopyBoxRegion(DType dtype, const char* src, const Box& src_box, char* dst,
                           const Box& dst_box, const Box& region) {
  if (!src_box.Contains(region) || !dst_box.Contains(region)) {
    return absl::InvalidArgumentError(absl::StrCat("copy region ", region.ToString(),
                                                   " is not inside both the source slice ",
                                                   src_box.ToString(), " and the destination ",
                                                   dst_box.ToString()));
  }
  const size_t rank = region.rank();
  std::vector<int64_t> src_off(rank), dst_off(rank);
  for (size_t i = 0; i < rank; ++i) {
    src_off[i] = region.lo[i] - src_box.lo[i];
    dst_off[i] = region.lo[i] - dst_box.lo[i];
  }
  Shape src_shape = src_box.shape(), dst_shape = dst_box.shape(), extent = region.shape();
  int64_t elem_bytes = ElementBits(dtype) / 8;
  if (ElementBits(dtype) == 4) {
    // Two Int4 values share a byte: copy bytes, which needs even boundaries on the last dim.
    if (rank == 0) return absl::InvalidArgumentError("an Int4 scalar cannot be stored");
    const size_t last = rank - 1;
    for (int64_t v : {src_shape[last], dst_shape[last], src_off[last], dst_off[last],
                      extent[last]}) {
      if (v % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Int4 tensors pack two values per byte; the slice boundaries on the last dim (",
            region.ToString(), " of ", src_box.ToString(), " -> ", dst_box.ToString(),
            ") must be even"));
      }
    }
    src_shape[last] /= 2;
    dst_shape[last] /= 2;
    src_off[last] /= 2;
    dst_off[last] /= 2;
    extent[last] /= 2;
    elem_bytes = 1;
  }
  return CopyRegion(src, src_shape, src_off, dst, dst_shape, dst_off, extent, elem_bytes);
}

}  // namespace ckpt
