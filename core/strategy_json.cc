// The JSON form of a strategy (MindSpore's to_json/FromJson): parsing with bounded memory, and
// serialising in the order MindSpore writes. nlohmann's SAX parser reads the text into a light
// document of our own (JsonDocument), and JsonWriter writes nlohmann's dump(2) form directly: a
// strategy of 50,000 parameters is a 16 MiB text, and nlohmann's own document costs an
// allocation per value.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/absl_compat.h"
#include "core/internal/strategy_parse.h"
#include "core/status_macros.h"
#include "core/strategy.h"
#include "nlohmann/json.hpp"

namespace ckpt::strategy_internal {
namespace {

// Parsed JSON: a light document built from nlohmann's SAX events by JsonDocument. A value's
// members (object) or elements (array) are contiguous; member names are views of the document's
// own copies; string values keep only their kind. The interface is the part of nlohmann::json's
// that the conversions below use. Parsing a 50,000-parameter strategy into nlohmann's own document
// (an allocation per value and per key, sorted maps) took most of the time of registering it.
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

  // Members ordered so that a value is 40 bytes: a strategy's document holds about twenty per
  // parameter.
  std::string_view key;  // an object member's name
  union {
    int64_t i = 0;  // kInt
    uint64_t u;     // kUint
  };
  union {
    const Json* children = nullptr;  // once parsed
    uint32_t first;  // while parsing: the index of the first child in the document's pool
  };
  uint32_t count = 0;
  Kind kind = Kind::kNull;
};

// Parses a JSON text with nlohmann's strict SAX parser (RFC 8259: UTF-8 checked, escapes
// decoded, surrogate pairs joined, a leading UTF-8 byte order mark skipped, nothing after the
// document) into a Json document that it owns (root(), valid while the JsonDocument lives).
// Bounds the values and the depth: a parsed value costs more memory than its text, so a large
// text of tiny values (or deep nesting) could cost far more memory than its size; both bounds
// are far above what a real strategy holds (tens of values per parameter, 5 levels). Not
// thread-safe; parse once per object.
class JsonDocument final : public nlohmann::json_sax<nlohmann::json> {
 public:
  static constexpr int64_t kMaxValues = int64_t{1} << 23;
  static constexpr size_t kMaxDepth = 32;

  // Parses `text`. On failure returns INVALID_ARGUMENT saying whether the text is not JSON
  // (with the byte position nlohmann reports) or exceeds a bound.
  absl::Status Parse(std::string_view text) {
    // Every decoded key is shorter than its quoted text, so the copies fit in a buffer of the
    // text's size and views of it stay valid.
    strings_.reserve(text.size());
    // Every value but the root is a member or element, and a container of n of them has n - 1
    // commas: so the values are at most 1 + commas + containers, which counting the characters
    // (those in strings too) bounds from above. The pool is reserved once at that size (untouched
    // until used): a strategy's document is larger than its text, and growing it by doubling
    // would copy it and touch twice its memory.
    size_t bound = 1;
    for (char c : text) bound += (c == ',') | (c == '[') | (c == '{');
    pool_.reserve(std::min<size_t>(bound, kMaxValues + 1));
    const bool ok = nlohmann::json::sax_parse(text.begin(), text.end(), this,
                                              nlohmann::json::input_format_t::json,
                                              /*strict=*/true);
    if (!error_.ok()) return error_;
    if (!ok || !done_) return absl::InvalidArgumentError("not a JSON strategy: no document");
    for (Json& v : pool_) Link(v);
    Link(root_);
    return absl::OkStatus();
  }
  const Json& root() const { return root_; }

  // nlohmann::json_sax: each returns false to stop the parse.
  bool null() override { return Value(Of(Json::Kind::kNull)); }
  bool boolean(bool /*val*/) override { return Value(Of(Json::Kind::kBool)); }
  bool number_integer(number_integer_t val) override {
    Json v = Of(Json::Kind::kInt);
    v.i = val;
    return Value(v);
  }
  bool number_unsigned(number_unsigned_t val) override {
    Json v = Of(Json::Kind::kUint);
    v.u = val;
    return Value(v);
  }
  bool number_float(number_float_t /*val*/, const string_t& /*s*/) override {
    return Value(Of(Json::Kind::kFloat));
  }
  // A string value's text is not kept: no conversion reads one.
  bool string(string_t& /*val*/) override { return Value(Of(Json::Kind::kString)); }
  bool binary(binary_t& /*val*/) override {
    return Fail(absl::InvalidArgumentError("not a JSON strategy: it holds a binary value"));
  }
  bool key(string_t& val) override {
    std::optional<std::string_view> k = Copy(val);
    if (!k) return false;
    key_ = *k;
    return true;
  }
  bool start_object(std::size_t /*elements*/) override { return Open(Json::Kind::kObject); }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t /*elements*/) override { return Open(Json::Kind::kArray); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::json::exception& ex) override {
    // ex.what() is "[json.exception.parse_error.101] parse error at line 1, column 5: syntax
    // error ... - invalid literal; last read: '<token>'": the bracketed prefix is nlohmann's
    // bookkeeping, and the token quotes the text, which need not be UTF-8 or printable, so it is
    // escaped. `position` counts the bytes read, the offending one included.
    std::string what = ex.what();
    if (const size_t end = what.find("] "); what.rfind('[', 0) == 0 && end != what.npos) {
      what.erase(0, end + 2);
    }
    const std::string quoted = absl::StrCat("; last read: '", last_token, "'");
    if (const size_t at = what.rfind(quoted); at != what.npos) {
      what.replace(at, quoted.size(),
                   absl::StrCat("; last read: '", absl::CHexEscape(last_token), "'"));
    }
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("not a JSON strategy: syntax error at byte ", position, ": ", what)));
  }

 private:
  // An open container: its Json (kind and key) and where its children start on stack_.
  struct Frame {
    Json value;
    size_t base;
  };

  static Json Of(Json::Kind kind) {
    Json v;
    v.kind = kind;
    return v;
  }
  bool Fail(absl::Status status) {
    if (error_.ok()) error_ = std::move(status);
    return false;
  }
  bool TooLarge(std::string_view what) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("JSON strategy refused: it ", Sv(what), ", more than any strategy needs")));
  }
  // Counts a value (scalar or container); false once there are too many.
  bool Count() {
    if (++values_ > kMaxValues) {
      return TooLarge(absl::StrCat("holds more than ", kMaxValues, " values"));
    }
    return true;
  }
  // A copy of `s` in strings_, or nullopt (error set) if it would not fit, which the sizing in
  // Parse rules out.
  std::optional<std::string_view> Copy(const std::string& s) {
    if (strings_.capacity() - strings_.size() < s.size()) {
      Fail(absl::InternalError("JSON strategy: decoded strings outgrew their buffer"));
      return std::nullopt;
    }
    const size_t at = strings_.size();
    strings_.append(s);
    std::string_view copy(strings_);
    copy = copy.substr(at);
    return copy;
  }
  // A member of the innermost open object takes the pending key.
  void TakeKey(Json& v) const {
    if (!frames_.empty() && frames_.back().value.kind == Json::Kind::kObject) v.key = key_;
  }
  bool Value(Json v) {
    if (!Count()) return false;
    TakeKey(v);
    Place(v);
    return true;
  }
  // A scalar or a closed container: a child of the innermost open container, or the root.
  void Place(const Json& v) {
    if (frames_.empty()) {
      root_ = v;
      done_ = true;
    } else {
      stack_.push_back(v);
    }
  }
  bool Open(Json::Kind kind) {
    if (!Count()) return false;
    if (frames_.size() >= kMaxDepth) {
      return TooLarge(absl::StrCat("nests deeper than ", kMaxDepth, " levels"));
    }
    Json v = Of(kind);
    TakeKey(v);
    frames_.push_back({v, stack_.size()});
    return true;
  }
  bool Close() {
    Frame frame = frames_.back();
    frames_.pop_back();
    // The children, contiguous in the pool (their own children are there already).
    Json& v = frame.value;
    v.first = static_cast<uint32_t>(pool_.size());
    v.count = static_cast<uint32_t>(stack_.size() - frame.base);
    pool_.insert(pool_.end(), stack_.begin() + static_cast<std::ptrdiff_t>(frame.base),
                 stack_.end());
    stack_.resize(frame.base);
    Place(v);
    return true;
  }
  void Link(Json& v) { v.children = v.count > 0 ? pool_.data() + v.first : nullptr; }

  absl::Status error_;
  int64_t values_ = 0;
  bool done_ = false;
  std::string strings_;        // the decoded keys, back to back (nlohmann lends each one)
  std::string_view key_;       // the key of the next member of the innermost object
  std::vector<Frame> frames_;  // the open containers, outermost first
  std::vector<Json> stack_;    // children of the open containers, each one's contiguous
  std::vector<Json> pool_;     // children of closed containers, each container's contiguous
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
// one array element per line, "[]" and "{}" for empty containers, strings escaped by nlohmann's
// serializer), straight into one string: building an ordered_json document first costs an
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
  // The same for one of the format's fixed member names, written for every parameter: it is
  // quoted once per writer. `key` must outlive the writer (a string literal).
  void FixedKey(std::string_view key) {
    Separate();
    auto [it, inserted] = quoted_.try_emplace(key);
    if (inserted) it->second = Quote(key);
    out_->append(it->second);
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
  // A string, quoted and escaped by nlohmann's serializer. The strings written are valid UTF-8
  // (Strategy::Create checks every name); error_handler_t::replace only keeps the serializer from
  // throwing should one not be.
  void String(std::string_view s) { out_->append(Quote(s)); }

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

  static std::string Quote(std::string_view s) {
    return nlohmann::json(std::string(s))
        .dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
  }

  std::string* out_;
  std::unordered_map<std::string_view, std::string> quoted_;  // FixedKey's names, quoted
  std::vector<bool> first_;  // per open container: nothing written in it yet
};

void WriteLayout(JsonWriter& w, const StrategyParam& param) {
  const Layout& layout = param.layout;
  w.BeginObject();
  w.FixedKey("dev_matrix");
  w.IntArray(layout.dev_matrix);
  w.FixedKey("tensor_map");
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
    w.FixedKey("tensor_shape");
    w.IntArray(*param.tensor_shape);
  }
  w.FixedKey("field");
  w.Int(layout.field);
  w.FixedKey("opt_weight_shard_step");
  w.Int(layout.opt_shard_step);
  w.FixedKey("opt_weight_shard_size");
  w.Int(layout.opt_shard_size);
  w.FixedKey("param_split_shape");
  w.IntArray(layout.param_split_shape);
  w.FixedKey("indices_offset");
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
  JsonDocument parsed;
  CKPT_RETURN_IF_ERROR(parsed.Parse(bytes));
  const Json& doc = parsed.root();
  if (!doc.is_object()) return JsonTypeError("a JSON strategy", "an object");

  std::vector<OpStrategy> ops;
  if (auto it = doc.find("parallel_strategy_item"); it != doc.end()) {
    if (!it->is_object()) return JsonTypeError("parallel_strategy_item", "an object");
    ops.reserve(it->size());
    CKPT_RETURN_IF_ERROR(ForEachInOrder(*it, [&](const std::string& name, const Json& item) {
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
  CKPT_RETURN_IF_ERROR(ForEachInOrder(*layouts, [&](const std::string& name, const Json& item) {
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
  w.FixedKey("current_stage");
  w.Int(strategy.stage_prefixed_names() ? 1 : 0);
  w.FixedKey("parallel_strategy_item");
  w.BeginObject();
  std::set<std::string_view> op_names;
  for (const OpStrategy& op : strategy.ops()) {
    // JSON keys operator items by node name; a repeated name keeps its first item, the one that
    // decides a per-stage file's stage.
    if (!op_names.insert(op.node_name).second) continue;
    w.Key(op.node_name);
    w.BeginObject();
    w.FixedKey("stage");
    w.Int(op.stage);
    w.FixedKey("parallel_strategy");
    w.BeginArray();
    for (const std::vector<uint32_t>& input : op.inputs) {
      w.Element();
      w.IntArray(input);
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndObject();
  w.FixedKey("parallel_layout_item");
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
