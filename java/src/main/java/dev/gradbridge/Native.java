package dev.gradbridge;

import java.nio.ByteBuffer;

/**
 * The JNI entry points of gradbridge's native library ({@code native/gradbridge_jni.cpp}), over
 * libtorch's C++ API. {@code javac -h} generates the C++ signatures from this file (see
 * {@code python/gradbridge/_runtime/native.py}), so the two cannot drift; it therefore uses only
 * {@code java.*} types. Callers load the library first ({@link NativeLibrary#load}).
 *
 * <p>Handles are {@code long}s: a tensor handle owns one {@code at::Tensor}, a module handle one
 * {@code torch::jit::Module}, ...; each is freed exactly once by its Java owner ({@link Tensor},
 * {@link TorchScriptEngine}). Each carries its kind ({@code jni_support.h}: release, borrow, drop): a
 * zero handle, or one of another kind, is refused by name in a {@link NativeException}
 * ("the tensor is closed", "a tensor handle where a module is expected"), never a crash. Every entry point turns a libtorch error into a {@link
 * NativeException} carrying libtorch's message without its C++ backtrace.
 */
final class Native {

    private Native() {}

    // ---- the library ----

    /** @return the libtorch version the library was compiled against, e.g. {@code 2.7.1} */
    static native String torchVersion();

    /** @return 1 when compiled with the C++11 ABI ({@code _GLIBCXX_USE_CXX11_ABI=1}), else 0 */
    static native int cxx11Abi();

    /** Seeds libtorch's default CPU generator ({@code torch::manual_seed}). */
    static native void manualSeed(long seed);

    /** Sets libtorch's intra-op thread count ({@code at::set_num_threads}). */
    static native void setNumThreads(int threads);

    /** @return libtorch's intra-op thread count */
    static native int getNumThreads();

    /** @return libtorch's inter-op thread count */
    static native int getNumInteropThreads();

    /** Sets libtorch's inter-op thread count; libtorch allows it once, before any inter-op work. */
    static native void setNumInteropThreads(int threads);

    /** glibc's {@code mallopt(param, value)}; returns its result (1 on success), -1 off glibc. */
    static native int mallopt(int param, int value);

    /** {@code dlopen(path, RTLD_NOW | RTLD_GLOBAL)} (custom operators register on load); dlerror() on failure. */
    static native void loadLibrary(String path);

    // ---- CUDA: {@link NativeLibrary} loads libtorch's CUDA libraries before anything asks for them ----

    /** @return whether libtorch's CUDA hooks are libtorch_cuda's (loaded before libtorch first asked for them) */
    static native boolean cudaBuilt();

    /** @return the CUDA devices libtorch sees ({@code torch::cuda::device_count()}; 0 without its CUDA libraries) */
    static native int cudaDeviceCount();

    /** @return whether the NVIDIA driver's {@code libcuda.so.1} loads */
    static native boolean cudaDriverLoads();

    /**
     * {@code torch.use_deterministic_algorithms(on)} (an op without a deterministic kernel fails), and cuDNN's
     * benchmark off while on.
     *
     * @return the setting it replaced
     */
    static native boolean setDeterministic(boolean on);

    /** {@code setenv(name, value)} unless the process has {@code name} set already. */
    static native void setEnvDefault(String name, String value);

    // ---- tensors ----

    /**
     * A tensor over a direct buffer's memory without a copy; the buffer stays referenced until
     * libtorch frees the tensor's storage (TorchScript may keep it).
     *
     * @param offset byte offset into the buffer (the caller checked capacity and alignment)
     */
    static native long tensorFromBuffer(ByteBuffer buffer, long offset, int scalarType, long[] shape);

    /** A new uninitialized contiguous CPU tensor. */
    static native long tensorEmpty(int scalarType, long[] shape);

    static native void tensorFree(long tensor);

    /** @return the tensor's {@code c10::ScalarType} code */
    static native int tensorScalarType(long tensor);

    static native long[] tensorShape(long tensor);

    /**
     * The tensor's memory as a direct buffer (native byte order), valid while the tensor lives.
     * Non-contiguous tensors are refused: call {@link #tensorContiguous} first.
     */
    static native ByteBuffer tensorBuffer(long tensor);

    /** Whether the tensor is a contiguous CPU tensor ({@link #tensorBuffer} accepts it). */
    static native boolean tensorIsContiguous(long tensor);

    /** A new handle: the same tensor if contiguous on the CPU, else a contiguous CPU copy. */
    static native long tensorContiguous(long tensor);

    /** {@code tensor.index_select(0, index)}: a new tensor. */
    static native long tensorIndexSelect(long tensor, long index);

    /** {@code tensor.narrow(0, start, length)}: a view sharing memory. */
    static native long tensorNarrow(long tensor, long start, long length);

    /** {@code tensor.clone()}: a new tensor with memory of its own. */
    static native long tensorClone(long tensor);

    /** {@code tensor.to(scalarType)}: a new tensor (the same when the type already matches). */
    static native long tensorTo(long tensor, int scalarType);

    /** A copy in page-locked (pinned) memory, which CUDA copies read directly; the same tensor when it is one. */
    static native long tensorPinned(long tensor);

    // ---- TorchScript modules ----

    /**
     * {@code torch::jit::load(path)}, onto {@code device} ({@code cpu}, {@code cuda:N}: every tensor of the
     * archive is read there); the module is put in training mode. A module's calls copy their tensor
     * arguments to its device and their tensor results back to the CPU: Java's tensors are CPU tensors.
     */
    static native long moduleLoad(String path, String device);

    /** The module as it is now, moved to {@code device}: a new module (free both). */
    static native long moduleTo(long module, String device);

    static native void moduleFree(long module);

    /**
     * {@code module.deepcopy()} with autograd on: a module of the same type whose tensors are clones;
     * 0 when two distinct tensors of the module share a storage (a copy would not alias them).
     */
    static native long moduleSnapshot(long module);

    /**
     * The named parameters' and buffers' tensors themselves, not copies (an exported training module's {@code
     * params} and {@code buffer_list}): handles the caller owns and frees.
     */
    static native long[] moduleTensors(long module, String[] names);

    /**
     * Every reference in the module to its named tensors refers to the given tensor itself instead, no copy
     * ({@code 0}: a zero-element placeholder of the tensor's dtype); the same dtype, device and shape, checked
     * whole before anything changes.
     *
     * @return the references changed (0: the module held those tensors already)
     */
    static native int moduleShare(long module, String[] names, long[] tensors);

    /** @return the module's method names */
    static native String[] moduleMethods(long module);

    /** {@code module.train(on)}: training or eval mode, recursively. */
    static native void moduleTrain(long module, boolean on);

    /**
     * {@code module.save(path, {extraName: extraContent})}, record by record into the file (never
     * the whole archive in memory); a failed write throws with the operating system's reason alone
     * (e.g. "No space left on device"). No extra file when extraName is null.
     */
    static native void moduleSaveFile(long module, String path, String extraName, byte[] extraContent);

    /**
     * Runs a method with autograd on and the optimizing graph executor off (both thread-local,
     * set for the call). Arguments and results convert as {@link TrainingModule#call} says:
     * tensors are {@link Tensor}s, results new ones that the caller owns.
     */
    static native Object moduleRun(long module, String method, Object[] args);

    /**
     * The module's method compiled once with every nested module call inlined (the ops the graph
     * executor runs with its optimizations off, in the same order, as one program), for serving
     * ({@link #inferPlanRun}) and the guarded steps ({@link #plansStepWhileFinite}); free it with
     * {@link #planFree}.
     */
    static native long planOf(long module, String method);

    static native void planFree(long plan);

    /** {@code method(tensor)} whose result is a tensor, autograd off; a new tensor handle the caller owns. */
    static native long inferPlanRun(long plan, long tensor);

    /**
     * A module's method looked up once, for the training hot path ({@link #methodRunToDouble},
     * {@link #methodRunToDoubles}): no name lookup per call. Free it with {@link #methodFree}.
     */
    static native long methodOf(long module, String method);

    static native void methodFree(long method);

    /**
     * {@code method(x, y)} whose result is a one-element tensor, as an exact double (float32
     * widens), run as {@link #moduleRun} runs methods; anything else fails naming the count.
     */
    static native double methodRunToDouble(long method, long x, long y);

    /**
     * {@code method(x, y)}, or {@code method(x, y, perm, batch)} when {@code perm} is not 0, whose
     * result is a tensor, returned as exact doubles (float32 widens; other dtypes convert in libtorch).
     */
    static native double[] methodRunToDoubles(long method, long x, long y, long perm, long batch);

    /**
     * A looked-up method without arguments that returns a list of tensors ({@code get_gradients}),
     * run as {@link #moduleRun} runs methods: whether every element of every tensor is finite (no
     * NaN, no infinity), decided natively.
     */
    static native boolean methodAllFinite(long method);

    /**
     * {@code train_step}'s calls, guarded, for micro-batches {@code (xs[i], ys[i])} in order, in one
     * call; {@code plans} are {@code zero_grad}, {@code calculate_loss_and_backward}, {@code
     * get_gradients} and {@code optimizer_step} ({@link #planOf}), run as {@link #moduleRun} runs
     * methods: zero_grad, the loss and backward (the loss
     * into {@code losses[i]}), then the step when the loss and every gradient are finite. Stops at
     * the first micro-batch that is not finite (its gradients left in place) or whose call fails
     * (that method's index in {@code plans}, the C++ {@code Step}, into {@code failed[0]}, else -1; libtorch's message into {@code error[0]}).
     *
     * @return how many micro-batches were stepped
     */
    static native int plansStepWhileFinite(long[] plans, long[] xs, long[] ys, double[] losses, int[] failed,
            String[] error);

    // ---- protocol 3: op lists run over libtorch's dispatcher (native/oplist_jni.cpp) ----

    /**
     * A protocol-3 module from its checked program as {@link ProgramArrays} writes it (parameters, inputs, limits,
     * graphs, training, counters: three arrays, no text) and its state tensors by binding name (copied onto
     * {@code device}: the caller keeps and frees its own). Its calls copy inputs to the device and results back to
     * the CPU.
     */
    static native long exportedLoad(long[] integers, double[] doubles, String[] strings, String[] stateNames,
            long[] stateTensors, String device);

    /** Moves every state tensor to {@code device}, where the module runs from now on. */
    static native void exportedTo(long module, String device);

    static native void exportedFree(long module);

    /** Runs a method over the inputs (in metadata order) and target; returns the result tensors (caller owns). */
    static native long[] exportedCall(long module, String method, long[] inputs, long target);

    /** {@code train_step} over the batches {@code perm[i:i + batch]}: each batch's loss. */
    static native double[] exportedTrainEpoch(long module, long[] inputs, long target, long perm, long batch);

    /** The state tensors' binding names, sorted. */
    static native String[] exportedStateNames(long module);

    /** Copies of state tensors by binding name (an absent gradient: zeros); the caller owns them. */
    static native long[] exportedGet(long module, String[] names);

    /** torch.optim's state layout: {@code state:KEY:PARAM} per key, its parameters in group order. */
    static native String[] exportedOptimizerLayout(long module);

    /**
     * Loads torch.optim's per-parameter state: {@code counts[k]} tensors of key {@code keys[k]}, in order,
     * checked whole against the layout before anything changes.
     */
    static native void exportedLoadOptimizerState(long module, String[] keys, long[] counts, long[] tensors);

    /** Replaces state tensors by binding name with copies of the given ones. */
    static native void exportedSet(long module, String[] names, long[] tensors);

    /** The state tensors bound to the names themselves, not copies: handles the caller owns and frees. */
    static native long[] exportedTensors(long module, String[] names);

    /**
     * Binds state names to the given tensors themselves, no copy ({@code 0}: a zero-element placeholder of the
     * bound tensor's dtype); the same dtype, device and shape, checked whole before anything changes.
     *
     * @return the bindings changed (0: the module held those tensors already)
     */
    static native int exportedShare(long module, String[] names, long[] tensors);

    /** A copy of the module: its own state tensors (cloned) and counters. */
    static native long exportedSnapshot(long module);

    /** Each parameter group's learning rate, in group order. */
    static native double[] exportedLrs(long module);

    /** Sets one group's learning rate, or every group's when {@code group} is negative. */
    static native void exportedSetLr(long module, int group, double lr);

    /** The end-of-epoch schedule step (ReduceLROnPlateau on {@code metric}); nothing unless it steps per epoch. */
    static native void exportedScheduleEpoch(long module, double metric);

    /** The host's counters as JSON (steps, learning rates, the schedule's state): what a checkpoint saves. */
    static native String exportedCounters(long module);

    /** {@code p -= lr * grad} for each parameter with a gradient, then the gradients are dropped. */
    static native void exportedSgdStep(long module, double lr);
}
