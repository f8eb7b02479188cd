// The protocol-3 module (oplist_engine.h; python: program.Program is its twin): its graphs, the state tensors it owns
// by binding name and the protocol's methods over them; the optimizer's host side is oplist_schedule.cpp's.

#include "oplist_engine.h"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "jni_support.h"

namespace gradbridge::exported {

at::Tensor owned(const at::Tensor& t, c10::Device device) {
  if (device.is_cpu() && t.device().is_cpu()) return t.clone();
  return t.to(t.options().device(device), /*non_blocking=*/false, /*copy=*/true);
}

// ProgramArrays.java's `program`: the names, the limits, each graph, then the training and counters.
void Exported::read(ProgramArrays& in) {
  auto strings = [&](const char* what, std::vector<std::string>& out) {
    const size_t n = in.count(what);
    for (size_t k = 0; k < n; k++) out.push_back(in.text(what));
  };
  strings("program parameters", parameters);
  strings("program inputs", inputs);
  limits.elements = in.integer("program limits elements");
  strings("program limits sized", limits.sized);
  const size_t count = in.count("program graphs");
  for (size_t k = 0; k < count; k++) {
    const std::string name = in.text("graph name");
    graphs.emplace(name, read_graph(name, in, limits));
  }
  training.read(in);
  in.finish();
  if (training.accumulate > 1 && graphs.count("train_accumulate") == 0)
    throw std::invalid_argument("program: accumulate " + std::to_string(training.accumulate) + " without a train_accumulate graph");
}

void Exported::hold(const std::vector<std::string>& names, const std::vector<at::Tensor>& tensors) {
  if (names.size() != tensors.size()) throw std::invalid_argument("state: names and tensors differ in number");
  for (size_t k = 0; k < names.size(); k++) state[names[k]] = owned(tensors[k], device);
  check_bound();
}

// A state binding a graph reads must be held, unless the first optimizer step creates it (SGD's momentum)
// and none of those is held.
void Exported::check_bound() const {
  const auto lazy = created();
  const bool none_created = created_held() == 0;
  for (const auto& [name, graph] : graphs)
    for (const auto& b : graph.inputs) {
      bool held = b.rfind("param:", 0) == 0 || b.rfind("buffer:", 0) == 0 || b.rfind("const:", 0) == 0 ||
                  b.rfind("state:", 0) == 0;
      if (!held || state.count(b) > 0) continue;
      if (none_created && std::find(lazy.begin(), lazy.end(), b) != lazy.end()) continue;
      throw std::invalid_argument("op list " + name + " reads state tensor " + b + ", which the file lacks");
    }
}

std::vector<std::pair<std::string, c10::IValue>> Exported::run(const std::string& name, const Values& values) {
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
std::string Exported::graph_for(const std::string& name, int64_t n) const {
  if (n == 1 && graphs.count(name + "@1") > 0) return name + "@1";
  if (n < 2)
    throw std::invalid_argument("a batch of " + std::to_string(n) + " samples: this protocol-3 module runs batches of at least 2 (its export captured no graph " + name + " at one sample)");
  return name;
}

Exported::Values Exported::batch_values(const std::vector<at::Tensor>& xs, const at::Tensor* y) const {
  if (xs.size() != inputs.size()) throw std::invalid_argument("expected " + std::to_string(inputs.size()) + " inputs, got " + std::to_string(xs.size()));
  Values values;
  for (size_t k = 0; k < xs.size(); k++) values["input:" + inputs[k]] = on_device(xs[k], device);
  if (y != nullptr) values["target"] = on_device(*y, device);
  return values;
}

// Runs a joint graph (`train`, or `train_accumulate`: its loss divided by the accumulation count) and
// accumulates its gradients as autograd's AccumulateGrad does; returns its loss.
at::Tensor Exported::backward(const std::string& graph, const std::vector<at::Tensor>& xs, const at::Tensor& y) {
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

at::Tensor Exported::calculate_loss_and_backward(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
  return backward("train", xs, y);
}

void Exported::zero_grad() {
  for (const auto& p : parameters) state.erase("grad:" + p);
}

// The state bindings the first optimizer step creates (SGD's momentum buffers), and how many are held:
// all or none (a load of a state holding some is refused).
std::vector<std::string> Exported::created() const {
  std::vector<std::string> out;
  auto first = graphs.find("optimizer_first");
  if (first != graphs.end())
    for (const auto& o : first->second.outputs) out.push_back(o.second);
  return out;
}

size_t Exported::created_held() const {
  size_t held = 0;
  for (const auto& b : created()) held += state.count(b);
  return held;
}

// torch.optim's state layout: per key in the order the step graph binds them, the trainable parameters
// that hold it (in group order); optimizer_state and load_optimizer_state take it.
std::vector<std::pair<std::string, std::vector<std::string>>> Exported::optimizer_layout() const {
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
void Exported::load_optimizer_state(const std::vector<std::string>& keys, const std::vector<int64_t>& counts,
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
  if (step >= 0) training.steps = step;
}

// torch's order: clip_grad_*_, optimizer.step(), scheduler.step() (a per-step schedule)
void Exported::optimizer_step() {
  for (const auto& p : training.trainable)
    if (state.find("grad:" + p) == state.end())
      throw std::invalid_argument("optimizer_step: parameter " + p + " has no gradient (run calculate_loss_and_backward first)");
  training.steps++;
  if (graphs.count("clip") > 0) run("clip", {});
  // SGD's first step with momentum (torch's momentum_buffer is None): copies the gradient into new buffers
  bool first = graphs.count("optimizer_first") > 0 && created_held() == 0;
  Values scalars;
  for (const auto& [binding, value] : training.host_scalars()) scalars[binding] = value;
  for (auto& [to, value] : run(first ? "optimizer_first" : "optimizer", scalars)) state[to] = value.toTensor();
  training.step_schedule();
}

// zero_grad, loss and backward, optimizer step; with accumulation k > 1 the batch's micro-batches of
// ceil(n / k) rows each add the gradients of loss / k, and the loss is their sum in order.
at::Tensor Exported::train_step(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
  zero_grad();
  at::Tensor loss;
  if (training.accumulate == 1) {
    loss = calculate_loss_and_backward(xs, y);
  } else {
    const int64_t n = y.size(0);
    const int64_t size = (n + training.accumulate - 1) / training.accumulate;
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

at::Tensor Exported::forward(const std::vector<at::Tensor>& xs) {
  Values values = batch_values(xs, nullptr);
  return run(graph_for("forward", xs[0].size(0)), values)[0].second.toTensor();
}

at::Tensor Exported::evaluate(const std::vector<at::Tensor>& xs, const at::Tensor& y) {
  at::Tensor output = forward(xs);
  Values values{{"output", output}, {"target", on_device(y, device)}};
  return run(graph_for("loss", y.size(0)), values)[0].second.toTensor();
}

void Exported::sgd_step(double rate) {
  at::NoGradGuard no_grad;
  for (const auto& p : parameters) {
    auto grad = state.find("grad:" + p);
    if (grad != state.end()) state["param:" + p].add_(grad->second, -rate);
  }
  zero_grad();
}

}  // namespace gradbridge::exported
