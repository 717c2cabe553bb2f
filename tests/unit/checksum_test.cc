// core/checksum.h: the stored and wire checksum. Its values are a format: the pinned ones below
// must never change.
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

TEST(ChecksumTest, IsXxh3With64BitsAndSeedZero) {
  // The empty input's value is the published test vector.
  EXPECT_EQ(Checksum(""), 0x2d06800538d394c2ull);
  EXPECT_EQ(Checksum("ckptd"), 0xf17738a15c790b97ull);
  EXPECT_STREQ(kChecksumName, "XXH3-64");
}

// The checksum goes through libxxhash's run-time dispatch (SIMD code for long inputs): it must
// equal the library's portable entry point at every size class, and a checksum over parts must
// equal the checksum of their concatenation, wherever the parts are cut.
TEST(ChecksumTest, DispatchedAndPartwiseHashesEqualTheReference) {
  std::mt19937_64 rng(11);
  std::string bytes(70000, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t size : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, 4096, 65536, 70000}) {
    const std::string_view all = std::string_view(bytes).substr(0, size);
    SCOPED_TRACE(size);
    EXPECT_EQ(Checksum(all), XXH3_64bits(all.data(), all.size()));
    for (int round = 0; round < 8; ++round) {
      std::vector<std::string_view> parts;
      for (size_t at = 0; at < size;) {
        if (rng() % 4 == 0) parts.push_back(all.substr(at, 0));  // empty parts count for nothing
        const size_t n = std::min<size_t>(size - at, 1 + rng() % (1 + size / (2 + round)));
        parts.push_back(all.substr(at, n));
        at += n;
      }
      EXPECT_EQ(Checksum(parts), Checksum(all));
    }
  }
}

}  // namespace
}  // namespace ckpt
