#include "core/dtype.h"

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(DTypeTest, EveryMindSporeSpellingRoundTrips) {
  const std::pair<const char*, int> kAll[] = {
      {"Bool", 8},     {"Int8", 8},     {"UInt8", 8},     {"Int16", 16},  {"UInt16", 16},
      {"Int32", 32},   {"UInt32", 32},  {"Int64", 64},    {"UInt64", 64}, {"Float16", 16},
      {"Float32", 32}, {"Float64", 64}, {"BFloat16", 16}, {"Int4", 4},    {"str", 32}};
  for (const auto& [name, bits] : kAll) {
    auto dtype = ParseDType(name);
    ASSERT_TRUE(dtype.ok()) << name;
    EXPECT_EQ(DTypeName(*dtype), name);
    EXPECT_EQ(ElementBits(*dtype), bits) << name;
  }
}

TEST(DTypeTest, SpellingIsCaseSensitive) {
  auto s = ParseDType("float32");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("float32"), std::string::npos);
  EXPECT_FALSE(ParseDType("").ok());
  EXPECT_FALSE(ParseDType("Float32 ").ok());
}

TEST(DTypeTest, ByteSizes) {
  EXPECT_EQ(*ByteSizeOf(DType::kFloat32, 10), 40);
  EXPECT_EQ(*ByteSizeOf(DType::kBFloat16, 3), 6);
  EXPECT_EQ(*ByteSizeOf(DType::kBool, 7), 7);
  EXPECT_EQ(*ByteSizeOf(DType::kInt4, 6), 3);
  EXPECT_EQ(*ByteSizeOf(DType::kStr, 5), 20);
  EXPECT_EQ(*ByteSizeOf(DType::kFloat64, 0), 0);
  EXPECT_FALSE(ByteSizeOf(DType::kInt4, 5).ok());
  EXPECT_FALSE(ByteSizeOf(DType::kFloat64, int64_t{1} << 61).ok());
  EXPECT_FALSE(ByteSizeOf(DType::kFloat32, -1).ok());
}

}  // namespace
}  // namespace ckpt
