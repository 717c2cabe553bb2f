#include "tests/testing/fixtures.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace ckpt::testing {

std::optional<std::string> FixturePath(const std::string& name) {
  std::filesystem::path p = std::filesystem::path(CKPT_FIXTURES_DIR) / name;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(p, ec)) return std::nullopt;
  return p.string();
}

std::optional<std::string> ReadFixture(const std::string& name) {
  auto path = FixturePath(name);
  if (!path) return std::nullopt;
  return ReadFileOrDie(*path);
}

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace ckpt::testing
