// The JSON form of a strategy (MindSpore's to_json/FromJson): parsing with bounded memory, and
// serialising in the order MindSpore writes.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/absl_compat.h"
#include "core/internal/strategy_parse.h"
#include "core/status_macros.h"
#include "core/strategy.h"
#include "nlohmann/json.hpp"

namespace ckpt::strategy_internal {
namespace {

// Parsed JSON. Objects are sorted maps (lookups in O(log n)): nlohmann's order-preserving
// ordered_json finds keys by a linear scan, which makes parsing an object of n keys O(n^2) (tens
// of seconds for a strategy of 50,000 parameters). The one order that matters, the key order of
// the two item objects (the first operator item decides a per-stage file's pipeline stage, as in
// merge_pipeline_strategys; layout items are reported and merged in file order), is recorded
// while parsing (LimitedDomBuilder).
using Json = nlohmann::json;

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

// The keys of the top-level "parallel_strategy_item" and "parallel_layout_item" objects in file
// order: keys at depth 1 name a top-level member, those at depth 2 a member of that member's value
// when it is an object.
struct ItemOrder {
  std::string section;  // the top-level key whose value is being parsed
  std::vector<std::string> ops;
  std::vector<std::string> layouts;

  void OnKey(int depth, const std::string& key) {
    if (depth == 1) {
      section = key;
      // A repeated top-level key: the parsed document keeps the last value, so its order counts.
      if (section == "parallel_strategy_item") ops.clear();
      if (section == "parallel_layout_item") layouts.clear();
    } else if (depth == 2) {
      if (section == "parallel_strategy_item") ops.push_back(key);
      if (section == "parallel_layout_item") layouts.push_back(key);
    }
  }
};

// Thrown by LimitedDomBuilder when the document exceeds a bound.
struct TooLarge {
  std::string what;
};

// A SAX handler that builds the document with nlohmann's own DOM builder, bounding its values and
// depth and recording the item order. (nlohmann's callback parser, the other way to watch a parse,
// scans an object's members at the end of each member object: O(n^2) for n parameters.)
class LimitedDomBuilder {
 public:
  // A parsed value costs 16 bytes and more, so a large text of tiny values (or deep nesting)
  // could cost far more memory than its size: both are bounded, far above what a real strategy
  // holds (tens of values per parameter, 5 levels).
  static constexpr int64_t kMaxValues = int64_t{1} << 23;
  static constexpr int kMaxDepth = 32;

  explicit LimitedDomBuilder(Json& root) : dom_(root, /*allow_exceptions_=*/true) {}

  const ItemOrder& order() const { return order_; }

  bool null() { return Value() && dom_.null(); }
  bool boolean(bool v) { return Value() && dom_.boolean(v); }
  bool number_integer(Json::number_integer_t v) { return Value() && dom_.number_integer(v); }
  bool number_unsigned(Json::number_unsigned_t v) { return Value() && dom_.number_unsigned(v); }
  bool number_float(Json::number_float_t v, const Json::string_t& s) {
    return Value() && dom_.number_float(v, s);
  }
  bool string(Json::string_t& v) { return Value() && dom_.string(v); }
  bool binary(Json::binary_t& v) { return Value() && dom_.binary(v); }
  bool start_object(std::size_t n) { return Enter() && dom_.start_object(n); }
  bool key(Json::string_t& k) {
    order_.OnKey(depth_, k);
    return dom_.key(k);
  }
  bool end_object() {
    --depth_;
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return Enter() && dom_.start_array(n); }
  bool end_array() {
    --depth_;
    return dom_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& ex) {
    return dom_.parse_error(position, token, ex);  // throws it
  }

 private:
  bool Value() {
    if (++values_ > kMaxValues) {
      throw TooLarge{absl::StrCat("holds more than ", kMaxValues, " values")};
    }
    return true;
  }
  bool Enter() {
    if (++depth_ > kMaxDepth) throw TooLarge{absl::StrCat("nests deeper than ", kMaxDepth, " levels")};
    return true;
  }

  nlohmann::detail::json_sax_dom_parser<Json> dom_;
  ItemOrder order_;
  int64_t values_ = 0;
  int depth_ = 0;
};

// Calls fn(name, value) for every member of `object` in the recorded `order`, each name once (a
// repeated key keeps its first position and, as parsed, its last value).
template <typename Fn>
absl::Status ForEachInOrder(const Json& object, const std::vector<std::string>& order, Fn&& fn) {
  std::set<std::string_view> done;
  for (const std::string& name : order) {
    if (!done.insert(name).second) continue;
    auto it = object.find(name);
    if (it == object.end()) continue;
    CKPT_RETURN_IF_ERROR(fn(name, *it));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Strategy> ParseJson(std::string_view bytes) {
  if (bytes.find_first_not_of(" \t\r\n") == std::string_view::npos) return NoLayoutItems();
  Json doc;
  LimitedDomBuilder builder(doc);
  try {
    Json::sax_parse(bytes.begin(), bytes.end(), &builder);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a JSON strategy: ", e.what()));
  } catch (const TooLarge& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("JSON strategy refused: it ", e.what, ", more than any strategy needs"));
  }
  const ItemOrder& order = builder.order();
  if (!doc.is_object()) return JsonTypeError("a JSON strategy", "an object");

  std::vector<OpStrategy> ops;
  if (auto it = doc.find("parallel_strategy_item"); it != doc.end()) {
    if (!it->is_object()) return JsonTypeError("parallel_strategy_item", "an object");
    ops.reserve(it->size());
    CKPT_RETURN_IF_ERROR(
        ForEachInOrder(*it, order.ops, [&](const std::string& name, const Json& item) {
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
      ForEachInOrder(*layouts, order.layouts, [&](const std::string& name, const Json& item) {
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
