package dev.gradbridge;

import java.io.IOException;
import java.nio.file.Path;
import java.util.Collection;
import java.util.Collections;
import java.util.LinkedHashSet;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;

/**
 * The engine boundary: everything gradbridge asks of a loaded training module, and nothing of
 * how an engine does it. {@link TorchScriptEngine} implements it over gradbridge's native layer
 * (libtorch's TorchScript runtime through JNI); {@link OpListEngine} over protocol 3's op lists
 * (torch.export), run op by op through libtorch's dispatcher. {@link TrainingModule} is its only caller.
 *
 * <p>Contract for every implementation: methods run with autograd on and without the
 * optimizing graph executor (its fused subgraphs drift from eager autograd in the last bits),
 * set per call on the calling thread; one thread at a time per module (the caller's {@link
 * ThreadGuard}); tensors are {@link Tensor}s, results owned by the caller.
 */
abstract class ModuleEngine implements AutoCloseable {

    /** The file the module was loaded from (what messages name). */
    final Path path;
    private final AtomicLong handle;
    private final Set<String> methodNames;
    private volatile String device;

    /**
     * @param handle the engine's native module, which this one frees on close
     * @param device where its tensors are ({@link Devices}, canonical)
     */
    ModuleEngine(Path path, long handle, Collection<String> methodNames, String device) {
        this.path = path;
        this.handle = new AtomicLong(handle);
        this.methodNames = Collections.unmodifiableSet(new LinkedHashSet<>(methodNames));
        this.device = device;
    }

    /**
     * Loads a module file with the engine that reads it, chosen by the metadata's protocol version:
     * TorchScript (protocols 1 and 2) or gradbridge's op lists over libtorch's dispatcher (protocol 3,
     * {@link OpListEngine}), in training mode.
     *
     * The module's tensors are on {@code device} (canonical; the caller checked it is there), its calls
     * copy their tensor arguments there and their tensor results back to the CPU.
     *
     * @throws NativeException when the engine cannot load it (nothing stays allocated)
     */
    static ModuleEngine load(Path file, Metadata metadata, String device) {
        if (metadata.getProtocolVersion() == Protocol.EXPORT_VERSION) {
            return OpListEngine.load(file, metadata, device);
        }
        return TorchScriptEngine.load(file, device);
    }

    /** Seeds the engine's process-wide CPU generator (what dropout draws from). */
    static void seed(long seed) {
        NativeLibrary.load();
        Native.manualSeed(seed);
    }

    /** @return the libtorch version the engine runs */
    static String engineVersion() {
        return NativeLibrary.torchVersion();
    }

    /** @return the module's method names */
    final Set<String> methodNames() {
        return methodNames;
    }

    /** @return the native module, while it is open */
    final long handle() {
        long value = handle.get();
        if (value == 0) {
            throw new IllegalStateException(path + " is closed");
        }
        return value;
    }

    /** @return the native module, now closed here (0 when it already was): the caller frees it */
    final long release() {
        return handle.getAndSet(0);
    }

    /** @return the device the module's tensors are on (canonical) */
    final String device() {
        return device;
    }

    /**
     * The module's native handle is now {@code moved}, on {@code to}.
     *
     * @return the one it replaces: the caller frees it
     */
    final long replace(long moved, String to) {
        long old = handle.getAndSet(moved);
        device = to;
        return old;
    }

    /**
     * Moves every tensor of the module (parameters, buffers, gradients, optimizer state) to {@code device}
     * (canonical, checked to be there); its calls run there from now on.
     */
    abstract void moveTo(String device);

    /** Training mode on (BatchNorm updates statistics, dropout drops) or off (eval). */
    abstract void setTraining(boolean training);

    /**
     * Writes the module with its current attributes, plus {@code extra/<metadataName>} holding {@code
     * metadataJson}, to {@code file} as an archive that the Python side loads too: tensor by tensor,
     * never the whole archive in memory.
     *
     * @throws IOException with the operating system's reason when the file cannot be written
     */
    abstract void save(Path file, String metadataName, String metadataJson) throws IOException;

    /**
     * A module of the same type whose attributes hold copies of this one's tensors (what it saves
     * is what this one saves now), or null when two of its tensors share a storage.
     */
    abstract ModuleEngine snapshot();

    /**
     * Runs a method by name and converts its result (see {@link TrainingModule#call} for the types).
     *
     * @throws ProtocolException when the module has no such method
     * @throws MethodCallException when the method fails inside the engine
     */
    abstract Object invoke(String method, Object... args);

    /** Runs a one-tensor method whose result is a tensor without autograd (serving); the caller owns the result. */
    abstract Tensor infer(String method, Tensor x);

    /**
     * Runs a method without arguments whose result is a list of tensors and tells whether every
     * element of every one is finite, without the tensors leaving the engine (the update guard).
     */
    abstract boolean allFinite(String method);

    /**
     * For each micro-batch {@code (xs[i], ys[i])} in order (the arguments checked): {@code
     * zero_grad}, {@code calculate_loss_and_backward} (its loss into {@code losses[i]}), then
     * {@code optimizer_step} when the loss and every gradient are finite; stops at the first that
     * is not finite (its gradients left in place) or whose call fails (the failure, naming the
     * method, into {@code failure[0]}).
     *
     * @return how many micro-batches were stepped
     */
    abstract int stepWhileFinite(Tensor[] xs, Tensor[] ys, double[] losses, MethodCallException[] failure);

    /**
     * The hot path of one training step ({@code train_step}, {@code evaluate}): runs {@code
     * method(x, y)}, whose result is a one-element tensor, and returns it as an exact double. The
     * caller has checked the arguments.
     *
     * @throws MethodCallException when the method fails or returns another number of values
     */
    abstract double invokeToDouble(String method, Tensor x, Tensor y);

    /**
     * The hot path of training in bulk ({@code train_epoch}, ...): runs {@code
     * method(x, y)}, or {@code method(x, y, perm, batch)} when {@code perm} is given, whose result
     * is a tensor, and returns its values as exact doubles (float32 widens without rounding). The
     * caller has checked the arguments.
     */
    abstract double[] invokeToDoubles(String method, Tensor x, Tensor y, Tensor perm, long batch);

    /** Frees the module. Idempotent. */
    @Override
    public abstract void close();

    /** libtorch's messages put the TorchScript traceback first and the actual error last. */
    static String libtorchSummary(Throwable e) {
        String message = String.valueOf(e.getMessage()).trim();
        return message.substring(message.lastIndexOf('\n') + 1).trim();
    }
}
