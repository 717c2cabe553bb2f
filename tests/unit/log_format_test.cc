// ckptd's JSON log lines (--log-format json): one object per line, the message's key=value pairs
// as typed fields, quoted values with quotes inside kept whole, reserved names never overwritten.
#include "service/log_format.h"

#include <memory>
#include <regex>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"

namespace ckpt {
namespace {

// Logs `text` at `level` through a logger named `name` with the JSON formatter; returns the
// output, which must be exactly one line.
std::string Format(const std::string& name, spdlog::level::level_enum level,
                   const std::string& text) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  sink->set_formatter(std::make_unique<JsonLogFormatter>());
  spdlog::logger logger(name, sink);
  logger.set_level(spdlog::level::trace);
  logger.log(level, "{}", text);
  return out.str();
}

nlohmann::json Parse(const std::string& line) {
  EXPECT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "more than one line: " << line;
  auto j = nlohmann::json::parse(line, nullptr, false);
  EXPECT_TRUE(j.is_object()) << line;
  return j;
}

TEST(JsonLogFormatterTest, FixedFieldsComeFirstWithAZonedTime) {
  const std::string line = Format("ckptd", spdlog::level::info, "event=start port=50051");
  EXPECT_EQ(line.rfind("{\"time\":\"", 0), 0u) << line;
  const nlohmann::json j = Parse(line);
  EXPECT_TRUE(std::regex_match(j["time"].get<std::string>(),
                               std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d)")))
      << line;
  EXPECT_EQ(j["level"], "info");
  EXPECT_EQ(j["logger"], "ckptd");
  EXPECT_EQ(j["msg"], "event=start port=50051");
  EXPECT_EQ(j["event"], "start");
  EXPECT_EQ(j["port"], 50051);
  EXPECT_EQ(Parse(Format("jobs", spdlog::level::warn, "x"))["level"], "warning");
}

TEST(JsonLogFormatterTest, ValuesAreTypedAndQuotedOnesKeptWhole) {
  const nlohmann::json j =
      Parse(Format("service", spdlog::level::warn,
                   "event=rpc ms=12.5 bytes=-3 ok=true peer=ipv4:1.2.3.4:5 version=1.2.3 "
                   "error=\"strategy \"a b\" not found: x=1\" after=2"));
  EXPECT_EQ(j["ms"], 12.5);
  EXPECT_EQ(j["bytes"], -3);
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["peer"], "ipv4:1.2.3.4:5");
  EXPECT_EQ(j["version"], "1.2.3");  // not a number
  EXPECT_EQ(j["error"], "strategy \"a b\" not found: x=1");
  EXPECT_EQ(j["after"], 2);
  EXPECT_FALSE(j.contains("x")) << "a pair inside a quoted value became a field";
}

TEST(JsonLogFormatterTest, ReservedNamesAreNotOverwrittenAndPlainTextStaysInMsg) {
  const nlohmann::json j =
      Parse(Format("ckptd", spdlog::level::err, "loaded level=3 msg=hi time=now logger=x"));
  EXPECT_EQ(j["level"], "error");
  EXPECT_EQ(j["logger"], "ckptd");
  EXPECT_EQ(j["msg"], "loaded level=3 msg=hi time=now logger=x");
  EXPECT_EQ(j["field_level"], 3);
  EXPECT_EQ(j["field_msg"], "hi");
  EXPECT_EQ(j["field_time"], "now");
  EXPECT_EQ(j["field_logger"], "x");
  EXPECT_FALSE(j.contains("loaded"));
}

TEST(JsonLogFormatterTest, InvalidUtf8AndNewlinesStayOnOneValidLine) {
  const nlohmann::json j =
      Parse(Format("ckptd", spdlog::level::info, "event=odd path=\xff\xfe name=\"two\nlines\""));
  EXPECT_EQ(j["event"], "odd");
  EXPECT_EQ(j["name"], "two\nlines");
  EXPECT_TRUE(j["path"].is_string());
}

}  // namespace
}  // namespace ckpt
