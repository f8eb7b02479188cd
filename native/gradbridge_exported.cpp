// gradbridge's protocol-3 engine: a training module captured with torch.export as gradbridge's own op lists
// (python/gradbridge/_runtime/oplist.py holds the format; program.py the Python twin of everything here), run op by
// op over libtorch's public dispatcher: each op resolved once per graph with
// c10::Dispatcher::findSchema and run with callBoxed on an IValue stack, the kernels eager PyTorch reaches.
// The module owns its state tensors (parameters, buffers, gradients, optimizer state) by binding name. An
// unknown op-list version, operator or argument kind is refused with one line naming it. Entry points
// follow gradbridge_jni.cpp's rules (one guard, handles are new'ed objects Java frees once).

#include <jni.h>

#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "dev_gradbridge_Native.h"
#include "jni_support.h"

namespace {

using namespace gradbridge;

constexpr int64_t kOpListVersion = 4;

// ---- a small JSON reader (the op lists and the program are JSON) ----
struct Json {
  enum Kind { Null, Bool, Number, String, Array, Object } kind = Null;
  bool b = false;
  std::string text;  // a number's literal, or a string
  std::vector<Json> items;
  std::vector<std::pair<std::string, Json>> fields;

  const Json* get(const std::string& key) const {
    for (const auto& f : fields)
      if (f.first == key) return &f.second;
    return nullptr;
  }
  const Json& at(const std::string& key, const std::string& where) const {
    const Json* v = get(key);
    if (v == nullptr) throw std::invalid_argument(where + " lacks '" + key + "'");
    return *v;
  }
  // Java's ProgramCheck has checked every field (the text here is Gson's); these checks stay strict anyway:
  // a whole JSON integer in int64's range, a whole number, a JSON true/false.
  int64_t integer() const {
    const size_t digits = !text.empty() && text[0] == '-' ? 1 : 0;
    if (kind != Number || text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos ||
        (text[digits] == '0' && text.size() > digits + 1))
      throw std::invalid_argument("op list: expected an integer, got " + text.substr(0, 80));
    try {
      return std::stoll(text);
    } catch (const std::logic_error&) {  // out of int64's range
      throw std::invalid_argument("op list: expected an integer, got " + text.substr(0, 80));
    }
  }
  double number() const {
    char* end = nullptr;
    double value = kind == Number ? std::strtod(text.c_str(), &end) : 0;
    if (kind != Number || end != text.c_str() + text.size()) throw std::invalid_argument("op list: expected a number");
    return value;
  }
  bool flag() const {
    if (kind != Bool) throw std::invalid_argument("op list: expected true or false");
    return b;
  }
  const std::string& str() const {
    if (kind != String) throw std::invalid_argument("op list: expected a string");
    return text;
  }
};

struct JsonParser {
  const std::string& s;
  size_t i = 0;
  int depth = 0;  // nesting, bounded: a crafted file must not exhaust the stack
  explicit JsonParser(const std::string& text) : s(text) {}
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
  }
  char peek() const { return i < s.size() ? s[i] : '\0'; }  // never past the end
  [[noreturn]] void fail(const char* what) { throw std::invalid_argument(std::string("op list: invalid JSON (") + what + " at " + std::to_string(i) + ")"); }
  Json value() {
    ws();
    if (i >= s.size()) fail("end of text");
    Json v;
    char c = s[i];
    if ((c == '{' || c == '[') && ++depth > 32) fail("nesting deeper than 32");
    if (c == '{') {
      v.kind = Json::Object;
      i++;
      ws();
      if (peek() == '}') { i++; depth--; return v; }
      while (true) {
        ws();
        Json key = value();
        if (key.kind != Json::String) fail("object key");
        ws();
        if (peek() != ':') fail("':'");
        i++;
        v.fields.emplace_back(key.text, value());
        ws();
        if (peek() == ',') { i++; continue; }
        if (peek() == '}') { i++; depth--; return v; }
        fail("',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      i++;
      ws();
      if (peek() == ']') { i++; depth--; return v; }
      while (true) {
        v.items.push_back(value());
        ws();
        if (peek() == ',') { i++; continue; }
        if (peek() == ']') { i++; depth--; return v; }
        fail("',' or ']'");
      }
    }
    if (c == '"') {
      v.kind = Json::String;
      i++;
      while (i < s.size() && s[i] != '"') {
        if (s[i] == '\\') {
          i++;
          char e = s[i];
          if (e == 'n') v.text += '\n'; else if (e == 't') v.text += '\t'; else if (e == 'r') v.text += '\r';
          else if (e == 'b') v.text += '\b'; else if (e == 'f') v.text += '\f'; else if (e == 'u') {
            std::string digits = s.substr(i + 1, 4);
            if (digits.size() != 4 || digits.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) fail("\\u escape");
            unsigned code = std::stoul(digits, nullptr, 16);
            i += 4;
            if (code < 0x80) v.text += static_cast<char>(code); else v.text += '?';
          } else v.text += e;
          i++;
        } else {
          v.text += s[i++];
        }
      }
      if (i >= s.size()) fail("unterminated string");
      i++;
      return v;
    }
    if (s.compare(i, 4, "null") == 0) { i += 4; return v; }
    if (s.compare(i, 4, "true") == 0) { i += 4; v.kind = Json::Bool; v.b = true; return v; }
    if (s.compare(i, 5, "false") == 0) { i += 5; v.kind = Json::Bool; return v; }
    size_t start = i;
    while (i < s.size() && (isdigit(s[i]) || s[i] == '-' || s[i] == '+' || s[i] == '.' || s[i] == 'e' || s[i] == 'E')) i++;
    if (start == i) fail("value");
    v.kind = Json::Number;
    v.text = s.substr(start, i - start);
    return v;
  }
};

Json parse_json(const std::string& text) {
  JsonParser p(text);
  Json v = p.value();
  p.ws();
  if (p.i != text.size()) p.fail("extra data after the value");
  return v;
}

// ---- op lists ----
struct Arg {
  enum Kind { Ref, RefList, OptRefList, None, Int, Double, Bool, IntList, SizeList, BatchInt, DoubleList, BoolList,
              Str, Dtype, Layout, Device, MemoryFormat, Constant } kind = None;
  int64_t i = 0;  // Ref slot, Int value, BatchInt's a
  int64_t c = 0;  // BatchInt's c
  double d = 0;
  bool b = false;
  std::string s;
  std::vector<int64_t> ints;  // RefList/OptRefList slots (-1: None), IntList; SizeList: pairs (a, c)
  std::vector<double> doubles;
  std::vector<bool> bools;
  at::Tensor constant;  // Constant: a number given where the schema takes a tensor
};

struct Node {
  std::optional<c10::OperatorHandle> op;  // empty: the #item built-in
  std::string name;
  std::vector<Arg> args;
  int64_t outputs = 1;
  std::vector<size_t> sized;  // the arguments that size a tensor (Limits::sized): checked before the op runs
  bool strided = false;       // takes a `size` and a `stride` (as_strided's kind): its extent checked against its storage
  std::string label;          // " node K (NAME)", for its error lines
};

// oplist_rules.json's limits that the op lists' run checks, as Java hands them over (python: oplist_check.LIMITS)
struct Limits {
  int64_t elements = 0;              // the most elements an argument may size a tensor to
  std::vector<std::string> sized;    // the names of those arguments
  bool is_sized(const std::string& name) const { return std::find(sized.begin(), sized.end(), name) != sized.end(); }
};

struct Graph {
  std::vector<std::string> inputs;
  std::vector<Node> nodes;
  std::vector<std::pair<int64_t, std::string>> outputs;
  int batch_input = -1;
  // A joint graph's first nodes, up to the one that computes `loss`, are its forward: they run with grad mode
  // on, as eager's forward (a kernel may branch on it: oneDNN's LSTM layer keeps its backward's workspace
  // only then); the backward runs with it off, as autograd's engine runs it (python: oplist.forward_ops).
  size_t forward_ops = 0;
  // The slots to let go after each node: those no later node reads and no output names (an optimizer step's
  // temporaries one parameter at a time, an activation once the backward has read it; python: oplist._last_reads)
  std::vector<std::vector<int64_t>> release_after;
};

const std::map<std::string, at::ScalarType>& dtypes() {
  static const std::map<std::string, at::ScalarType> table = {
      {"uint8", at::kByte}, {"int8", at::kChar}, {"int16", at::kShort}, {"int32", at::kInt},
      {"int64", at::kLong}, {"float16", at::kHalf}, {"float32", at::kFloat}, {"float64", at::kDouble},
      {"bool", at::kBool}, {"bfloat16", at::kBFloat16}};
  return table;
}

at::ScalarType dtype_named(const std::string& name) {
  auto it = dtypes().find(name);
  if (it == dtypes().end()) throw std::invalid_argument("op list: unknown dtype " + name);
  return it->second;
}

double hex_double(const Json& v) { return std::strtod(v.str().c_str(), nullptr); }

Arg parse_arg(const Json& v, const std::string& where) {
  Arg a;
  if (v.kind == Json::Null) return a;
  if (v.kind != Json::Object || v.fields.size() != 1) throw std::invalid_argument(where + ": an argument is not an object of one kind");
  const std::string& kind = v.fields[0].first;
  const Json& x = v.fields[0].second;
  if (kind == "t") { a.kind = Arg::Ref; a.i = x.integer(); }
  else if (kind == "tl" || kind == "otl") {
    a.kind = kind == "tl" ? Arg::RefList : Arg::OptRefList;
    for (const auto& item : x.items) a.ints.push_back(item.kind == Json::Null ? -1 : item.integer());
  }
  else if (kind == "i") { a.kind = Arg::Int; a.i = x.integer(); }
  else if (kind == "f") { a.kind = Arg::Double; a.d = hex_double(x); }
  else if (kind == "b") { a.kind = Arg::Bool; a.b = x.flag(); }
  else if (kind == "il") { a.kind = Arg::IntList; for (const auto& item : x.items) a.ints.push_back(item.integer()); }
  else if (kind == "sl") {
    a.kind = Arg::SizeList;
    for (const auto& item : x.items) {
      if (item.kind == Json::Number) { a.ints.push_back(0); a.ints.push_back(item.integer()); }
      else { const Json& bx = item.at("bx", where); a.ints.push_back(bx.items.at(0).integer()); a.ints.push_back(bx.items.at(1).integer()); }
    }
  }
  else if (kind == "bx") { a.kind = Arg::BatchInt; a.i = x.items.at(0).integer(); a.c = x.items.at(1).integer(); }
  else if (kind == "fl") { a.kind = Arg::DoubleList; for (const auto& item : x.items) a.doubles.push_back(hex_double(item)); }
  else if (kind == "bl") { a.kind = Arg::BoolList; for (const auto& item : x.items) a.bools.push_back(item.flag()); }
  else if (kind == "s") { a.kind = Arg::Str; a.s = x.str(); }
  else if (kind == "dtype") { a.kind = Arg::Dtype; a.i = static_cast<int64_t>(dtype_named(x.str())); }
  else if (kind == "layout") { if (x.str() != "strided") throw std::invalid_argument(where + ": unknown layout " + x.str()); a.kind = Arg::Layout; }
  else if (kind == "device") { if (x.str() != "cpu") throw std::invalid_argument(where + ": unknown device " + x.str()); a.kind = Arg::Device; }
  else if (kind == "mf") {
    a.kind = Arg::MemoryFormat;
    const std::string& f = x.str();
    a.i = f == "contiguous_format" ? static_cast<int64_t>(c10::MemoryFormat::Contiguous)
        : f == "preserve_format" ? static_cast<int64_t>(c10::MemoryFormat::Preserve)
        : f == "channels_last" ? static_cast<int64_t>(c10::MemoryFormat::ChannelsLast)
        : f == "channels_last_3d" ? static_cast<int64_t>(c10::MemoryFormat::ChannelsLast3d) : -1;
    if (a.i < 0) throw std::invalid_argument(where + ": unknown memory format " + f);
  }
  else throw std::invalid_argument(where + ": unknown argument kind '" + kind + "'");
  return a;
}

// What a slot holds, known at load from the bindings and the schemas' return types (python: oplist.slot_kinds).
enum class Slot { Tensor, Double, List, Other };

Slot slot_of_return(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return Slot::Tensor;
  if (type->kind() == c10::TypeKind::ListType) return Slot::List;
  return Slot::Other;
}

const char* slot_name(Slot s) {
  return s == Slot::Tensor ? "a tensor" : s == Slot::Double ? "a double" : s == Slot::List ? "a list" : "no value";
}

// Whether argument `a` fits schema type `given` (its real type: ScalarType, not int) as the boxed kernel reads
// it: a kernel given another kind than it reads stops in an internal assert of libtorch's, or worse (python:
// oplist._fits). A number given for a Tensor is wrapped, an int for a float widened (type_arguments).
bool fits(const Arg& a, const c10::TypePtr& given, const std::vector<Slot>& slots) {
  c10::TypePtr type = given;
  if (auto optional = type->cast<c10::OptionalType>()) {
    if (a.kind == Arg::None) return true;
    type = optional->getElementType();
  }
  auto slot = [&](Slot want) { return a.kind == Arg::Ref && slots[a.i] == want; };
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
      return slot(Slot::Tensor) || a.kind == Arg::Int || a.kind == Arg::Double || a.kind == Arg::Bool;
    case c10::TypeKind::ListType: {
      c10::TypePtr element = type->castRaw<c10::ListType>()->getElementType();
      const auto kind = element->kind();
      if (kind == c10::TypeKind::TensorType) return a.kind == Arg::RefList || slot(Slot::List);
      if (kind == c10::TypeKind::OptionalType)
        return element->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType &&
               (a.kind == Arg::OptRefList || slot(Slot::List));
      if (kind == c10::TypeKind::IntType || kind == c10::TypeKind::SymIntType)
        return a.kind == Arg::IntList || a.kind == Arg::SizeList;
      if (kind == c10::TypeKind::FloatType) return a.kind == Arg::DoubleList;
      if (kind == c10::TypeKind::BoolType) return a.kind == Arg::BoolList;
      return false;
    }
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: return a.kind == Arg::Int || a.kind == Arg::BatchInt;
    case c10::TypeKind::FloatType: return a.kind == Arg::Double || a.kind == Arg::Int || slot(Slot::Double);
    case c10::TypeKind::NumberType:
      return a.kind == Arg::Int || a.kind == Arg::Double || a.kind == Arg::Bool || a.kind == Arg::BatchInt || slot(Slot::Double);
    case c10::TypeKind::BoolType: return a.kind == Arg::Bool;
    case c10::TypeKind::StringType: return a.kind == Arg::Str;
    case c10::TypeKind::ScalarTypeType: return a.kind == Arg::Dtype;
    case c10::TypeKind::LayoutType: return a.kind == Arg::Layout;
    case c10::TypeKind::DeviceObjType: return a.kind == Arg::Device;
    case c10::TypeKind::MemoryFormatType: return a.kind == Arg::MemoryFormat;
    default: return false;
  }
}

// Checks each argument against the op's schema; then a number where the schema takes a Tensor
// (`num_batches_tracked.add_(1)` is `add.Tensor(t, 1)`) becomes the tensor Python's argument parser makes of
// it: a 0-dim tensor marked as a wrapped number, so type promotion treats it as a scalar, as in eager; an int
// where it takes a float becomes that double.
void type_arguments(Node& node, const std::vector<Slot>& slots, const std::string& where) {
  const auto& arguments = node.op->schema().arguments();
  if (node.args.size() != arguments.size())
    throw std::invalid_argument(where + ": " + std::to_string(node.args.size()) + " arguments, its schema takes " +
                                std::to_string(arguments.size()));
  for (size_t k = 0; k < arguments.size(); k++) {
    Arg& a = node.args[k];
    const c10::TypePtr& real = arguments[k].real_type();
    if (!fits(a, real, slots)) {
      std::string given = a.kind == Arg::Ref ? "slot " + std::to_string(a.i) + " (" + slot_name(slots[a.i]) + ")"
                                             : std::string("an argument of another kind");
      throw std::invalid_argument(where + " args[" + std::to_string(k) + "]: " + given + " where its schema takes " +
                                  real->str() + " " + arguments[k].name());
    }
    c10::TypePtr type = real;
    if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (a.kind == Arg::Int && type->kind() == c10::TypeKind::FloatType) {
      a.kind = Arg::Double;
      a.d = static_cast<double>(a.i);
      continue;
    }
    if (a.kind != Arg::Int && a.kind != Arg::Double && a.kind != Arg::Bool) continue;
    if (type->kind() != c10::TypeKind::TensorType) continue;
    c10::Scalar number = a.kind == Arg::Int    ? c10::Scalar(a.i)
                         : a.kind == Arg::Double ? c10::Scalar(a.d)
                                                 : c10::Scalar(a.b);
    a.constant = at::native::wrapped_scalar_tensor(number);
    a.kind = Arg::Constant;
  }
}

Graph parse_graph(const std::string& name, const Json& g, const Limits& limits) {
  std::string where = "op list " + name;
  const Json* version = g.get("oplist_version");
  if (version == nullptr || version->kind != Json::Number || version->integer() != kOpListVersion) {
    throw std::invalid_argument(where + ": op-list version " + (version == nullptr ? std::string("missing") : version->text) +
                                ", this gradbridge runs version " + std::to_string(kOpListVersion));
  }
  Graph graph;
  for (const auto& input : g.at("inputs", where).items) graph.inputs.push_back(input.str());
  for (size_t k = 0; k < graph.inputs.size(); k++) {
    const auto& b = graph.inputs[k];
    if (graph.batch_input < 0 && b.rfind("input:", 0) == 0) graph.batch_input = static_cast<int>(k);
  }
  if (graph.batch_input < 0) {
    for (size_t k = 0; k < graph.inputs.size(); k++)
      if (graph.inputs[k] == "target") graph.batch_input = static_cast<int>(k);
  }
  std::vector<Slot> slots;
  for (const auto& b : graph.inputs) slots.push_back(b.rfind("scalar:", 0) == 0 ? Slot::Double : Slot::Tensor);
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto& nodes = g.at("nodes", where).items;
  for (size_t index = 0; index < nodes.size(); index++) {
    const Json& n = nodes[index];
    Node node;
    std::string op = n.at("op", where).str();
    std::string overload = n.at("overload", where).str();
    node.name = op + (overload.empty() ? "" : "." + overload);
    node.label = " node " + std::to_string(index) + " (" + node.name + ")";
    const std::string at = where + node.label;
    if (op != "#item") {
      auto handle = dispatcher.findSchema({op, overload == "default" ? "" : overload});
      if (!handle.has_value()) throw std::invalid_argument(where + ": unknown operator " + node.name);
      node.op = *handle;
    }
    const auto& args = n.at("args", where).items;
    if (!node.op.has_value() && args.size() != 2) throw std::invalid_argument(at + ": expected 2 arguments");
    for (size_t k = 0; k < args.size(); k++) {
      node.args.push_back(parse_arg(args[k], at));
      const Arg& a = node.args.back();
      auto check_slot = [&](int64_t s) {
        if (s < 0 || s >= static_cast<int64_t>(slots.size()))
          throw std::invalid_argument(at + ": argument refers to slot " + std::to_string(s) + " before it is computed");
      };
      if (a.kind == Arg::Ref) check_slot(a.i);
      if (a.kind == Arg::RefList || a.kind == Arg::OptRefList)
        for (int64_t s : a.ints) {
          if (s == -1 && a.kind == Arg::OptRefList) continue;
          check_slot(s);
          if (slots[s] != Slot::Tensor)
            throw std::invalid_argument(at + " args[" + std::to_string(k) + "]: slot " + std::to_string(s) + " holds " +
                                        slot_name(slots[s]) + ", not a tensor");
        }
    }
    node.outputs = n.at("outputs", where).integer();
    if (node.op.has_value()) {
      type_arguments(node, slots, at);
      const auto& arguments = node.op->schema().arguments();
      const auto& returns = node.op->schema().returns();
      if (node.outputs != static_cast<int64_t>(returns.size()))
        throw std::invalid_argument(at + ": " + std::to_string(node.outputs) + " outputs, it returns " + std::to_string(returns.size()));
      for (const auto& r : returns) slots.push_back(slot_of_return(r.type()));
      if (returns.empty()) slots.push_back(Slot::Other);
      bool size = false, stride = false;  // as_strided's kind takes both (a convolution's stride is no view's)
      for (size_t k = 0; k < arguments.size(); k++) {
        if (limits.is_sized(arguments[k].name())) node.sized.push_back(k);
        size = size || arguments[k].name() == "size";
        stride = stride || arguments[k].name() == "stride";
      }
      node.strided = size && stride;
    } else {
      if (node.args[0].kind != Arg::Ref || slots[node.args[0].i] != Slot::List || node.args[1].kind != Arg::Int || node.outputs != 1)
        throw std::invalid_argument(at + ": takes a list slot and an index and has one output");
      slots.push_back(Slot::Tensor);
    }
    graph.nodes.push_back(std::move(node));
  }
  const int64_t count = static_cast<int64_t>(slots.size());
  for (const auto& out : g.at("outputs", where).items) {
    int64_t ref = out.at("ref", where).integer();
    if (ref < 0 || ref >= count) throw std::invalid_argument(where + ": an output refers to slot " + std::to_string(ref));
    if (slots[ref] != Slot::Tensor)
      throw std::invalid_argument(where + ": an output refers to slot " + std::to_string(ref) + ", which holds " + slot_name(slots[ref]) + ", not a tensor");
    graph.outputs.emplace_back(ref, out.at("to", where).str());
  }
  bool joint = false;
  int64_t loss = -1;
  for (const auto& [ref, to] : graph.outputs) {
    if (to == "loss") loss = ref;
    if (to.rfind("grad:", 0) == 0) joint = true;
  }
  if (joint && loss >= 0) {
    int64_t computed = static_cast<int64_t>(graph.inputs.size());
    for (size_t k = 0; k < graph.nodes.size() && graph.forward_ops == 0; k++) {
      computed += std::max<int64_t>(graph.nodes[k].outputs, 1);
      if (loss < computed) graph.forward_ops = k + 1;
    }
  }
  std::vector<int64_t> last(count, -1);  // the node that reads a slot last (or makes it, when none reads it)
  int64_t made = static_cast<int64_t>(graph.inputs.size());
  for (size_t k = 0; k < graph.nodes.size(); k++) {
    const Node& node = graph.nodes[k];
    for (int64_t n = std::max<int64_t>(node.outputs, 1); n > 0; n--) last[made++] = static_cast<int64_t>(k);
    for (const Arg& a : node.args) {
      if (a.kind == Arg::Ref) last[a.i] = static_cast<int64_t>(k);
      if (a.kind == Arg::RefList || a.kind == Arg::OptRefList)
        for (int64_t ref : a.ints) if (ref >= 0) last[ref] = static_cast<int64_t>(k);
    }
  }
  for (const auto& out : graph.outputs) last[out.first] = -1;
  graph.release_after.assign(graph.nodes.size(), {});
  for (int64_t ref = 0; ref < count; ref++)
    if (last[ref] >= 0) graph.release_after[last[ref]].push_back(ref);
  return graph;
}

// a * batch + c, an int the op list computes from the batch size, refused past int64 (python: oplist._decode)
int64_t batch_int(int64_t a, int64_t batch, int64_t c) {
  int64_t product = 0, sum = 0;
  if (__builtin_mul_overflow(a, batch, &product) || __builtin_add_overflow(product, c, &sum))
    throw std::invalid_argument("op list: " + std::to_string(a) + " * batch " + std::to_string(batch) + " + " + std::to_string(c) + " overflows int64");
  return sum;
}

// Before an op runs, what its arguments size from the file (python: oplist._check_sizes): each argument named
// in Limits::sized (a view's or a new tensor's size, slice_backward's input_sizes, embedding's num_weights)
// holds sizes of at least -1 (a view's inferred one) whose product is at most Limits::elements; an op that takes
// a `size` and a `stride` (as_strided's kind) stays within its source's storage: the file cannot make a tensor reach
// past the memory it owns, nor allocate past the limit.
void check_sizes(const Node& node, const torch::jit::Stack& stack, const Limits& limits, const std::string& graph) {
  auto where = [&] { return "op list " + graph + node.label; };
  for (size_t k : node.sized) {
    const c10::IValue& v = stack[k];
    std::vector<int64_t> sizes = v.isInt() ? std::vector<int64_t>{v.toInt()} : v.isIntList() ? v.toIntVector() : std::vector<int64_t>{};
    int64_t product = 1;
    for (int64_t d : sizes) {
      if (d < -1 || (v.isInt() && d < 0))
        throw std::invalid_argument(where() + ": " + node.op->schema().arguments()[k].name() + " " + c10::str(c10::IntArrayRef(sizes)) + " holds a negative size");
      if (d > 0 && (__builtin_mul_overflow(product, d, &product) || product > limits.elements))
        throw std::invalid_argument(where() + ": " + node.op->schema().arguments()[k].name() + " " + c10::str(c10::IntArrayRef(sizes)) +
                                    " sizes more than the limit of " + std::to_string(limits.elements) + " elements");
    }
  }
  if (!node.strided) return;
  const auto& arguments = node.op->schema().arguments();
  const at::Tensor* source = nullptr;
  std::vector<int64_t> size, stride;
  int64_t offset = 0;
  for (size_t k = 0; k < arguments.size(); k++) {
    const std::string& name = arguments[k].name();
    if (source == nullptr && stack[k].isTensor()) source = &stack[k].toTensor();
    if (name == "size" && stack[k].isIntList()) size = stack[k].toIntVector();
    if (name == "stride" && stack[k].isIntList()) stride = stack[k].toIntVector();
    if (name == "storage_offset" && stack[k].isInt()) offset = stack[k].toInt();
  }
  if (source == nullptr) return;
  const int64_t storage = static_cast<int64_t>(source->storage().nbytes() / std::max<size_t>(source->dtype().itemsize(), 1));
  int64_t reach = offset;
  bool empty = false;
  for (size_t d = 0; d < size.size(); d++) empty = empty || size[d] == 0;
  bool fits = size.size() == stride.size() && offset >= 0;
  for (size_t d = 0; fits && !empty && d < size.size(); d++) {
    int64_t step = 0;
    fits = size[d] >= 0 && stride[d] >= 0 && !__builtin_mul_overflow(size[d] - 1, stride[d], &step) &&
           !__builtin_add_overflow(reach, step, &reach);
  }
  if (!fits || (!empty && reach >= storage))
    throw std::invalid_argument(where() + ": size " + c10::str(c10::IntArrayRef(size)) + ", stride " + c10::str(c10::IntArrayRef(stride)) +
                                " and offset " + std::to_string(offset) + " reach past its source's " + std::to_string(storage) + " elements");
}

// An op's argument; a device argument is the module's device (the op lists hold "cpu", where they were captured).
c10::IValue argument(const Arg& a, const std::vector<c10::IValue>& slots, int64_t batch, c10::Device device) {
  switch (a.kind) {
    case Arg::Ref: return slots[a.i];
    case Arg::RefList: {
      c10::List<at::Tensor> list;
      for (int64_t s : a.ints) list.push_back(slots[s].toTensor());
      return list;
    }
    case Arg::OptRefList: {
      c10::List<std::optional<at::Tensor>> list;
      for (int64_t s : a.ints) list.push_back(s < 0 ? std::optional<at::Tensor>() : std::optional<at::Tensor>(slots[s].toTensor()));
      return list;
    }
    case Arg::None: return c10::IValue();
    case Arg::Int: return c10::IValue(a.i);
    case Arg::Double: return c10::IValue(a.d);
    case Arg::Bool: return c10::IValue(a.b);
    case Arg::IntList: return c10::IValue(a.ints);
    case Arg::SizeList: {
      std::vector<int64_t> sizes;
      for (size_t k = 0; k < a.ints.size(); k += 2) sizes.push_back(batch_int(a.ints[k], batch, a.ints[k + 1]));
      return c10::IValue(sizes);
    }
    case Arg::BatchInt: return c10::IValue(batch_int(a.i, batch, a.c));
    case Arg::DoubleList: return c10::IValue(a.doubles);
    case Arg::BoolList: {
      c10::List<bool> list;
      for (bool b : a.bools) list.push_back(b);
      return list;
    }
    case Arg::Str: return c10::IValue(a.s);
    case Arg::Dtype: return c10::IValue(static_cast<at::ScalarType>(a.i));
    case Arg::Layout: return c10::IValue(c10::Layout::Strided);
    case Arg::Device: return c10::IValue(device);
    case Arg::MemoryFormat: return c10::IValue(static_cast<c10::MemoryFormat>(a.i));
    case Arg::Constant: return c10::IValue(a.constant);
  }
  return c10::IValue();
}

// ---- the host's side of a step (program.py's twins): per-group scalars and the learning-rate schedule ----

// A double as C's "%a" writes it (Python's float.fromhex and strtod read it back exactly, inf included).
std::string hex_text(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%a", value);
  return buffer;
}

std::vector<double> hex_doubles(const Json& list) {
  std::vector<double> out;
  for (const auto& item : list.items) out.push_back(hex_double(item));
  return out;
}

struct Group {
  std::vector<std::string> params;
  double momentum = 0, beta1 = 0, beta2 = 0, weight_decay = 0, lr_decay = 0;
};

// export/scheduler_modules.py's arithmetic (torch.optim.lr_scheduler's chainable get_lr) for the schedules
// protocol 3 holds; `step` is one scheduler.step(), `step_metric` ReduceLROnPlateau.step(metric); SequentialLR
// restarts a child at its milestone with the child's closed form.
struct Schedule {
  std::string name;              // empty: no schedule
  std::string interval = "none";  // "step", "epoch" or "none"
  std::vector<double> base_lrs;
  int64_t step_size = 1, t_max = 1, total_iters = 1, patience = 0, cooldown = 0;
  double gamma = 1, eta_min = 0, start_factor = 1, end_factor = 1, factor = 1, threshold = 0, eps = 0;
  bool minimize = true, relative = true;
  std::vector<int64_t> milestones;  // MultiStepLR's, or SequentialLR's
  std::vector<double> min_lrs;
  std::vector<Schedule> children;  // SequentialLR's
  // OneCycleLR's, resolved at export (scheduler_modules.OneCycleLR): per group the initial, max and min lrs
  // and momenta; per phase its end step and the keys of the values it anneals between (0 initial lr, 1 max
  // lr, 2 min lr, 3 max momentum, 4 base momentum)
  int64_t total_steps = 0;
  std::vector<double> initial, max_lrs, end_steps, max_momenta, base_momenta;
  std::vector<int64_t> start_keys, end_keys, start_momentum_keys, end_momentum_keys;
  bool cos = true, cycle_momentum = false;
  // what a checkpoint saves (and each child's last_epoch); momenta: OneCycleLR's cycled momentum (SGD) or
  // beta1 (Adam) per group, empty when not cycled
  int64_t last_epoch = 0, num_bad_epochs = 0, cooldown_counter = 0;
  double best = 0;
  std::vector<double> momenta;

  // the closed form from the base lrs, what SequentialLR's step(0) uses to restart a schedule
  std::vector<double> closed_form() const {
    const double pi = 3.141592653589793;  // math.pi
    std::vector<double> out;
    for (double b : base_lrs) {
      if (name == "step") {
        out.push_back(b * std::pow(gamma, static_cast<double>(last_epoch / step_size)));
      } else if (name == "multistep") {
        int64_t passed = 0;
        for (int64_t m : milestones) passed += m <= last_epoch ? 1 : 0;
        out.push_back(b * std::pow(gamma, static_cast<double>(passed)));
      } else if (name == "exponential") {
        out.push_back(b * std::pow(gamma, static_cast<double>(last_epoch)));
      } else if (name == "cosine") {
        out.push_back(eta_min + (b - eta_min) * (1 + std::cos(pi * static_cast<double>(last_epoch) / static_cast<double>(t_max))) / 2);
      } else if (name == "linear") {
        out.push_back(b * (start_factor + (end_factor - start_factor) *
                                              static_cast<double>(std::min(total_iters, last_epoch)) /
                                              static_cast<double>(total_iters)));
      } else {
        throw std::invalid_argument("schedule " + name + " cannot restart");
      }
    }
    return out;
  }

  double anneal(double start, double end, double pct) const {
    const double pi = 3.141592653589793;  // math.pi
    if (cos) {
      double cos_out = std::cos(pi * pct) + 1;
      return end + (start - end) / 2.0 * cos_out;
    }
    return (end - start) * pct + start;
  }

  double one_cycle_value(int64_t key, size_t group) const {
    switch (key) {
      case 0: return initial.at(group);
      case 1: return max_lrs.at(group);
      case 2: return min_lrs.at(group);
      case 3: return max_momenta.at(group);
      default: return base_momenta.at(group);
    }
  }

  std::vector<double> one_cycle(std::vector<double> lrs) {
    const int64_t step_num = last_epoch;
    if (step_num > total_steps)
      throw std::invalid_argument("Tried to step " + std::to_string(step_num) + " times. The specified number of total steps is " + std::to_string(total_steps));
    std::vector<double> cycled(lrs.size(), 0.0);
    for (size_t g = 0; g < lrs.size(); g++) {
      double start_step = 0.0;
      for (size_t i = 0; i < end_steps.size(); i++) {
        const double end_step = end_steps[i];
        if (static_cast<double>(step_num) <= end_step || i == end_steps.size() - 1) {
          const double pct = (static_cast<double>(step_num) - start_step) / (end_step - start_step);
          lrs[g] = anneal(one_cycle_value(start_keys[i], g), one_cycle_value(end_keys[i], g), pct);
          if (cycle_momentum)
            cycled[g] = anneal(one_cycle_value(start_momentum_keys[i], g), one_cycle_value(end_momentum_keys[i], g), pct);
          break;
        }
        start_step = end_steps[i];
      }
    }
    if (cycle_momentum) momenta = cycled;
    return lrs;
  }

  std::vector<double> step(std::vector<double> lrs) {
    if (name.empty()) return lrs;
    if (name == "plateau") throw std::invalid_argument("ReduceLROnPlateau steps with a metric (schedule_epoch)");
    last_epoch++;
    const int64_t e = last_epoch;
    if (name == "onecycle") return one_cycle(std::move(lrs));
    if (name == "sequential") {
      size_t index = 0;
      for (int64_t m : milestones) index += m <= e ? 1 : 0;
      Schedule& child = children.at(index);
      if (index > 0 && milestones[index - 1] == e) {
        child.last_epoch = 0;
        return child.closed_form();
      }
      return child.step(std::move(lrs));
    }
    if (name == "step") {
      if (e == 0 || e % step_size != 0) return lrs;
      for (auto& lr : lrs) lr = lr * gamma;
    } else if (name == "multistep") {
      int64_t count = 0;
      for (int64_t m : milestones) count += m == e ? 1 : 0;
      if (count == 0) return lrs;
      for (auto& lr : lrs) lr = lr * std::pow(gamma, static_cast<double>(count));
    } else if (name == "exponential") {
      if (e == 0) return lrs;
      for (auto& lr : lrs) lr = lr * gamma;
    } else if (name == "cosine") {
      if (e == 0) return lrs;
      const double pi = 3.141592653589793;  // math.pi
      if ((e - 1 - t_max) % (2 * t_max) == 0) {
        for (size_t i = 0; i < lrs.size(); i++)
          lrs[i] = lrs[i] + (base_lrs[i] - eta_min) * (1 - std::cos(pi / static_cast<double>(t_max))) / 2;
        return lrs;
      }
      for (auto& lr : lrs)
        lr = (1 + std::cos(pi * static_cast<double>(e) / static_cast<double>(t_max))) /
                 (1 + std::cos(pi * static_cast<double>(e - 1) / static_cast<double>(t_max))) * (lr - eta_min) +
             eta_min;
    } else if (name == "linear") {
      if (e == 0) {
        for (auto& lr : lrs) lr = lr * start_factor;
        return lrs;
      }
      if (e > total_iters) return lrs;
      for (auto& lr : lrs)
        lr = lr * (1.0 + (end_factor - start_factor) /
                             (static_cast<double>(total_iters) * start_factor +
                              static_cast<double>(e - 1) * (end_factor - start_factor)));
    } else {
      throw std::invalid_argument("unknown schedule " + name);
    }
    return lrs;
  }

  bool better(double a) const {
    if (minimize && relative) return a < best * (1.0 - threshold);
    if (minimize) return a < best - threshold;
    if (relative) return a > best * (threshold + 1.0);
    return a > best + threshold;
  }

  std::vector<double> step_metric(std::vector<double> lrs, double metric) {
    if (name != "plateau") return step(std::move(lrs));
    last_epoch++;
    if (better(metric)) {
      best = metric;
      num_bad_epochs = 0;
    } else {
      num_bad_epochs++;
    }
    if (cooldown_counter > 0) {
      cooldown_counter--;
      num_bad_epochs = 0;
    }
    if (num_bad_epochs > patience) {
      for (size_t i = 0; i < lrs.size(); i++) {
        double reduced = std::max(lrs[i] * factor, min_lrs[i]);
        if (lrs[i] - reduced > eps) lrs[i] = reduced;
      }
      cooldown_counter = cooldown;
      num_bad_epochs = 0;
    }
    return lrs;
  }

  void read(const Json& spec) {
    const std::string where = "scheduler";
    name = spec.at("name", where).str();
    base_lrs = hex_doubles(spec.at("base_lrs", where));
    if (name == "step") {
      step_size = spec.at("step_size", where).integer();
      gamma = spec.at("gamma", where).number();
    } else if (name == "multistep") {
      for (const auto& m : spec.at("milestones", where).items) milestones.push_back(m.integer());
      gamma = spec.at("gamma", where).number();
    } else if (name == "exponential") {
      gamma = spec.at("gamma", where).number();
    } else if (name == "cosine") {
      t_max = spec.at("T_max", where).integer();
      eta_min = spec.at("eta_min", where).number();
    } else if (name == "linear") {
      start_factor = spec.at("start_factor", where).number();
      end_factor = spec.at("end_factor", where).number();
      total_iters = spec.at("total_iters", where).integer();
    } else if (name == "sequential") {
      for (const auto& m : spec.at("milestones", where).items) milestones.push_back(m.integer());
      for (const auto& child : spec.at("schedulers", where).items) {
        children.emplace_back();
        children.back().read(child);
      }
      if (children.size() != milestones.size() + 1) throw std::invalid_argument("program: SequentialLR needs one milestone fewer than schedules");
    } else if (name == "plateau") {
      minimize = spec.at("minimize", where).flag();
      relative = spec.at("relative", where).flag();
      factor = spec.at("factor", where).number();
      patience = spec.at("patience", where).integer();
      threshold = spec.at("threshold", where).number();
      cooldown = spec.at("cooldown", where).integer();
      min_lrs = hex_doubles(spec.at("min_lrs", where));
      eps = spec.at("eps", where).number();
    } else if (name == "onecycle") {
      total_steps = spec.at("total_steps", where).integer();
      initial = hex_doubles(spec.at("initial", where));
      max_lrs = hex_doubles(spec.at("max_lrs", where));
      min_lrs = hex_doubles(spec.at("min_lrs", where));
      end_steps = hex_doubles(spec.at("end_steps", where));
      max_momenta = hex_doubles(spec.at("max_momenta", where));
      base_momenta = hex_doubles(spec.at("base_momenta", where));
      for (const auto& k : spec.at("start_keys", where).items) start_keys.push_back(k.integer());
      for (const auto& k : spec.at("end_keys", where).items) end_keys.push_back(k.integer());
      for (const auto& k : spec.at("start_momentum_keys", where).items) start_momentum_keys.push_back(k.integer());
      for (const auto& k : spec.at("end_momentum_keys", where).items) end_momentum_keys.push_back(k.integer());
      cos = spec.at("cos", where).flag();
      cycle_momentum = spec.at("cycle_momentum", where).flag();
      const size_t phases = end_steps.size(), groups = base_lrs.size();
      if (phases == 0 || start_keys.size() != phases || end_keys.size() != phases || start_momentum_keys.size() != phases ||
          end_momentum_keys.size() != phases || initial.size() != groups || max_lrs.size() != groups || min_lrs.size() != groups ||
          (cycle_momentum && (max_momenta.size() != groups || base_momenta.size() != groups)))
        throw std::invalid_argument("program: scheduler onecycle's phases or groups do not add up");
    } else {
      throw std::invalid_argument("program: unknown scheduler '" + name + "'");
    }
    // Java's ProgramCheck refused these and every count past 2^40 already; the divisions above stay guarded here
    // (an integer division by zero, or INT64_MIN % -1, is SIGFPE: the JVM's end)
    if (step_size < 1 || t_max < 1 || total_iters < 1 || step_size > (int64_t{1} << 40) || t_max > (int64_t{1} << 40))
      throw std::invalid_argument("program scheduler " + name + ": step_size, T_max and total_iters must be 1 to 2^40");
  }
};

// A state tensor of the module's own on `device`: a clone on the CPU, a copy on another device.
at::Tensor owned(const at::Tensor& t, c10::Device device) {
  if (device.is_cpu() && t.device().is_cpu()) return t.clone();
  return t.to(t.options().device(device), /*non_blocking=*/false, /*copy=*/true);
}

// ---- the module: graphs, state and the protocol's methods (program.Program's twin) ----
struct Exported {
  std::unordered_map<std::string, Graph> graphs;
  std::unordered_map<std::string, at::Tensor> state;
  std::vector<std::string> parameters;  // all, in the model's order
  std::vector<std::string> trainable;   // the groups' parameters, in group order
  std::vector<std::string> inputs;
  std::string optimizer;
  std::vector<Group> groups;
  std::vector<double> lrs;  // per group
  Schedule schedule;
  int64_t steps = 0;
  int64_t accumulate = 1;
  Limits limits;
  c10::Device device{c10::kCPU};  // where the state tensors are and the ops run; inputs are copied here

  using Values = std::unordered_map<std::string, c10::IValue>;

  std::vector<std::pair<std::string, c10::IValue>> run(const std::string& name, const Values& values) {
    auto it = graphs.find(name);
    if (it == graphs.end()) throw std::invalid_argument("the module has no graph '" + name + "'");
    const Graph& graph = it->second;
    std::vector<c10::IValue> slots;
    slots.reserve(graph.inputs.size() + graph.nodes.size() * 2);
    for (const auto& binding : graph.inputs) {
      auto v = values.find(binding);
      if (v != values.end()) { slots.push_back(v->second); continue; }
      auto s = state.find(binding);
      if (s == state.end()) {
        if (binding.rfind("grad:", 0) == 0)
          throw std::invalid_argument(name + ": parameter " + binding.substr(5) + " has no gradient (run calculate_loss_and_backward first)");
        throw std::invalid_argument(name + ": the module holds no state tensor " + binding);
      }
      slots.push_back(s->second);
    }
    int64_t batch = graph.batch_input >= 0 ? slots[graph.batch_input].toTensor().size(0) : 0;
    torch::jit::Stack stack;
    std::optional<at::AutoGradMode> grad_mode(std::in_place, graph.forward_ops > 0);
    for (size_t k = 0; k < graph.nodes.size(); k++) {
      const Node& node = graph.nodes[k];
      if (k > 0)
        for (int64_t ref : graph.release_after[k - 1]) slots[ref] = c10::IValue();
      if (k == graph.forward_ops && k > 0) grad_mode.emplace(false);
      stack.clear();
      for (const Arg& a : node.args) stack.push_back(argument(a, slots, batch, device));
      if (!node.op.has_value()) {
        const auto list = stack[0].toList();
        const int64_t index = stack[1].toInt();
        if (index < 0 || index >= static_cast<int64_t>(list.size()))
          throw std::invalid_argument("op list " + name + node.label + ": index " + std::to_string(index) + " of a list of " + std::to_string(list.size()));
        slots.push_back(list.get(index));
        continue;
      }
      check_sizes(node, stack, limits, name);
      try {
        node.op->callBoxed(stack);
      } catch (const std::exception& ex) {
        std::string what = ex.what();
        throw std::runtime_error("op list " + name + node.label + " failed: " + what.substr(0, what.find('\n')));
      }
      if (node.outputs == 0) slots.emplace_back();
      for (int64_t k = 0; k < node.outputs; k++) slots.push_back(std::move(stack[k]));
    }
    std::vector<std::pair<std::string, c10::IValue>> out;
    for (const auto& o : graph.outputs) out.emplace_back(o.second, slots[o.first]);
    return out;
  }

  // The graph that runs `name` on a batch of n samples: its capture at one sample (`name@1`, program.one)
  // for a batch of one, since torch.export specializes on size 1; a batch its file holds no graph for is refused.
  std::string graph_for(const std::string& name, int64_t n) const {
    if (n == 1 && graphs.count(name + "@1") > 0) return name + "@1";
    if (n < 2)
      throw std::invalid_argument("a batch of " + std::to_string(n) + " samples: this protocol-3 module runs batches of at least 2 (its export captured no graph " + name + " at one sample)");
    return name;
  }

  Values batch_values(const std::vector<at::Tensor>& xs, const at::Tensor* y) const {
    if (xs.size() != inputs.size()) throw std::invalid_argument("expected " + std::to_string(inputs.size()) + " inputs, got " + std::to_string(xs.size()));
    Values values;
    for (size_t k = 0; k < xs.size(); k++) values["input:" + inputs[k]] = on_device(xs[k], device);
    if (y != nullptr) values["target"] = on_device(*y, device);
    return values;
  }

  // Runs a joint graph (`train`, or `train_accumulate`: its loss divided by the accumulation count) and
  // accumulates its gradients as autograd's AccumulateGrad does; returns its loss.
  at::Tensor backward(const std::string& graph, const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    at::Tensor loss;
    for (auto& [to, value] : run(graph_for(graph, y.size(0)), batch_values(xs, &y))) {
      if (to == "loss") {
        loss = value.toTensor();
      } else if (to.rfind("grad:", 0) == 0) {
        auto held = state.find(to);
        at::NoGradGuard no_grad;
        if (held == state.end()) state[to] = value.toTensor(); else held->second.add_(value.toTensor());
      } else {
        state[to] = value.toTensor();
      }
    }
    return loss;
  }

  at::Tensor calculate_loss_and_backward(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    return backward("train", xs, y);
  }

  void zero_grad() {
    for (const auto& p : parameters) state.erase("grad:" + p);
  }

  // torch.optim's per-step Python doubles, per group (program.host_scalars is the specification).
  Values host_scalars() const {
    Values v;
    const double step = static_cast<double>(steps);
    for (size_t g = 0; g < groups.size(); g++) {
      const Group& group = groups[g];
      const double lr = lrs[g];
      auto put = [&](const char* name, double value) { v["scalar:" + std::string(name) + ":" + std::to_string(g)] = value; };
      const bool cycled = !schedule.momenta.empty();
      if (optimizer == "sgd" || optimizer == "rmsprop") {
        put("neg_lr", -lr);
        put("momentum", cycled ? schedule.momenta[g] : group.momentum);
      } else if (optimizer == "adagrad") {
        put("neg_clr", -(lr / (1 + (step - 1) * group.lr_decay)));
      } else {
        const double beta1 = cycled ? schedule.momenta[g] : group.beta1;
        put("one_minus_beta1", 1 - beta1);
        double bias_correction1 = 1 - std::pow(beta1, step);
        double bias_correction2 = 1 - std::pow(group.beta2, step);
        double step_size = lr / bias_correction1;
        put("neg_step_size", -step_size);
        put("bias_correction2_sqrt", std::pow(bias_correction2, 0.5));
        put("decay", 1 - lr * group.weight_decay);
      }
    }
    return v;
  }

  // The state bindings the first optimizer step creates (SGD's momentum buffers), and how many are held:
  // all or none (a load of a state holding some is refused).
  std::vector<std::string> created() const {
    std::vector<std::string> out;
    auto first = graphs.find("optimizer_first");
    if (first != graphs.end())
      for (const auto& o : first->second.outputs) out.push_back(o.second);
    return out;
  }

  size_t created_held() const {
    size_t held = 0;
    for (const auto& b : created()) held += state.count(b);
    return held;
  }

  // torch.optim's state layout: per key in the order the step graph binds them, the trainable parameters
  // that hold it (in group order); optimizer_state and load_optimizer_state take it.
  std::vector<std::pair<std::string, std::vector<std::string>>> optimizer_layout() const {
    std::vector<std::pair<std::string, std::vector<std::string>>> layout;
    auto it = graphs.find("optimizer");
    if (it == graphs.end()) return layout;
    for (const auto& b : it->second.inputs) {
      if (b.rfind("state:", 0) != 0) continue;
      const size_t colon = b.find(':', 6);
      const std::string key = b.substr(6, colon - 6);
      auto entry = std::find_if(layout.begin(), layout.end(), [&](const auto& e) { return e.first == key; });
      if (entry == layout.end()) entry = layout.insert(layout.end(), {key, {}});
      entry->second.push_back(b.substr(colon + 1));
    }
    return layout;
  }

  // torch.optim's load_state_dict of the per-parameter state (export/scripted_module.py's load_optimizer_state
  // is the TorchScript twin): every key of the layout, one tensor per parameter that holds it, each of its
  // parameter's shape (`step` a scalar); a key the first step creates (SGD's momentum_buffer) may be absent
  // or an empty tensor, for all parameters or none. The steps count becomes the state's `step` (Adam's
  // bias corrections read it). Checked whole before anything changes.
  void load_optimizer_state(const std::vector<std::string>& keys, const std::vector<int64_t>& counts,
                            const std::vector<at::Tensor>& tensors) {
    const std::string where = "load_optimizer_state: ";
    const auto layout = optimizer_layout();
    const auto lazy = created();
    std::map<std::string, std::vector<at::Tensor>> given;
    size_t at = 0;
    for (size_t k = 0; k < keys.size(); k++) {
      if (counts[k] < 0 || at + counts[k] > tensors.size()) throw std::invalid_argument(where + "tensor counts do not add up");
      given[keys[k]] = std::vector<at::Tensor>(tensors.begin() + at, tensors.begin() + at + counts[k]);
      at += counts[k];
    }
    for (const auto& [key, _] : given)
      if (std::none_of(layout.begin(), layout.end(), [&](const auto& e) { return e.first == key; }))
        throw std::invalid_argument(where + "unexpected key " + key);
    std::vector<std::pair<std::string, at::Tensor>> loads;  // binding, tensor (undefined: not held)
    int64_t step = -1;
    for (const auto& [key, params] : layout) {
      const bool creatable = std::find(lazy.begin(), lazy.end(), "state:" + key + ":" + params[0]) != lazy.end();
      auto it = given.find(key);
      if (it == given.end()) {
        if (!creatable) throw std::invalid_argument(where + "missing key " + key);
        for (const auto& p : params) loads.emplace_back("state:" + key + ":" + p, at::Tensor());
        continue;
      }
      const auto& values = it->second;
      if (values.size() != params.size())
        throw std::invalid_argument(where + key + " has " + std::to_string(values.size()) + " tensors, expected " + std::to_string(params.size()));
      size_t held = 0;
      std::string without;  // a parameter that holds none (named in the refusal below)
      for (size_t i = 0; i < params.size(); i++) {
        const at::Tensor& param = state.at("param:" + params[i]);
        const bool empty = values[i].dim() == 1 && values[i].size(0) == 0;
        if (creatable && empty) {
          if (without.empty()) without = params[i];
          loads.emplace_back("state:" + key + ":" + params[i], at::Tensor());
          continue;
        }
        const std::vector<int64_t> expected = key == "step" ? std::vector<int64_t>{} : param.sizes().vec();
        if (values[i].sizes().vec() != expected)
          throw std::invalid_argument(where + key + "[" + std::to_string(i) + "] has shape " + c10::str(values[i].sizes()) + ", expected " + c10::str(c10::IntArrayRef(expected)));
        at::NoGradGuard no_grad;
        at::Tensor copy = owned(values[i].to(key == "step" ? at::kFloat : param.scalar_type()), device);
        if (key == "step") {
          const int64_t count = static_cast<int64_t>(copy.item<float>());
          if (step >= 0 && count != step)
            throw std::invalid_argument(where + "step is " + std::to_string(step) + " for " + params[0] + " but " + std::to_string(count) + " for " + params[i] + "; a protocol-3 module steps its parameters together");
          step = count;
        }
        loads.emplace_back("state:" + key + ":" + params[i], copy);
        held++;
      }
      if (held > 0 && held < params.size())
        throw std::invalid_argument(where + key + " is held for " + std::to_string(held) + " of " + std::to_string(params.size()) + " parameters, not for " + without + "; a protocol-3 module loads it for all of them or none");
    }
    for (auto& [binding, tensor] : loads) {
      if (tensor.defined()) state[binding] = tensor; else state.erase(binding);
    }
    if (step >= 0) steps = step;
  }

  // torch's order: clip_grad_*_, optimizer.step(), scheduler.step() (a per-step schedule)
  void optimizer_step() {
    for (const auto& p : trainable)
      if (state.find("grad:" + p) == state.end())
        throw std::invalid_argument("optimizer_step: parameter " + p + " has no gradient (run calculate_loss_and_backward first)");
    steps++;
    if (graphs.count("clip") > 0) run("clip", {});
    // SGD's first step with momentum (torch's momentum_buffer is None): copies the gradient into new buffers
    bool first = graphs.count("optimizer_first") > 0 && created_held() == 0;
    for (auto& [to, value] : run(first ? "optimizer_first" : "optimizer", host_scalars())) state[to] = value.toTensor();
    if (schedule.interval == "step") lrs = schedule.step(lrs);
  }

  void schedule_epoch(double metric) {
    if (schedule.interval == "epoch") lrs = schedule.step_metric(lrs, metric);
  }

  // zero_grad, loss and backward, optimizer step; with accumulation k > 1 the batch's micro-batches of
  // ceil(n / k) rows each add the gradients of loss / k, and the loss is their sum in order.
  at::Tensor train_step(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    zero_grad();
    at::Tensor loss;
    if (accumulate == 1) {
      loss = calculate_loss_and_backward(xs, y);
    } else {
      const int64_t n = y.size(0);
      const int64_t size = (n + accumulate - 1) / accumulate;
      for (int64_t start = 0; start < n; start += size) {
        const int64_t rows = std::min(size, n - start);
        std::vector<at::Tensor> part;
        for (const auto& x : xs) part.push_back(x.narrow(0, start, rows));
        at::Tensor scaled = backward("train_accumulate", part, y.narrow(0, start, rows));
        at::NoGradGuard no_grad;
        loss = start == 0 ? scaled : at::add(loss, scaled);
      }
    }
    optimizer_step();
    return loss;
  }

  at::Tensor forward(const std::vector<at::Tensor>& xs) {
    Values values = batch_values(xs, nullptr);
    return run(graph_for("forward", xs[0].size(0)), values)[0].second.toTensor();
  }

  at::Tensor evaluate(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    at::Tensor output = forward(xs);
    Values values{{"output", output}, {"target", on_device(y, device)}};
    return run(graph_for("loss", y.size(0)), values)[0].second.toTensor();
  }

  void sgd_step(double rate) {
    at::NoGradGuard no_grad;
    for (const auto& p : parameters) {
      auto grad = state.find("grad:" + p);
      if (grad != state.end()) state["param:" + p].add_(grad->second, -rate);
    }
    zero_grad();
  }

  void set_lr(int64_t group, double lr) {
    if (group < 0) {
      for (auto& value : lrs) value = lr;
      return;
    }
    if (group >= static_cast<int64_t>(lrs.size()))
      throw std::invalid_argument("set_group_lr: no parameter group " + std::to_string(group) + "; there are " + std::to_string(lrs.size()));
    lrs[group] = lr;
  }

  // The host's counters as JSON (program.counters, what a checkpoint saves beside the state tensors).
  std::string counters() const {
    std::string text = "{\"steps\":" + std::to_string(steps) + ",\"lrs\":[";
    for (size_t g = 0; g < lrs.size(); g++) text += (g ? ",\"" : "\"") + hex_text(lrs[g]) + "\"";
    text += "],\"last_epoch\":" + std::to_string(schedule.last_epoch) + ",\"best\":\"" + hex_text(schedule.best) +
            "\",\"num_bad_epochs\":" + std::to_string(schedule.num_bad_epochs) +
            ",\"cooldown_counter\":" + std::to_string(schedule.cooldown_counter) + ",\"children_last_epochs\":[";
    for (size_t k = 0; k < schedule.children.size(); k++) text += (k ? "," : "") + std::to_string(schedule.children[k].last_epoch);
    text += "],\"momenta\":[";
    for (size_t g = 0; g < schedule.momenta.size(); g++) text += (g ? ",\"" : "\"") + hex_text(schedule.momenta[g]) + "\"";
    return text + "]}";
  }

  void read_training(const Json& training, const Json& counts) {
    const std::string where = "program training";
    optimizer = training.at("optimizer", where).str();
    if (optimizer != "sgd" && optimizer != "adam" && optimizer != "adamw" && optimizer != "rmsprop" && optimizer != "adagrad")
      throw std::invalid_argument("program: unknown optimizer '" + optimizer + "'");
    for (const auto& g : training.at("groups", where).items) {
      Group group;
      for (const auto& p : g.at("params", where).items) {
        group.params.push_back(p.str());
        trainable.push_back(p.str());
      }
      if (const Json* betas = g.get("betas")) {
        group.beta1 = betas->items.at(0).number();
        group.beta2 = betas->items.at(1).number();
      }
      if (const Json* momentum = g.get("momentum")) group.momentum = momentum->number();
      if (const Json* decay = g.get("weight_decay")) group.weight_decay = decay->number();
      if (const Json* decay = g.get("lr_decay")) group.lr_decay = decay->number();
      groups.push_back(group);
    }
    accumulate = training.at("accumulate", where).integer();
    if (accumulate < 1 || accumulate > 65536) throw std::invalid_argument("program: accumulate " + std::to_string(accumulate) + ", expected 1 to 65536");
    schedule.interval = training.at("scheduler_interval", where).str();
    const Json* spec = training.get("scheduler");
    if (spec != nullptr && spec->kind == Json::Object) schedule.read(*spec);
    steps = counts.at("steps", "program counters").integer();
    lrs = hex_doubles(counts.at("lrs", "program counters"));
    if (lrs.size() != groups.size())
      throw std::invalid_argument("program counters: " + std::to_string(lrs.size()) + " learning rates for " + std::to_string(groups.size()) + " parameter groups");
    if (!schedule.name.empty() && schedule.base_lrs.size() != groups.size())
      throw std::invalid_argument("program scheduler: base_lrs for " + std::to_string(schedule.base_lrs.size()) + " groups, not " + std::to_string(groups.size()));
    schedule.last_epoch = counts.at("last_epoch", "program counters").integer();
    schedule.best = hex_double(counts.at("best", "program counters"));
    schedule.num_bad_epochs = counts.at("num_bad_epochs", "program counters").integer();
    schedule.cooldown_counter = counts.at("cooldown_counter", "program counters").integer();
    const auto& children = counts.at("children_last_epochs", "program counters").items;
    if (children.size() != schedule.children.size())
      throw std::invalid_argument("program counters: " + std::to_string(children.size()) + " children's epochs for " + std::to_string(schedule.children.size()) + " schedules");
    for (size_t k = 0; k < children.size(); k++) schedule.children[k].last_epoch = children[k].integer();
    // files written before OneCycleLR's momentum was held lack the entry: nothing cycled
    if (const Json* momenta = counts.get("momenta")) schedule.momenta = hex_doubles(*momenta);
    if (!schedule.momenta.empty() && (!schedule.cycle_momentum || schedule.momenta.size() != groups.size()))
      throw std::invalid_argument("program counters: " + std::to_string(schedule.momenta.size()) + " momenta for " + std::to_string(groups.size()) + " parameter groups of a schedule that cycles " + (schedule.cycle_momentum ? "them" : "none"));
  }
};

}  // namespace

GRADBRIDGE_HANDLE_KIND(Exported, exported);

namespace {

Exported& exported_of(jlong handle) { return borrow<Exported>(handle); }

at::Tensor& tensor_at(jlong handle) { return borrow<at::Tensor>(handle); }

jlong handle_of(at::Tensor tensor) { return release(std::move(tensor)); }

std::vector<at::Tensor> tensors_of(JNIEnv* env, jlongArray handles) {
  std::vector<at::Tensor> out;
  for (int64_t h : longs(env, handles, "tensor array")) out.push_back(tensor_at(h));
  return out;
}

jobjectArray to_java(JNIEnv* env, const std::vector<std::string>& strings) {
  jclass string = env->FindClass("java/lang/String");
  jobjectArray out = env->NewObjectArray(static_cast<jsize>(strings.size()), string, nullptr);
  if (out == nullptr) throw JavaPending{};
  for (size_t k = 0; k < strings.size(); k++) {
    jstring s = env->NewStringUTF(strings[k].c_str());
    env->SetObjectArrayElement(out, static_cast<jsize>(k), s);
    env->DeleteLocalRef(s);
  }
  return out;
}

jlongArray to_java(JNIEnv* env, const std::vector<jlong>& handles) {
  jlongArray out = env->NewLongArray(static_cast<jsize>(handles.size()));
  if (out == nullptr) throw JavaPending{};
  env->SetLongArrayRegion(out, 0, static_cast<jsize>(handles.size()), handles.data());
  return out;
}

std::vector<std::string> strings_of(JNIEnv* env, jobjectArray array) {
  std::vector<std::string> out;
  jsize n = env->GetArrayLength(array);
  for (jsize k = 0; k < n; k++) {
    auto s = static_cast<jstring>(env->GetObjectArrayElement(array, k));
    check_java(env);
    Utf8 text(env, s);
    out.push_back(text.str());
    env->DeleteLocalRef(s);
  }
  return out;
}

// A state binding a graph reads must be held, unless the first optimizer step creates it (SGD's momentum)
// and none of those is held.
void check_bound(const Exported& module) {
  const auto created = module.created();
  const bool none_created = module.created_held() == 0;
  for (const auto& [name, graph] : module.graphs)
    for (const auto& b : graph.inputs) {
      bool held = b.rfind("param:", 0) == 0 || b.rfind("buffer:", 0) == 0 || b.rfind("const:", 0) == 0 ||
                  b.rfind("state:", 0) == 0;
      if (!held || module.state.count(b) > 0) continue;
      if (none_created && std::find(created.begin(), created.end(), b) != created.end()) continue;
      throw std::invalid_argument("op list " + name + " reads state tensor " + b + ", which the file lacks");
    }
}

}  // namespace

extern "C" {

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_exportedLoad(JNIEnv* env, jclass, jstring program,
                                                                jobjectArray state_names, jlongArray state_tensors,
                                                                jstring device) {
  return guarded(env, jlong{0}, [&] {
    Utf8 text(env, program);
    Json root = parse_json(text.str());
    auto module = std::make_unique<Exported>();
    module->device = device_named(env, device);
    for (const auto& p : root.at("parameters", "program").items) module->parameters.push_back(p.str());
    for (const auto& p : root.at("inputs", "program").items) module->inputs.push_back(p.str());
    const Json& limits = root.at("limits", "program");
    module->limits.elements = limits.at("elements", "program limits").integer();
    for (const auto& name : limits.at("sized", "program limits").items) module->limits.sized.push_back(name.str());
    for (const auto& g : root.at("graphs", "program").fields) module->graphs.emplace(g.first, parse_graph(g.first, g.second, module->limits));
    module->read_training(root.at("training", "program"), root.at("counters", "program"));
    if (module->accumulate > 1 && module->graphs.count("train_accumulate") == 0)
      throw std::invalid_argument("program: accumulate " + std::to_string(module->accumulate) + " without a train_accumulate graph");
    auto names = strings_of(env, state_names);
    auto tensors = tensors_of(env, state_tensors);
    if (names.size() != tensors.size()) throw std::invalid_argument("state: names and tensors differ in number");
    for (size_t k = 0; k < names.size(); k++) module->state[names[k]] = owned(tensors[k], module->device);
    check_bound(*module);
    return release(std::move(*module));
  });
}

// Every state tensor moved to a device, where the module runs from now on.
JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedTo(JNIEnv* env, jclass, jlong handle, jstring device) {
  guarded(env, 0, [&] {
    Exported& m = exported_of(handle);
    const c10::Device to = device_named(env, device);
    std::unordered_map<std::string, at::Tensor> moved;
    at::NoGradGuard no_grad;
    for (const auto& [name, tensor] : m.state) moved[name] = tensor.to(to);
    m.state = std::move(moved);
    m.device = to;
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedFree(JNIEnv* env, jclass, jlong module) {
  guarded(env, 0, [&] {
    drop<Exported>(module);
    return 0;
  });
}

// A module of its own with copies of this one's state tensors and counters (the graphs are shared values).
JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_exportedSnapshot(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, jlong{0}, [&] {
    auto copy = std::make_unique<Exported>(exported_of(handle));
    at::NoGradGuard no_grad;
    for (auto& [name, tensor] : copy->state) tensor = tensor.clone();
    return release(std::move(*copy));
  });
}

JNIEXPORT jlongArray JNICALL Java_dev_gradbridge_Native_exportedCall(JNIEnv* env, jclass, jlong handle, jstring method,
                                                                      jlongArray inputs, jlong target) {
  return guarded<Message::first_line>(env, static_cast<jlongArray>(nullptr), [&] {
    Exported& m = exported_of(handle);
    std::string name = Utf8(env, method).str();
    std::vector<jlong> out;
    if (name == "zero_grad") {
      m.zero_grad();
    } else if (name == "optimizer_step") {
      m.optimizer_step();
    } else {
      auto xs = tensors_of(env, inputs);
      if (name == "forward") {
        out.push_back(handle_of(on_host(m.forward(xs))));
      } else {
        const at::Tensor& y = tensor_at(target);
        if (name == "train_step") out.push_back(handle_of(on_host(m.train_step(xs, y))));
        else if (name == "calculate_loss_and_backward") out.push_back(handle_of(on_host(m.calculate_loss_and_backward(xs, y))));
        else if (name == "evaluate") out.push_back(handle_of(on_host(m.evaluate(xs, y))));
        else throw std::invalid_argument("protocol 3 has no method " + name);
      }
    }
    return to_java(env, out);
  });
}

JNIEXPORT jdoubleArray JNICALL Java_dev_gradbridge_Native_exportedTrainEpoch(JNIEnv* env, jclass, jlong handle,
                                                                              jlongArray inputs, jlong target,
                                                                              jlong perm, jlong batch) {
  return guarded<Message::first_line>(env, static_cast<jdoubleArray>(nullptr), [&] {
    Exported& m = exported_of(handle);
    auto xs = tensors_of(env, inputs);
    const at::Tensor& y = tensor_at(target);
    const at::Tensor& order = tensor_at(perm);
    std::vector<double> losses;
    std::vector<at::Tensor> held;  // on another device: the losses stay there until the epoch's end (no wait per step)
    int64_t n = order.size(0);
    for (int64_t start = 0; start < n; start += batch) {
      at::Tensor index = order.narrow(0, start, std::min<int64_t>(batch, n - start));
      std::vector<at::Tensor> bx;
      for (const auto& x : xs) bx.push_back(x.index_select(0, index));
      at::Tensor loss = m.train_step(bx, y.index_select(0, index));
      if (m.device.is_cpu()) losses.push_back(loss.to(at::kDouble).item<double>());
      else held.push_back(loss.detach().reshape({}));
    }
    if (!held.empty()) {
      at::Tensor all = at::stack(held).to(at::kCPU, at::kDouble).contiguous();
      losses.assign(all.const_data_ptr<double>(), all.const_data_ptr<double>() + all.numel());
    }
    jdoubleArray out = env->NewDoubleArray(static_cast<jsize>(losses.size()));
    if (out == nullptr) throw JavaPending{};
    env->SetDoubleArrayRegion(out, 0, static_cast<jsize>(losses.size()), losses.data());
    return out;
  });
}

JNIEXPORT jobjectArray JNICALL Java_dev_gradbridge_Native_exportedStateNames(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, static_cast<jobjectArray>(nullptr), [&] {
    Exported& m = exported_of(handle);
    std::vector<std::string> names;
    for (const auto& [name, _] : m.state) names.push_back(name);
    std::sort(names.begin(), names.end());
    return to_java(env, names);
  });
}

// Copies of state tensors by name; a gradient not held is zeros of its parameter's shape.
JNIEXPORT jlongArray JNICALL Java_dev_gradbridge_Native_exportedGet(JNIEnv* env, jclass, jlong handle, jobjectArray names) {
  return guarded(env, static_cast<jlongArray>(nullptr), [&] {
    Exported& m = exported_of(handle);
    std::vector<jlong> out;
    at::NoGradGuard no_grad;
    for (const auto& name : strings_of(env, names)) {
      auto it = m.state.find(name);
      if (it != m.state.end()) { out.push_back(handle_of(m.device.is_cpu() ? it->second.clone() : on_host(it->second))); continue; }
      // an optimizer state a parameter does not hold (SGD's momentum_buffer before its first step): empty,
      // as the TorchScript path's optimizer_state says
      if (name.rfind("state:", 0) == 0) { out.push_back(handle_of(at::empty({0}))); continue; }
      if (name.rfind("grad:", 0) == 0) { out.push_back(handle_of(on_host(at::zeros_like(m.state.at("param:" + name.substr(5)))))); continue; }
      for (jlong h : out) drop<at::Tensor>(h);
      throw std::invalid_argument("the module holds no state tensor " + name);
    }
    return to_java(env, out);
  });
}

// torch.optim's state layout: "state:KEY:PARAM" per key (the step graph's order), its parameters in group order.
JNIEXPORT jobjectArray JNICALL Java_dev_gradbridge_Native_exportedOptimizerLayout(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, static_cast<jobjectArray>(nullptr), [&] {
    std::vector<std::string> names;
    for (const auto& [key, params] : exported_of(handle).optimizer_layout())
      for (const auto& p : params) names.push_back("state:" + key + ":" + p);
    return to_java(env, names);
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedLoadOptimizerState(JNIEnv* env, jclass, jlong handle,
                                                                             jobjectArray keys, jlongArray counts,
                                                                             jlongArray tensors) {
  guarded<Message::first_line>(env, 0, [&] {
    exported_of(handle).load_optimizer_state(strings_of(env, keys), longs(env, counts, "counts"), tensors_of(env, tensors));
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSet(JNIEnv* env, jclass, jlong handle, jobjectArray names,
                                                              jlongArray tensors) {
  guarded(env, 0, [&] {
    Exported& m = exported_of(handle);
    auto keys = strings_of(env, names);
    auto values = tensors_of(env, tensors);
    for (size_t k = 0; k < keys.size(); k++) m.state[keys[k]] = owned(values[k], m.device);
    return 0;
  });
}

JNIEXPORT jdoubleArray JNICALL Java_dev_gradbridge_Native_exportedLrs(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, static_cast<jdoubleArray>(nullptr), [&] {
    const auto& lrs = exported_of(handle).lrs;
    jdoubleArray out = env->NewDoubleArray(static_cast<jsize>(lrs.size()));
    if (out == nullptr) throw JavaPending{};
    env->SetDoubleArrayRegion(out, 0, static_cast<jsize>(lrs.size()), lrs.data());
    return out;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSetLr(JNIEnv* env, jclass, jlong handle, jint group, jdouble lr) {
  guarded<Message::first_line>(env, 0, [&] {
    exported_of(handle).set_lr(group, lr);
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedScheduleEpoch(JNIEnv* env, jclass, jlong handle, jdouble metric) {
  guarded<Message::first_line>(env, 0, [&] {
    exported_of(handle).schedule_epoch(metric);
    return 0;
  });
}

JNIEXPORT jstring JNICALL Java_dev_gradbridge_Native_exportedCounters(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, static_cast<jstring>(nullptr), [&] {
    jstring out = env->NewStringUTF(exported_of(handle).counters().c_str());
    if (out == nullptr) throw JavaPending{};
    return out;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSgdStep(JNIEnv* env, jclass, jlong handle, jdouble lr) {
  guarded(env, 0, [&] {
    exported_of(handle).sgd_step(lr);
    return 0;
  });
}

}  // extern "C"
