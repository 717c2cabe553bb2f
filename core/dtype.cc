#include "core/dtype.h"

#include <array>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"

namespace ckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bits;
};

constexpr std::array<DTypeInfo, 15> kDTypes = {{
    {DType::kBool, "Bool", 8},
    {DType::kInt8, "Int8", 8},
    {DType::kUInt8, "UInt8", 8},
    {DType::kInt16, "Int16", 16},
    {DType::kUInt16, "UInt16", 16},
    {DType::kInt32, "Int32", 32},
    {DType::kUInt32, "UInt32", 32},
    {DType::kInt64, "Int64", 64},
    {DType::kUInt64, "UInt64", 64},
    {DType::kFloat16, "Float16", 16},
    {DType::kFloat32, "Float32", 32},
    {DType::kFloat64, "Float64", 64},
    {DType::kBFloat16, "BFloat16", 16},
    {DType::kInt4, "Int4", 4},
    {DType::kStr, "str", 32},
}};

}  // namespace

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tensor_type \"", Sv(name),
                   "\": expected one of Bool, Int8, UInt8, Int16, UInt16, Int32, UInt32, Int64, "
                   "UInt64, Float16, Float32, Float64, BFloat16, Int4, str"));
}

std::string_view DTypeName(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

int ElementBits(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].bits; }

absl::StatusOr<int64_t> ByteSizeOf(DType dtype, int64_t elements) {
  if (elements < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative element count ", elements));
  }
  const int bits = ElementBits(dtype);
  if (bits == 4) {
    if (elements % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Int4 tensors pack two elements per byte; an odd element count (", elements,
          ") cannot be stored"));
    }
    return elements / 2;
  }
  const int64_t bytes_per = bits / 8;
  if (elements > std::numeric_limits<int64_t>::max() / bytes_per) {
    return absl::InvalidArgumentError(absl::StrCat("byte size of ", elements, " ",
                                                   Sv(DTypeName(dtype)), " elements overflows int64"));
  }
  return elements * bytes_per;
}

}  // namespace ckpt
