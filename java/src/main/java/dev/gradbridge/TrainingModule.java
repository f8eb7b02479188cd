package dev.gradbridge;

import dev.gradbridge.internal.AtomicFiles;
import dev.gradbridge.internal.ModuleAccess;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Supplier;

/**
 * An exported gradbridge training module, loaded into libtorch through gradbridge's native layer.
 *
 * <p>Every method runs with autograd on, so a scripted backward works. Typed calls ({@link
 * #calculateLossAndBackward}, {@link #sgdStep}, ...) check their inputs against the module's
 * metadata first; {@link #call} runs any scripted method by name. One thread at a time: a call
 * that overlaps another thread's call on the same module fails with {@link
 * ConcurrentUseException} before it touches anything. Load one module per thread; modules on
 * different threads train independently.
 *
 * <pre>{@code
 * try (TrainingModule module = TrainingModule.load(Paths.get("model.pt"));
 *         Tensor x = Tensor.of(xs, n, 1);
 *         Tensor y = Tensor.of(ys, n, 1)) {
 *     double loss = module.calculateLossAndBackward(x, y);
 *     module.sgdStep(0.01);
 *     Map<String, double[]> params = module.getParameters();
 * }
 * }</pre>
 */
public final class TrainingModule implements AutoCloseable {

    static {
        ModuleAccess.register(new ModuleAccessCalls());
    }

    final Path path;
    final Metadata metadata;
    final ModuleEngine scripted;
    private final Set<String> methodNames;
    private final List<String> parameterNames;
    private final List<String> bufferNames;
    private final ThreadGuard guard;
    private final ModuleInputs inputs;
    final TypedCalls calls; // what the typed calls run under the thread guard
    private final ModuleState state;

    TrainingModule(Path path, Metadata metadata, ModuleEngine scripted) {
        this.path = path;
        this.metadata = metadata;
        this.scripted = scripted;
        this.methodNames = scripted.methodNames();
        this.guard = new ThreadGuard(path.toString());
        this.inputs = new ModuleInputs(path, metadata);
        this.state = new ModuleState(path, metadata, scripted, methodNames);
        this.calls = new TypedCalls(scripted, inputs, methodNames);
        ModuleLoader.requireMethods(path, methodNames);
        this.parameterNames = Collections.unmodifiableList(ModuleLoader.stringList(scripted, Protocol.PARAMETER_NAMES));
        this.bufferNames = Collections.unmodifiableList(ModuleLoader.stringList(scripted, Protocol.BUFFER_NAMES));
        ModuleLoader.checkParameters(path, metadata, scripted, parameterNames);
    }

    /**
     * Loads an exported training module for training.
     *
     * @param path the .pt written by {@code gradbridge export}
     * @return the module, in training mode
     * @throws ModuleLoadException when the file is missing or libtorch cannot load it
     * @throws ProtocolException when it is TorchScript but not a gradbridge training module
     */
    public static TrainingModule load(Path path) {
        return load(path, Collections.emptyList());
    }

    /**
     * Loads an exported training module that calls custom operators, after loading the shared
     * libraries that register them. Library paths come only from the caller, never from the file.
     *
     * @param path the .pt written by {@code gradbridge export}
     * @param opLibraries operator libraries (built against the libtorch this JVM runs) to load
     *     first; loading one twice is harmless
     * @return the module, in training mode
     * @throws ModuleLoadException when a library cannot be loaded, or the module needs an operator
     *     that no loaded library provides (the message names it)
     */
    public static TrainingModule load(Path path, List<Path> opLibraries) {
        return load(path, opLibraries, Devices.CPU);
    }

    /**
     * Loads an exported training module onto a device: its parameters, buffers and optimizer state are read
     * onto it, and its calls copy their input tensors there and their result tensors back to the CPU (the
     * {@link Tensor}s Java holds are CPU tensors; a loss comes back as a double). The file is the same for
     * every device, and so are the checkpoints it saves (CPU tensors).
     *
     * @param path the .pt written by {@code gradbridge export}
     * @param device {@code cpu} (what {@link #load(Path)} loads on), {@code cuda} or {@code cuda:N}
     * @return the module, in training mode
     * @throws InvalidInputException when {@code device} names no device, or one this process does not have
     *     (a libtorch without CUDA, no such GPU): one line naming it and why
     */
    public static TrainingModule load(Path path, String device) {
        return load(path, Collections.emptyList(), device);
    }

    /** {@link #load(Path, List)} onto a device ({@link #load(Path, String)}): the module, in training mode. */
    public static TrainingModule load(Path path, List<Path> opLibraries, String device) {
        return ModuleLoader.load(path, opLibraries, device);
    }

    /** @return the absolute path the module was loaded from */
    public Path getPath() {
        return path;
    }

    /** @return the device the module trains on: {@code cpu} or {@code cuda:N} */
    public String getDevice() {
        return scripted.device();
    }

    /**
     * Moves the module to {@code device} (canonical): every tensor of it, for the calls from now on
     * ({@link Trainer}'s {@code optDevice}). The caller holds the thread guard.
     */
    void moveTo(String device) {
        NativeLibrary.requireDevice(device);
        if (!device.equals(scripted.device())) {
            scripted.moveTo(device);
        }
    }

    /** @return the module's gradbridge.json */
    public Metadata getMetadata() {
        return metadata;
    }

    /** @return the scripted methods the module has */
    public Set<String> getMethodNames() {
        return methodNames;
    }

    /** @return parameter names in protocol order */
    public List<String> getParameterNames() {
        return parameterNames;
    }

    /** @return buffer names (e.g. BatchNorm running statistics) in protocol order */
    public List<String> getBufferNames() {
        return bufferNames;
    }

    /**
     * @return the model's input names: {@code [x]} for a model of one input tensor, else the names
     *     the methods taking a {@code Map} of inputs expect (e.g. {@code [input_ids, attention_mask]})
     */
    public List<String> getInputNames() {
        return inputs.names();
    }

    /**
     * Runs {@code forward(x)} in eval mode (predictions, as eager {@code model.eval(); model(x)}:
     * no dropout, BatchNorm's running statistics), then returns the module to training mode.
     *
     * @param x input matching the metadata's {@code x} spec
     * @return predictions, a new tensor the caller closes
     */
    public Tensor forward(Tensor x) {
        return forward(inputs.single(Protocol.FORWARD, x));
    }

    /**
     * {@link #forward(Tensor)} for a model of several inputs (or {@code {x: tensor}}): each of {@link
     * #getInputNames()} by name, matching its spec, the same batch size; an {@link InvalidInputException}
     * names the input that is missing, unknown or does not match.
     */
    public Tensor forward(Map<String, Tensor> x) {
        return guarded(() -> calls.forward(x));
    }

    /**
     * Runs {@code forward(x)} in eval mode without autograd, as eager PyTorch under {@code torch.no_grad()}:
     * the same values as {@link #forward}, without recording a graph for a backward (serving).
     *
     * @param x input matching the metadata's {@code x} spec
     * @return predictions, a new tensor the caller closes
     */
    public Tensor predict(Tensor x) {
        return predict(inputs.single(Protocol.FORWARD, x));
    }

    /** {@link #predict(Tensor)} for a model of several inputs, as {@link #forward(Map)} takes them. */
    public Tensor predict(Map<String, Tensor> x) {
        return guarded(() -> calls.predict(x));
    }

    /**
     * Runs {@code calculate_loss_and_backward(x, y)}: forward, loss, backward; gradients add up.
     *
     * @param x inputs matching the metadata's {@code x} spec
     * @param y targets matching the metadata's {@code y} spec, same batch size as {@code x}
     * @return the loss, exactly (float32 widened to double)
     * @throws InvalidInputException when x or y do not match the metadata; nothing ran
     */
    public double calculateLossAndBackward(Tensor x, Tensor y) {
        return calculateLossAndBackward(inputs.single(Protocol.CALCULATE_LOSS_AND_BACKWARD, x), y);
    }

    /** {@link #calculateLossAndBackward(Tensor, Tensor)} for a model of several inputs, as {@link #forward(Map)}. */
    public double calculateLossAndBackward(Map<String, Tensor> x, Tensor y) {
        return guarded(() -> calls.scalarLoss(Protocol.CALCULATE_LOSS_AND_BACKWARD, x, y));
    }

    /**
     * Runs {@code train_step(x, y)}: zero_grad, loss and backward, one optimizer step; x and y as
     * {@link #calculateLossAndBackward(Tensor, Tensor)} takes them.
     *
     * @return the loss computed before the step
     */
    public double trainStep(Tensor x, Tensor y) {
        return trainStep(inputs.single(Protocol.TRAIN_STEP, x), y);
    }

    /** {@link #trainStep(Tensor, Tensor)} for a model of several inputs, as {@link #forward(Map)} takes them. */
    public double trainStep(Map<String, Tensor> x, Tensor y) {
        return guarded(() -> calls.scalarLoss(Protocol.TRAIN_STEP, x, y));
    }

    /**
     * Runs {@code train_epoch(x, y, perm, batch_size)}: one native call that steps through the
     * batches {@code perm[i:i + batchSize]}.
     *
     * @param x all inputs of the epoch
     * @param y all targets of the epoch
     * @param perm int64 sample order, a permutation of (a subset of) {@code 0..n-1}
     * @param batchSize samples per batch, 1..n; the last batch may be smaller
     * @return the loss of each batch
     */
    public double[] trainEpoch(Tensor x, Tensor y, Tensor perm, int batchSize) {
        return trainEpoch(inputs.single(Protocol.TRAIN_EPOCH, x), y, perm, batchSize);
    }

    /** {@link #trainEpoch(Tensor, Tensor, Tensor, int)} for a model of several inputs, as {@link #forward(Map)}. */
    public double[] trainEpoch(Map<String, Tensor> x, Tensor y, Tensor perm, int batchSize) {
        return guarded(() -> calls.trainEpoch(x, y, perm, batchSize));
    }

    /**
     * Runs {@code evaluate(x, y)} in eval mode (BatchNorm uses running statistics, dropout is off), then
     * returns the module to training mode; x and y as {@link #calculateLossAndBackward(Tensor, Tensor)}.
     *
     * @return the loss, without gradients
     */
    public double evaluate(Tensor x, Tensor y) {
        return evaluate(inputs.single(Protocol.EVALUATE, x), y);
    }

    /** {@link #evaluate(Tensor, Tensor)} for a model of several inputs, as {@link #forward(Map)} takes them. */
    public double evaluate(Map<String, Tensor> x, Tensor y) {
        return guarded(() -> calls.evaluate(x, y));
    }

    /** Runs {@code zero_grad()}. */
    public void zeroGrad() {
        guarded(() -> scripted.invoke(Protocol.ZERO_GRAD));
    }

    /** Runs {@code sgd_step(lr)}: {@code p -= lr * grad} (torch.optim.SGD's op), then zeroes grads; lr positive, finite. */
    public void sgdStep(double lr) {
        guarded(() -> calls.sgdStep(lr));
    }

    /** Runs {@code optimizer_step()}: one step of the exported optimizer; consumes the gradients. */
    public void optimizerStep() {
        guarded(() -> scripted.invoke(Protocol.OPTIMIZER_STEP));
    }

    /** @return the exported optimizer's current learning rate */
    public double getLr() {
        return guarded(() -> (Double) scripted.invoke(Protocol.GET_LR));
    }

    /** Sets the exported optimizer's learning rate (every group's) to {@code lr}, non-negative and finite. */
    public void setLr(double lr) {
        guarded(() -> calls.setLr(lr));
    }

    /**
     * @return every parameter group's learning rate, in group order (one group unless the export has
     *     parameter groups); a module exported without {@code get_lrs} gives {@code [getLr()]}
     */
    public double[] getLrs() {
        return guarded(() -> state.lrs());
    }

    /** Sets the learning rate of {@code group} (an index into {@link #getLrs()}) as {@link #setLr(double)} does. */
    public void setLr(int group, double lr) {
        guarded(() -> state.setLr(group, lr));
    }

    /**
     * The end-of-epoch schedule step ({@code schedule_epoch}): a per-epoch schedule steps, ReduceLROnPlateau
     * steps on {@code metric} (the epoch's validation loss, or its training loss without validation data).
     */
    public void scheduleEpoch(double metric) {
        guarded(() -> calls.scheduleEpoch(metric));
    }

    /** @return current parameter values by name (flattened, exact), in protocol order */
    public Map<String, double[]> getParameters() {
        return guarded(() -> state.named(Protocol.GET_PARAMETERS, parameterNames, null));
    }

    /**
     * One {@code get_parameters} call for an epoch's record: each parameter's digest, and its exact values
     * only into {@code values} when that is not null (see {@link ModuleState#readParameters}).
     */
    void readParameters(Map<String, String> digests, Map<String, ByteBuffer> values) {
        guarded(() -> state.readParameters(digests, values));
    }

    /** @return accumulated gradients by name (flattened, exact), in protocol order */
    public Map<String, double[]> getGradients() {
        return guarded(() -> state.named(Protocol.GET_GRADIENTS, parameterNames, null));
    }

    /** @return whether every gradient is finite (no NaN, no infinity), decided in libtorch without copying them */
    public boolean gradientsFinite() {
        return guarded(() -> scripted.allFinite(Protocol.GET_GRADIENTS));
    }

    /** @return whether every parameter and optimizer state tensor is finite (the online learner's check) */
    public boolean stateFinite() {
        return guarded(() -> scripted.allFinite(Protocol.GET_PARAMETERS)
                && scripted.allFinite(Protocol.OPTIMIZER_STATE));
    }

    /** @return buffer values by name (flattened, exact), in protocol order */
    public Map<String, double[]> getBuffers() {
        return guarded(() -> state.named(Protocol.GET_BUFFERS, bufferNames, null));
    }

    /** @return the values of the buffers a training step writes, by name (flattened, exact), in protocol order */
    public Map<String, double[]> getTrainedBuffers() {
        return getState(metadata.getTrainedBufferNames(), Protocol.GET_BUFFERS, bufferNames);
    }

    /** @return the values of the parameters that train, as {@link #getParameters()}; the frozen rest is not copied */
    public Map<String, double[]> getTrainableParameters() {
        return getState(metadata.getTrainableParameterNames(), Protocol.GET_PARAMETERS, parameterNames);
    }

    /** Named values through {@code get_state}, or in older modules all of {@code whole}'s then those wanted. */
    private Map<String, double[]> getState(List<String> wanted, String whole, List<String> wholeNames) {
        if (wanted.isEmpty()) {
            return new LinkedHashMap<>();
        }
        return guarded(() -> state.subset(wanted, whole, wholeNames));
    }

    /**
     * Runs {@code set_state}: copies {@code values} (flattened, by name) into the named parameters and buffers,
     * any of them (a published version's trainable parameters and trained buffers: the frozen rest stays),
     * checked whole before anything changes: a name unknown or a count wrong is an {@link InvalidInputException}
     * and changes nothing; a module exported before {@code set_state} existed, a {@link ProtocolException}.
     */
    public void setState(Map<String, double[]> values) {
        if (values.isEmpty()) {
            return;
        }
        guarded(() -> state.setState(values));
    }

    /**
     * Runs {@code set_parameters}: replaces every parameter's values ({@code values}: every parameter's,
     * flattened, by name); a name missing or a count wrong is an {@link InvalidInputException}, nothing changed.
     */
    public void setParameters(Map<String, double[]> values) {
        guarded(() -> state.setParameters(values, parameterNames));
    }

    /**
     * @return the optimizer's per-parameter state (torch.optim's keys, e.g. {@code exp_avg}) to one flattened
     *     array per parameter, in protocol order (empty where torch.optim holds none yet: SGD's {@code
     *     momentum_buffer} before a parameter's first step, which is left out while no parameter has one)
     */
    public Map<String, List<double[]>> getOptimizerState() {
        return guarded(() -> state.optimizerState());
    }

    /**
     * Saves the module as it is now (parameters, buffers, optimizer state, learning rate) as a TorchScript
     * archive (it loads with {@code torch.jit.load} too) at {@code target}, replaced only once the new file is
     * complete, with its metadata plus a {@code checkpoint} entry (epochs trained so far, the run's settings
     * and data) that lets {@link Trainer} resume the run. An {@link IOException} when the folder cannot be written.
     */
    public void saveCheckpoint(Path target, Metadata.Checkpoint checkpoint) throws IOException {
        AtomicFiles.write(target, tmp -> ModuleAccessCalls.archive(this, checkpoint, tmp)); // tensor by tensor
    }

    /**
     * Runs any scripted method by name, with autograd on.
     *
     * <p>Arguments: {@link Tensor}, {@link Double}/{@link Float}, {@link Long}/{@link Integer},
     * {@link Boolean}, {@link String}, {@code null} (None), a {@link List} of one of these (an
     * empty list is a tensor list), or a String-keyed {@link Map} of tensor lists (what
     * {@code load_optimizer_state} takes). Results: {@code null}, Tensor (new: the caller closes
     * it), Double, Long, Boolean, String, or a List (also for tuples) or String-keyed Map of these. A
     * {@link ProtocolException} when the module has no such method, a {@link MethodCallException} when it
     * fails inside libtorch.
     */
    public Object call(String method, Object... args) {
        return guarded(() -> scripted.invoke(method, args));
    }

    /** Runs {@code call} under the thread guard every public call holds ({@link #use}). */
    private <T> T guarded(Supplier<T> call) {
        try (ThreadGuard.Use use = use()) {
            return call.get();
        }
    }

    private void guarded(Runnable call) {
        try (ThreadGuard.Use use = use()) {
            call.run();
        }
    }

    /** The thread guard every public call holds; {@link Trainer} holds it for a whole run. */
    ThreadGuard.Use use() {
        return guard.enter();
    }

    /** Frees the module (tensors the caller holds stay valid until they are closed). Idempotent. */
    @Override
    public void close() {
        if (guard.isClosed()) {
            return;
        }
        try (ThreadGuard.Use use = use()) {
            guard.markClosed();
            scripted.close();
        }
    }
}
