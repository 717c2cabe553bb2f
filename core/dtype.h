// MindSpore tensor element types (the tensor_type strings of .ckpt files) and their sizes.
#ifndef CKPT_CORE_DTYPE_H_
#define CKPT_CORE_DTYPE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckpt {

// Every `tensor_type` spelling MindSpore writes into a .ckpt (case-sensitive).
enum class DType : uint8_t {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kFloat32,
  kFloat64,
  kBFloat16,
  kInt4,  // qint4x2: two 4-bit values packed per byte.
  kStr,   // numpy unicode: UTF-32LE, 4 bytes per character; only in verbatim scalars.
};

// Parses a MindSpore dtype string ("Float32", "BFloat16", "str", ...).
// INVALID_ARGUMENT naming the string when it is not one of them.
absl::StatusOr<DType> ParseDType(std::string_view name);

// The exact MindSpore spelling, e.g. "Float32".
std::string_view DTypeName(DType dtype);

// Bits per element: 4 for Int4, 32 for str (one UTF-32 code unit), else 8 × byte size.
int ElementBits(DType dtype);

// Bytes needed for `elements` elements, overflow-checked. Int4 needs an even count.
absl::StatusOr<int64_t> ByteSizeOf(DType dtype, int64_t elements);

}  // namespace ckpt

#endif  // CKPT_CORE_DTYPE_H_
