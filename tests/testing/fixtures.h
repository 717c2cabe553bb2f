// Access to the shared MindSpore fixtures, read in place (never copied into the project).
#ifndef CKPT_TESTS_TESTING_FIXTURES_H_
#define CKPT_TESTS_TESTING_FIXTURES_H_

#include <optional>
#include <string>

#include "gtest/gtest.h"

namespace ckpt::testing {

// Full path of a fixture file, or nullopt when the fixtures folder is absent (a user's clone).
std::optional<std::string> FixturePath(const std::string& name);
// Whole contents of a fixture file, or nullopt when absent.
std::optional<std::string> ReadFixture(const std::string& name);
// Reads a whole file from disk (test helper); fails the test if unreadable.
std::string ReadFileOrDie(const std::string& path);

}  // namespace ckpt::testing

// Skips the current test with a visible message when fixture `name` is absent; otherwise
// declares `std::string var` with its contents.
#define CKPT_REQUIRE_FIXTURE(var, name)                                                  \
  auto var##_opt = ::ckpt::testing::ReadFixture(name);                                  \
  if (!var##_opt) {                                                                      \
    GTEST_SKIP() << "MindSpore fixture " << (name) << " not found under "                \
                 << CKPT_FIXTURES_DIR << " (../shared is absent on a user's clone)";    \
  }                                                                                      \
  std::string var = std::move(*var##_opt)

#endif  // CKPT_TESTS_TESTING_FIXTURES_H_
