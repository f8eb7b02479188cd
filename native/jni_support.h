// What gradbridge's JNI files (gradbridge_jni.cpp: modules and tensors; oplist_jni.cpp: protocol 3;
// gradbridge-spark's gradbridge_gloo.cpp: the Gloo collective, a library of its own) share: the one error
// path and guard around every entry point, the handles Java owns, jstring arguments, Java arrays in and out
// (long[], double[], String[]), and CPU tensors over Java's direct buffers.
#pragma once

#include <jni.h>

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace gradbridge {

// A Java exception is pending: C++ unwinds to the guard, which leaves it pending.
struct JavaPending {};

inline void check_java(JNIEnv* env) {
  if (env->ExceptionCheck()) throw JavaPending{};
}

inline void throw_native(JNIEnv* env, const std::string& message) {
  if (env->ExceptionCheck()) return;
  jclass type = env->FindClass("dev/gradbridge/NativeException");
  if (type != nullptr) env->ThrowNew(type, message.c_str());
}

// How libtorch's errors read in Java: whole (the module layer reads TorchScript's tracebacks,
// dev.gradbridge.ModuleEngine) or their first line (c10d's carry context lines).
enum class Message { whole, first_line };

// The one error path: what an exception caught in flight says in Java (c10::Error without its C++
// backtrace), shaped as M says. The guard below uses it, and so does an entry point that reports a
// failure through its results rather than throwing (plansStepWhileFinite).
template <Message M = Message::whole>
std::string message_of(std::exception_ptr error) {
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown C++ exception in libtorch";
  }
  return M == Message::first_line ? message.substr(0, message.find('\n')) : message;
}

// The one guard around every entry point's body: c10::Error, std::exception and anything else
// become a dev.gradbridge.NativeException; nothing escapes to the JVM.
template <Message M = Message::whole, typename R, typename F>
R guarded(JNIEnv* env, R failed, F&& body) {
  try {
    return body();
  } catch (const JavaPending&) {
  } catch (...) {
    throw_native(env, message_of<M>(std::current_exception()));
  }
  return failed;
}

// A local reference deleted at scope exit (loops over many results must not pile them up).
struct Local {
  JNIEnv* env;
  jobject ref;
  Local(JNIEnv* e, jobject r) : env(e), ref(r) {}
  ~Local() {
    if (ref != nullptr) env->DeleteLocalRef(ref);
  }
  Local(const Local&) = delete;
  Local& operator=(const Local&) = delete;
};

// RAII holder for a jstring's UTF-8 characters.
struct Utf8 {
  JNIEnv* env;
  jstring string;
  const char* chars;
  Utf8(JNIEnv* e, jstring s) : env(e), string(s), chars(nullptr) {
    if (s == nullptr) throw std::invalid_argument("a string argument is null");
    chars = env->GetStringUTFChars(s, nullptr);
    if (chars == nullptr) throw JavaPending{};
  }
  ~Utf8() {
    if (chars != nullptr) env->ReleaseStringUTFChars(string, chars);
  }
  Utf8(const Utf8&) = delete;
  Utf8& operator=(const Utf8&) = delete;
  std::string str() const { return std::string(chars); }
};

// A long[]'s values; `what` names it when it is null.
inline std::vector<int64_t> longs(JNIEnv* env, jlongArray array, const char* what) {
  if (array == nullptr) throw std::invalid_argument(std::string("the ") + what + " is null");
  std::vector<int64_t> out(env->GetArrayLength(array));
  env->GetLongArrayRegion(array, 0, static_cast<jsize>(out.size()), reinterpret_cast<jlong*>(out.data()));
  check_java(env);
  return out;
}

// A double[]'s values; `what` names it when it is null.
inline std::vector<double> doubles(JNIEnv* env, jdoubleArray array, const char* what) {
  if (array == nullptr) throw std::invalid_argument(std::string("the ") + what + " is null");
  std::vector<double> out(env->GetArrayLength(array));
  env->GetDoubleArrayRegion(array, 0, static_cast<jsize>(out.size()), out.data());
  check_java(env);
  return out;
}

// A String[]'s values; `what` names it when it is null (a null element: "a string argument is null").
inline std::vector<std::string> strings(JNIEnv* env, jobjectArray array, const char* what) {
  if (array == nullptr) throw std::invalid_argument(std::string("the ") + what + " is null");
  std::vector<std::string> out;
  const jsize n = env->GetArrayLength(array);
  out.reserve(static_cast<size_t>(n));
  for (jsize k = 0; k < n; k++) {
    Local item(env, env->GetObjectArrayElement(array, k));
    check_java(env);
    out.push_back(Utf8(env, static_cast<jstring>(item.ref)).str());
  }
  return out;
}

// Java arrays of C++ values (a failed allocation leaves Java's OutOfMemoryError pending).
inline jobjectArray to_java(JNIEnv* env, const std::vector<std::string>& values) {
  Local type(env, env->FindClass("java/lang/String"));
  if (type.ref == nullptr) throw JavaPending{};
  jobjectArray out = env->NewObjectArray(static_cast<jsize>(values.size()), static_cast<jclass>(type.ref), nullptr);
  if (out == nullptr) throw JavaPending{};
  for (size_t k = 0; k < values.size(); k++) {
    Local s(env, env->NewStringUTF(values[k].c_str()));
    if (s.ref == nullptr) throw JavaPending{};
    env->SetObjectArrayElement(out, static_cast<jsize>(k), s.ref);
  }
  return out;
}

inline jlongArray to_java(JNIEnv* env, const std::vector<jlong>& values) {
  jlongArray out = env->NewLongArray(static_cast<jsize>(values.size()));
  if (out == nullptr) throw JavaPending{};
  env->SetLongArrayRegion(out, 0, static_cast<jsize>(values.size()), values.data());
  return out;
}

inline jdoubleArray to_java(JNIEnv* env, const std::vector<double>& values) {
  jdoubleArray out = env->NewDoubleArray(static_cast<jsize>(values.size()));
  if (out == nullptr) throw JavaPending{};
  env->SetDoubleArrayRegion(out, 0, static_cast<jsize>(values.size()), values.data());
  return out;
}

// A CPU tensor over `data`, memory inside a direct buffer. The storage's deleter drops the global
// reference that keeps the buffer alive: libtorch may keep the tensor longer than its Java owner
// (TorchScript, a Gloo Work still in flight after Java gave up on it).
inline at::Tensor tensor_over(JNIEnv* env, jobject buffer, void* data, at::IntArrayRef shape, at::ScalarType type) {
  JavaVM* vm = nullptr;
  if (env->GetJavaVM(&vm) != JNI_OK) throw std::runtime_error("no Java VM");
  jobject keep = env->NewGlobalRef(buffer);
  if (keep == nullptr) throw JavaPending{};
  auto release = [vm, keep](void*) {
    JNIEnv* e = nullptr;
    if (vm->GetEnv(reinterpret_cast<void**>(&e), JNI_VERSION_1_8) == JNI_OK) {
      e->DeleteGlobalRef(keep);
    } else if (vm->AttachCurrentThreadAsDaemon(reinterpret_cast<void**>(&e), nullptr) == JNI_OK) {
      e->DeleteGlobalRef(keep);
      vm->DetachCurrentThread();
    }
  };
  try {
    return at::from_blob(data, shape, release, at::TensorOptions().dtype(type));
  } catch (...) {
    env->DeleteGlobalRef(keep);
    throw;
  }
}

// ---- devices: a module runs on one; Java's tensors are CPU tensors ----

// The device Java names ("cpu", "cuda:N"; Java checked the string and that the device is there).
inline c10::Device device_named(JNIEnv* env, jstring name) {
  Utf8 text(env, name);
  return c10::Device(text.str());
}

// `t` on a module's `device`: the tensor itself where it is there already (a CPU module's every call), else a
// copy, non-blocking (from pinned memory it overlaps; from pageable memory CUDA copies the source out first).
inline at::Tensor on_device(const at::Tensor& t, c10::Device device) {
  if (!t.defined() || t.device() == device) return t;
  return t.to(device, /*non_blocking=*/true);
}

// A result for Java, whose tensors are CPU tensors: the tensor itself on the CPU, else a copy there.
inline at::Tensor on_host(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  return t.to(at::kCPU);
}

// ---- handles: what Java owns crosses JNI as a jlong, boxed with its kind ----
// Every kind of object a Java owner holds (Tensor, TorchScriptEngine, ..., gradbridge-spark's
// GlooGroup) is one of these. release<T> boxes a value for Java; borrow<T> gives it back, refusing a
// zero handle ("the tensor is closed") and a handle of another kind by name ("a module handle where
// a tensor is expected") as a NativeException, never a crash; drop<T> frees it (take<T>: out of its box). A box
// clears its tag as it goes, so a handle freed before is refused too while its memory is unused.
enum class Kind : uint32_t { tensor = 1, module, method, plan, exported, store, group, work };

inline const char* kind_name(Kind kind) {
  switch (kind) {
    case Kind::tensor: return "tensor";
    case Kind::module: return "module";
    case Kind::method: return "method";
    case Kind::plan: return "plan";
    case Kind::exported: return "exported module";
    case Kind::store: return "store";
    case Kind::group: return "Gloo group";
    case Kind::work: return "Gloo operation";
  }
  return "unknown";
}

// "a tensor", "an exported module": for messages.
inline std::string a_kind(Kind kind) {
  std::string name = kind_name(kind);
  return (std::string("aeiou").find(name[0]) == std::string::npos ? "a " : "an ") + name;
}

// Which kind each C++ type is: GRADBRIDGE_HANDLE_KIND(Type, kind) beside the type, once.
template <typename T>
struct KindOf;
#define GRADBRIDGE_HANDLE_KIND(Type, name) \
  template <>                              \
  struct gradbridge::KindOf<Type> {        \
    static constexpr gradbridge::Kind kind = gradbridge::Kind::name; \
  }

template <>
struct KindOf<at::Tensor> {
  static constexpr Kind kind = Kind::tensor;
};

// A tag that a stray pointer is unlikely to hold: "gb" and the kind.
constexpr uint32_t tag_of(Kind kind) { return 0x67620000u | static_cast<uint32_t>(kind); }

struct Box {
  uint32_t tag;
};

template <typename T>
struct Held : Box {
  T value;
  explicit Held(T v) : Box{tag_of(KindOf<T>::kind)}, value(std::move(v)) {}
};

template <typename T>
jlong release(T value) {
  return reinterpret_cast<jlong>(static_cast<Box*>(new Held<T>(std::move(value))));
}

template <typename T>
Held<T>& held(jlong handle) {
  constexpr Kind want = KindOf<T>::kind;
  if (handle == 0) throw std::invalid_argument(std::string("the ") + kind_name(want) + " is closed");
  auto* box = reinterpret_cast<Box*>(handle);
  if (box->tag != tag_of(want)) {
    uint32_t other = box->tag & 0xffffu;
    bool known = (box->tag & 0xffff0000u) == 0x67620000u && other >= 1 && other <= static_cast<uint32_t>(Kind::work);
    throw std::invalid_argument(known ? a_kind(static_cast<Kind>(other)) + " handle where " + a_kind(want) + " is expected"
                                      : std::string("the ") + kind_name(want) + " handle is no live handle (freed, or not gradbridge's)");
  }
  return *static_cast<Held<T>*>(box);
}

template <typename T>
T& borrow(jlong handle) {
  return held<T>(handle).value;
}

// Frees a handle's object (a zero handle: nothing to free).
template <typename T>
void drop(jlong handle) {
  if (handle == 0) return;
  Held<T>& box = held<T>(handle);
  box.tag = 0;
  delete &box;
}

// The value out of its box, which is freed: for an object freed elsewhere (a Gloo group, on a thread of its own).
template <typename T>
T take(jlong handle) {
  Held<T>& box = held<T>(handle);
  T value = std::move(box.value);
  box.tag = 0;
  delete &box;
  return value;
}

}  // namespace gradbridge
