// N-d strided copy between row-major buffers. Inner contiguous runs are coalesced and moved with
// memcpy; nothing is allocated.
#ifndef CKPT_CORE_STRIDED_COPY_H_
#define CKPT_CORE_STRIDED_COPY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "core/box.h"
#include "core/dtype.h"

namespace ckpt {

// Copies the region of shape `extent` starting at `src_offset` inside the row-major array `src`
// of shape `src_shape`, to `dst_offset` inside the row-major array `dst` of shape `dst_shape`.
// Each element is `elem_bytes` bytes. INVALID_ARGUMENT (naming the dim) when ranks differ or the
// region leaves either array.
absl::Status CopyRegion(const char* src, const Shape& src_shape,
                        const std::vector<int64_t>& src_offset, char* dst, const Shape& dst_shape,
                        const std::vector<int64_t>& dst_offset, const Shape& extent,
                        int64_t elem_bytes);

// Same, but the arrays are boxes of one global tensor and the region is given in global
// coordinates: copies `region` (which must lie inside both boxes) from the buffer holding
// `src_box` into the buffer holding `dst_box`. Handles Int4 (two elements per byte) when every
// boundary on the last dim is even; INVALID_ARGUMENT otherwise.
absl::Status CopyBoxRegion(DType dtype, const char* src, const Box& src_box, char* dst,
                           const Box& dst_box, const Box& region);

}  // namespace ckpt

#endif  // CKPT_CORE_STRIDED_COPY_H_
