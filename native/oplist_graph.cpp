// Protocol 3's op lists (oplist_engine.h): each graph built from the program's arrays (oplist_arrays.h; Java
// wrote them from the file it read with Gson and checked), its ops resolved once and each argument typed against
// the op's schema and the slots computed before it, at load; as an op runs, each argument's value and the sizes
// it asks for (python: oplist.py and oplist_check.py are the twins).

#include "oplist_engine.h"

#include <ATen/ScalarOps.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradbridge::exported {

namespace {

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

// The argument kinds as ProgramArrays.java codes them (0: null; then its kinds "t" to "mf", in order).
enum Code : int64_t { kNull, kT, kTl, kOtl, kI, kF, kB, kIl, kSl, kBx, kFl, kBl, kS, kDtype, kLayout, kDevice, kMf };

Arg read_arg(ProgramArrays& in, const std::string& where) {
  Arg a;
  const int64_t code = in.integer("argument kind");
  auto ints = [&](const char* what) {
    const size_t n = in.count(what);
    for (size_t k = 0; k < n; k++) a.ints.push_back(in.integer(what));
  };
  switch (code) {
    case kNull: return a;
    case kT: a.kind = Arg::Ref; a.i = in.integer("argument t"); return a;
    case kTl: a.kind = Arg::RefList; ints("argument tl"); return a;
    case kOtl: a.kind = Arg::OptRefList; ints("argument otl"); return a;  // -1: None
    case kI: a.kind = Arg::Int; a.i = in.integer("argument i"); return a;
    case kF: a.kind = Arg::Double; a.d = in.number("argument f"); return a;
    case kB: a.kind = Arg::Bool; a.b = in.flag("argument b"); return a;
    case kIl: a.kind = Arg::IntList; ints("argument il"); return a;
    case kSl: {  // per size a pair (a, c): a * batch + c
      a.kind = Arg::SizeList;
      const size_t n = in.count("argument sl");
      for (size_t k = 0; k < n; k++) {
        a.ints.push_back(in.integer("argument sl"));
        a.ints.push_back(in.integer("argument sl"));
      }
      return a;
    }
    case kBx: a.kind = Arg::BatchInt; a.i = in.integer("argument bx"); a.c = in.integer("argument bx"); return a;
    case kFl: {
      a.kind = Arg::DoubleList;
      const size_t n = in.count("argument fl");
      for (size_t k = 0; k < n; k++) a.doubles.push_back(in.number("argument fl"));
      return a;
    }
    case kBl: {
      a.kind = Arg::BoolList;
      const size_t n = in.count("argument bl");
      for (size_t k = 0; k < n; k++) a.bools.push_back(in.flag("argument bl"));
      return a;
    }
    case kS: a.kind = Arg::Str; a.s = in.text("argument s"); return a;
    case kDtype: a.kind = Arg::Dtype; a.i = static_cast<int64_t>(dtype_named(in.text("argument dtype"))); return a;
    case kLayout: {
      const std::string& x = in.text("argument layout");
      if (x != "strided") throw std::invalid_argument(where + ": unknown layout " + x);
      a.kind = Arg::Layout;
      return a;
    }
    case kDevice: {
      const std::string& x = in.text("argument device");
      if (x != "cpu") throw std::invalid_argument(where + ": unknown device " + x);
      a.kind = Arg::Device;
      return a;
    }
    case kMf: {
      a.kind = Arg::MemoryFormat;
      const std::string& f = in.text("argument mf");
      a.i = f == "contiguous_format" ? static_cast<int64_t>(c10::MemoryFormat::Contiguous)
          : f == "preserve_format" ? static_cast<int64_t>(c10::MemoryFormat::Preserve)
          : f == "channels_last" ? static_cast<int64_t>(c10::MemoryFormat::ChannelsLast)
          : f == "channels_last_3d" ? static_cast<int64_t>(c10::MemoryFormat::ChannelsLast3d) : -1;
      if (a.i < 0) throw std::invalid_argument(where + ": unknown memory format " + f);
      return a;
    }
    default: throw std::invalid_argument(where + ": unknown argument kind " + std::to_string(code));
  }
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

// a * batch + c, an int the op list computes from the batch size, refused past int64 (python: oplist._decode)
int64_t batch_int(int64_t a, int64_t batch, int64_t c) {
  int64_t product = 0, sum = 0;
  if (__builtin_mul_overflow(a, batch, &product) || __builtin_add_overflow(product, c, &sum))
    throw std::invalid_argument("op list: " + std::to_string(a) + " * batch " + std::to_string(batch) + " + " + std::to_string(c) + " overflows int64");
  return sum;
}

}  // namespace

Graph read_graph(const std::string& name, ProgramArrays& in, const Limits& limits) {
  std::string where = "op list " + name;
  const int64_t version = in.integer("graph oplist_version");
  if (version != kOpListVersion) {
    throw std::invalid_argument(where + ": op-list version " + std::to_string(version) + ", this gradbridge runs version " +
                                std::to_string(kOpListVersion));
  }
  Graph graph;
  const size_t inputs = in.count("graph inputs");
  for (size_t k = 0; k < inputs; k++) graph.inputs.push_back(in.text("graph inputs"));
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
  const size_t nodes = in.count("graph nodes");
  for (size_t index = 0; index < nodes; index++) {
    Node node;
    std::string op = in.text("node op");
    std::string overload = in.text("node overload");
    node.name = op + (overload.empty() ? "" : "." + overload);
    node.label = " node " + std::to_string(index) + " (" + node.name + ")";
    const std::string at = where + node.label;
    if (op != "#item") {
      auto handle = dispatcher.findSchema({op, overload == "default" ? "" : overload});
      if (!handle.has_value()) throw std::invalid_argument(where + ": unknown operator " + node.name);
      node.op = *handle;
    }
    const size_t args = in.count("node args");
    if (!node.op.has_value() && args != 2) throw std::invalid_argument(at + ": expected 2 arguments");
    for (size_t k = 0; k < args; k++) {
      node.args.push_back(read_arg(in, at));
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
    node.outputs = in.integer("node outputs");
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
  const size_t outputs = in.count("graph outputs");
  for (size_t k = 0; k < outputs; k++) {
    int64_t ref = in.integer("output ref");
    if (ref < 0 || ref >= count) throw std::invalid_argument(where + ": an output refers to slot " + std::to_string(ref));
    if (slots[ref] != Slot::Tensor)
      throw std::invalid_argument(where + ": an output refers to slot " + std::to_string(ref) + ", which holds " + slot_name(slots[ref]) + ", not a tensor");
    graph.outputs.emplace_back(ref, in.text("output to"));
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

}  // namespace gradbridge::exported
