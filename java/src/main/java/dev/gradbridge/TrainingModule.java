package dev.gradbridge;

import ai.djl.engine.EngineException;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * An exported gradbridge training module, loaded with DJL's PyTorch engine.
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
 *         NDManager data = module.getManager().newSubManager()) {
 *     NDArray x = data.create(xs, new Shape(n, 1));
 *     NDArray y = data.create(ys, new Shape(n, 1));
 *     double loss = module.calculateLossAndBackward(x, y);
 *     module.sgdStep(0.01);
 *     Map<String, double[]> params = module.getParameters();
 * }
 * }</pre>
 */
public final class TrainingModule implements AutoCloseable {

    private static final Logger logger = LoggerFactory.getLogger(TrainingModule.class);

    private final Path path;
    private final Metadata metadata;
    private final ScriptedModule scripted;
    private final NDManager manager;
    private final Set<String> methodNames;
    private final List<String> parameterNames;
    private final List<String> bufferNames;
    private final ThreadGuard guard;

    private TrainingModule(Path path, Metadata metadata, ScriptedModule scripted) {
        this.path = path;
        this.metadata = metadata;
        this.scripted = scripted;
        this.manager = scripted.manager();
        this.methodNames = scripted.methodNames();
        this.guard = new ThreadGuard(path.toString());
        List<String> missing = new ArrayList<>();
        for (String method : Protocol.REQUIRED_METHODS) {
            if (!methodNames.contains(method)) {
                missing.add(method);
            }
        }
        if (!missing.isEmpty()) {
            throw new ProtocolException(
                    path + " lacks protocol methods " + missing + "; it has " + methodNames);
        }
        this.parameterNames = Collections.unmodifiableList(stringList(Protocol.PARAMETER_NAMES));
        this.bufferNames = Collections.unmodifiableList(stringList(Protocol.BUFFER_NAMES));
        List<String> declared = new ArrayList<>();
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            declared.add(spec.getName());
        }
        if (!declared.equals(parameterNames)) {
            throw new ProtocolException(
                    path + ": parameter_names() returns " + parameterNames
                            + " but the metadata lists " + declared);
        }
        checkParameterSpecs();
    }

    /** The metadata's shapes and dtypes are trusted by every check after this: verify them once. */
    private void checkParameterSpecs() {
        try (NDManager scope = manager.newSubManager()) {
            List<?> values = (List<?>) invoke(Protocol.GET_PARAMETERS, scope);
            List<Metadata.TensorSpec> specs = metadata.getParameters();
            for (int i = 0; i < specs.size(); i++) {
                Metadata.TensorSpec spec = specs.get(i);
                NDArray value = (NDArray) values.get(i);
                String dtype = Tensors.dtypeName(value);
                long[] shape = value.getShape().getShape();
                if (!spec.getDtype().equals(dtype) || !Arrays.equals(spec.getShape(), shape)) {
                    throw new ProtocolException(
                            Messages.parameterMismatch(
                                    path.toString(), spec.getName(),
                                    spec.getDtype() + " " + Arrays.toString(spec.getShape()),
                                    dtype + " " + Arrays.toString(shape)));
                }
            }
        }
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
        Path file = path.toAbsolutePath();
        if (!Files.isRegularFile(file)) {
            throw new ModuleLoadException(
                    "no training module at " + file + " (file not found). Export one with"
                            + " `gradbridge export linear-regression -o " + path + "`.");
        }
        Metadata metadata = Metadata.read(file);
        String engineVersion = ScriptedModule.engine().getVersion();
        if (!engineVersion.equals(metadata.getTorchVersion())) {
            logger.warn(
                    "{} was exported with torch {} but libtorch here is {}; results may differ",
                    file, metadata.getTorchVersion(), engineVersion);
        }
        OperatorLibraries.load(opLibraries);
        ScriptedModule scripted;
        try {
            scripted = ScriptedModule.load(file);
        } catch (EngineException e) {
            String operator = OperatorLibraries.missingOperator(metadata, e);
            if (operator != null) {
                throw new ModuleLoadException(Messages.missingCustomOp(file.toString(), operator), e);
            }
            throw new ModuleLoadException(
                    "libtorch cannot load " + file + ": " + ScriptedModule.libtorchSummary(e), e);
        }
        try {
            return new TrainingModule(file, metadata, scripted);
        } catch (RuntimeException e) {
            scripted.close();
            throw e;
        }
    }

    /** @return the absolute path the module was loaded from */
    public Path getPath() {
        return path;
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
     * The module's NDManager: create inputs in a sub-manager of it and close that when done.
     *
     * @return the manager that owns the module
     */
    public NDManager getManager() {
        return manager;
    }

    /**
     * Runs {@code forward(x)}.
     *
     * @param x input matching the metadata's {@code x} spec
     * @return predictions, attached to {@code x}'s manager
     */
    public NDArray forward(NDArray x) {
        try (ThreadGuard.Use use = use()) {
            checkTensor("x", x);
            return (NDArray) invoke(Protocol.FORWARD, x.getManager(), x);
        }
    }

    /**
     * Runs {@code calculate_loss_and_backward(x, y)}: forward, loss, backward; gradients add up.
     *
     * @param x inputs matching the metadata's {@code x} spec
     * @param y targets matching the metadata's {@code y} spec, same batch size as {@code x}
     * @return the loss, exactly (float32 widened to double)
     * @throws InvalidInputException when x or y do not match the metadata; nothing ran
     */
    public double calculateLossAndBackward(NDArray x, NDArray y) {
        try (ThreadGuard.Use use = use()) {
            return scalarLoss(Protocol.CALCULATE_LOSS_AND_BACKWARD, x, y);
        }
    }

    /**
     * Runs {@code train_step(x, y)}: zero_grad, loss and backward, one optimizer step.
     *
     * @param x inputs matching the metadata's {@code x} spec
     * @param y targets matching the metadata's {@code y} spec
     * @return the loss computed before the step
     * @throws InvalidInputException when x or y do not match the metadata; nothing ran
     */
    public double trainStep(NDArray x, NDArray y) {
        try (ThreadGuard.Use use = use()) {
            return scalarLoss(Protocol.TRAIN_STEP, x, y);
        }
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
    public double[] trainEpoch(NDArray x, NDArray y, NDArray perm, int batchSize) {
        try (ThreadGuard.Use use = use()) {
            long n = checkBatch(Protocol.TRAIN_EPOCH, x, y);
            if (perm.getDataType() != DataType.INT64 || perm.getShape().dimension() != 1) {
                throw new InvalidInputException(
                        Protocol.TRAIN_EPOCH + ": perm must be a 1-d int64 array, got "
                                + perm.getDataType() + " " + perm.getShape());
            }
            if (batchSize < 1 || batchSize > n) {
                throw new InvalidInputException(
                        Protocol.TRAIN_EPOCH + ": batch size must be in 1.." + n + ", got " + batchSize);
            }
            for (long index : perm.toLongArray()) {
                if (index < 0 || index >= n) {
                    throw new InvalidInputException(
                            Protocol.TRAIN_EPOCH + ": perm holds index " + index + ", outside 0.." + (n - 1));
                }
            }
            try (NDArray losses = (NDArray) invoke(Protocol.TRAIN_EPOCH, manager, x, y, perm, (long) batchSize)) {
                return Tensors.exactDoubles(losses);
            }
        }
    }

    /**
     * Runs {@code evaluate(x, y)} in eval mode (BatchNorm uses running statistics, dropout is
     * off), then returns the module to training mode.
     *
     * @param x inputs matching the metadata's {@code x} spec
     * @param y targets matching the metadata's {@code y} spec
     * @return the loss, without gradients
     */
    public double evaluate(NDArray x, NDArray y) {
        try (ThreadGuard.Use use = use()) {
            scripted.setTraining(false);
            try {
                return scalarLoss(Protocol.EVALUATE, x, y);
            } finally {
                scripted.setTraining(true);
            }
        }
    }

    private double scalarLoss(String method, NDArray x, NDArray y) {
        checkBatch(method, x, y);
        // The hot path of training: one result tensor, closed here, no per-call sub-manager.
        try (NDArray loss = (NDArray) invoke(method, manager, x, y)) {
            return Tensors.exactDouble(loss);
        }
    }

    /** Checks x and y against the metadata and each other; returns the number of samples. */
    private long checkBatch(String method, NDArray x, NDArray y) {
        checkTensor("x", x);
        checkTensor("y", y);
        long n = x.getShape().get(0);
        if (n != y.getShape().get(0)) {
            throw new InvalidInputException(
                    method + ": x has " + n + " samples but y has " + y.getShape().get(0));
        }
        return n;
    }

    /** Runs {@code zero_grad()}. */
    public void zeroGrad() {
        try (ThreadGuard.Use use = use()) {
            invoke(Protocol.ZERO_GRAD, manager);
        }
    }

    /**
     * Runs {@code sgd_step(lr)}: {@code p -= lr * grad} (torch.optim.SGD's op), then zeroes grads.
     *
     * @param lr learning rate, positive and finite
     */
    public void sgdStep(double lr) {
        try (ThreadGuard.Use use = use()) {
            if (!(lr > 0) || Double.isInfinite(lr)) {
                throw new InvalidInputException(Protocol.SGD_STEP + ": invalid learning rate " + lr);
            }
            invoke(Protocol.SGD_STEP, manager, lr);
        }
    }

    /** Runs {@code optimizer_step()}: one step of the exported optimizer; consumes the gradients. */
    public void optimizerStep() {
        try (ThreadGuard.Use use = use()) {
            invoke(Protocol.OPTIMIZER_STEP, manager);
        }
    }

    /** @return the exported optimizer's current learning rate */
    public double getLr() {
        try (ThreadGuard.Use use = use()) {
            return (Double) invoke(Protocol.GET_LR, manager);
        }
    }

    /**
     * Sets the exported optimizer's learning rate.
     *
     * @param lr the new rate, non-negative and finite
     */
    public void setLr(double lr) {
        try (ThreadGuard.Use use = use()) {
            if (!(lr >= 0) || Double.isInfinite(lr)) {
                throw new InvalidInputException(Protocol.SET_LR + ": invalid learning rate " + lr);
            }
            invoke(Protocol.SET_LR, manager, lr);
        }
    }

    /**
     * Every parameter group's learning rate, in group order (one group unless the export has
     * parameter groups); a module exported without {@code get_lrs} gives {@code [getLr()]}.
     *
     * @return the learning rates
     */
    public double[] getLrs() {
        try (ThreadGuard.Use use = use()) {
            if (!methodNames.contains(Protocol.GET_LRS)) {
                return new double[] {(Double) invoke(Protocol.GET_LR, manager)};
            }
            List<?> values = (List<?>) invoke(Protocol.GET_LRS, manager);
            double[] lrs = new double[values.size()];
            for (int i = 0; i < lrs.length; i++) {
                lrs[i] = (Double) values.get(i);
            }
            return lrs;
        }
    }

    /**
     * Sets one parameter group's learning rate ({@link #setLr(double)} sets every group's).
     *
     * @param group the group's index, in the order of {@link #getLrs()}
     * @param lr the new rate, non-negative and finite
     */
    public void setLr(int group, double lr) {
        try (ThreadGuard.Use use = use()) {
            if (!(lr >= 0) || Double.isInfinite(lr)) {
                throw new InvalidInputException(Protocol.SET_GROUP_LR + ": invalid learning rate " + lr);
            }
            int groups = getLrs().length;
            if (group < 0 || group >= groups) {
                throw new InvalidInputException(
                        Protocol.SET_GROUP_LR + ": no parameter group " + group + "; the module has " + groups);
            }
            if (!methodNames.contains(Protocol.SET_GROUP_LR)) {
                invoke(Protocol.SET_LR, manager, lr);
                return;
            }
            invoke(Protocol.SET_GROUP_LR, manager, (long) group, lr);
        }
    }

    /**
     * The end-of-epoch schedule step ({@code schedule_epoch}): a per-epoch schedule steps,
     * ReduceLROnPlateau steps on {@code metric}; nothing for per-step or no schedule.
     *
     * @param metric the epoch's validation loss, or its training loss without validation data
     */
    public void scheduleEpoch(double metric) {
        try (ThreadGuard.Use use = use()) {
            if (methodNames.contains(Protocol.SCHEDULE_EPOCH)) {
                invoke(Protocol.SCHEDULE_EPOCH, manager, metric);
            }
        }
    }

    /** @return current parameter values by name (flattened, exact), in protocol order */
    public Map<String, double[]> getParameters() {
        try (ThreadGuard.Use use = use()) {
            return namedValues(Protocol.GET_PARAMETERS, parameterNames);
        }
    }

    /** @return accumulated gradients by name (flattened, exact), in protocol order */
    public Map<String, double[]> getGradients() {
        try (ThreadGuard.Use use = use()) {
            return namedValues(Protocol.GET_GRADIENTS, parameterNames);
        }
    }

    /** @return buffer values by name (flattened, exact), in protocol order */
    public Map<String, double[]> getBuffers() {
        try (ThreadGuard.Use use = use()) {
            return namedValues(Protocol.GET_BUFFERS, bufferNames);
        }
    }

    /**
     * Runs {@code set_parameters}: replaces every parameter's values.
     *
     * @param values flattened values by parameter name; every parameter, each with as many
     *     values as its shape holds
     * @throws InvalidInputException when a name is missing or a count is wrong; nothing changed
     */
    public void setParameters(Map<String, double[]> values) {
        try (ThreadGuard.Use use = use()) {
            if (!values.keySet().equals(new LinkedHashSet<>(parameterNames))) {
                throw new InvalidInputException(
                        Protocol.SET_PARAMETERS + ": expected values for " + parameterNames + ", got "
                                + values.keySet());
            }
            try (NDManager scope = manager.newSubManager()) {
                List<NDArray> tensors = new ArrayList<>();
                for (Metadata.TensorSpec spec : metadata.getParameters()) {
                    double[] data = values.get(spec.getName());
                    Shape shape = new Shape(spec.getShape());
                    if (data.length != shape.size()) {
                        throw new InvalidInputException(
                                Protocol.SET_PARAMETERS + ": " + spec.getName() + " needs " + shape.size()
                                        + " values for shape " + shape + ", got " + data.length);
                    }
                    DataType dtype = DataType.valueOf(spec.getDtype().toUpperCase(Locale.ROOT));
                    tensors.add(scope.create(data, shape).toType(dtype, false));
                }
                invoke(Protocol.SET_PARAMETERS, scope, tensors);
            }
        }
    }

    /**
     * Returns the optimizer's per-parameter state (torch.optim's keys, e.g. {@code exp_avg}).
     *
     * @return state key to one flattened array per parameter, in protocol order
     */
    public Map<String, List<double[]>> getOptimizerState() {
        try (ThreadGuard.Use use = use();
                NDManager scope = manager.newSubManager()) {
            Map<?, ?> state = (Map<?, ?>) invoke(Protocol.OPTIMIZER_STATE, scope);
            Map<String, List<double[]>> converted = new TreeMap<>();
            for (Map.Entry<?, ?> entry : state.entrySet()) {
                List<double[]> arrays = new ArrayList<>();
                for (Object tensor : (List<?>) entry.getValue()) {
                    arrays.add(Tensors.exactDoubles((NDArray) tensor));
                }
                converted.put((String) entry.getKey(), arrays);
            }
            return converted;
        }
    }

    /**
     * Saves the module as it is now (parameters, buffers, optimizer state, learning rate) as a
     * TorchScript archive, atomically, with its metadata plus a {@code checkpoint} entry that lets
     * {@link Trainer} resume the run. The file loads with {@code torch.jit.load} too.
     *
     * @param target the .pt to write; replaced only once the new file is complete
     * @param checkpoint epochs trained so far, and the run's settings and data
     * @throws IOException when the folder cannot be written
     */
    public void saveCheckpoint(Path target, Metadata.Checkpoint checkpoint) throws IOException {
        try (ThreadGuard.Use use = use()) {
            CheckpointWriter.write(scripted, metadata.withCheckpoint(checkpoint), target);
        }
    }

    /**
     * Runs any scripted method by name, with autograd on.
     *
     * <p>Arguments: {@link NDArray} (PyTorch engine), {@link Double}/{@link Float}, {@link
     * Long}/{@link Integer}, {@link Boolean}, {@link String}, or a {@link List} of NDArrays.
     * Results: {@code null}, NDArray (attached to this module's manager: close it), Double, Long,
     * Boolean, String, or a List or String-keyed Map of these.
     *
     * @param method the method name
     * @param args the arguments
     * @return the converted result
     * @throws ProtocolException when the module has no such method
     * @throws MethodCallException when the method fails inside libtorch
     */
    public Object call(String method, Object... args) {
        try (ThreadGuard.Use use = use()) {
            return invoke(method, manager, args);
        }
    }

    /** The thread guard every public call holds; {@link Trainer} holds it for a whole run. */
    ThreadGuard.Use use() {
        return guard.enter();
    }

    private Object invoke(String method, NDManager resultManager, Object... args) {
        return scripted.invoke(method, resultManager, args);
    }

    private Map<String, double[]> namedValues(String method, List<String> names) {
        try (NDManager scope = manager.newSubManager()) {
            List<?> values = (List<?>) invoke(method, scope);
            Map<String, double[]> named = new LinkedHashMap<>();
            for (int i = 0; i < names.size(); i++) {
                NDArray value = (NDArray) values.get(i);
                named.put(names.get(i), Tensors.exactDoubles(value));
            }
            return named;
        }
    }

    private List<String> stringList(String method) {
        List<?> values = (List<?>) invoke(method, manager);
        List<String> strings = new ArrayList<>(values.size());
        for (Object value : values) {
            strings.add((String) value);
        }
        return strings;
    }

    private void checkTensor(String name, NDArray array) {
        if (!ScriptedModule.isTorchArray(array)) {
            throw new InvalidInputException(
                    name + ": expected an NDArray of DJL's PyTorch engine, got "
                            + (array == null ? "null" : array.getClass().getName()));
        }
        Tensors.checkSpec(path.getFileName().toString(), "input " + name, array, metadata.getInput(name), true);
    }

    /** Frees the module and every tensor attached to its manager. Idempotent. */
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
