#include "core/rank_files.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;

TEST(RankFilesTest, NamesFollowMindSporeLayout) {
  EXPECT_EQ(RankDirName(0), "rank_0");
  EXPECT_EQ(RankDirName(4095), "rank_4095");
  EXPECT_EQ(RankFileName("checkpoint_", 7), "checkpoint_7.ckpt");
  EXPECT_EQ(RankFilePath("/out/x", kDefaultRankFilePrefix, 12),
            "/out/x/rank_12/checkpoint_12.ckpt");
}

TEST(RankFilesTest, ParsesOnlyCanonicalRankDirectories) {
  EXPECT_EQ(ParseRankDirName("rank_0"), 0);
  EXPECT_EQ(ParseRankDirName("rank_17"), 17);
  EXPECT_EQ(ParseRankDirName("rank_01"), std::nullopt);
  EXPECT_EQ(ParseRankDirName("rank_"), std::nullopt);
  EXPECT_EQ(ParseRankDirName("rank_backup"), std::nullopt);
  EXPECT_EQ(ParseRankDirName("rank_-1"), std::nullopt);
  EXPECT_EQ(ParseRankDirName("rank_99999999999999999999999"), std::nullopt);
  EXPECT_EQ(ParseRankDirName("Rank_1"), std::nullopt);
  EXPECT_TRUE(LooksLikeRankDirName("rank_01"));
  EXPECT_FALSE(LooksLikeRankDirName("rank_backup"));
  EXPECT_FALSE(LooksLikeRankDirName("rank_"));
}

TEST(RankFilesTest, PrefixRule) {
  EXPECT_TRUE(ValidateRankFilePrefix("checkpoint_").ok());
  EXPECT_TRUE(ValidateRankFilePrefix("net-v2.step_").ok());
  EXPECT_TRUE(ValidateRankFilePrefix(std::string(200, 'a')).ok());
  for (const std::string &bad : std::vector<std::string>{
           "", "a/b", "x y", "../", std::string(201, 'a'), std::string("a\0b", 3)}) {
    const absl::Status status = ValidateRankFilePrefix(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(status.message(), HasSubstr("prefix")) << bad;
  }
}

}  // namespace
}  // namespace ckpt
