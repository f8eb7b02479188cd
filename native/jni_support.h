// What gradbridge's two JNI files (gradbridge_jni.cpp: modules and tensors; gradbridge_gloo.cpp:
// the Gloo collective) share: the one error guard around every entry point, jstring and jlong[]
// arguments, and CPU tensors over Java's direct buffers.
#pragma once

#include <jni.h>

#include <ATen/ATen.h>

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
// dev.gradbridge.ScriptedModule) or their first line (c10d's carry context lines).
enum class Message { whole, first_line };

// The one guard around every entry point's body: c10::Error, std::exception and anything else
// become a dev.gradbridge.NativeException; nothing escapes to the JVM.
template <Message M = Message::whole, typename R, typename F>
R guarded(JNIEnv* env, R failed, F&& body) {
  auto shaped = [](std::string message) {
    return M == Message::first_line ? message.substr(0, message.find('\n')) : message;
  };
  try {
    return body();
  } catch (const JavaPending&) {
  } catch (const c10::Error& e) {
    throw_native(env, shaped(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw_native(env, shaped(e.what()));
  } catch (...) {
    throw_native(env, "unknown C++ exception in libtorch");
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

}  // namespace gradbridge
