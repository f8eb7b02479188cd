// gradbridge's native layer: TorchScript modules and tensors over libtorch's C++ API, for Java
// through JNI. The signatures come from `javac -h` on dev/gradbridge/Native.java (the generated
// header is included below), so Java and C++ cannot drift. Built per libtorch build by
// python/gradbridge/_runtime/native.py; nothing here depends on a particular libtorch minor version.
//
// Rules every entry point follows:
// - one guard (`guarded`, in jni_support.h with gradbridge_gloo.cpp) turns c10::Error,
//   std::exception and anything else into a Java dev.gradbridge.NativeException carrying
//   what_without_backtrace(); nothing escapes to the JVM;
// - handles are `new`ed objects passed as jlong; Java frees each once;
// - grad mode and the graph executor's optimization are thread-local in libtorch: every method
//   call sets them with RAII guards for its own duration (autograd on, optimizer off) and gives
//   the calling thread back as it was (in-process, that thread may be Python's).

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>
#include <jni.h>
#include <sched.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <ATen/Parallel.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/runtime/interpreter.h>
#include <torch/csrc/jit/runtime/profiling_graph_executor_impl.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/cuda.h>
#include <torch/script.h>
#include <torch/version.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "dev_gradbridge_Native.h"
#include "jni_support.h"

namespace {

using namespace gradbridge;

// Classes and methods cached once in JNI_OnLoad (global references).
struct JavaTypes {
  jclass tensor;
  jmethodID tensor_new, tensor_handle;
  jclass boxed_double, boxed_long, boxed_integer, boxed_float, boxed_boolean, string;
  jmethodID double_new, double_value, long_new, long_value, integer_value, float_value;
  jmethodID boolean_new, boolean_value;
  jclass list, array_list, map, map_entry, linked_hash_map, set;
  jmethodID list_to_array, array_list_new, array_list_add;
  jmethodID map_entry_set, set_to_array, entry_key, entry_value, linked_hash_map_new, map_put;
} T;

jclass global_class(JNIEnv* env, const char* name) {
  jclass local = env->FindClass(name);
  if (local == nullptr) return nullptr;
  auto global = static_cast<jclass>(env->NewGlobalRef(local));
  env->DeleteLocalRef(local);
  return global;
}

at::Tensor& tensor_of(jlong handle) { return borrow<at::Tensor>(handle); }

// A TorchScript module and the device it runs on: its tensors are there, its calls' tensor arguments are
// copied there (on_device), their results come back to the CPU (on_host).
struct Loaded {
  torch::jit::Module module;
  c10::Device device;
};

// A method looked up once (Native.methodOf), with its module's device.
struct Bound {
  torch::jit::Method method;
  c10::Device device;
};

torch::jit::Module& module_of(jlong handle) { return borrow<Loaded>(handle).module; }

c10::Device device_of(jlong handle) { return borrow<Loaded>(handle).device; }

// The module as it is now, on `device`: written to an archive in memory and read back with libtorch's map
// location, so every tensor moves (attributes, lists, a trace's constants) and tensors that share a storage
// still share one; the training flags travel in the archive.
torch::jit::Module moved(const torch::jit::Module& module, c10::Device device) {
  std::stringstream archive;
  torch::jit::ExportModule(module, archive, {}, false, false, false);
  archive.seekg(0);
  return torch::jit::load(archive, device);
}

// Every tensor of an argument on `device` (tensors, lists of tensors, dicts of tensor lists).
c10::IValue argument_on(c10::IValue value, c10::Device device) {
  if (device.is_cpu()) return value;
  if (value.isTensor()) return on_device(value.toTensor(), device);
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorVector()) out.push_back(on_device(t, device));
    return out;
  }
  if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    for (const auto& entry : dict) out.insert(entry.key(), argument_on(entry.value(), device));
    return out;
  }
  return value;
}

jlong new_handle(at::Tensor tensor) { return release(std::move(tensor)); }

std::vector<int64_t> shape_of(JNIEnv* env, jlongArray shape) {
  auto dims = longs(env, shape, "shape");
  for (int64_t d : dims) {
    if (d < 0) throw std::invalid_argument("a tensor dimension is negative");
  }
  return dims;
}

c10::ScalarType scalar_type(jint code) {
  if (code < 0 || code >= static_cast<jint>(c10::ScalarType::NumOptions)) {
    throw std::invalid_argument("unknown scalar type code " + std::to_string(code));
  }
  return static_cast<c10::ScalarType>(code);
}

// ---- IValue conversion (what TrainingModule.call documents) ----

c10::IValue to_ivalue(JNIEnv* env, jobject value);

c10::IValue list_to_ivalue(JNIEnv* env, jobject list) {
  Local array(env, env->CallObjectMethod(list, T.list_to_array));
  check_java(env);
  auto items = static_cast<jobjectArray>(array.ref);
  jsize n = env->GetArrayLength(items);
  std::vector<c10::IValue> values;
  values.reserve(n);
  for (jsize i = 0; i < n; i++) {
    Local item(env, env->GetObjectArrayElement(items, i));
    values.push_back(to_ivalue(env, item.ref));
  }
  // TorchScript lists are typed: an empty list or a list of tensors is List[Tensor].
  bool tensors = true, doubles = true, ints = true, bools = true, strings = true;
  for (const auto& v : values) {
    tensors &= v.isTensor();
    doubles &= v.isDouble();
    ints &= v.isInt();
    bools &= v.isBool();
    strings &= v.isString();
  }
  if (tensors) {
    c10::List<at::Tensor> out;
    for (auto& v : values) out.push_back(v.toTensor());
    return out;
  }
  if (doubles) {
    c10::List<double> out;
    for (auto& v : values) out.push_back(v.toDouble());
    return out;
  }
  if (ints) {
    c10::List<int64_t> out;
    for (auto& v : values) out.push_back(v.toInt());
    return out;
  }
  if (bools) {
    c10::List<bool> out;
    for (auto& v : values) out.push_back(v.toBool());
    return out;
  }
  if (strings) {
    c10::List<std::string> out;
    for (auto& v : values) out.push_back(v.toStringRef());
    return out;
  }
  throw std::invalid_argument("a list argument mixes element types; expected one of Tensor, Double, Long, "
                              "Boolean, String");
}

c10::IValue map_to_ivalue(JNIEnv* env, jobject map) {
  Local entries(env, env->CallObjectMethod(map, T.map_entry_set));
  check_java(env);
  Local array(env, env->CallObjectMethod(entries.ref, T.set_to_array));
  check_java(env);
  auto items = static_cast<jobjectArray>(array.ref);
  jsize n = env->GetArrayLength(items);
  // optimizer_state's shape: {str: List[Tensor]}.
  c10::Dict<std::string, c10::List<at::Tensor>> dict;
  for (jsize i = 0; i < n; i++) {
    Local entry(env, env->GetObjectArrayElement(items, i));
    Local key(env, env->CallObjectMethod(entry.ref, T.entry_key));
    check_java(env);
    Local value(env, env->CallObjectMethod(entry.ref, T.entry_value));
    check_java(env);
    if (key.ref == nullptr || !env->IsInstanceOf(key.ref, T.string)) {
      throw std::invalid_argument("a map argument has a key that is not a String");
    }
    c10::IValue converted = value.ref == nullptr ? c10::IValue() : to_ivalue(env, value.ref);
    if (!converted.isTensorList()) {
      throw std::invalid_argument("a map argument's values must be lists of tensors (Dict[str, List[Tensor]])");
    }
    dict.insert(Utf8(env, static_cast<jstring>(key.ref)).str(), converted.toTensorList());
  }
  return dict;
}

c10::IValue to_ivalue(JNIEnv* env, jobject value) {
  if (value == nullptr) return c10::IValue();
  if (env->IsInstanceOf(value, T.tensor)) {
    jlong handle = env->CallLongMethod(value, T.tensor_handle);
    check_java(env);
    return tensor_of(handle);
  }
  if (env->IsInstanceOf(value, T.boxed_double)) return env->CallDoubleMethod(value, T.double_value);
  if (env->IsInstanceOf(value, T.boxed_float)) return static_cast<double>(env->CallFloatMethod(value, T.float_value));
  if (env->IsInstanceOf(value, T.boxed_long)) return static_cast<int64_t>(env->CallLongMethod(value, T.long_value));
  if (env->IsInstanceOf(value, T.boxed_integer)) {
    return static_cast<int64_t>(env->CallIntMethod(value, T.integer_value));
  }
  if (env->IsInstanceOf(value, T.boxed_boolean)) return env->CallBooleanMethod(value, T.boolean_value) == JNI_TRUE;
  if (env->IsInstanceOf(value, T.string)) return Utf8(env, static_cast<jstring>(value)).str();
  if (env->IsInstanceOf(value, T.list)) return list_to_ivalue(env, value);
  if (env->IsInstanceOf(value, T.map)) return map_to_ivalue(env, value);
  throw std::invalid_argument("unsupported argument type");
}

jobject tensor_object(JNIEnv* env, at::Tensor tensor) {
  jlong handle = new_handle(std::move(tensor));
  jobject object = env->NewObject(T.tensor, T.tensor_new, handle);
  if (object == nullptr) {
    drop<at::Tensor>(handle);
    throw JavaPending{};
  }
  return object;
}

jobject from_ivalue(JNIEnv* env, const c10::IValue& value);

jobject list_object(JNIEnv* env, const std::vector<c10::IValue>& items) {
  jobject list = env->NewObject(T.array_list, T.array_list_new, static_cast<jint>(items.size()));
  if (list == nullptr) throw JavaPending{};
  for (const auto& item : items) {
    Local converted(env, from_ivalue(env, item));
    env->CallBooleanMethod(list, T.array_list_add, converted.ref);
    check_java(env);
  }
  return list;
}

jobject from_ivalue(JNIEnv* env, const c10::IValue& value) {
  if (value.isNone()) return nullptr;
  if (value.isTensor()) return tensor_object(env, on_host(value.toTensor()));
  if (value.isDouble()) return env->NewObject(T.boxed_double, T.double_new, value.toDouble());
  if (value.isInt()) return env->NewObject(T.boxed_long, T.long_new, static_cast<jlong>(value.toInt()));
  if (value.isBool()) return env->NewObject(T.boxed_boolean, T.boolean_new, value.toBool() ? JNI_TRUE : JNI_FALSE);
  if (value.isString()) return env->NewStringUTF(value.toStringRef().c_str());
  if (value.isList()) {
    auto list = value.toListRef();
    return list_object(env, std::vector<c10::IValue>(list.begin(), list.end()));
  }
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    return list_object(env, std::vector<c10::IValue>(elements.begin(), elements.end()));
  }
  if (value.isGenericDict()) {
    jobject map = env->NewObject(T.linked_hash_map, T.linked_hash_map_new);
    if (map == nullptr) throw JavaPending{};
    for (const auto& entry : value.toGenericDict()) {
      if (!entry.key().isString()) throw std::invalid_argument("a dict result has a key that is not a str");
      Local key(env, env->NewStringUTF(entry.key().toStringRef().c_str()));
      Local converted(env, from_ivalue(env, entry.value()));
      Local previous(env, env->CallObjectMethod(map, T.map_put, key.ref, converted.ref));
      check_java(env);
    }
    return map;
  }
  throw std::invalid_argument("unsupported result type " + value.tagKind());
}

// Grad mode on and the optimizing graph executor off, for one call on this thread.
struct TrainingCall {
  c10::AutoGradMode grad{true};
  torch::jit::GraphOptimizerEnabledGuard optimizer{false};
};

torch::jit::Method method_of(torch::jit::Module& module, JNIEnv* env, jstring name) {
  Utf8 method(env, name);
  auto found = module.find_method(method.chars);
  if (!found) throw std::invalid_argument(std::string("the module has no method '") + method.chars + "'");
  return *found;
}

// Runs a method looked up once (Native.methodOf) under TrainingCall, its tensor arguments on its module's
// device; its result must be a tensor (left where the method made it).
at::Tensor run_to_tensor(jlong method, std::vector<c10::IValue> inputs) {
  auto& bound = borrow<Bound>(method);
  for (c10::IValue& input : inputs) input = argument_on(std::move(input), bound.device);
  TrainingCall call;
  c10::IValue result = bound.method(std::move(inputs));
  if (!result.isTensor()) throw std::invalid_argument("returned " + result.tagKind() + ", not a tensor");
  return result.toTensor();
}

// A tensor's values as exact doubles into out[numel]: float32 widens here (exact), rather than in
// a libtorch conversion kernel; other dtypes convert in libtorch.
void copy_doubles(const at::Tensor& values, double* out) {
  const int64_t count = values.numel();
  if (values.device().is_cpu() && values.is_contiguous() && values.scalar_type() == at::kFloat) {
    const float* data = values.const_data_ptr<float>();
    std::copy(data, data + count, out);
  } else {
    at::NoGradGuard no_grad;
    at::Tensor wide = values.to(at::kCPU, at::kDouble).contiguous();
    std::copy(wide.const_data_ptr<double>(), wide.const_data_ptr<double>() + count, out);
  }
}

// A method compiled once with its nested calls inlined (Native.planOf): its module object, its flat program
// and the module's device.
struct Plan {
  c10::IValue self;
  torch::jit::Code code;
  c10::Device device;
};

// The plans of the guarded steps (plansStepWhileFinite), in the order Java passes them
// (Native.STEP_ZERO_GRAD ...); the one that failed is reported by this index.
enum Step : jint { zero_grad = 0, loss_and_backward = 1, get_gradients = 2, optimizer_step = 3, steps = 4 };

// Runs a plan on the module object and `inputs` (the interpreter does not check arity as a method
// call does: a count that does not match is refused here, before it runs).
c10::IValue run_plan(Plan& plan, std::vector<c10::IValue> inputs) {
  if (plan.code.num_inputs() != inputs.size() + 1) {
    throw std::invalid_argument("takes " + std::to_string(plan.code.num_inputs() - 1) + " arguments, not "
                                + std::to_string(inputs.size()));
  }
  torch::jit::Stack stack{plan.self};
  for (c10::IValue& input : inputs) stack.push_back(argument_on(std::move(input), plan.device));
  torch::jit::InterpreterState(plan.code).run(stack);
  return stack.empty() ? c10::IValue() : stack.back();
}

// Whether every element is finite: a plain loop over contiguous float32/float64 memory (the update
// guard's common case, per micro-batch), libtorch's isfinite for anything else.
bool all_finite(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0) return true;
  if (t.device().is_cpu() && t.is_contiguous()) {
    const int64_t n = t.numel();
    if (t.scalar_type() == at::kFloat) {
      const float* data = t.const_data_ptr<float>();
      return std::all_of(data, data + n, [](float v) { return std::isfinite(v); });
    }
    if (t.scalar_type() == at::kDouble) {
      const double* data = t.const_data_ptr<double>();
      return std::all_of(data, data + n, [](double v) { return std::isfinite(v); });
    }
  }
  at::NoGradGuard no_grad;
  return at::isfinite(t).all().item<bool>();
}

// Whether two distinct tensors anywhere in `value` (attributes, lists, dicts, submodules) share a
// storage: IValue::deepcopy clones each tensor apart, so a copy would split them (and its archive
// and its training would no longer be the module's).
bool shares_storage(const c10::IValue& value, std::unordered_map<const void*, const void*>& owners) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined() || !t.has_storage()) return false;
    auto [at, fresh] = owners.emplace(t.storage().unsafeGetStorageImpl(), t.unsafeGetTensorImpl());
    return !fresh && at->second != t.unsafeGetTensorImpl();
  }
  if (value.isObject()) {
    for (const auto& slot : value.toObjectRef().slots()) {
      if (shares_storage(slot, owners)) return true;
    }
  } else if (value.isList()) {
    for (const c10::IValue& e : value.toListRef()) {
      if (shares_storage(e, owners)) return true;
    }
  } else if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) {
      if (shares_storage(e, owners)) return true;
    }
  } else if (value.isGenericDict()) {
    for (const auto& e : value.toGenericDict()) {
      if (shares_storage(e.key(), owners) || shares_storage(e.value(), owners)) return true;
    }
  }
  return false;
}

// ---- one tensor in several modules of one file (Native.moduleShare: the online learner's frozen weights) ----

// The named parameters' and buffers' tensors of an exported training module, where scripted_module.py keeps
// them: the ParameterList `params` (its attribute i named names[i]) and the list `buffer_list` (named
// buffer_name_list[i]).
std::vector<at::Tensor> named_tensors(const torch::jit::Module& module, const std::vector<std::string>& wanted) {
  for (const char* attribute : {"names", "params", "buffer_name_list", "buffer_list"}) {
    if (!module.hasattr(attribute))
      throw std::invalid_argument(std::string("the module has no attribute ") + attribute + " (exported by an older gradbridge)");
  }
  std::unordered_map<std::string, at::Tensor> by_name;
  const torch::jit::Module params = module.attr("params").toModule();
  const auto names = module.attr("names").toListRef();
  for (size_t i = 0; i < names.size(); i++) by_name.emplace(names[i].toStringRef(), params.attr(std::to_string(i)).toTensor());
  const auto buffer_names = module.attr("buffer_name_list").toListRef();
  const auto buffers = module.attr("buffer_list").toListRef();
  for (size_t i = 0; i < buffer_names.size() && i < buffers.size(); i++)
    by_name.emplace(buffer_names[i].toStringRef(), buffers[i].toTensor());
  std::vector<at::Tensor> out;
  for (const auto& name : wanted) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw std::invalid_argument("the module has no parameter or buffer " + name);
    out.push_back(it->second);
  }
  return out;
}

// Each tensor to replace (by identity) and its replacement.
using Replacements = std::unordered_map<const c10::TensorImpl*, at::Tensor>;

const at::Tensor* replacement(const c10::IValue& value, const Replacements& with) {
  if (!value.isTensor()) return nullptr;
  auto it = with.find(value.toTensor().unsafeGetTensorImpl());
  return it == with.end() ? nullptr : &it->second;
}

// Every reference in `value` to a tensor `with` maps made a reference to its replacement (when `apply`; else
// only counted and checked): objects' attributes (the modules, the ParameterList), lists, dicts' values. A
// tuple or a dict key holding one cannot change, and is refused. Returns the references.
size_t replace_tensors(const c10::IValue& value, const Replacements& with, bool apply,
                       std::unordered_set<const void*>& seen) {
  if (!(value.isObject() || value.isList() || value.isGenericDict() || value.isTuple())) return 0;
  if (!seen.insert(value.internalToPointer()).second) return 0;
  size_t n = 0;
  if (value.isObject()) {
    auto object = value.toObject();
    for (size_t i = 0; i < object->slots().size(); i++) {
      const c10::IValue slot = object->getSlot(i);
      if (const at::Tensor* to = replacement(slot, with)) {
        if (apply) object->setSlot(i, *to);
        n++;
      } else {
        n += replace_tensors(slot, with, apply, seen);
      }
    }
  } else if (value.isList()) {
    auto list = value.toList();
    for (size_t i = 0; i < list.size(); i++) {
      const c10::IValue element = list.get(i);
      if (const at::Tensor* to = replacement(element, with)) {
        if (apply) list.set(i, *to);
        n++;
      } else {
        n += replace_tensors(element, with, apply, seen);
      }
    }
  } else if (value.isGenericDict()) {
    auto dict = value.toGenericDict();
    std::vector<std::pair<c10::IValue, at::Tensor>> changes;
    for (const auto& entry : dict) {
      if (replacement(entry.key(), with)) throw std::invalid_argument("a tensor to share is a dict key");
      if (const at::Tensor* to = replacement(entry.value(), with)) changes.emplace_back(entry.key(), *to);
      else n += replace_tensors(entry.value(), with, apply, seen);
    }
    if (apply) for (auto& [key, to] : changes) dict.insert_or_assign(key, to);
    n += changes.size();
  } else {
    for (const auto& element : value.toTupleRef().elements()) {
      if (replacement(element, with)) throw std::invalid_argument("a tensor to share is held in a tuple, which cannot change");
      n += replace_tensors(element, with, apply, seen);
    }
  }
  return n;
}

}  // namespace

GRADBRIDGE_HANDLE_KIND(Loaded, module);
GRADBRIDGE_HANDLE_KIND(Bound, method);
GRADBRIDGE_HANDLE_KIND(Plan, plan);

extern "C" {

JNIEXPORT jint JNICALL JNI_OnLoad(JavaVM* vm, void*) {
  JNIEnv* env = nullptr;
  if (vm->GetEnv(reinterpret_cast<void**>(&env), JNI_VERSION_1_8) != JNI_OK) return JNI_ERR;
  T.tensor = global_class(env, "dev/gradbridge/Tensor");
  T.boxed_double = global_class(env, "java/lang/Double");
  T.boxed_float = global_class(env, "java/lang/Float");
  T.boxed_long = global_class(env, "java/lang/Long");
  T.boxed_integer = global_class(env, "java/lang/Integer");
  T.boxed_boolean = global_class(env, "java/lang/Boolean");
  T.string = global_class(env, "java/lang/String");
  T.list = global_class(env, "java/util/List");
  T.array_list = global_class(env, "java/util/ArrayList");
  T.map = global_class(env, "java/util/Map");
  T.map_entry = global_class(env, "java/util/Map$Entry");
  T.linked_hash_map = global_class(env, "java/util/LinkedHashMap");
  T.set = global_class(env, "java/util/Set");
  if (env->ExceptionCheck()) return JNI_ERR;
  T.tensor_new = env->GetMethodID(T.tensor, "<init>", "(J)V");
  T.tensor_handle = env->GetMethodID(T.tensor, "handle", "()J");
  T.double_new = env->GetMethodID(T.boxed_double, "<init>", "(D)V");
  T.double_value = env->GetMethodID(T.boxed_double, "doubleValue", "()D");
  T.float_value = env->GetMethodID(T.boxed_float, "floatValue", "()F");
  T.long_new = env->GetMethodID(T.boxed_long, "<init>", "(J)V");
  T.long_value = env->GetMethodID(T.boxed_long, "longValue", "()J");
  T.integer_value = env->GetMethodID(T.boxed_integer, "intValue", "()I");
  T.boolean_new = env->GetMethodID(T.boxed_boolean, "<init>", "(Z)V");
  T.boolean_value = env->GetMethodID(T.boxed_boolean, "booleanValue", "()Z");
  T.list_to_array = env->GetMethodID(T.list, "toArray", "()[Ljava/lang/Object;");
  T.array_list_new = env->GetMethodID(T.array_list, "<init>", "(I)V");
  T.array_list_add = env->GetMethodID(T.array_list, "add", "(Ljava/lang/Object;)Z");
  T.map_entry_set = env->GetMethodID(T.map, "entrySet", "()Ljava/util/Set;");
  T.set_to_array = env->GetMethodID(T.set, "toArray", "()[Ljava/lang/Object;");
  T.entry_key = env->GetMethodID(T.map_entry, "getKey", "()Ljava/lang/Object;");
  T.entry_value = env->GetMethodID(T.map_entry, "getValue", "()Ljava/lang/Object;");
  T.linked_hash_map_new = env->GetMethodID(T.linked_hash_map, "<init>", "()V");
  T.map_put = env->GetMethodID(T.map, "put", "(Ljava/lang/Object;Ljava/lang/Object;)Ljava/lang/Object;");
  if (env->ExceptionCheck()) return JNI_ERR;
  return JNI_VERSION_1_8;
}

// ---- the library ----

JNIEXPORT jstring JNICALL Java_dev_gradbridge_Native_torchVersion(JNIEnv* env, jclass) {
  return env->NewStringUTF(TORCH_VERSION);
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_cxx11Abi(JNIEnv*, jclass) { return _GLIBCXX_USE_CXX11_ABI; }

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_manualSeed(JNIEnv* env, jclass, jlong seed) {
  guarded(env, 0, [&] {
    torch::manual_seed(static_cast<uint64_t>(seed));
    return 0;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_setNumThreads(JNIEnv* env, jclass, jint threads) {
  guarded(env, 0, [&] {
    at::set_num_threads(threads);
    return 0;
  });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_getNumThreads(JNIEnv* env, jclass) {
  return guarded(env, 0, [&] { return static_cast<jint>(at::get_num_threads()); });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_getNumInteropThreads(JNIEnv* env, jclass) {
  return guarded(env, 0, [&] { return static_cast<jint>(at::get_num_interop_threads()); });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_setNumInteropThreads(JNIEnv* env, jclass, jint threads) {
  guarded(env, 0, [&] {
    at::set_num_interop_threads(threads);
    return 0;
  });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_mallopt(JNIEnv*, jclass, jint param, jint value) {
#if defined(__GLIBC__)
  return mallopt(param, value);
#else
  return -1;
#endif
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_loadLibrary(JNIEnv* env, jclass, jstring path) {
  guarded(env, 0, [&] {
    Utf8 file(env, path);
    if (dlopen(file.chars, RTLD_NOW | RTLD_GLOBAL) == nullptr) {
      const char* error = dlerror();
      throw std::runtime_error(error != nullptr ? error : "dlopen failed");
    }
    return 0;
  });
}

// ---- CUDA (NativeLibrary loads libc10_cuda and libtorch_cuda before anything asks for them) ----

// Whether libtorch's CUDA hooks are libtorch_cuda's (it was loaded before libtorch first asked for them;
// asked later, libtorch keeps the CPU-only stub for good).
JNIEXPORT jboolean JNICALL Java_dev_gradbridge_Native_cudaBuilt(JNIEnv* env, jclass) {
  return guarded(env, jboolean{JNI_FALSE}, [&] {
    return at::detail::getCUDAHooks().isBuilt() ? jboolean{JNI_TRUE} : jboolean{JNI_FALSE};
  });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_cudaDeviceCount(JNIEnv* env, jclass) {
  return guarded(env, jint{0}, [&] { return static_cast<jint>(torch::cuda::device_count()); });
}

// Whether the NVIDIA driver's library loads (the usual reason a CUDA build sees no device is its absence).
JNIEXPORT jboolean JNICALL Java_dev_gradbridge_Native_cudaDriverLoads(JNIEnv*, jclass) {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return JNI_FALSE;
  dlclose(driver);
  return JNI_TRUE;
}

// torch.use_deterministic_algorithms(on) (errors, not warnings, for an op without a deterministic kernel),
// and cuDNN's benchmark off while on; returns the setting it replaced.
JNIEXPORT jboolean JNICALL Java_dev_gradbridge_Native_setDeterministic(JNIEnv* env, jclass, jboolean on) {
  return guarded(env, jboolean{JNI_FALSE}, [&] {
    auto& context = at::globalContext();
    const bool previous = context.deterministicAlgorithms();
    context.setDeterministicAlgorithms(on == JNI_TRUE, false);
    if (on == JNI_TRUE) context.setBenchmarkCuDNN(false);
    return previous ? jboolean{JNI_TRUE} : jboolean{JNI_FALSE};
  });
}

// setenv(name, value) unless the process has it set already (CUBLAS_WORKSPACE_CONFIG, before CUDA starts).
JNIEXPORT void JNICALL Java_dev_gradbridge_Native_setEnvDefault(JNIEnv* env, jclass, jstring name, jstring value) {
  guarded(env, 0, [&] {
    Utf8 key(env, name);
    Utf8 text(env, value);
    if (setenv(key.chars, text.chars, 0) != 0) throw std::runtime_error(std::strerror(errno));
    return 0;
  });
}

// ---- tensors ----

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorFromBuffer(
    JNIEnv* env, jclass, jobject buffer, jlong offset, jint type, jlongArray shape) {
  return guarded(env, jlong{0}, [&] {
    auto* base = static_cast<char*>(env->GetDirectBufferAddress(buffer));
    if (base == nullptr) throw std::invalid_argument("the buffer is not a direct buffer");
    auto dims = shape_of(env, shape);
    return new_handle(tensor_over(env, buffer, base + offset, dims, scalar_type(type)));
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorEmpty(JNIEnv* env, jclass, jint type, jlongArray shape) {
  return guarded(env, jlong{0}, [&] {
    return new_handle(at::empty(shape_of(env, shape), at::TensorOptions().dtype(scalar_type(type))));
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_tensorFree(JNIEnv* env, jclass, jlong tensor) {
  guarded(env, 0, [&] {
    drop<at::Tensor>(tensor);
    return 0;
  });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_tensorScalarType(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, jint{-1}, [&] { return static_cast<jint>(tensor_of(tensor).scalar_type()); });
}

JNIEXPORT jlongArray JNICALL Java_dev_gradbridge_Native_tensorShape(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, static_cast<jlongArray>(nullptr), [&] {
    auto sizes = tensor_of(tensor).sizes();
    jlongArray out = env->NewLongArray(static_cast<jsize>(sizes.size()));
    if (out == nullptr) throw JavaPending{};
    env->SetLongArrayRegion(out, 0, static_cast<jsize>(sizes.size()), reinterpret_cast<const jlong*>(sizes.data()));
    return out;
  });
}

JNIEXPORT jboolean JNICALL Java_dev_gradbridge_Native_tensorIsContiguous(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, jboolean{JNI_FALSE}, [&] {
    const at::Tensor& t = tensor_of(tensor);
    return static_cast<jboolean>(t.device().is_cpu() && t.is_contiguous() ? JNI_TRUE : JNI_FALSE);
  });
}

JNIEXPORT jobject JNICALL Java_dev_gradbridge_Native_tensorBuffer(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, static_cast<jobject>(nullptr), [&] {
    const at::Tensor& t = tensor_of(tensor);
    if (!t.device().is_cpu() || !t.is_contiguous()) throw std::invalid_argument("the tensor is not contiguous");
    jobject buffer = env->NewDirectByteBuffer(t.data_ptr(), static_cast<jlong>(t.nbytes()));
    if (buffer == nullptr) throw JavaPending{};
    return buffer;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorContiguous(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, jlong{0}, [&] { return new_handle(tensor_of(tensor).to(at::kCPU).contiguous()); });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorIndexSelect(JNIEnv* env, jclass, jlong tensor, jlong index) {
  return guarded(env, jlong{0}, [&] {
    at::NoGradGuard no_grad;
    return new_handle(tensor_of(tensor).index_select(0, tensor_of(index)));
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorNarrow(
    JNIEnv* env, jclass, jlong tensor, jlong start, jlong length) {
  return guarded(env, jlong{0}, [&] { return new_handle(tensor_of(tensor).narrow(0, start, length)); });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorClone(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, jlong{0}, [&] {
    at::NoGradGuard no_grad;
    return new_handle(tensor_of(tensor).clone());
  });
}

// A copy in page-locked memory, which a CUDA copy reads without staging (the tensor itself when it is one).
JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorPinned(JNIEnv* env, jclass, jlong tensor) {
  return guarded(env, jlong{0}, [&] {
    const at::Tensor& t = tensor_of(tensor);
    return new_handle(t.is_pinned() ? t : t.pin_memory());
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_tensorTo(JNIEnv* env, jclass, jlong tensor, jint type) {
  return guarded(env, jlong{0}, [&] {
    at::NoGradGuard no_grad;
    return new_handle(tensor_of(tensor).to(scalar_type(type)));
  });
}

// ---- TorchScript modules ----

// torch::jit::load(path), or with the device as its map location: every tensor of the archive (attributes,
// a trace's constants) is read onto it.
JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_moduleLoad(JNIEnv* env, jclass, jstring path, jstring device) {
  return guarded(env, jlong{0}, [&] {
    Utf8 file(env, path);
    const c10::Device on = device_named(env, device);
    torch::jit::Module module = on.is_cpu() ? torch::jit::load(file.str()) : torch::jit::load(file.str(), on);
    module.train(true);
    return release(Loaded{std::move(module), on});
  });
}

// The module moved to a device, as a new module (the old one's handles stay valid until Java frees them).
JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_moduleTo(JNIEnv* env, jclass, jlong module, jstring device) {
  return guarded(env, jlong{0}, [&] {
    const c10::Device on = device_named(env, device);
    return release(Loaded{moved(module_of(module), on), on});
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_moduleFree(JNIEnv* env, jclass, jlong module) {
  guarded(env, 0, [&] {
    drop<Loaded>(module);
    return 0;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_moduleSnapshot(JNIEnv* env, jclass, jlong module) {
  return guarded(env, jlong{0}, [&] {
    const torch::jit::Module& original = module_of(module);
    std::unordered_map<const void*, const void*> owners;
    if (shares_storage(original._ivalue(), owners)) return jlong{0};
    // autograd on: a clone of a parameter keeps requires_grad, which the archive records
    at::AutoGradMode grad(true);
    return release(Loaded{original.deepcopy(), device_of(module)});
  });
}

// The named parameters' and buffers' tensors themselves, not copies: handles the caller owns.
JNIEXPORT jlongArray JNICALL Java_dev_gradbridge_Native_moduleTensors(JNIEnv* env, jclass, jlong module, jobjectArray names) {
  return guarded(env, static_cast<jlongArray>(nullptr), [&] {
    std::vector<std::string> wanted;
    for (jsize i = 0, n = env->GetArrayLength(names); i < n; i++) {
      Local name(env, env->GetObjectArrayElement(names, i));
      wanted.push_back(Utf8(env, static_cast<jstring>(name.ref)).str());
    }
    std::vector<at::Tensor> tensors = named_tensors(module_of(module), wanted);
    jlongArray out = env->NewLongArray(static_cast<jsize>(tensors.size()));
    if (out == nullptr) throw JavaPending{};
    std::vector<jlong> handles;
    for (at::Tensor& t : tensors) handles.push_back(new_handle(t));
    env->SetLongArrayRegion(out, 0, static_cast<jsize>(handles.size()), handles.data());
    return out;
  });
}

// Every reference in the module to its named tensors (its attributes, the lists of parameters and buffers, a
// traced eval model's) refers to the given tensor itself instead, no copy; 0 gives a zero-element placeholder of
// the tensor's dtype. Checked whole before anything changes; returns the references changed (0: shared already).
JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_moduleShare(JNIEnv* env, jclass, jlong module, jobjectArray names,
                                                              jlongArray tensors) {
  return guarded(env, jint{0}, [&] {
    std::vector<std::string> wanted;
    for (jsize i = 0, n = env->GetArrayLength(names); i < n; i++) {
      Local name(env, env->GetObjectArrayElement(names, i));
      wanted.push_back(Utf8(env, static_cast<jstring>(name.ref)).str());
    }
    const auto handles = longs(env, tensors, "tensors");
    if (handles.size() != wanted.size()) throw std::invalid_argument("names and tensors differ in number");
    torch::jit::Module& m = module_of(module);
    const std::vector<at::Tensor> own = named_tensors(m, wanted);
    Replacements with;
    for (size_t k = 0; k < own.size(); k++) {
      at::Tensor to = handles[k] == 0 ? at::empty({0}, own[k].options()) : tensor_of(handles[k]);
      if (to.unsafeGetTensorImpl() == own[k].unsafeGetTensorImpl()) continue;
      if (handles[k] != 0 && (to.scalar_type() != own[k].scalar_type() || to.device() != device_of(module)
                              || (own[k].numel() > 0 && to.sizes() != own[k].sizes())))
        throw std::invalid_argument(wanted[k] + ": a " + std::string(c10::toString(to.scalar_type())) + " tensor on "
                                    + to.device().str() + " cannot stand for the module's");
      if (!with.emplace(own[k].unsafeGetTensorImpl(), to).second)
        throw std::invalid_argument(wanted[k] + " is the same tensor as another name");
    }
    const c10::IValue root(m._ivalue());
    std::unordered_set<const void*> checked, applied;
    replace_tensors(root, with, false, checked);
    return static_cast<jint>(replace_tensors(root, with, true, applied));
  });
}

JNIEXPORT jobjectArray JNICALL Java_dev_gradbridge_Native_moduleMethods(JNIEnv* env, jclass, jlong module) {
  return guarded(env, static_cast<jobjectArray>(nullptr), [&] {
    std::vector<std::string> names;
    for (const auto& method : module_of(module).get_methods()) names.push_back(method.name());
    jobjectArray out = env->NewObjectArray(static_cast<jsize>(names.size()), T.string, nullptr);
    if (out == nullptr) throw JavaPending{};
    for (size_t i = 0; i < names.size(); i++) {
      Local name(env, env->NewStringUTF(names[i].c_str()));
      env->SetObjectArrayElement(out, static_cast<jsize>(i), name.ref);
    }
    return out;
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_moduleTrain(JNIEnv* env, jclass, jlong module, jboolean on) {
  guarded(env, 0, [&] {
    module_of(module).train(on == JNI_TRUE);
    return 0;
  });
}

// module.save(path, {extraName: extraContent}), record by record straight into the file (a module of
// hundreds of millions of parameters never sits in memory as one archive). A failed write throws
// the operating system's reason ("No space left on device"), which Java names the file with. A module on
// another device is saved from a CPU copy: files hold CPU tensors, and load on any device.
JNIEXPORT void JNICALL Java_dev_gradbridge_Native_moduleSaveFile(
    JNIEnv* env, jclass, jlong module, jstring path, jstring extra_name, jbyteArray extra_content) {
  guarded(env, 0, [&] {
    torch::jit::ExtraFilesMap extra;
    if (extra_name != nullptr) {
      // Bytes, not a jstring: JNI's "modified UTF-8" is not UTF-8 for every character.
      std::string content(static_cast<size_t>(env->GetArrayLength(extra_content)), '\0');
      env->GetByteArrayRegion(extra_content, 0, static_cast<jsize>(content.size()),
                              reinterpret_cast<jbyte*>(content.data()));
      check_java(env);
      extra[Utf8(env, extra_name).str()] = content;
    }
    const std::string file = Utf8(env, path).str();
    const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) throw std::runtime_error(std::strerror(errno));
    int failure = 0;
    // After a failed write the rest is dropped but reported written: a short count makes libtorch's
    // writer throw, and its destructor then writes again and throws during the unwinding (abort).
    auto writer = [&](const void* data, size_t size) -> size_t {
      const char* at = static_cast<const char*>(data);
      size_t left = failure == 0 ? size : 0;
      while (left > 0) {
        const ssize_t n = ::write(fd, at, left);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          failure = n < 0 ? errno : ENOSPC;
          break;
        }
        at += n;
        left -= static_cast<size_t>(n);
      }
      return size;
    };
    try {
      if (device_of(module).is_cpu()) {
        torch::jit::ExportModule(module_of(module), writer, extra, false, false, false);
      } else {
        torch::jit::ExportModule(moved(module_of(module), at::kCPU), writer, extra, false, false, false);
      }
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::fsync(fd) != 0) failure = errno;
    if (::close(fd) != 0 && failure == 0) failure = errno;
    if (failure != 0) throw std::runtime_error(std::strerror(failure));
    return 0;
  });
}

JNIEXPORT jobject JNICALL Java_dev_gradbridge_Native_moduleRun(
    JNIEnv* env, jclass, jlong module, jstring name, jobjectArray args) {
  return guarded(env, static_cast<jobject>(nullptr), [&] {
    torch::jit::Method method = method_of(module_of(module), env, name);
    std::vector<c10::IValue> inputs;
    jsize n = args == nullptr ? 0 : env->GetArrayLength(args);
    inputs.reserve(n);
    for (jsize i = 0; i < n; i++) {
      Local arg(env, env->GetObjectArrayElement(args, i));
      try {
        inputs.push_back(to_ivalue(env, arg.ref));
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("argument " + std::to_string(i) + ": " + e.what());
      }
    }
    const c10::Device on = device_of(module);
    for (c10::IValue& input : inputs) input = argument_on(std::move(input), on);
    c10::IValue result;
    {
      TrainingCall call;
      result = method(std::move(inputs));
    }
    return from_ivalue(env, result);
  });
}

// A method compiled once with every call inlined, for serving (inferPlanRun) and the guarded steps
// (plansStepWhileFinite). The graph gets what the graph executor gives it with its optimizations
// off (runNooptPassPipeline: the same ops in the same order, so the same values), but as one flat
// program: the executor runs each nested module call (Sequential -> Linear -> ...) through a plan
// lookup of its own.
JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_planOf(JNIEnv* env, jclass, jlong module, jstring name) {
  return guarded(env, jlong{0}, [&] {
    torch::jit::Module& owner = module_of(module);
    torch::jit::Method method = method_of(owner, env, name);
    auto graph = torch::jit::toGraphFunction(method.function()).graph()->copy();
    // Inline takes one level of calls when the executor's optimizations are off: repeat until none is left.
    std::function<size_t(torch::jit::Block*)> calls = [&](torch::jit::Block* block) {
      size_t n = 0;
      for (torch::jit::Node* node : block->nodes()) {
        if (node->kind() == c10::prim::CallMethod || node->kind() == c10::prim::CallFunction) n++;
        for (torch::jit::Block* inner : node->blocks()) n += calls(inner);
      }
      return n;
    };
    for (size_t before = calls(graph->block()), round = 0; before > 0 && round < 64; round++) {
      torch::jit::Inline(*graph);
      size_t after = calls(graph->block());
      if (after >= before) break;  // calls Inline cannot take (interfaces) stay calls
      before = after;
    }
    torch::jit::runNooptPassPipeline(graph);
    return release(Plan{owner._ivalue(), torch::jit::Code(graph, method.name()), device_of(module)});
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_planFree(JNIEnv* env, jclass, jlong plan) {
  guarded(env, 0, [&] {
    drop<Plan>(plan);
    return 0;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_inferPlanRun(JNIEnv* env, jclass, jlong plan, jlong tensor) {
  return guarded(env, jlong{0}, [&] {
    auto& run = borrow<Plan>(plan);
    at::NoGradGuard no_grad;
    torch::jit::GraphOptimizerEnabledGuard optimizer{false};
    c10::IValue result = run_plan(run, {tensor_of(tensor)});
    if (!result.isTensor()) throw std::invalid_argument("returned " + result.tagKind() + ", not a tensor");
    return new_handle(on_host(result.toTensor()));
  });
}

// ---- the training hot path: a method looked up once, tensor handles in, the loss out ----

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_methodOf(JNIEnv* env, jclass, jlong module, jstring name) {
  return guarded(env, jlong{0}, [&] {
    // A Method holds a reference to its module's object: valid whichever is freed first.
    return release(Bound{method_of(module_of(module), env, name), device_of(module)});
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_methodFree(JNIEnv* env, jclass, jlong method) {
  guarded(env, 0, [&] {
    drop<Bound>(method);
    return 0;
  });
}

JNIEXPORT jdouble JNICALL Java_dev_gradbridge_Native_methodRunToDouble(
    JNIEnv* env, jclass, jlong method, jlong x, jlong y) {
  return guarded(env, jdouble{0}, [&] {
    at::Tensor value = run_to_tensor(method, {tensor_of(x), tensor_of(y)});
    if (value.numel() != 1) {
      throw std::invalid_argument("returned " + std::to_string(value.numel()) + " values, not one loss");
    }
    double out = 0;
    copy_doubles(value, &out);
    return static_cast<jdouble>(out);
  });
}

JNIEXPORT jdoubleArray JNICALL Java_dev_gradbridge_Native_methodRunToDoubles(
    JNIEnv* env, jclass, jlong method, jlong x, jlong y, jlong perm, jlong batch) {
  return guarded(env, static_cast<jdoubleArray>(nullptr), [&] {
    at::Tensor values = perm == 0 ? run_to_tensor(method, {tensor_of(x), tensor_of(y)})
                                  : run_to_tensor(method, {tensor_of(x), tensor_of(y), tensor_of(perm),
                                                           static_cast<int64_t>(batch)});
    jsize count = static_cast<jsize>(values.numel());
    std::vector<double> doubles(static_cast<size_t>(count));
    copy_doubles(values, doubles.data());
    jdoubleArray out = env->NewDoubleArray(count);
    if (out == nullptr) throw JavaPending{};
    env->SetDoubleArrayRegion(out, 0, count, doubles.data());
    return out;
  });
}

// Whether every tensor in a method's result (a tensor list, a dict of tensor lists, ...) is finite;
// false for a result that holds no tensor container at all.
bool all_finite_tensors(const c10::IValue& value) {
  if (value.isTensor()) return all_finite(value.toTensor());
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) {
      if (!all_finite(t)) return false;
    }
    return true;
  }
  if (value.isList()) {
    for (const c10::IValue& item : value.toListRef()) {
      if (!all_finite_tensors(item)) return false;
    }
    return true;
  }
  if (value.isTuple()) {
    for (const c10::IValue& item : value.toTupleRef().elements()) {
      if (!all_finite_tensors(item)) return false;
    }
    return true;
  }
  if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      if (!all_finite_tensors(entry.value())) return false;
    }
    return true;
  }
  return true;  // a number or a string: not a tensor to check
}

// A looked-up method without arguments whose result is a list of tensors (get_gradients,
// get_parameters) or a dict of tensor lists (optimizer_state): whether every element of every
// tensor is finite, decided here without a tensor crossing into Java.
JNIEXPORT jboolean JNICALL Java_dev_gradbridge_Native_methodAllFinite(JNIEnv* env, jclass, jlong method) {
  return guarded(env, jboolean{JNI_FALSE}, [&] {
    auto& run = borrow<Bound>(method);
    c10::IValue result;
    {
      TrainingCall call;
      result = run.method(std::vector<c10::IValue>{});
    }
    if (!result.isTensorList() && !result.isGenericDict() && !result.isList() && !result.isTuple()) {
      throw std::invalid_argument("returned " + result.tagKind() + ", not a list or dict of tensors");
    }
    return all_finite_tensors(result) ? jboolean{JNI_TRUE} : jboolean{JNI_FALSE};
  });
}

// train_step's calls, guarded, for several micro-batches in one call (the online learner), the
// methods looked up once (methods = zero_grad, calculate_loss_and_backward, get_gradients,
// optimizer_step): for each (xs[i], ys[i]) in order: zero_grad(), calculate_loss_and_backward(x, y),
// then optimizer_step() when the loss and every gradient are finite. Stops at the first micro-batch
// that is not finite, its gradients left in place for the caller to explain, or whose call fails:
// that method's Step into failed[0] (else -1), its message (message_of, as the guard says it) into error[0]. losses[i] gets each
// computed loss. Returns how many micro-batches were stepped.
JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_plansStepWhileFinite(JNIEnv* env, jclass, jlongArray plans,
    jlongArray xs, jlongArray ys, jdoubleArray losses, jintArray failed, jobjectArray error) {
  return guarded(env, jint{0}, [&] {
    const jsize n = env->GetArrayLength(xs);
    if (env->GetArrayLength(plans) != Step::steps || env->GetArrayLength(ys) != n || env->GetArrayLength(losses) < n
        || env->GetArrayLength(failed) < 1 || env->GetArrayLength(error) < 1) {
      throw std::invalid_argument("plans, xs, ys, losses, failed and error do not match");
    }
    jlong handles[Step::steps];
    env->GetLongArrayRegion(plans, 0, Step::steps, handles);
    std::vector<jlong> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    env->GetLongArrayRegion(xs, 0, n, x.data());
    env->GetLongArrayRegion(ys, 0, n, y.data());
    check_java(env);
    Plan* plan[Step::steps];
    for (int step = 0; step < Step::steps; step++) plan[step] = &borrow<Plan>(handles[step]);
    auto call_method = [&](Step step, std::vector<c10::IValue> inputs) {
      return run_plan(*plan[step], std::move(inputs));
    };
    jint calling = -1;
    jint stepped = 0;
    std::string message;
    try {
      TrainingCall call;
      for (; stepped < n; stepped++) {
        calling = Step::zero_grad;
        call_method(Step::zero_grad, {});
        calling = Step::loss_and_backward;
        c10::IValue value = call_method(Step::loss_and_backward, {tensor_of(x[stepped]), tensor_of(y[stepped])});
        if (!value.isTensor()) throw std::invalid_argument("returned " + value.tagKind() + ", not a tensor");
        if (value.toTensor().numel() != 1) {
          throw std::invalid_argument("returned " + std::to_string(value.toTensor().numel()) + " values, not one loss");
        }
        double loss = 0;
        copy_doubles(value.toTensor(), &loss);
        env->SetDoubleArrayRegion(losses, stepped, 1, &loss);
        if (!std::isfinite(loss)) break;
        calling = Step::get_gradients;
        c10::IValue grads = call_method(Step::get_gradients, {});
        if (!grads.isTensorList()) throw std::invalid_argument("returned " + grads.tagKind() + ", not a list of tensors");
        bool finite = true;
        for (const at::Tensor& t : grads.toTensorVector()) {
          finite = finite && all_finite(t);
        }
        if (!finite) break;
        calling = Step::optimizer_step;
        call_method(Step::optimizer_step, {});
        // Hand the core to any thread waiting for it (one syscall when none is): a run of
        // micro-batches then holds a core for one of them at most, not for a scheduler tick.
        if (stepped + 1 < n) sched_yield();
      }
      calling = -1;
    } catch (const JavaPending&) {
      throw;
    } catch (...) {  // reported through failed/error (the steps before it stand), worded as the guard words it
      message = message_of(std::current_exception());
    }
    env->SetIntArrayRegion(failed, 0, 1, &calling);
    if (calling >= 0) {
      Local text(env, env->NewStringUTF(message.c_str()));
      check_java(env);
      env->SetObjectArrayElement(error, 0, text.ref);
    }
    check_java(env);
    return stepped;
  });
}

}  // extern "C"
