// gradbridge's collective among Spark's training tasks: libtorch's own c10d Gloo process group
// (what TorchDistributor's workers use) and its TCP store, for Java through JNI (the Gloo entry
// points of dev/gradbridge/Native.java). Part of the same native library as gradbridge_jni.cpp,
// compiled per libtorch build by python/gradbridge/native.py, against torch's c10d headers and
// the gloo headers vendored in native/third_party/gloo (pip torch ships the first, not the second;
// every gloo object is created inside libtorch, so the headers only have to compile).
//
// - Errors (a peer died, a timeout, a port in use) become one-line dev.gradbridge.NativeException,
//   never an abort: the same guard as gradbridge_jni.cpp's, over this file's entry points.
// - Collectives run on Gloo's own threads; Java starts one (a Work handle) and waits for it in
//   short slices, so that a task Spark killed gets out ({@code glooWait}).
// - CPU tensors over Java's direct buffers (bytes: the exchange sends raw little-endian bytes);
//   each keeps a global reference to its buffer, released when libtorch drops the tensor.
// - A group is freed on a thread of its own: ProcessGroupGloo's destructor joins Gloo's threads,
//   which wait for an operation in flight to end (its peer gone, or Gloo's timeout).

#include <jni.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "dev_gradbridge_Native.h"

namespace {

// A Java exception is pending: C++ unwinds to the guard, which leaves it pending.
struct JavaPending {};

void throw_java(JNIEnv* env, const std::string& message) {
  if (env->ExceptionCheck()) return;
  jclass type = env->FindClass("dev/gradbridge/NativeException");
  if (type != nullptr) env->ThrowNew(type, message.c_str());
}

// The first line only: c10d's messages may carry context lines.
std::string first_line(const std::string& message) { return message.substr(0, message.find('\n')); }

template <typename R, typename F>
R guarded(JNIEnv* env, R failed, F&& body) {
  try {
    return body();
  } catch (const JavaPending&) {
  } catch (const c10::Error& e) {
    throw_java(env, first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw_java(env, first_line(e.what()));
  } catch (...) {
    throw_java(env, "unknown C++ exception in libtorch's Gloo");
  }
  return failed;
}

std::string utf8(JNIEnv* env, jstring s) {
  if (s == nullptr) throw std::invalid_argument("a string argument is null");
  const char* chars = env->GetStringUTFChars(s, nullptr);
  if (chars == nullptr) throw JavaPending{};
  std::string out(chars);
  env->ReleaseStringUTFChars(s, chars);
  return out;
}

std::vector<int64_t> longs(JNIEnv* env, jlongArray array) {
  if (array == nullptr) throw std::invalid_argument("the split sizes are null");
  std::vector<int64_t> out(env->GetArrayLength(array));
  env->GetLongArrayRegion(array, 0, static_cast<jsize>(out.size()), reinterpret_cast<jlong*>(out.data()));
  if (env->ExceptionCheck()) throw JavaPending{};
  return out;
}

// A uint8 tensor over the first `bytes` of a direct buffer; the buffer stays referenced until
// libtorch frees the tensor (a Work in flight holds its tensors, even after Java gave up on it).
at::Tensor bytes_of(JNIEnv* env, jobject buffer, int64_t bytes) {
  if (buffer == nullptr) throw std::invalid_argument("the buffer is null");
  auto* base = env->GetDirectBufferAddress(buffer);
  if (base == nullptr) throw std::invalid_argument("the buffer is not a direct buffer");
  if (bytes < 0 || bytes > env->GetDirectBufferCapacity(buffer)) {
    throw std::invalid_argument("the buffer holds " + std::to_string(env->GetDirectBufferCapacity(buffer)) +
                                " bytes, the operation needs " + std::to_string(bytes));
  }
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
    return at::from_blob(base, {bytes}, release, at::TensorOptions().dtype(at::kByte));
  } catch (...) {
    env->DeleteGlobalRef(keep);
    throw;
  }
}

using Store = c10::intrusive_ptr<c10d::Store>;
using Group = c10::intrusive_ptr<c10d::ProcessGroupGloo>;
using Work = c10::intrusive_ptr<c10d::Work>;

template <typename T>
T& of(jlong handle, const char* what) {
  if (handle == 0) throw std::invalid_argument(std::string("the ") + what + " is closed");
  return *reinterpret_cast<T*>(handle);
}

std::shared_ptr<::gloo::transport::Device> device_for(const std::string& host) {
  // torch 2.15 added a lazyInit argument (defaulted); the call reads the same on every version.
  return c10d::ProcessGroupGloo::createDeviceForHostname(host);
}

}  // namespace

extern "C" {

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_glooStore(
    JNIEnv* env, jclass, jstring host, jint port, jboolean server, jint timeout_ms) {
  return guarded(env, jlong{0}, [&] {
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);  // 0 on the server: a free port
    options.isServer = server;
    options.waitWorkers = false;  // the group's rendezvous waits for the peers
    options.timeout = std::chrono::milliseconds(timeout_ms);
    Store store = c10::make_intrusive<c10d::TCPStore>(utf8(env, host), options);
    return reinterpret_cast<jlong>(new Store(std::move(store)));
  });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_Native_glooStorePort(JNIEnv* env, jclass, jlong store) {
  return guarded(env, jint{0}, [&] {
    auto* tcp = dynamic_cast<c10d::TCPStore*>(of<Store>(store, "store").get());
    return static_cast<jint>(tcp->getPort());
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_glooStoreFree(JNIEnv* env, jclass, jlong store) {
  guarded(env, 0, [&] {
    delete reinterpret_cast<Store*>(store);
    return 0;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_glooGroup(
    JNIEnv* env, jclass, jlong store, jstring prefix, jstring host, jint rank, jint size, jint timeout_ms) {
  return guarded(env, jlong{0}, [&] {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(utf8(env, prefix), of<Store>(store, "store"));
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
    options->devices.push_back(device_for(utf8(env, host)));
    options->threads = 1;  // one collective at a time: the exchange waits for each
    Group group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
    return reinterpret_cast<jlong>(new Group(std::move(group)));
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_glooGroupFree(JNIEnv* env, jclass, jlong group) {
  guarded(env, 0, [&] {
    auto* owned = reinterpret_cast<Group*>(group);
    if (owned != nullptr) std::thread([owned] { delete owned; }).detach();
    return 0;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_glooAlltoall(
    JNIEnv* env, jclass, jlong group, jobject send, jlongArray send_splits, jobject receive,
    jlongArray receive_splits) {
  return guarded(env, jlong{0}, [&] {
    c10::AutoGradMode no_grad(false);
    auto sends = longs(env, send_splits);
    auto receives = longs(env, receive_splits);
    int64_t out_bytes = 0, in_bytes = 0;
    for (auto s : sends) out_bytes += s;
    for (auto r : receives) in_bytes += r;
    at::Tensor input = bytes_of(env, send, out_bytes);
    at::Tensor output = bytes_of(env, receive, in_bytes);
    Work work = of<Group>(group, "Gloo group")->alltoall_base(output, input, receives, sends);
    return reinterpret_cast<jlong>(new Work(std::move(work)));
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_Native_glooAllgather(
    JNIEnv* env, jclass, jlong group, jobject send, jobject receive, jlong each) {
  return guarded(env, jlong{0}, [&] {
    c10::AutoGradMode no_grad(false);
    Group& g = of<Group>(group, "Gloo group");
    int size = g->getSize();
    at::Tensor input = bytes_of(env, send, each);
    at::Tensor output = bytes_of(env, receive, each * size);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size; ++r) outputs[0].push_back(output.narrow(0, r * each, each));
    std::vector<at::Tensor> inputs{input};
    Work work = g->allgather(outputs, inputs);
    return reinterpret_cast<jlong>(new Work(std::move(work)));
  });
}

JNIEXPORT jboolean JNICALL Java_dev_gradbridge_Native_glooWait(JNIEnv* env, jclass, jlong work, jint millis) {
  return guarded(env, jboolean{JNI_FALSE}, [&] {
    Work& w = of<Work>(work, "Gloo operation");
    try {
      w->wait(std::chrono::milliseconds(millis));
    } catch (...) {
      if (!w->isCompleted()) return jboolean{JNI_FALSE};  // the wait timed out, not the operation
      throw;
    }
    return jboolean{w->isCompleted() ? JNI_TRUE : JNI_FALSE};
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_Native_glooWorkFree(JNIEnv* env, jclass, jlong work) {
  guarded(env, 0, [&] {
    delete reinterpret_cast<Work*>(work);
    return 0;
  });
}

}  // extern "C"
