// gradbridge's protocol-3 engine: a training module captured with torch.export as gradbridge's own op lists
// (python/gradbridge/_runtime/oplist.py holds the format; program.py the Python twin of everything here), run op by
// op over libtorch's public dispatcher: each op resolved once per graph with c10::Dispatcher::findSchema and run
// with callBoxed on an IValue stack, the kernels eager PyTorch reaches. The module owns its state tensors
// (parameters, buffers, gradients, optimizer state) by binding name. Nothing here parses text: Java reads the
// file with Gson, checks it and hands over typed arrays (oplist_arrays.h). An unknown op-list version, operator
// or argument kind is refused with one line naming it.
//
//   oplist_graph.cpp    op lists from the arrays: each op resolved and its arguments typed against its schema
//                          at load; each argument's value, and the sizes it asks for, as the op runs
//   oplist_schedule.cpp  the optimizer's host scalars, the learning-rate schedules, the counters (plain C++)
//   oplist_module.cpp    the module: graphs, state and the protocol's methods (program.Program's twin)
//   oplist_jni.cpp       the JNI entry points (gradbridge_jni.cpp's rules: one guard, handles Java frees once)
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "oplist_arrays.h"
#include "oplist_schedule.h"

namespace gradbridge::exported {

// The op lists' format version (python: oplist.VERSION, Java: Protocol.OPLIST_VERSION; tests/test_pins.py)
constexpr int64_t kOpListVersion = 4;

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

// ---- oplist_graph.cpp ----

// One graph (ProgramArrays.java's `graph`, after its name): each op resolved and its arguments checked against
// its schema and the slots computed before it.
Graph read_graph(const std::string& name, ProgramArrays& in, const Limits& limits);

// Before an op runs, what its arguments size from the file: within the limits, a view within its source.
void check_sizes(const Node& node, const torch::jit::Stack& stack, const Limits& limits, const std::string& graph);

// An op's argument as the kernel takes it; a device argument is the module's device.
c10::IValue argument(const Arg& a, const std::vector<c10::IValue>& slots, int64_t batch, c10::Device device);

// ---- oplist_module.cpp ----

// A state tensor of the module's own on `device`: a clone on the CPU, a copy on another device.
at::Tensor owned(const at::Tensor& t, c10::Device device);

struct Exported {
  std::unordered_map<std::string, Graph> graphs;
  std::unordered_map<std::string, at::Tensor> state;
  std::vector<std::string> parameters;  // all, in the model's order
  std::vector<std::string> inputs;
  Training training;  // the optimizer, its groups and schedule, the counters
  Limits limits;
  c10::Device device{c10::kCPU};  // where the state tensors are and the ops run; inputs are copied here

  using Values = std::unordered_map<std::string, c10::IValue>;

  // ProgramArrays.java's `program`, every value read; then the state (`names`, `tensors`) taken as copies
  void read(ProgramArrays& in);
  void hold(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors);

  std::vector<std::pair<std::string, c10::IValue>> run(const std::string& name, const Values& values);
  std::string graph_for(const std::string& name, int64_t n) const;
  Values batch_values(const std::vector<at::Tensor>& xs, const at::Tensor* y) const;
  at::Tensor backward(const std::string& graph, const std::vector<at::Tensor>& xs, const at::Tensor& y);
  at::Tensor calculate_loss_and_backward(const std::vector<at::Tensor>& xs, const at::Tensor& y);
  void zero_grad();
  std::vector<std::string> created() const;
  size_t created_held() const;
  std::vector<std::pair<std::string, std::vector<std::string>>> optimizer_layout() const;
  void load_optimizer_state(const std::vector<std::string>& keys, const std::vector<int64_t>& counts,
                            const std::vector<at::Tensor>& tensors);
  void optimizer_step();
  at::Tensor train_step(const std::vector<at::Tensor>& xs, const at::Tensor& y);
  at::Tensor forward(const std::vector<at::Tensor>& xs);
  at::Tensor evaluate(const std::vector<at::Tensor>& xs, const at::Tensor& y);
  void sgd_step(double rate);
  void check_bound() const;
};

}  // namespace gradbridge::exported
