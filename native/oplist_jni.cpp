// Protocol 3's JNI entry points (dev.gradbridge.Native's exported* methods) over the module of oplist_engine.h:
// gradbridge_jni.cpp's rules (one guard per entry point, handles are new'ed objects Java frees once; the
// array helpers are jni_support.h's). The program arrives as ProgramArrays.java's three arrays, never as text.

#include <jni.h>

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dev_gradbridge_Native.h"
#include "oplist_engine.h"
#include "jni_support.h"

using gradbridge::exported::Exported;

GRADBRIDGE_HANDLE_KIND(Exported, exported);

namespace {

using namespace gradbridge;
using gradbridge::exported::owned;
using gradbridge::exported::ProgramArrays;

Exported& exported_of(jlong handle) { return borrow<Exported>(handle); }

at::Tensor& tensor_at(jlong handle) { return borrow<at::Tensor>(handle); }

jlong handle_of(at::Tensor tensor) { return release(std::move(tensor)); }

std::vector<at::Tensor> tensors_of(JNIEnv* env, jlongArray handles) {
  std::vector<at::Tensor> out;
  for (int64_t h : longs(env, handles, "tensor array")) out.push_back(tensor_at(h));
  return out;
}

}  // namespace

extern "C" {

// The module from ProgramArrays.java's arrays (read whole, then every value checked as it is used) and its state
// tensors by binding name, copied onto `device`.
JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_exportedLoad(JNIEnv* env, jclass, jlongArray integers,
                                                                jdoubleArray doubles_, jobjectArray strings_,
                                                                jobjectArray state_names, jlongArray state_tensors,
                                                                jstring device) {
  return guarded(env, jlong{0}, [&] {
    auto module = std::make_unique<Exported>();
    module->device = device_named(env, device);
    ProgramArrays program(longs(env, integers, "program's integers"), doubles(env, doubles_, "program's doubles"),
                          strings(env, strings_, "program's strings"));
    module->read(program);
    module->hold(strings(env, state_names, "state names"), tensors_of(env, state_tensors));
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
    return to_java(env, losses);
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
    for (const auto& name : strings(env, names, "names")) {
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
    exported_of(handle).load_optimizer_state(strings(env, keys, "keys"), longs(env, counts, "counts"), tensors_of(env, tensors));
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSet(JNIEnv* env, jclass, jlong handle, jobjectArray names,
                                                              jlongArray tensors) {
  guarded(env, 0, [&] {
    Exported& m = exported_of(handle);
    auto keys = strings(env, names, "names");
    auto values = tensors_of(env, tensors);
    for (size_t k = 0; k < keys.size(); k++) m.state[keys[k]] = owned(values[k], m.device);
    return 0;
  });
}

// The named state tensors themselves, not copies (Native.exportedTensors): handles the caller owns.
JNIEXPORT jlongArray JNICALL Java_dev_gradbridge_Native_exportedTensors(JNIEnv* env, jclass, jlong handle,
                                                                        jobjectArray names) {
  return guarded(env, static_cast<jlongArray>(nullptr), [&] {
    Exported& m = exported_of(handle);
    std::vector<at::Tensor> found;
    for (const auto& name : strings(env, names, "names")) {
      auto it = m.state.find(name);
      if (it == m.state.end()) throw std::invalid_argument("the module holds no state tensor " + name);
      found.push_back(it->second);
    }
    std::vector<jlong> out;
    for (at::Tensor& t : found) out.push_back(handle_of(t));
    return to_java(env, out);
  });
}

// Binds state names to the given tensors themselves, no copy (Native.exportedShare); 0 gives a zero-element
// placeholder of the bound tensor's dtype. Checked whole before anything changes; returns the bindings changed.
JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_exportedShare(JNIEnv* env, jclass, jlong handle, jobjectArray names,
                                                                jlongArray tensors) {
  return guarded(env, jint{0}, [&] {
    Exported& m = exported_of(handle);
    auto keys = strings(env, names, "names");
    auto handles = longs(env, tensors, "tensor array");
    if (handles.size() != keys.size()) throw std::invalid_argument("names and tensors differ in number");
    std::vector<at::Tensor> values;
    jint changed = 0;
    for (size_t k = 0; k < keys.size(); k++) {
      auto it = m.state.find(keys[k]);
      if (it == m.state.end()) throw std::invalid_argument("the module holds no state tensor " + keys[k]);
      const at::Tensor& own = it->second;
      at::Tensor to = handles[k] == 0 ? at::empty({0}, own.options()) : tensor_at(handles[k]);
      if (handles[k] != 0 && (to.scalar_type() != own.scalar_type() || to.device() != m.device
                              || (own.numel() > 0 && to.sizes() != own.sizes())))
        throw std::invalid_argument(keys[k] + ": a " + std::string(c10::toString(to.scalar_type())) + " tensor on "
                                    + to.device().str() + " cannot stand for the module's");
      changed += to.unsafeGetTensorImpl() != own.unsafeGetTensorImpl() ? 1 : 0;
      values.push_back(to);
    }
    for (size_t k = 0; k < keys.size(); k++) m.state[keys[k]] = values[k];
    return changed;
  });
}

JNIEXPORT jdoubleArray JNICALL Java_dev_gradbridge_Native_exportedLrs(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, static_cast<jdoubleArray>(nullptr), [&] {
    return to_java(env, exported_of(handle).training.lrs);
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedSetLr(JNIEnv* env, jclass, jlong handle, jint group, jdouble lr) {
  guarded<Message::first_line>(env, 0, [&] {
    exported_of(handle).training.set_lr(group, lr);
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_exportedScheduleEpoch(JNIEnv* env, jclass, jlong handle, jdouble metric) {
  guarded<Message::first_line>(env, 0, [&] {
    exported_of(handle).training.schedule_epoch(metric);
    return 0;
  });
}

JNIEXPORT jstring JNICALL Java_dev_gradbridge_Native_exportedCounters(JNIEnv* env, jclass, jlong handle) {
  return guarded(env, static_cast<jstring>(nullptr), [&] {
    jstring out = env->NewStringUTF(exported_of(handle).training.counters().c_str());
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

