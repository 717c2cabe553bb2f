#include "core/names.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(NamesTest, AcceptsPrintableUtf8) {
  for (const std::string name : {"w", "layers.0.attention.dense.weight", "adam_m/x-1 (copy)",
                                 "权重", "名前\xf0\x9f\x98\x80"}) {
    EXPECT_TRUE(ValidatePrintableName("tensor name", name).ok()) << name;
  }
  EXPECT_TRUE(ValidatePrintableName("n", std::string(kMaxNameBytes, 'a')).ok());
}

TEST(NamesTest, RefusesControlCharactersBadUtf8AndLength) {
  const std::vector<std::string> bad = {
      "",
      std::string(kMaxNameBytes + 1, 'a'),
      "a\nb",
      "a\rb",
      "a\tb",
      std::string("a\0b", 3),
      "a\x7f",
      "a\x1b[2J",
      "a\xc2\x85",      // NEL (C1)
      "a\xe2\x80\xa8",  // LINE SEPARATOR
      "a\xff",
      "a\xc0\xaf",      // invalid, overlong
      "a\xed\xa0\x80",  // surrogate
  };
  for (const std::string& name : bad) {
    const absl::Status s = ValidatePrintableName("tensor name", name);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tensor name"));
    // The message itself carries no control character.
    EXPECT_EQ(std::string(s.message()).find_first_of(std::string("\n\r\t\x1b\0", 5)),
              std::string::npos)
        << s.message();
  }
}

TEST(NamesTest, EscapeForLogKeepsOneLine) {
  EXPECT_EQ(EscapeForLog("plain name"), "plain name");
  EXPECT_EQ(EscapeForLog("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(EscapeForLog("say \"hi\" \\ bye"), "say \\\"hi\\\" \\\\ bye");
  EXPECT_EQ(EscapeForLog("x\x1b[1m"), "x\\x1b[1m");
  EXPECT_EQ(EscapeForLog("\xff"), "\\xff");
  EXPECT_EQ(EscapeForLog("a\xe2\x80\xa8"), "a\\xe2\\x80\\xa8");
  EXPECT_EQ(EscapeForLog("权重"), "权重");
  EXPECT_THAT(EscapeForLog(std::string("a\0b", 3)), Not(HasSubstr(std::string(1, '\0'))));
}

}  // namespace
}  // namespace ckpt
