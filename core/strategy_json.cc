// The JSON form of a strategy (MindSpore's to_json/FromJson): parsing with bounded memory, and
// serialising in the order MindSpore writes. Both are our own (JsonParser, JsonWriter): a
// strategy of 50,000 parameters is a 16 MiB text, and a general-purpose document costs an
// allocation per value.
#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/internal/strategy_parse.h"
#include "core/status_macros.h"
#include "core/strategy.h"

namespace ckpt::strategy_internal {
namespace {

// Parsed JSON: a light document over the text, built by JsonParser. A value's members (object)
// or elements (array) are contiguous; strings are views of the text, or of the parser's decoded
// copy when they hold escapes. The interface is the part of nlohmann::json's that the
// conversions below use. Parsing a 50,000-parameter strategy with nlohmann's document (an
// allocation per value and per key, sorted maps) took most of the time of registering it.
class Json {
 public:
  enum class Kind : uint8_t { kNull, kBool, kInt, kUint, kFloat, kString, kArray, kObject };

  bool is_object() const { return kind == Kind::kObject; }
  bool is_array() const { return kind == Kind::kArray; }
  // As nlohmann: non-negative integers are unsigned, negative ones signed; both are integers.
  bool is_number_unsigned() const { return kind == Kind::kUint; }
  bool is_number_integer() const { return kind == Kind::kInt || kind == Kind::kUint; }
  template <typename T>
  T get() const {
    return kind == Kind::kUint ? static_cast<T>(u) : static_cast<T>(i);
  }
  // Members or elements.
  size_t size() const { return count; }
  const Json* begin() const { return children; }
  const Json* end() const { return children + count; }
  const Json& operator[](size_t k) const { return children[k]; }
  // The member named `k`, or end(): the last one of that name, as a repeated key keeps its last
  // value in nlohmann's document.
  const Json* find(std::string_view k) const {
    const Json* found = end();
    for (const Json& m : *this) {
      if (m.key == k) found = &m;
    }
    return found;
  }

  Kind kind = Kind::kNull;
  std::string_view key;  // an object member's name
  int64_t i = 0;         // kInt
  uint64_t u = 0;        // kUint
  const Json* children = nullptr;
  uint32_t count = 0;
  uint32_t first = 0;  // while parsing: the index of the first child in the parser's pool
};

// Thrown by JsonParser when the document exceeds a bound.
struct TooLarge {
  std::string what;
};
// Thrown by JsonParser for text that is not JSON.
struct SyntaxError {
  std::string what;
};

// A strict JSON (RFC 8259) parser: UTF-8 checked (no overlong forms, surrogates or code points
// above U+10FFFF), escapes decoded, surrogate pairs joined, a leading byte order mark skipped, as
// nlohmann's parser does. Owns the document it builds (root()). Bounds the values and the depth:
// a parsed value costs more memory than its text, so a large text of tiny values (or deep
// nesting) could cost far more memory than its size; both bounds are far above what a real
// strategy holds (tens of values per parameter, 5 levels).
class JsonParser {
 public:
  static constexpr int64_t kMaxValues = int64_t{1} << 23;
  static constexpr int kMaxDepth = 32;

  explicit JsonParser(std::string_view text) : text_(text) {
    // Decoded strings are never longer than their text: views of decoded_ stay valid.
    decoded_.reserve(text.size());
  }

  // Parses the whole text; throws SyntaxError or TooLarge.
  const Json& Parse() {
    if (text_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = 3;
    ParseValue(root_, 0);
    SkipSpace();
    if (pos_ != text_.size()) Fail("unexpected content after the document");
    for (Json& v : pool_) Link(v);
    Link(root_);
    return root_;
  }

 private:
  [[noreturn]] void Fail(std::string_view what) const {
    throw SyntaxError{absl::StrCat("syntax error at byte ", pos_, ": ", Sv(what))};
  }
  void Link(Json& v) {
    if (v.count > 0) v.children = pool_.data() + v.first;
  }
  void CountValue() {
    if (++values_ > kMaxValues) {
      throw TooLarge{absl::StrCat("holds more than ", kMaxValues, " values")};
    }
  }
  void SkipSpace() {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return;
      ++pos_;
    }
  }
  char Peek() {
    SkipSpace();
    if (pos_ >= text_.size()) Fail("unexpected end of the text");
    return text_[pos_];
  }
  void Expect(char c) {
    if (Peek() != c) Fail(absl::StrCat("expected '", std::string(1, c), "'"));
    ++pos_;
  }

  void ParseValue(Json& out, int depth) {
    const char c = Peek();
    switch (c) {
      case '{':
      case '[':
        ParseContainer(out, depth + 1, c == '{');
        return;
      case '"':
        CountValue();
        out.kind = Json::Kind::kString;
        ParseString();
        return;
      case 't':
        CountValue();
        Literal("true");
        out.kind = Json::Kind::kBool;
        return;
      case 'f':
        CountValue();
        Literal("false");
        out.kind = Json::Kind::kBool;
        return;
      case 'n':
        CountValue();
        Literal("null");
        out.kind = Json::Kind::kNull;
        return;
      default:
        if (c == '-' || (c >= '0' && c <= '9')) {
          CountValue();
          ParseNumber(out);
          return;
        }
        Fail("expected a value");
    }
  }

  void ParseContainer(Json& out, int depth, bool object) {
    if (depth > kMaxDepth) throw TooLarge{absl::StrCat("nests deeper than ", kMaxDepth, " levels")};
    ++pos_;  // the bracket
    out.kind = object ? Json::Kind::kObject : Json::Kind::kArray;
    const size_t base = stack_.size();
    const char close = object ? '}' : ']';
    if (Peek() == close) {
      ++pos_;
    } else {
      while (true) {
        Json v;
        if (object) {
          if (Peek() != '"') Fail("expected a member name");
          v.key = ParseString();
          Expect(':');
        }
        ParseValue(v, depth);
        stack_.push_back(v);
        const char next = Peek();
        ++pos_;
        if (next == close) break;
        if (next != ',') {
          --pos_;
          Fail(object ? "expected ',' or '}'" : "expected ',' or ']'");
        }
      }
    }
    // The children, contiguous in the pool (their own children are there already).
    out.first = static_cast<uint32_t>(pool_.size());
    out.count = static_cast<uint32_t>(stack_.size() - base);
    pool_.insert(pool_.end(), stack_.begin() + static_cast<std::ptrdiff_t>(base), stack_.end());
    stack_.resize(base);
  }

  void Literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) Fail(absl::StrCat("expected ", Sv(word)));
    pos_ += word.size();
  }

  void ParseNumber(Json& out) {
    const size_t begin = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ - from;
    };
    if (text_[pos_] == '-') ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '0') {
      ++pos_;
    } else if (digits() == 0) {
      Fail("expected a digit");
    }
    bool integer = true;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      ++pos_;
      if (digits() == 0) Fail("expected a digit after '.'");
      integer = false;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (digits() == 0) Fail("expected a digit in the exponent");
      integer = false;
    }
    const char* first = text_.data() + begin;
    const char* last = text_.data() + pos_;
    // Integers that do not fit 64 bits are floats, as nlohmann reads them.
    out.kind = Json::Kind::kFloat;
    if (!integer) return;
    if (*first == '-') {
      if (std::from_chars(first, last, out.i).ec == std::errc()) out.kind = Json::Kind::kInt;
    } else if (std::from_chars(first, last, out.u).ec == std::errc()) {
      out.kind = Json::Kind::kUint;
    }
  }

  // The string at pos_ (its opening quote); a view of the text when it holds no escapes, else of
  // its decoded copy in decoded_.
  std::string_view ParseString() {
    ++pos_;
    const size_t begin = pos_;
    size_t out_begin = std::string::npos;  // in decoded_, once an escape was met
    while (true) {
      if (pos_ >= text_.size()) Fail("unterminated string");
      const auto c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') break;
      if (c < 0x20) Fail("control character in a string");
      if (c == '\\') {
        if (out_begin == std::string::npos) {
          out_begin = decoded_.size();
          decoded_.append(text_.substr(begin, pos_ - begin));
        }
        Escape();
        continue;
      }
      const size_t n = c < 0x80 ? 1 : Utf8Length();
      if (out_begin != std::string::npos) decoded_.append(text_.substr(pos_, n));
      pos_ += n;
    }
    const size_t end = pos_++;
    if (out_begin == std::string::npos) return text_.substr(begin, end - begin);
    return std::string_view(decoded_).substr(out_begin);
  }

  // The length of the UTF-8 sequence at pos_ (a byte >= 0x80); fails unless it is strict UTF-8.
  size_t Utf8Length() const {
    auto at = [&](size_t k) -> unsigned {
      return pos_ + k < text_.size() ? static_cast<unsigned char>(text_[pos_ + k]) : 0u;
    };
    const unsigned lead = at(0);
    unsigned lo = 0x80, hi = 0xBF;  // the second byte's range
    size_t n = 0;
    if (lead >= 0xC2 && lead <= 0xDF) {
      n = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      n = 3;
      if (lead == 0xE0) lo = 0xA0;
      if (lead == 0xED) hi = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      n = 4;
      if (lead == 0xF0) lo = 0x90;
      if (lead == 0xF4) hi = 0x8F;
    } else {
      Fail("invalid UTF-8 in a string");
    }
    if (at(1) < lo || at(1) > hi) Fail("invalid UTF-8 in a string");
    for (size_t k = 2; k < n; ++k) {
      if (at(k) < 0x80 || at(k) > 0xBF) Fail("invalid UTF-8 in a string");
    }
    return n;
  }

  // Decodes the escape at pos_ (its backslash) onto decoded_.
  void Escape() {
    ++pos_;
    if (pos_ >= text_.size()) Fail("unterminated string");
    const char c = text_[pos_++];
    switch (c) {
      case '"': decoded_.push_back('"'); return;
      case '\\': decoded_.push_back('\\'); return;
      case '/': decoded_.push_back('/'); return;
      case 'b': decoded_.push_back('\b'); return;
      case 'f': decoded_.push_back('\f'); return;
      case 'n': decoded_.push_back('\n'); return;
      case 'r': decoded_.push_back('\r'); return;
      case 't': decoded_.push_back('\t'); return;
      case 'u': break;
      default: --pos_; Fail("invalid escape in a string");
    }
    uint32_t cp = Hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) Fail("unpaired surrogate in a string");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (text_.substr(pos_, 2) != "\\u") Fail("unpaired surrogate in a string");
      pos_ += 2;
      const uint32_t low = Hex4();
      if (low < 0xDC00 || low > 0xDFFF) Fail("unpaired surrogate in a string");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
    }
    // UTF-8: at most 6 text bytes become at most 4, so decoded_ never outgrows its reservation.
    if (cp < 0x80) {
      decoded_.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      decoded_.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      decoded_.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      decoded_.push_back(static_cast<char>(0xE0 | (cp >> 12)));
      decoded_.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      decoded_.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      decoded_.push_back(static_cast<char>(0xF0 | (cp >> 18)));
      decoded_.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      decoded_.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      decoded_.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  uint32_t Hex4() {
    if (pos_ + 4 > text_.size()) Fail("unterminated string");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = text_[pos_++];
      v <<= 4;
      if (h >= '0' && h <= '9') {
        v |= static_cast<uint32_t>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        v |= static_cast<uint32_t>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        v |= static_cast<uint32_t>(h - 'A' + 10);
      } else {
        --pos_;
        Fail("expected four hex digits after \\u");
      }
    }
    return v;
  }

  const std::string_view text_;
  size_t pos_ = 0;
  int64_t values_ = 0;
  std::string decoded_;
  std::vector<Json> stack_;  // children of the containers being parsed
  std::vector<Json> pool_;   // children of complete containers, each container's contiguous
  Json root_;
};

constexpr int64_t kUint32Max = std::numeric_limits<uint32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// nlohmann reads non-negative integers as unsigned and negative ones as signed; floats and
// booleans are not integers here.
std::optional<int64_t> JsonInt(const Json& v) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(kInt64Max)) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
}

std::optional<std::vector<int64_t>> JsonIntList(const Json& v, int64_t min, int64_t max) {
  if (!v.is_array()) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (const Json& e : v) {
    std::optional<int64_t> i = JsonInt(e);
    if (!i || *i < min || *i > max) return std::nullopt;
    out.push_back(*i);
  }
  return out;
}

absl::Status JsonTypeError(std::string_view path, std::string_view expected) {
  return absl::InvalidArgumentError(absl::StrCat(Sv(path), " must be ", Sv(expected)));
}

// An optional int32 key; absent means 0, as in the binary form.
absl::StatusOr<int64_t> JsonOptionalInt32(const Json& obj, const char* key, std::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end()) return 0;
  std::optional<int64_t> v = JsonInt(*it);
  if (!v || *v < kInt32Min || *v > kInt32Max) {
    return JsonTypeError(absl::StrCat(Sv(path), ".", key), "a 32-bit integer");
  }
  return *v;
}

// param_split_shape / indices_offset: a list of integers, or the binary form's single entry
// wrapped in a list. Absent means empty.
absl::StatusOr<std::vector<int64_t>> JsonOptionalDims(const Json& obj, const char* key,
                                                      std::string_view path) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::vector<int64_t>{};
  const Json* list = &*it;
  if (list->is_array() && list->size() == 1 && (*list)[0].is_array()) list = &(*list)[0];
  std::optional<std::vector<int64_t>> dims =
      JsonIntList(*list, std::numeric_limits<int64_t>::min(), kInt64Max);
  if (!dims) return JsonTypeError(absl::StrCat(Sv(path), ".", key), "a list of integers");
  return *dims;
}

absl::StatusOr<StrategyParam> ParamFromJson(const std::string& name, const Json& item) {
  const std::string path = absl::StrCat("parallel_layout_item.", name);
  if (!item.is_object()) return JsonTypeError(path, "an object");
  StrategyParam param;
  Layout& layout = param.layout;

  auto dev = item.find("dev_matrix");
  std::optional<std::vector<int64_t>> dev_matrix;
  if (dev != item.end()) dev_matrix = JsonIntList(*dev, 1, kInt64Max);
  if (!dev_matrix) return JsonTypeError(path + ".dev_matrix", "a list of positive integers");
  layout.dev_matrix = std::move(*dev_matrix);

  constexpr std::string_view kMapExpected =
      "a list of integers (-1 or a device axis >= 0) or, nested, a list of such lists per "
      "tensor dim";
  auto map = item.find("tensor_map");
  if (map == item.end() || !map->is_array())
    return JsonTypeError(path + ".tensor_map", kMapExpected);
  const bool nested =
      std::any_of(map->begin(), map->end(), [](const Json& e) { return e.is_array(); });
  if (nested) {
    // Nested: every dim a list; a bare integer m is accepted as the one-axis list [m].
    std::vector<std::vector<int64_t>> dims;
    dims.reserve(map->size());
    for (const Json& e : *map) {
      std::optional<std::vector<int64_t>> axes;
      if (e.is_array()) {
        axes = JsonIntList(e, kInt32Min, kInt32Max);
      } else if (std::optional<int64_t> m = JsonInt(e); m && *m >= kInt32Min && *m <= kInt32Max) {
        axes = std::vector<int64_t>{*m};
      }
      if (!axes) return JsonTypeError(path + ".tensor_map", kMapExpected);
      dims.push_back(std::move(*axes));
    }
    CKPT_ASSIGN_OR_RETURN(layout.tensor_map, FromNestedMap(std::move(dims), name));
    layout.nested_form = true;
  } else {
    std::optional<std::vector<int64_t>> plain = JsonIntList(*map, kInt32Min, kInt32Max);
    if (!plain) return JsonTypeError(path + ".tensor_map", kMapExpected);
    CKPT_ASSIGN_OR_RETURN(layout.tensor_map, FromPlainMap(*plain, name));
  }

  if (auto shape = item.find("tensor_shape"); shape != item.end()) {
    std::optional<std::vector<int64_t>> dims = JsonIntList(*shape, 0, kInt64Max);
    if (!dims) return JsonTypeError(path + ".tensor_shape", "a list of non-negative integers");
    param.tensor_shape = std::move(*dims);
  }
  CKPT_ASSIGN_OR_RETURN(int64_t field, JsonOptionalInt32(item, "field", path));
  layout.field = static_cast<int32_t>(field);
  CKPT_ASSIGN_OR_RETURN(layout.opt_shard_step,
                        JsonOptionalInt32(item, "opt_weight_shard_step", path));
  CKPT_ASSIGN_OR_RETURN(layout.opt_shard_size,
                        JsonOptionalInt32(item, "opt_weight_shard_size", path));
  CKPT_ASSIGN_OR_RETURN(layout.param_split_shape,
                        JsonOptionalDims(item, "param_split_shape", path));
  CKPT_ASSIGN_OR_RETURN(layout.indices_offset, JsonOptionalDims(item, "indices_offset", path));
  return param;
}

absl::StatusOr<OpStrategy> OpFromJson(const std::string& name, const Json& item) {
  const std::string path = absl::StrCat("parallel_strategy_item.", name);
  if (!item.is_object()) return JsonTypeError(path, "an object");
  OpStrategy op;
  op.node_name = name;
  auto stage = item.find("stage");
  std::optional<int64_t> stage_value;
  if (stage != item.end()) stage_value = JsonInt(*stage);
  if (!stage_value || *stage_value < 0 || *stage_value > kInt32Max) {
    return JsonTypeError(path + ".stage", "a non-negative 32-bit integer");
  }
  op.stage = static_cast<int32_t>(*stage_value);
  if (auto inputs = item.find("parallel_strategy"); inputs != item.end()) {
    constexpr std::string_view kExpected = "a list of lists of non-negative integers";
    if (!inputs->is_array()) return JsonTypeError(path + ".parallel_strategy", kExpected);
    for (const Json& input : *inputs) {
      std::optional<std::vector<int64_t>> dims = JsonIntList(input, 0, kUint32Max);
      if (!dims) return JsonTypeError(path + ".parallel_strategy", kExpected);
      op.inputs.emplace_back(dims->begin(), dims->end());
    }
  }
  return op;
}

// Writes JSON text in the form nlohmann::json's dump(2) gives (two-space indents, "key": value,
// one array element per line, "[]" and "{}" for empty containers, strings escaped as nlohmann
// escapes them), straight into one string: building an ordered_json document first costs an
// allocation per value and a second pass, a good part of registering a large strategy.
// Strings must be valid UTF-8 (Strategy::Create checks every name).
class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : out_(out) {}

  // Containers. Each member or element starts with Key()/Element(), then its value.
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void Key(std::string_view key) {
    Separate();
    String(key);
    out_->append(": ");
  }
  // Before a value that is an element of the innermost array.
  void Element() { Separate(); }

  void Int(int64_t v) { absl::StrAppend(out_, v); }
  template <typename T>
  void IntArray(const std::vector<T>& values) {
    BeginArray();
    for (T v : values) {
      Element();
      Int(static_cast<int64_t>(v));
    }
    EndArray();
  }
  void String(std::string_view s) {
    out_->push_back('"');
    size_t run = 0;  // start of the bytes not yet copied
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      out_->append(s.substr(run, i - run));
      run = i + 1;
      switch (c) {
        case '"': out_->append("\\\""); break;
        case '\\': out_->append("\\\\"); break;
        case '\b': out_->append("\\b"); break;
        case '\f': out_->append("\\f"); break;
        case '\n': out_->append("\\n"); break;
        case '\r': out_->append("\\r"); break;
        case '\t': out_->append("\\t"); break;
        default: absl::StrAppend(out_, absl::StrFormat("\\u%04x", c)); break;
      }
    }
    out_->append(s.substr(run));
    out_->push_back('"');
  }

 private:
  // The comma and line break before a member or element (none before a container's first).
  void Separate() {
    if (!first_.back()) out_->push_back(',');
    first_.back() = false;
    out_->push_back('\n');
    out_->append(2 * first_.size(), ' ');
  }
  void Open(char c) {
    out_->push_back(c);
    first_.push_back(true);
  }
  void Close(char c) {
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty) {
      out_->push_back('\n');
      out_->append(2 * first_.size(), ' ');
    }
    out_->push_back(c);
  }

  std::string* out_;
  std::vector<bool> first_;  // per open container: nothing written in it yet
};

void WriteLayout(JsonWriter& w, const StrategyParam& param) {
  const Layout& layout = param.layout;
  w.BeginObject();
  w.Key("dev_matrix");
  w.IntArray(layout.dev_matrix);
  w.Key("tensor_map");
  w.BeginArray();
  for (const std::vector<int32_t>& axes : layout.tensor_map) {
    w.Element();
    if (layout.nested_form) {
      if (axes.empty()) {
        w.IntArray(std::vector<int32_t>{-1});
      } else {
        w.IntArray(axes);
      }
    } else {
      w.Int(axes.empty() ? -1 : axes.front());
    }
  }
  w.EndArray();
  if (param.tensor_shape) {
    w.Key("tensor_shape");
    w.IntArray(*param.tensor_shape);
  }
  w.Key("field");
  w.Int(layout.field);
  w.Key("opt_weight_shard_step");
  w.Int(layout.opt_shard_step);
  w.Key("opt_weight_shard_size");
  w.Int(layout.opt_shard_size);
  w.Key("param_split_shape");
  w.IntArray(layout.param_split_shape);
  w.Key("indices_offset");
  w.IntArray(layout.indices_offset);
  w.EndObject();
}

// Calls fn(name, value) for every member of `object` in file order, each name once: a repeated
// name keeps its first position and its last value, as nlohmann's parser and a sorted document
// gave them. (The order matters: the first operator item decides a per-stage file's pipeline
// stage, as in merge_pipeline_strategys; layout items are reported and merged in file order.)
template <typename Fn>
absl::Status ForEachInOrder(const Json& object, Fn&& fn) {
  std::unordered_map<std::string_view, size_t> last;
  last.reserve(object.size());
  std::vector<std::string_view> order;
  order.reserve(object.size());
  for (size_t k = 0; k < object.size(); ++k) {
    auto [it, inserted] = last.try_emplace(object[k].key, k);
    if (inserted) {
      order.push_back(object[k].key);
    } else {
      it->second = k;
    }
  }
  std::string name;
  for (std::string_view key : order) {
    name.assign(key);
    CKPT_RETURN_IF_ERROR(fn(name, object[last[key]]));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Strategy> ParseJson(std::string_view bytes) {
  if (bytes.find_first_not_of(" \t\r\n") == std::string_view::npos) return NoLayoutItems();
  JsonParser parser(bytes);
  const Json* root = nullptr;
  try {
    root = &parser.Parse();
  } catch (const SyntaxError& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a JSON strategy: ", e.what));
  } catch (const TooLarge& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON strategy refused: it ", e.what, ", more than any strategy needs"));
  }
  const Json& doc = *root;
  if (!doc.is_object()) return JsonTypeError("a JSON strategy", "an object");

  std::vector<OpStrategy> ops;
  if (auto it = doc.find("parallel_strategy_item"); it != doc.end()) {
    if (!it->is_object()) return JsonTypeError("parallel_strategy_item", "an object");
    ops.reserve(it->size());
    CKPT_RETURN_IF_ERROR(
        ForEachInOrder(*it, [&](const std::string& name, const Json& item) {
          CKPT_ASSIGN_OR_RETURN(OpStrategy op, OpFromJson(name, item));
          ops.push_back(std::move(op));
          return absl::OkStatus();
        }));
  }

  auto layouts = doc.find("parallel_layout_item");
  if (layouts == doc.end()) return NoLayoutItems();
  if (!layouts->is_object()) return JsonTypeError("parallel_layout_item", "an object");
  std::vector<LayoutItem> items;
  items.reserve(layouts->size());
  CKPT_RETURN_IF_ERROR(
      ForEachInOrder(*layouts, [&](const std::string& name, const Json& item) {
        CKPT_ASSIGN_OR_RETURN(StrategyParam param, ParamFromJson(name, item));
        items.push_back({name, std::move(param)});
        return absl::OkStatus();
      }));
  return BuildStrategy(std::move(items), std::move(ops));
}

std::string SerializeJson(const Strategy& strategy) {
  // Keys are unique by construction (checked below for operators; parameter names are unique and
  // each is written once per stage, or once when the names carry no stage prefix).
  std::string out;
  out.reserve(strategy.params().size() * 400 + strategy.ops().size() * 100 + 128);
  JsonWriter w(&out);
  w.BeginObject();
  w.Key("current_stage");
  w.Int(strategy.stage_prefixed_names() ? 1 : 0);
  w.Key("parallel_strategy_item");
  w.BeginObject();
  std::set<std::string_view> op_names;
  for (const OpStrategy& op : strategy.ops()) {
    // JSON keys operator items by node name; a repeated name keeps its first item, the one that
    // decides a per-stage file's stage.
    if (!op_names.insert(op.node_name).second) continue;
    w.Key(op.node_name);
    w.BeginObject();
    w.Key("stage");
    w.Int(op.stage);
    w.Key("parallel_strategy");
    w.BeginArray();
    for (const std::vector<uint32_t>& input : op.inputs) {
      w.Element();
      w.IntArray(input);
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndObject();
  w.Key("parallel_layout_item");
  w.BeginObject();
  for (const auto& [name, param] : strategy.params()) {
    if (!strategy.stage_prefixed_names()) {
      w.Key(name);
      WriteLayout(w, param);
      continue;
    }
    for (int32_t stage : param.layout.stages) {
      w.Key(absl::StrCat(stage, "-", name));
      WriteLayout(w, param);
    }
  }
  w.EndObject();
  w.EndObject();
  return out;
}

}  // namespace ckpt::strategy_internal
