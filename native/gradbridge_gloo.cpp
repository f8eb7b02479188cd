// gradbridge's collective among Spark's training tasks: libtorch's own c10d Gloo process group
// (what TorchDistributor's workers use) and its TCP store, for Java through JNI (the Gloo entry
// points of dev/gradbridge/Native.java). Part of the same native library as gradbridge_jni.cpp,
// compiled per libtorch build by python/gradbridge/native.py, against torch's c10d headers and
// the gloo headers vendored in native/third_party/gloo (pip torch ships the first, not the second;
// every gloo object is created inside libtorch, so the headers only have to compile).
//
// - Errors (a peer died, a timeout, a port in use) become one-line dev.gradbridge.NativeException,
//   never an abort: the guard of gradbridge_jni.cpp (jni_support.h), keeping the first line.
// - Collectives run on Gloo's own threads; Java starts one (a Work handle) and waits for it in
//   short slices, so that a task Spark killed gets out ({@code glooWait}).
// - CPU tensors over Java's direct buffers (bytes: the exchange sends raw little-endian bytes);
//   each keeps its buffer alive until libtorch drops the tensor (jni_support.h).
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
#include "jni_support.h"

namespace {

using gradbridge::JavaPending;
using gradbridge::Message;
using gradbridge::Utf8;
using gradbridge::longs;
using gradbridge::tensor_over;

// A uint8 tensor over the first `bytes` of a direct buffer (the exchange sends raw bytes).
at::Tensor bytes_of(JNIEnv* env, jobject buffer, int64_t bytes) {
  if (buffer == nullptr) throw std::invalid_argument("the buffer is null");
  auto* base = env->GetDirectBufferAddress(buffer);
  if (base == nullptr) throw std::invalid_argument("the buffer is not a direct buffer");
  if (bytes < 0 || bytes > env->GetDirectBufferCapacity(buffer)) {
    throw std::invalid_argument("the buffer holds " + std::to_string(env->GetDirectBufferCapacity(buffer)) +
                                " bytes, the operation needs " + std::to_string(bytes));
  }
  return tensor_over(env, buffer, base, {bytes}, at::kByte);
}

// This file's entry points: c10d's errors as their first line.
template <typename R, typename F>
R guarded(JNIEnv* env, R failed, F&& body) {
  return gradbridge::guarded<Message::first_line>(env, failed, std::forward<F>(body));
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
    Store store = c10::make_intrusive<c10d::TCPStore>(Utf8(env, host).str(), options);
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
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(Utf8(env, prefix).str(), of<Store>(store, "store"));
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
    options->devices.push_back(device_for(Utf8(env, host).str()));
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
    auto sends = longs(env, send_splits, "split sizes");
    auto receives = longs(env, receive_splits, "split sizes");
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
