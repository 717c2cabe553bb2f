// core/checksum.h: the stored and wire checksum algorithms. Their values are a format: the pinned
// ones below must never change.
#include "core/checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt {
namespace {

TEST(ChecksumTest, AlgorithmsKeepTheirNumbersNamesAndValues) {
  EXPECT_EQ(ChecksumAlgorithmFromNumber(0), ChecksumAlgorithm::kXxh64);
  EXPECT_EQ(ChecksumAlgorithmFromNumber(1), ChecksumAlgorithm::kXxh3);
  EXPECT_EQ(ChecksumAlgorithmFromNumber(2), std::nullopt);
  EXPECT_EQ(ChecksumAlgorithmFromNumber(-1), std::nullopt);
  EXPECT_EQ(ChecksumAlgorithmFromNumber(int64_t{1} << 40), std::nullopt);
  EXPECT_STREQ(ChecksumAlgorithmName(ChecksumAlgorithm::kXxh64), "xxh64");
  EXPECT_STREQ(ChecksumAlgorithmName(ChecksumAlgorithm::kXxh3), "xxh3");
  EXPECT_EQ(kStoredChecksum, ChecksumAlgorithm::kXxh3);
  // XXH64 and XXH3-64 with seed 0 (the empty input's are the published test vectors).
  EXPECT_EQ(Checksum(ChecksumAlgorithm::kXxh64, ""), 0xef46db3751d8e999ull);
  EXPECT_EQ(Checksum(ChecksumAlgorithm::kXxh3, ""), 0x2d06800538d394c2ull);
  EXPECT_EQ(Checksum(ChecksumAlgorithm::kXxh64, "ckptd"), 0x0c0c09d8992730a7ull);
  EXPECT_EQ(Checksum(ChecksumAlgorithm::kXxh3, "ckptd"), 0xf17738a15c790b97ull);
}

// XXH3 goes through libxxhash's run-time dispatch (SIMD code for long inputs): it must equal the
// library's portable entry point at every size class, and a hash over parts must equal the hash
// of their concatenation for both algorithms, wherever the parts are cut.
TEST(ChecksumTest, DispatchedAndPartwiseHashesEqualTheReference) {
  std::mt19937_64 rng(11);
  std::string bytes(70000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t size : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, 4096, 65536, 70000}) {
    const std::string_view all = std::string_view(bytes).substr(0, size);
    SCOPED_TRACE(size);
    EXPECT_EQ(Checksum(ChecksumAlgorithm::kXxh3, all), XXH3_64bits(all.data(), all.size()));
    EXPECT_EQ(Checksum(ChecksumAlgorithm::kXxh64, all), XXH64(all.data(), all.size(), 0));
    for (int round = 0; round < 8; ++round) {
      std::vector<std::string_view> parts;
      for (size_t at = 0; at < size;) {
        if (rng() % 4 == 0) parts.push_back(all.substr(at, 0));  // empty parts count for nothing
        const size_t n = std::min<size_t>(size - at, 1 + rng() % (1 + size / (2 + round)));
        parts.push_back(all.substr(at, n));
        at += n;
      }
      for (ChecksumAlgorithm a : {ChecksumAlgorithm::kXxh64, ChecksumAlgorithm::kXxh3}) {
        EXPECT_EQ(Checksum(a, parts), Checksum(a, all)) << ChecksumAlgorithmName(a);
      }
    }
  }
}

}  // namespace
}  // namespace ckpt
