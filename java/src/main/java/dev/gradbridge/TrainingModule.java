package dev.gradbridge;

import dev.gradbridge.internal.AtomicFiles;
import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.ModuleAccess;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.LongBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.function.Supplier;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

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

    private static final Logger logger = LoggerFactory.getLogger(TrainingModule.class);

    static {
        ModuleAccess.register(new ModuleAccessCalls());
    }

    final Path path;
    final Metadata metadata;
    final ModuleEngine scripted;
    private final Set<String> methodNames;
    private boolean evalOnly; // a predictor: eval mode for good (keepEvalMode); read under the thread guard
    private final List<String> parameterNames;
    private final List<String> bufferNames;
    private final ThreadGuard guard;
    private final Map<String, Tensors.SpecCheck> inputChecks = new LinkedHashMap<>();
    private final Tensors.SpecCheck yCheck;
    private final List<String> inputNames;

    TrainingModule(Path path, Metadata metadata, ModuleEngine scripted) {
        this.path = path;
        this.metadata = metadata;
        this.scripted = scripted;
        this.methodNames = scripted.methodNames();
        this.guard = new ThreadGuard(path.toString());
        this.yCheck = specCheck(metadata, "y");
        this.inputNames = metadata.getInputNames();
        for (String name : inputNames) {
            inputChecks.put(name, specCheck(metadata, name));
        }
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

    /** The allocation-free check of an input, or null when the metadata lacks it (then every call fails). */
    private static Tensors.SpecCheck specCheck(Metadata metadata, String name) {
        for (Metadata.TensorSpec spec : metadata.getInputs()) {
            if (spec.getName().equals(name)) {
                return new Tensors.SpecCheck(spec);
            }
        }
        return null;
    }

    /** The metadata's shapes and dtypes are trusted by every check after this: verify them once. */
    private void checkParameterSpecs() {
        List<?> values = (List<?>) invoke(Protocol.GET_PARAMETERS);
        try {
            List<Metadata.TensorSpec> specs = metadata.getParameters();
            for (int i = 0; i < specs.size(); i++) {
                Metadata.TensorSpec spec = specs.get(i);
                Tensor value = (Tensor) values.get(i);
                String dtype = value.dtype().torchName();
                long[] shape = value.shape();
                if (!spec.getDtype().equals(dtype) || !Arrays.equals(spec.getShape(), shape) && !FrozenSharing.leftOut(spec, shape)) {
                    throw new ProtocolException(
                            Messages.parameterMismatch(
                                    path.toString(), spec.getName(),
                                    spec.getDtype() + " " + Arrays.toString(spec.getShape()),
                                    dtype + " " + Arrays.toString(shape)));
                }
            }
        } finally {
            Tensors.closeAll(values);
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

    /**
     * {@link #load(Path, List)} onto a device ({@link #load(Path, String)}).
     *
     * @param path the .pt written by {@code gradbridge export}
     * @param opLibraries operator libraries to load first
     * @param device {@code cpu}, {@code cuda} or {@code cuda:N}
     * @return the module, in training mode
     */
    public static TrainingModule load(Path path, List<Path> opLibraries, String device) {
        String on = Devices.canonical(device);
        Path file = path.toAbsolutePath();
        if (!Files.isRegularFile(file)) {
            throw new ModuleLoadException(
                    "no training module at " + file + " (file not found). Export one with"
                            + " `gradbridge export linear-regression -o " + path + "`.");
        }
        Metadata metadata = Metadata.read(file);
        NativeLibrary.requireDevice(on); // before libtorch's first use: a CUDA device loads its CUDA libraries
        String engineVersion = ModuleEngine.engineVersion();
        if (metadata.getProtocolVersion() == Protocol.EXPORT_VERSION
                && !minorRelease(engineVersion).equals(minorRelease(metadata.getTorchVersion()))) {
            // op lists hold the ops one torch release's autograd and export chose: another release's kernels
            // and formulas are not bitwise with it
            throw new ModuleLoadException(Messages.protocol3OtherTorch(file.toString(), metadata.getTorchVersion(),
                    engineVersion));
        }
        if (!engineVersion.equals(metadata.getTorchVersion())) {
            logger.warn(
                    "{} was exported with torch {} but libtorch here is {}; results may differ",
                    file, metadata.getTorchVersion(), engineVersion);
        }
        OperatorLibraries.load(opLibraries);
        ModuleEngine scripted;
        try {
            scripted = ModuleEngine.load(file, metadata, on);
        } catch (NativeException e) {
            String operator = OperatorLibraries.missingOperator(metadata, e);
            if (operator != null) {
                throw new ModuleLoadException(Messages.missingCustomOp(file.toString(), operator), e);
            }
            throw new ModuleLoadException(
                    "libtorch cannot load " + file + ": " + ModuleEngine.libtorchSummary(e), e);
        }
        try {
            return new TrainingModule(file, metadata, scripted);
        } catch (RuntimeException e) {
            scripted.close();
            throw e;
        }
    }

    /** {@code 2.15} of {@code 2.15.0+cpu}. */
    private static String minorRelease(String version) {
        String[] parts = String.valueOf(version).split("[.+]");
        return parts.length < 2 ? String.valueOf(version) : parts[0] + "." + parts[1];
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
        return inputNames;
    }

    /**
     * Runs {@code forward(x)} in eval mode (predictions, as eager {@code model.eval(); model(x)}:
     * no dropout, BatchNorm's running statistics), then returns the module to training mode.
     *
     * @param x input matching the metadata's {@code x} spec
     * @return predictions, a new tensor the caller closes
     */
    public Tensor forward(Tensor x) {
        return forward(single(Protocol.FORWARD, x));
    }

    /**
     * {@link #forward(Tensor)} for a model of several inputs (or {@code {x: tensor}}).
     *
     * @param x each of {@link #getInputNames()} by name, matching its spec, the same batch size
     * @return predictions, a new tensor the caller closes
     * @throws InvalidInputException naming the input that is missing, unknown or does not match
     */
    public Tensor forward(Map<String, Tensor> x) {
        try (ThreadGuard.Use use = use()) {
            Object argument = argument(Protocol.FORWARD, x, null, false);
            return inEvalMode(() -> (Tensor) invoke(Protocol.FORWARD, argument));
        }
    }

    /**
     * Runs {@code forward(x)} in eval mode without autograd, as eager PyTorch under {@code torch.no_grad()}:
     * the same values as {@link #forward}, without recording a graph for a backward (serving).
     *
     * @param x input matching the metadata's {@code x} spec
     * @return predictions, a new tensor the caller closes
     */
    public Tensor predict(Tensor x) {
        return predict(single(Protocol.FORWARD, x));
    }

    /**
     * {@link #predict(Tensor)} for a model of several inputs (or {@code {x: tensor}}).
     *
     * @param x each of {@link #getInputNames()} by name, matching its spec, the same batch size
     * @return predictions, a new tensor the caller closes
     */
    public Tensor predict(Map<String, Tensor> x) {
        try (ThreadGuard.Use use = use()) {
            Object argument = argument(Protocol.FORWARD, x, null, false);
            if (argument instanceof Tensor) {
                return inEvalMode(() -> scripted.infer(Protocol.FORWARD, (Tensor) argument));
            }
            return inEvalMode(() -> (Tensor) invoke(Protocol.FORWARD, argument));
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
    public double calculateLossAndBackward(Tensor x, Tensor y) {
        return calculateLossAndBackward(single(Protocol.CALCULATE_LOSS_AND_BACKWARD, x), y);
    }

    /**
     * {@link #calculateLossAndBackward(Tensor, Tensor)} for a model of several inputs (or {@code {x: tensor}}).
     *
     * @param x each of {@link #getInputNames()} by name, matching its spec, the same batch size
     * @param y targets matching the metadata's {@code y} spec, as many samples
     * @return the loss, exactly (float32 widened to double)
     */
    public double calculateLossAndBackward(Map<String, Tensor> x, Tensor y) {
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
    public double trainStep(Tensor x, Tensor y) {
        return trainStep(single(Protocol.TRAIN_STEP, x), y);
    }

    /**
     * {@link #trainStep(Tensor, Tensor)} for a model of several inputs (or {@code {x: tensor}}).
     *
     * @param x each of {@link #getInputNames()} by name, matching its spec, the same batch size
     * @param y targets matching the metadata's {@code y} spec, as many samples
     * @return the loss computed before the step
     */
    public double trainStep(Map<String, Tensor> x, Tensor y) {
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
    public double[] trainEpoch(Tensor x, Tensor y, Tensor perm, int batchSize) {
        return trainEpoch(single(Protocol.TRAIN_EPOCH, x), y, perm, batchSize);
    }

    /**
     * {@link #trainEpoch(Tensor, Tensor, Tensor, int)} for a model of several inputs (or {@code {x: tensor}}).
     *
     * @param x each of {@link #getInputNames()} by name: all inputs of the epoch
     * @param y all targets of the epoch
     * @param perm int64 sample order, a permutation of (a subset of) {@code 0..n-1}
     * @param batchSize samples per batch, 1..n; the last batch may be smaller
     * @return the loss of each batch
     */
    public double[] trainEpoch(Map<String, Tensor> x, Tensor y, Tensor perm, int batchSize) {
        try (ThreadGuard.Use use = use()) {
            Object argument = argument(Protocol.TRAIN_EPOCH, x, y, true);
            long n = rows(argument);
            if (perm == null || perm.isClosed()) {
                throw new InvalidInputException(Protocol.TRAIN_EPOCH + ": perm: expected a Tensor, got "
                        + (perm == null ? "null" : "a closed one"));
            }
            if (perm.dtype() != DType.INT64 || perm.dim() != 1) {
                throw new InvalidInputException(
                        Protocol.TRAIN_EPOCH + ": perm must be a 1-d int64 array, got "
                                + perm.dtype() + " " + Tensors.shapeText(perm.dims()));
            }
            if (batchSize < 1 || batchSize > n) {
                throw new InvalidInputException(
                        Protocol.TRAIN_EPOCH + ": " + Messages.batchSize(n, batchSize));
            }
            if (perm.size(0) > 0) { // range read from perm's memory: no copy into Java
                long[] range = minMax(perm);
                if (range[0] < 0 || range[1] >= n) {
                    throw new InvalidInputException(
                            Protocol.TRAIN_EPOCH + ": perm holds index " + (range[0] < 0 ? range[0] : range[1])
                                    + ", outside 0.." + (n - 1));
                }
            }
            if (argument instanceof Tensor) {
                return scripted.invokeToDoubles(Protocol.TRAIN_EPOCH, (Tensor) argument, y, perm, batchSize);
            }
            try (Tensor losses = (Tensor) invoke(Protocol.TRAIN_EPOCH, argument, y, perm, (long) batchSize)) {
                return losses.toExactDoubles();
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
    public double evaluate(Tensor x, Tensor y) {
        return evaluate(single(Protocol.EVALUATE, x), y);
    }

    /**
     * {@link #evaluate(Tensor, Tensor)} for a model of several inputs (or {@code {x: tensor}}).
     *
     * @param x each of {@link #getInputNames()} by name, matching its spec, the same batch size
     * @param y targets matching the metadata's {@code y} spec, as many samples
     * @return the loss, without gradients
     */
    public double evaluate(Map<String, Tensor> x, Tensor y) {
        try (ThreadGuard.Use use = use()) {
            return inEvalMode(() -> scalarLoss(Protocol.EVALUATE, x, y));
        }
    }

    /**
     * From now on the module stays in eval mode (a predictor, which never trains): {@link #forward},
     * {@link #predict} and {@link #evaluate} no longer switch modes around each call (two calls into
     * the engine per prediction).
     */
    void keepEvalMode() {
        try (ThreadGuard.Use use = use()) {
            scripted.setTraining(false);
            evalOnly = true;
        }
    }

    /** Runs {@code call} with the module in eval mode, then returns it to training mode (unless it stays in eval). */
    private <T> T inEvalMode(Supplier<T> call) {
        if (evalOnly) {
            return call.get();
        }
        scripted.setTraining(false);
        try {
            return call.get();
        } finally {
            scripted.setTraining(true);
        }
    }

    private double scalarLoss(String method, Map<String, Tensor> x, Tensor y) {
        Object argument = argument(method, x, y, true);
        if (argument instanceof Tensor) {
            return scripted.invokeToDouble(method, (Tensor) argument, y); // the hot path: see ModuleEngine
        }
        try (Tensor loss = (Tensor) invoke(method, argument, y)) {
            return loss.toExactDoubles()[0];
        }
    }

    /** A one-tensor call's input as the map the named path takes; refused for a model of several inputs. */
    private Map<String, Tensor> single(String method, Tensor x) {
        if (!inputNames.equals(Collections.singletonList("x"))) {
            throw new InvalidInputException(Messages.namedInputsNeeded(method, inputNames));
        }
        return Collections.singletonMap("x", x);
    }

    /**
     * The inputs as the scripted method takes them, after checking them against the metadata and
     * each other: the tensor {@code x} for a model of one input, else the list of the named inputs
     * in metadata order. With {@code target}, {@code y} is checked too, with as many samples.
     */
    private Object argument(String method, Map<String, Tensor> x, Tensor y, boolean target) {
        if (x == null) {
            throw new InvalidInputException(method + ": inputs: expected a map of " + inputNames + ", got null");
        }
        for (String name : x.keySet()) {
            if (!inputNames.contains(name)) {
                throw new InvalidInputException(Messages.unknownInput(method, String.valueOf(name), inputNames));
            }
        }
        List<Tensor> tensors = new ArrayList<>(inputNames.size());
        String first = inputNames.get(0);
        for (String name : inputNames) {
            Tensor tensor = x.get(name);
            if (tensor == null && !x.containsKey(name)) {
                throw new InvalidInputException(Messages.missingInput(method, name, inputNames));
            }
            checkTensor(name, tensor);
            if (!tensors.isEmpty() && tensor.size(0) != tensors.get(0).size(0)) {
                throw new InvalidInputException(method + ": " + first + " has " + tensors.get(0).size(0)
                        + " samples but " + name + " has " + tensor.size(0));
            }
            tensors.add(tensor);
        }
        long n = tensors.get(0).size(0);
        if (target) {
            checkTensor("y", y);
            if (n != y.size(0)) {
                throw new InvalidInputException(method + ": " + first + " has " + n + " samples but y has " + y.size(0));
            }
        }
        return metadata.hasNamedInputs() ? tensors : tensors.get(0);
    }

    /** The batch size of a checked {@link #argument}. */
    private static long rows(Object argument) {
        return (argument instanceof Tensor ? (Tensor) argument : (Tensor) ((List<?>) argument).get(0)).size(0);
    }

    /** Checks x and y against the metadata and each other; returns the number of samples. */
    long checkBatch(String method, Tensor x, Tensor y) {
        return rows(argument(method, single(method, x), y, true));
    }

    /** Runs {@code zero_grad()}. */
    public void zeroGrad() {
        try (ThreadGuard.Use use = use()) {
            invoke(Protocol.ZERO_GRAD);
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
            invoke(Protocol.SGD_STEP, lr);
        }
    }

    /** Runs {@code optimizer_step()}: one step of the exported optimizer; consumes the gradients. */
    public void optimizerStep() {
        try (ThreadGuard.Use use = use()) {
            invoke(Protocol.OPTIMIZER_STEP);
        }
    }

    /** @return the exported optimizer's current learning rate */
    public double getLr() {
        try (ThreadGuard.Use use = use()) {
            return (Double) invoke(Protocol.GET_LR);
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
            invoke(Protocol.SET_LR, lr);
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
                return new double[] {(Double) invoke(Protocol.GET_LR)};
            }
            List<?> values = (List<?>) invoke(Protocol.GET_LRS);
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
                invoke(Protocol.SET_LR, lr);
                return;
            }
            invoke(Protocol.SET_GROUP_LR, (long) group, lr);
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
                invoke(Protocol.SCHEDULE_EPOCH, metric);
            }
        }
    }

    /** @return current parameter values by name (flattened, exact), in protocol order */
    public Map<String, double[]> getParameters() {
        try (ThreadGuard.Use use = use()) {
            return namedValues(Protocol.GET_PARAMETERS, parameterNames);
        }
    }

    /**
     * One {@code get_parameters} call for an epoch's record: each parameter's digest hashed from the
     * tensor's own bytes, and its exact values (float64, in a direct buffer) only into {@code values}
     * when that is not null. A record then copies no parameter into a Java array (widening every value
     * to a Java double[] and back to bytes cost ~0.2 s an epoch on a 1.5M-parameter model).
     */
    void readParameters(Map<String, String> digests, Map<String, ByteBuffer> values) {
        try (ThreadGuard.Use use = use()) {
            List<?> tensors = (List<?>) invoke(Protocol.GET_PARAMETERS);
            try {
                List<Metadata.TensorSpec> specs = metadata.getParameters();
                for (int i = 0; i < specs.size(); i++) {
                    Tensor tensor = (Tensor) tensors.get(i);
                    String name = specs.get(i).getName();
                    digests.put(name, History.digest(tensor, specs.get(i).getDtype()));
                    if (values != null) {
                        values.put(name, tensor.exactDoubleBuffer());
                    }
                }
            } finally {
                Tensors.closeAll(tensors);
            }
        }
    }

    /** @return accumulated gradients by name (flattened, exact), in protocol order */
    public Map<String, double[]> getGradients() {
        try (ThreadGuard.Use use = use()) {
            return namedValues(Protocol.GET_GRADIENTS, parameterNames);
        }
    }

    /**
     * @return whether every gradient is finite (no NaN, no infinity), decided in libtorch without
     *     copying the gradients out
     */
    public boolean gradientsFinite() {
        try (ThreadGuard.Use use = use()) {
            return scripted.allFinite(Protocol.GET_GRADIENTS);
        }
    }

    /**
     * @return whether every parameter and every tensor of the optimizer's state is finite, decided
     *     in libtorch without copying them out (the online learner's check after an update)
     */
    public boolean stateFinite() {
        try (ThreadGuard.Use use = use()) {
            return scripted.allFinite(Protocol.GET_PARAMETERS) && scripted.allFinite(Protocol.OPTIMIZER_STATE);
        }
    }

    /** @return buffer values by name (flattened, exact), in protocol order */
    public Map<String, double[]> getBuffers() {
        try (ThreadGuard.Use use = use()) {
            return namedValues(Protocol.GET_BUFFERS, bufferNames);
        }
    }

    /** @return the values of the buffers a training step writes, by name (flattened, exact), in protocol order */
    public Map<String, double[]> getTrainedBuffers() {
        return getState(metadata.getTrainedBufferNames(), Protocol.GET_BUFFERS, bufferNames);
    }

    /**
     * @return the values of the parameters that train, by name (flattened, exact), in protocol order; the
     *     frozen rest is not copied (a LoRA model's base)
     */
    public Map<String, double[]> getTrainableParameters() {
        return getState(metadata.getTrainableParameterNames(), Protocol.GET_PARAMETERS, parameterNames);
    }

    /** Named values through {@code get_state}, or in older modules all of {@code whole}'s then those wanted. */
    private Map<String, double[]> getState(List<String> wanted, String whole, List<String> wholeNames) {
        if (wanted.isEmpty()) {
            return new LinkedHashMap<>();
        }
        try (ThreadGuard.Use use = use()) {
            if (!methodNames.contains(Protocol.GET_STATE)) {
                return namedValues(whole, wholeNames, new LinkedHashSet<>(wanted));
            }
            return namedValues(Protocol.GET_STATE, wanted, null, wanted);
        }
    }

    /**
     * Runs {@code set_state}: copies values into the named parameters and buffers, any of them (a
     * published version's trainable parameters and trained buffers: the frozen rest stays), checked
     * whole before anything changes.
     *
     * @param values flattened values by parameter or buffer name
     * @throws InvalidInputException when a name is unknown or a count is wrong; nothing changed
     * @throws ProtocolException when the module was exported before {@code set_state} existed
     */
    public void setState(Map<String, double[]> values) {
        if (values.isEmpty()) {
            return;
        }
        try (ThreadGuard.Use use = use()) {
            if (!methodNames.contains(Protocol.SET_STATE)) {
                throw new ProtocolException(path + " has no method " + Protocol.SET_STATE
                        + " (exported by an older gradbridge): export the model again");
            }
            Map<String, Metadata.TensorSpec> byName = new LinkedHashMap<>();
            for (Metadata.TensorSpec spec : metadata.getParameters()) {
                byName.put(spec.getName(), spec);
            }
            for (Metadata.TensorSpec spec : metadata.getBuffers()) {
                byName.put(spec.getName(), spec);
            }
            List<String> names = new ArrayList<>();
            List<Tensor> tensors = new ArrayList<>();
            try {
                for (Map.Entry<String, double[]> entry : values.entrySet()) {
                    Metadata.TensorSpec spec = byName.get(entry.getKey());
                    if (spec == null) {
                        throw new InvalidInputException(Protocol.SET_STATE + ": no parameter or buffer " + entry.getKey()
                                + "; the module's: " + byName.keySet());
                    }
                    names.add(entry.getKey());
                    tensors.add(Tensor.ofDoubles(DType.of(spec.getDtype()), entry.getValue(), spec.getShape()));
                }
                invoke(Protocol.SET_STATE, names, tensors);
            } finally {
                Tensors.closeAll(tensors);
            }
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
            List<Tensor> tensors = new ArrayList<>();
            try {
                for (Metadata.TensorSpec spec : metadata.getParameters()) {
                    double[] data = values.get(spec.getName());
                    long[] shape = spec.getShape();
                    long size = 1;
                    for (long dim : shape) {
                        size *= dim;
                    }
                    if (data.length != size) {
                        throw new InvalidInputException(
                                Protocol.SET_PARAMETERS + ": " + spec.getName() + " needs " + size
                                        + " values for shape " + Tensors.shapeText(shape) + ", got " + data.length);
                    }
                    tensors.add(Tensor.ofDoubles(DType.of(spec.getDtype()), data, shape));
                }
                invoke(Protocol.SET_PARAMETERS, tensors);
            } finally {
                Tensors.closeAll(tensors);
            }
        }
    }

    /**
     * Returns the optimizer's per-parameter state (torch.optim's keys, e.g. {@code exp_avg}).
     *
     * @return state key to one flattened array per parameter, in protocol order (empty where torch.optim
     *     holds none yet: SGD's {@code momentum_buffer} before a parameter's first step, which is left out
     *     while no parameter has one)
     */
    public Map<String, List<double[]>> getOptimizerState() {
        try (ThreadGuard.Use use = use()) {
            Map<?, ?> state = (Map<?, ?>) invoke(Protocol.OPTIMIZER_STATE);
            try {
                Map<String, List<double[]>> converted = new TreeMap<>();
                for (Map.Entry<?, ?> entry : state.entrySet()) {
                    List<double[]> arrays = new ArrayList<>();
                    for (Object tensor : (List<?>) entry.getValue()) {
                        arrays.add(((Tensor) tensor).toExactDoubles());
                    }
                    converted.put((String) entry.getKey(), arrays);
                }
                return converted;
            } finally {
                for (Object tensors : state.values()) {
                    Tensors.closeAll((List<?>) tensors);
                }
            }
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
        AtomicFiles.write(target, tmp -> ModuleAccessCalls.archive(this, checkpoint, tmp)); // tensor by tensor
    }

    /**
     * Runs any scripted method by name, with autograd on.
     *
     * <p>Arguments: {@link Tensor}, {@link Double}/{@link Float}, {@link Long}/{@link Integer},
     * {@link Boolean}, {@link String}, {@code null} (None), a {@link List} of one of these (an
     * empty list is a tensor list), or a String-keyed {@link Map} of tensor lists (what
     * {@code load_optimizer_state} takes). Results: {@code null}, Tensor (new: the caller closes
     * it), Double, Long, Boolean, String, or a List (also for tuples) or String-keyed Map of these.
     *
     * @param method the method name
     * @param args the arguments
     * @return the converted result
     * @throws ProtocolException when the module has no such method
     * @throws MethodCallException when the method fails inside libtorch
     */
    public Object call(String method, Object... args) {
        try (ThreadGuard.Use use = use()) {
            return invoke(method, args);
        }
    }

    /** The thread guard every public call holds; {@link Trainer} holds it for a whole run. */
    ThreadGuard.Use use() {
        return guard.enter();
    }

    private Object invoke(String method, Object... args) {
        return scripted.invoke(method, args);
    }

    private Map<String, double[]> namedValues(String method, List<String> names) {
        return namedValues(method, names, null);
    }

    /** The method's tensors by name, converted only where {@code wanted} (null: all) holds the name. */
    private Map<String, double[]> namedValues(String method, List<String> names, Set<String> wanted, Object... args) {
        List<?> values = (List<?>) invoke(method, args);
        try {
            Map<String, double[]> named = new LinkedHashMap<>();
            for (int i = 0; i < names.size(); i++) {
                if (wanted == null || wanted.contains(names.get(i))) {
                    named.put(names.get(i), ((Tensor) values.get(i)).toExactDoubles());
                }
            }
            return named;
        } finally {
            Tensors.closeAll(values);
        }
    }

    /** The smallest and largest value of a non-empty 1-d int64 tensor, read from its memory. */
    private static long[] minMax(Tensor indices) {
        LongBuffer values = indices.buffer().asLongBuffer();
        long min = Long.MAX_VALUE;
        long max = Long.MIN_VALUE;
        for (int i = 0; i < values.limit(); i++) {
            long value = values.get(i);
            min = Math.min(min, value);
            max = Math.max(max, value);
        }
        return new long[] {min, max};
    }

    private List<String> stringList(String method) {
        List<?> values = (List<?>) invoke(method);
        List<String> strings = new ArrayList<>(values.size());
        for (Object value : values) {
            strings.add((String) value);
        }
        return strings;
    }

    private void checkTensor(String name, Tensor array) {
        if (array == null || array.isClosed()) {
            throw new InvalidInputException(name + ": expected a Tensor, got " + (array == null ? "null" : "a closed one"));
        }
        Tensors.SpecCheck fast = "y".equals(name) ? yCheck : inputChecks.get(name);
        if (fast != null && fast.fits(array)) {
            return; // the per-call path: no allocation; anything else gets the full check's message
        }
        Tensors.checkSpec(path.getFileName().toString(), "input " + name, array, metadata.getInput(name), true);
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
