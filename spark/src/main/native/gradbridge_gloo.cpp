// gradbridge-spark's collective among Spark's training tasks: libtorch's own c10d Gloo process group (what
// TorchDistributor's workers use) and its TCP store, for Java through JNI (the entry points of
// dev/gradbridge/spark/GlooNative.java). A native library of its own (libgradbridge_gloo), so that gradbridge's core
// library and wheel carry no gloo: compiled per libtorch build by python/gradbridge/_runtime/native.py
// (`build --gloo`), against torch's c10d headers, the core's native/jni_support.h and the gloo headers vendored beside
// this file in third_party/gloo (pip torch ships the first, not the last; every gloo object is created inside libtorch,
// so the headers only have to compile). Java loads it after the core library, so libtorch is already in the process.
//
// - Errors (a peer died, a timeout, a port in use) become one-line dev.gradbridge.NativeException,
//   never an abort: the guard of gradbridge_jni.cpp (jni_support.h), keeping the first line.
// - Collectives run on Gloo's own threads; Java starts one (a Work handle) and waits for it in
//   short slices, so that a task Spark killed gets out ({@code glooWait}).
// - CPU tensors over Java's direct buffers (bytes: the exchange sends raw little-endian bytes);
//   each keeps its buffer alive until libtorch drops the tensor (jni_support.h).
// - A group is freed on a thread of its own: ProcessGroupGloo's destructor joins Gloo's threads,
//   which wait for an operation in flight to end (its peer gone, or Gloo's timeout).
// - Two kinds of store: a TCPStore whose server listens on the host it is given (a socket bound here
//   and handed to c10d: c10d's own server would listen on every interface), and a store kept by a
//   Java object (JavaStore: dev.gradbridge.spark.GlooGroup.Rendezvous; gradbridge-spark's is on its
//   driver, over Spark's RPC, behind the run's secret), which opens no socket at all.

#include <jni.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dev_gradbridge_spark_GlooNative.h"
#include "jni_support.h"

namespace {

using gradbridge::JavaPending;
using gradbridge::Local;
using gradbridge::Message;
using gradbridge::Utf8;
using gradbridge::borrow;
using gradbridge::drop;
using gradbridge::longs;
using gradbridge::release;
using gradbridge::take;
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

std::shared_ptr<::gloo::transport::Device> device_for(const std::string& host) {
  // torch 2.15 added a lazyInit argument (defaulted); the call reads the same on every version.
  return c10d::ProcessGroupGloo::createDeviceForHostname(host);
}

// A listening TCP socket bound to `host` (an address of this machine), port `port` (0: a free one).
int listen_on(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  int resolved = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (resolved != 0) {
    throw std::runtime_error("the store's host " + host + " does not resolve: " + gai_strerror(resolved));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> addresses(found, &freeaddrinfo);
  std::string failure = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      failure = std::strerror(errno);
      continue;
    }
    int on = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) return fd;
    failure = std::strerror(errno);
    close(fd);
  }
  throw std::runtime_error("the store cannot listen on " + host + ":" + std::to_string(port) + ": " + failure);
}

// The current thread's JNIEnv, attaching a thread of libtorch's for the length of one call.
class Attached {
 public:
  explicit Attached(JavaVM* vm) : vm_(vm) {
    if (vm_->GetEnv(reinterpret_cast<void**>(&env_), JNI_VERSION_1_8) == JNI_OK) return;
    if (vm_->AttachCurrentThreadAsDaemon(reinterpret_cast<void**>(&env_), nullptr) != JNI_OK) {
      throw std::runtime_error("cannot attach a thread to the Java VM");
    }
    attached_ = true;
  }
  ~Attached() {
    if (attached_) vm_->DetachCurrentThread();
  }
  Attached(const Attached&) = delete;
  Attached& operator=(const Attached&) = delete;
  JNIEnv* env() const { return env_; }

 private:
  JavaVM* vm_;
  JNIEnv* env_ = nullptr;
  bool attached_ = false;
};

// A global reference to the Java object that keeps the keys, shared by a store and its clones.
struct Keeper {
  JavaVM* vm = nullptr;
  jobject object = nullptr;
  jmethodID set = nullptr, get = nullptr, compare_set = nullptr, add = nullptr, remove = nullptr, count = nullptr,
            await = nullptr;
  ~Keeper() {
    if (vm == nullptr || object == nullptr) return;
    try {
      Attached attached(vm);
      attached.env()->DeleteGlobalRef(object);
    } catch (...) {
    }
  }
};

// A Java exception thrown by the keeper: its text as a C++ exception (the guard reports it in one line).
void rethrow_java(JNIEnv* env) {
  if (!env->ExceptionCheck()) return;
  jthrowable thrown = env->ExceptionOccurred();
  env->ExceptionClear();
  std::string text = "the store's keeper failed";
  jclass type = env->FindClass("java/lang/Throwable");
  jmethodID to_string = type == nullptr ? nullptr : env->GetMethodID(type, "toString", "()Ljava/lang/String;");
  jobject described = to_string == nullptr ? nullptr : env->CallObjectMethod(thrown, to_string);
  if (env->ExceptionCheck()) env->ExceptionClear();
  if (described != nullptr) {
    const char* chars = env->GetStringUTFChars(static_cast<jstring>(described), nullptr);
    if (chars != nullptr) {
      text = chars;
      env->ReleaseStringUTFChars(static_cast<jstring>(described), chars);
    }
    env->DeleteLocalRef(described);
  }
  env->DeleteLocalRef(thrown);
  if (type != nullptr) env->DeleteLocalRef(type);
  throw std::runtime_error(text);
}

// A c10d store whose keys a Java object keeps (dev.gradbridge.GlooGroup.Rendezvous): each operation
// is a call into Java, on whatever thread libtorch makes it. No socket.
class JavaStore : public c10d::Store {
 public:
  JavaStore(std::shared_ptr<Keeper> keeper, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), keeper_(std::move(keeper)) {}

  // Pure virtual in newer libtorch (so no `override`: 2.7.1 has no clone).
  c10::intrusive_ptr<c10d::Store> clone() { return c10::make_intrusive<JavaStore>(keeper_, timeout_); }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    Local k(env, string_of(env, key)), v(env, bytes_of(env, value));
    env->CallVoidMethod(keeper_->object, keeper_->set, k.ref, v.ref);
    rethrow_java(env);
  }

  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    Local k(env, string_of(env, key)), e(env, bytes_of(env, expected)), d(env, bytes_of(env, desired));
    Local out(env, env->CallObjectMethod(keeper_->object, keeper_->compare_set, k.ref, e.ref, d.ref));
    rethrow_java(env);
    return vector_of(env, out.ref);
  }

  std::vector<uint8_t> get(const std::string& key) override {
    wait({key}, timeout_);
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    Local k(env, string_of(env, key));
    Local out(env, env->CallObjectMethod(keeper_->object, keeper_->get, k.ref));
    rethrow_java(env);
    if (out.ref == nullptr) throw std::runtime_error("the store lost key " + key);
    return vector_of(env, out.ref);
  }

  int64_t add(const std::string& key, int64_t value) override {
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    Local k(env, string_of(env, key));
    jlong out = env->CallLongMethod(keeper_->object, keeper_->add, k.ref, static_cast<jlong>(value));
    rethrow_java(env);
    return out;
  }

  bool deleteKey(const std::string& key) override {
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    Local k(env, string_of(env, key));
    jboolean out = env->CallBooleanMethod(keeper_->object, keeper_->remove, k.ref);
    rethrow_java(env);
    return out == JNI_TRUE;
  }

  bool check(const std::vector<std::string>& keys) override { return await(keys, 0); }

  int64_t getNumKeys() override {
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    jlong out = env->CallLongMethod(keeper_->object, keeper_->count);
    rethrow_java(env);
    return out;
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    if (!await(keys, timeout.count())) {
      throw std::runtime_error("the store's keys did not arrive within " + std::to_string(timeout.count()) + " ms");
    }
  }

 private:
  // Whether every key is present, waiting up to `millis` (0: only looking).
  bool await(const std::vector<std::string>& keys, int64_t millis) {
    Attached a(keeper_->vm);
    JNIEnv* env = a.env();
    jclass string_type = env->FindClass("java/lang/String");
    if (string_type == nullptr) rethrow_java(env);
    Local type(env, string_type);
    Local names(env, env->NewObjectArray(static_cast<jsize>(keys.size()), string_type, nullptr));
    if (names.ref == nullptr) rethrow_java(env);
    for (size_t i = 0; i < keys.size(); ++i) {
      Local k(env, string_of(env, keys[i]));
      env->SetObjectArrayElement(static_cast<jobjectArray>(names.ref), static_cast<jsize>(i), k.ref);
      rethrow_java(env);
    }
    jboolean out = env->CallBooleanMethod(keeper_->object, keeper_->await, names.ref, static_cast<jlong>(millis));
    rethrow_java(env);
    return out == JNI_TRUE;
  }

  static jobject string_of(JNIEnv* env, const std::string& text) {
    jstring out = env->NewStringUTF(text.c_str());
    if (out == nullptr) rethrow_java(env);
    return out;
  }

  static jobject bytes_of(JNIEnv* env, const std::vector<uint8_t>& value) {
    jbyteArray out = env->NewByteArray(static_cast<jsize>(value.size()));
    if (out == nullptr) rethrow_java(env);
    env->SetByteArrayRegion(out, 0, static_cast<jsize>(value.size()), reinterpret_cast<const jbyte*>(value.data()));
    return out;
  }

  static std::vector<uint8_t> vector_of(JNIEnv* env, jobject array) {
    if (array == nullptr) return {};
    auto bytes = static_cast<jbyteArray>(array);
    std::vector<uint8_t> out(env->GetArrayLength(bytes));
    env->GetByteArrayRegion(bytes, 0, static_cast<jsize>(out.size()), reinterpret_cast<jbyte*>(out.data()));
    rethrow_java(env);
    return out;
  }

  std::shared_ptr<Keeper> keeper_;
};

}  // namespace

GRADBRIDGE_HANDLE_KIND(Store, store);
GRADBRIDGE_HANDLE_KIND(Group, group);
GRADBRIDGE_HANDLE_KIND(Work, work);

extern "C" {

JNIEXPORT jlong JNICALL Java_dev_gradbridge_spark_GlooNative_glooStore(
    JNIEnv* env, jclass, jstring host, jint port, jboolean server, jint timeout_ms) {
  return guarded(env, jlong{0}, [&] {
    std::string where = Utf8(env, host).str();
    c10d::TCPStoreOptions options;
    options.port = static_cast<std::uint16_t>(port);  // 0 on the server: a free port
    options.isServer = server;
    options.waitWorkers = false;  // the group's rendezvous waits for the peers
    options.timeout = std::chrono::milliseconds(timeout_ms);
    if (!server) {
      Store store = c10::make_intrusive<c10d::TCPStore>(where, options);
      return release<Store>(std::move(store));
    }
    // c10d's own server listens on every interface; this socket only on `host`. Handed over as
    // masterListenFd, which the legacy backend takes (libuv's refuses it on torch 2.7; it is tried
    // second, for a libtorch without the legacy backend).
    for (bool libuv : {false, true}) {
      int fd = listen_on(where, port);
      sockaddr_storage bound{};
      socklen_t length = sizeof(bound);
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      options.port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      options.masterListenFd = fd;
      options.useLibUV = libuv;
      try {
        Store store = c10::make_intrusive<c10d::TCPStore>(where, options);
        return release<Store>(std::move(store));
      } catch (const std::exception&) {
        if (libuv) throw;
      }
    }
    throw std::logic_error("unreachable");
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_spark_GlooNative_glooStoreOver(JNIEnv* env, jclass, jobject keeper, jint timeout_ms) {
  return guarded(env, jlong{0}, [&] {
    if (keeper == nullptr) throw std::invalid_argument("the store's keeper is null");
    auto held = std::make_shared<Keeper>();
    if (env->GetJavaVM(&held->vm) != JNI_OK) throw std::runtime_error("no Java VM");
    jclass type = env->FindClass("dev/gradbridge/spark/GlooGroup$Rendezvous");
    if (type == nullptr) throw JavaPending{};
    held->set = env->GetMethodID(type, "set", "(Ljava/lang/String;[B)V");
    held->get = env->GetMethodID(type, "get", "(Ljava/lang/String;)[B");
    held->compare_set = env->GetMethodID(type, "compareSet", "(Ljava/lang/String;[B[B)[B");
    held->add = env->GetMethodID(type, "add", "(Ljava/lang/String;J)J");
    held->remove = env->GetMethodID(type, "delete", "(Ljava/lang/String;)Z");
    held->count = env->GetMethodID(type, "count", "()J");
    held->await = env->GetMethodID(type, "await", "([Ljava/lang/String;J)Z");
    env->DeleteLocalRef(type);
    gradbridge::check_java(env);
    held->object = env->NewGlobalRef(keeper);
    if (held->object == nullptr) throw JavaPending{};
    Store store = c10::make_intrusive<JavaStore>(held, std::chrono::milliseconds(timeout_ms));
    return release<Store>(std::move(store));
  });
}

JNIEXPORT jint JNICALL Java_dev_gradbridge_spark_GlooNative_glooStorePort(JNIEnv* env, jclass, jlong store) {
  return guarded(env, jint{0}, [&] {
    auto* tcp = dynamic_cast<c10d::TCPStore*>(borrow<Store>(store).get());
    if (tcp == nullptr) throw std::invalid_argument("the store has no port (its keys are kept in Java)");
    return static_cast<jint>(tcp->getPort());
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_spark_GlooNative_glooStoreFree(JNIEnv* env, jclass, jlong store) {
  guarded(env, 0, [&] {
    drop<Store>(store);
    return 0;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_spark_GlooNative_glooGroup(
    JNIEnv* env, jclass, jlong store, jstring prefix, jstring host, jint rank, jint size, jint timeout_ms) {
  return guarded(env, jlong{0}, [&] {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(Utf8(env, prefix).str(), borrow<Store>(store));
    auto options = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(timeout_ms));
    options->devices.push_back(device_for(Utf8(env, host).str()));
    options->threads = 1;  // one collective at a time: the exchange waits for each
    Group group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, options);
    return release(std::move(group));
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_spark_GlooNative_glooGroupFree(JNIEnv* env, jclass, jlong group) {
  guarded(env, 0, [&] {
    if (group != 0) std::thread([owned = take<Group>(group)]() mutable { owned.reset(); }).detach();
    return 0;
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_spark_GlooNative_glooAlltoall(
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
    Work work = borrow<Group>(group)->alltoall_base(output, input, receives, sends);
    return release(std::move(work));
  });
}

JNIEXPORT jlong JNICALL Java_dev_gradbridge_spark_GlooNative_glooAllgather(
    JNIEnv* env, jclass, jlong group, jobject send, jobject receive, jlong each) {
  return guarded(env, jlong{0}, [&] {
    c10::AutoGradMode no_grad(false);
    Group& g = borrow<Group>(group);
    int size = g->getSize();
    at::Tensor input = bytes_of(env, send, each);
    at::Tensor output = bytes_of(env, receive, each * size);
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size; ++r) outputs[0].push_back(output.narrow(0, r * each, each));
    std::vector<at::Tensor> inputs{input};
    Work work = g->allgather(outputs, inputs);
    return release(std::move(work));
  });
}

JNIEXPORT jboolean JNICALL Java_dev_gradbridge_spark_GlooNative_glooWait(JNIEnv* env, jclass, jlong work, jint millis) {
  return guarded(env, jboolean{JNI_FALSE}, [&] {
    Work& w = borrow<Work>(work);
    try {
      w->wait(std::chrono::milliseconds(millis));
    } catch (...) {
      if (!w->isCompleted()) return jboolean{JNI_FALSE};  // the wait timed out, not the operation
      throw;
    }
    return jboolean{w->isCompleted() ? JNI_TRUE : JNI_FALSE};
  });
}

JNIEXPORT void JNICALL Java_dev_gradbridge_spark_GlooNative_glooWorkFree(JNIEnv* env, jclass, jlong work) {
  guarded(env, 0, [&] {
    drop<Work>(work);
    return 0;
  });
}

}  // extern "C"
