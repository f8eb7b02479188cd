// gradbridge's protocol-3 engine: a training module captured with torch.export as gradbridge's own op lists
// (python/gradbridge/oplist.py holds the format; program.py the Python twin of everything here), run op by
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

constexpr int64_t kOpListVersion = 1;

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
  int64_t integer() const {
    if (kind != Number || text.find_first_of(".eE") != std::string::npos) throw std::invalid_argument("op list: expected an integer, got " + text);
    return std::stoll(text);
  }
  double number() const {
    if (kind != Number) throw std::invalid_argument("op list: expected a number");
    return std::strtod(text.c_str(), nullptr);
  }
  const std::string& str() const {
    if (kind != String) throw std::invalid_argument("op list: expected a string");
    return text;
  }
};

struct JsonParser {
  const std::string& s;
  size_t i = 0;
  explicit JsonParser(const std::string& text) : s(text) {}
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\r' || s[i] == '\t')) i++;
  }
  [[noreturn]] void fail(const char* what) { throw std::invalid_argument(std::string("op list: invalid JSON (") + what + " at " + std::to_string(i) + ")"); }
  Json value() {
    ws();
    if (i >= s.size()) fail("end of text");
    Json v;
    char c = s[i];
    if (c == '{') {
      v.kind = Json::Object;
      i++;
      ws();
      if (s[i] == '}') { i++; return v; }
      while (true) {
        ws();
        Json key = value();
        if (key.kind != Json::String) fail("object key");
        ws();
        if (s[i++] != ':') fail("':'");
        v.fields.emplace_back(key.text, value());
        ws();
        if (s[i] == ',') { i++; continue; }
        if (s[i] == '}') { i++; return v; }
        fail("',' or '}'");
      }
    }
    if (c == '[') {
      v.kind = Json::Array;
      i++;
      ws();
      if (s[i] == ']') { i++; return v; }
      while (true) {
        v.items.push_back(value());
        ws();
        if (s[i] == ',') { i++; continue; }
        if (s[i] == ']') { i++; return v; }
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
          if (e == 'n') v.text += '\n'; else if (e == 't') v.text += '\t'; else if (e == 'u') {
            unsigned code = std::stoul(s.substr(i + 1, 4), nullptr, 16);
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
};

struct Graph {
  std::vector<std::string> inputs;
  std::vector<Node> nodes;
  std::vector<std::pair<int64_t, std::string>> outputs;
  int batch_input = -1;
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
  else if (kind == "b") { a.kind = Arg::Bool; a.b = x.b; }
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
  else if (kind == "bl") { a.kind = Arg::BoolList; for (const auto& item : x.items) a.bools.push_back(item.b); }
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

// A number where the op's schema takes a Tensor (`num_batches_tracked.add_(1)` is `add.Tensor(t, 1)`) becomes
// the tensor Python's argument parser makes of it: a 0-dim tensor marked as a wrapped number, so type
// promotion treats it as a scalar, as in eager.
void wrap_numbers(Node& node, const std::string& where) {
  const auto& arguments = node.op->schema().arguments();
  if (node.args.size() != arguments.size())
    throw std::invalid_argument(where + " " + node.name + ": " + std::to_string(node.args.size()) +
                                " arguments, the schema takes " + std::to_string(arguments.size()));
  for (size_t k = 0; k < arguments.size(); k++) {
    Arg& a = node.args[k];
    if (a.kind != Arg::Int && a.kind != Arg::Double && a.kind != Arg::Bool) continue;
    c10::TypePtr type = arguments[k].type();
    if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (type->kind() != c10::TypeKind::TensorType) continue;
    c10::Scalar number = a.kind == Arg::Int    ? c10::Scalar(a.i)
                         : a.kind == Arg::Double ? c10::Scalar(a.d)
                                                 : c10::Scalar(a.b);
    a.constant = at::native::wrapped_scalar_tensor(number);
    a.kind = Arg::Constant;
  }
}

Graph parse_graph(const std::string& name, const Json& g) {
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
  int64_t slots = static_cast<int64_t>(graph.inputs.size());
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const auto& n : g.at("nodes", where).items) {
    Node node;
    std::string op = n.at("op", where).str();
    std::string overload = n.at("overload", where).str();
    node.name = op + (overload.empty() ? "" : "." + overload);
    if (op != "#item") {
      auto handle = dispatcher.findSchema({op, overload == "default" ? "" : overload});
      if (!handle.has_value()) throw std::invalid_argument(where + ": unknown operator " + node.name);
      node.op = *handle;
    }
    for (const auto& arg : n.at("args", where).items) {
      node.args.push_back(parse_arg(arg, where + " " + node.name));
      const Arg& a = node.args.back();
      auto check_slot = [&](int64_t s) {
        if (s >= slots) throw std::invalid_argument(where + " " + node.name + ": argument refers to slot " + std::to_string(s) + " before it is computed");
      };
      if (a.kind == Arg::Ref) check_slot(a.i);
      if (a.kind == Arg::RefList || a.kind == Arg::OptRefList) for (int64_t s : a.ints) check_slot(s);
    }
    if (node.op.has_value()) wrap_numbers(node, where);
    node.outputs = n.at("outputs", where).integer();
    slots += std::max<int64_t>(node.outputs, 1);
    graph.nodes.push_back(std::move(node));
  }
  for (const auto& out : g.at("outputs", where).items) {
    int64_t ref = out.at("ref", where).integer();
    if (ref >= slots) throw std::invalid_argument(where + ": an output refers to slot " + std::to_string(ref));
    graph.outputs.emplace_back(ref, out.at("to", where).str());
  }
  return graph;
}

c10::IValue argument(const Arg& a, const std::vector<c10::IValue>& slots, int64_t batch) {
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
      for (size_t k = 0; k < a.ints.size(); k += 2) sizes.push_back(a.ints[k] * batch + a.ints[k + 1]);
      return c10::IValue(sizes);
    }
    case Arg::BatchInt: return c10::IValue(a.i * batch + a.c);
    case Arg::DoubleList: return c10::IValue(a.doubles);
    case Arg::BoolList: {
      c10::List<bool> list;
      for (bool b : a.bools) list.push_back(b);
      return list;
    }
    case Arg::Str: return c10::IValue(a.s);
    case Arg::Dtype: return c10::IValue(static_cast<at::ScalarType>(a.i));
    case Arg::Layout: return c10::IValue(c10::Layout::Strided);
    case Arg::Device: return c10::IValue(c10::Device(c10::kCPU));
    case Arg::MemoryFormat: return c10::IValue(static_cast<c10::MemoryFormat>(a.i));
    case Arg::Constant: return c10::IValue(a.constant);
  }
  return c10::IValue();
}

// ---- the module: graphs, state and the protocol's methods (program.Program's twin) ----
struct Exported {
  std::unordered_map<std::string, Graph> graphs;
  std::unordered_map<std::string, at::Tensor> state;
  std::vector<std::string> parameters;
  std::vector<std::string> inputs;
  std::string optimizer;
  double lr = 0, beta1 = 0, beta2 = 0, weight_decay = 0;
  int64_t steps = 0;
  int64_t min_batch = 2;

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
    at::NoGradGuard no_grad;
    torch::jit::Stack stack;
    for (const Node& node : graph.nodes) {
      stack.clear();
      for (const Arg& a : node.args) stack.push_back(argument(a, slots, batch));
      if (!node.op.has_value()) {
        slots.push_back(stack[0].toList().get(stack[1].toInt()));
        continue;
      }
      try {
        node.op->callBoxed(stack);
      } catch (const std::exception& ex) {
        std::string what = ex.what();
        throw std::runtime_error("op list " + name + ": " + node.name + " failed: " + what.substr(0, what.find('\n')));
      }
      if (node.outputs == 0) slots.emplace_back();
      for (int64_t k = 0; k < node.outputs; k++) slots.push_back(std::move(stack[k]));
    }
    std::vector<std::pair<std::string, c10::IValue>> out;
    for (const auto& o : graph.outputs) out.emplace_back(o.second, slots[o.first]);
    return out;
  }

  Values batch_values(const std::vector<at::Tensor>& xs, const at::Tensor* y) const {
    if (xs.size() != inputs.size()) throw std::invalid_argument("expected " + std::to_string(inputs.size()) + " inputs, got " + std::to_string(xs.size()));
    int64_t n = xs[0].size(0);
    if (n < min_batch)
      throw std::invalid_argument("a batch of " + std::to_string(n) + " samples: a protocol-3 module runs batches of at least " + std::to_string(min_batch));
    Values values;
    for (size_t k = 0; k < xs.size(); k++) values["input:" + inputs[k]] = xs[k];
    if (y != nullptr) values["target"] = *y;
    return values;
  }

  at::Tensor calculate_loss_and_backward(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    at::Tensor loss;
    for (auto& [to, value] : run("train", batch_values(xs, &y))) {
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

  void zero_grad() {
    for (const auto& p : parameters) state.erase("grad:" + p);
  }

  // torch.optim's per-step Python doubles (program.host_scalars is the specification).
  Values host_scalars() const {
    Values v;
    if (optimizer == "sgd") {
      v["scalar:neg_lr"] = -lr;
      return v;
    }
    double step = static_cast<double>(steps);
    double bias_correction1 = 1 - std::pow(beta1, step);
    double bias_correction2 = 1 - std::pow(beta2, step);
    double step_size = lr / bias_correction1;
    v["scalar:neg_step_size"] = -step_size;
    v["scalar:bias_correction2_sqrt"] = std::pow(bias_correction2, 0.5);
    v["scalar:decay"] = 1 - lr * weight_decay;
    return v;
  }

  void optimizer_step() {
    for (const auto& p : parameters)
      if (state.find("grad:" + p) == state.end())
        throw std::invalid_argument("optimizer_step: parameter " + p + " has no gradient (run calculate_loss_and_backward first)");
    steps++;
    bool first = steps == 1 && graphs.count("optimizer_first") > 0;
    for (auto& [to, value] : run(first ? "optimizer_first" : "optimizer", host_scalars())) state[to] = value.toTensor();
  }

  at::Tensor train_step(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    zero_grad();
    at::Tensor loss = calculate_loss_and_backward(xs, y);
    optimizer_step();
    return loss;
  }

  at::Tensor forward(const std::vector<at::Tensor>& xs) {
    return run("forward", batch_values(xs, nullptr))[0].second.toTensor();
  }

  at::Tensor evaluate(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
    at::Tensor output = forward(xs);
    Values values{{"output", output}, {"target", y}};
    return run("loss", values)[0].second.toTensor();
  }

  void sgd_step(double rate) {
    at::NoGradGuard no_grad;
    for (const auto& p : parameters) {
      auto grad = state.find("grad:" + p);
      if (grad != state.end()) state["param:" + p].add_(grad->second, -rate);
    }
    zero_grad();
  }
};

Exported& exported_of(jlong handle) {
  if (handle == 0) throw std::invalid_argument("the module is closed");
  return *reinterpret_cast<Exported*>(handle);
}

at::Tensor& tensor_at(jlong handle) {
  if (handle == 0) throw std::invalid_argument("the tensor is closed");
  return *reinterpret_cast<at::Tensor*>(handle);
}

jlong handle_of(at::Tensor tensor) { return reinterpret_cast<jlong>(new at::Tensor(std::move(tensor))); }

std::vector<at::Tensor> tensors_of(JNIEnv* env, jlongArray handles) {
  std::vector<at::Tensor> out;
  for (int64_t h : longs(env, handles, "tensor array")) out.push_back(tensor_at(h));
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

}  // namespace

extern "C" {

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_exportedLoad(JNIEnv* env, jclass, jstring program,
                                                                jobjectArray state_names, jlongArray state_tensors) {
  return guarded(env, jlong{0}, [&] {
    Utf8 text(env, program);
    Json root = parse_json(text.str());
    auto module = std::make_unique<Exported>();
    const Json& optimizer = root.at("optimizer", "program");
    module->optimizer = optimizer.at("name", "optimizer").str();
    module->lr = optimizer.at("lr", "optimizer").number();
    if (module->optimizer != "sgd") {
      const Json& betas = optimizer.at("betas", "optimizer");
      module->beta1 = betas.items.at(0).number();
      module->beta2 = betas.items.at(1).number();
    }
    module->weight_decay = optimizer.at("weight_decay", "optimizer").number();
    module->min_batch = root.at("min_batch", "program").integer();
    for (const auto& p : root.at("parameters", "program").items) module->parameters.push_back(p.str());
    for (const auto& p : root.at("inputs", "program").items) module->inputs.push_back(p.str());
    for (const auto& g : root.at("graphs", "program").fields) module->graphs.emplace(g.first, parse_graph(g.first, g.second));
    auto names = strings_of(env, state_names);
    auto tensors = tensors_of(env, state_tensors);
    if (names.size() != tensors.size()) throw std::invalid_argument("state: names and tensors differ in number");
    for (size_t k = 0; k < names.size(); k++) module->state[names[k]] = tensors[k].clone();
    for (const auto& [name, graph] : module->graphs)
      for (const auto& b : graph.inputs) {
        bool held = b.rfind("param:", 0) == 0 || b.rfind("buffer:", 0) == 0 || b.rfind("const:", 0) == 0;
        if (held && module->state.count(b) == 0) throw std::invalid_argument("op list " + name + " reads state tensor " + b + ", which the file lacks");
      }
    return reinterpret_cast<jlong>(module.release());
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedFree(JNIEnv* env, jclass, jlong module) {
  guarded(env, 0, [&] {
    delete reinterpret_cast<Exported*>(module);
    return 0;
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
        out.push_back(handle_of(m.forward(xs)));
      } else {
        const at::Tensor& y = tensor_at(target);
        if (name == "train_step") out.push_back(handle_of(m.train_step(xs, y)));
        else if (name == "calculate_loss_and_backward") out.push_back(handle_of(m.calculate_loss_and_backward(xs, y)));
        else if (name == "evaluate") out.push_back(handle_of(m.evaluate(xs, y)));
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
    int64_t n = order.size(0);
    for (int64_t start = 0; start < n; start += batch) {
      at::Tensor index = order.narrow(0, start, std::min<int64_t>(batch, n - start));
      std::vector<at::Tensor> bx;
      for (const auto& x : xs) bx.push_back(x.index_select(0, index));
      at::Tensor loss = m.train_step(bx, y.index_select(0, index));
      losses.push_back(loss.to(at::kDouble).item<double>());
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
    jclass string = env->FindClass("java/lang/String");
    jobjectArray out = env->NewObjectArray(static_cast<jsize>(names.size()), string, nullptr);
    if (out == nullptr) throw JavaPending{};
    for (size_t k = 0; k < names.size(); k++) {
      jstring s = env->NewStringUTF(names[k].c_str());
      env->SetObjectArrayElement(out, static_cast<jsize>(k), s);
      env->DeleteLocalRef(s);
    }
    return out;
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
      if (it != m.state.end()) { out.push_back(handle_of(it->second.clone())); continue; }
      if (name.rfind("grad:", 0) == 0) { out.push_back(handle_of(at::zeros_like(m.state.at("param:" + name.substr(5))))); continue; }
      for (jlong h : out) delete reinterpret_cast<at::Tensor*>(h);
      throw std::invalid_argument("the module holds no state tensor " + name);
    }
    return to_java(env, out);
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSet(JNIEnv* env, jclass, jlong handle, jobjectArray names,
                                                              jlongArray tensors) {
  guarded(env, 0, [&] {
    Exported& m = exported_of(handle);
    auto keys = strings_of(env, names);
    auto values = tensors_of(env, tensors);
    for (size_t k = 0; k < keys.size(); k++) m.state[keys[k]] = values[k].clone();
    return 0;
  });
}

JNIEXPORT jdouble JNICALL Java_dev_gradbridge_Native_exportedLr(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, jdouble{0}, [&] { return exported_of(handle).lr; });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSetLr(JNIEnv* env, jclass, jlong handle, jdouble lr) {
  guarded(env, 0, [&] {
    exported_of(handle).lr = lr;
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSgdStep(JNIEnv* env, jclass, jlong handle, jdouble lr) {
  guarded(env, 0, [&] {
    exported_of(handle).sgd_step(lr);
    return 0;
  });
}

}  // extern "C"
