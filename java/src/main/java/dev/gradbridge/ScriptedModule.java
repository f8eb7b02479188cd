package dev.gradbridge;

import ai.djl.engine.Engine;
import ai.djl.engine.EngineException;
import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.pytorch.engine.PtNDArray;
import ai.djl.pytorch.engine.PtNDManager;
import ai.djl.pytorch.engine.PtSymbolBlock;
import ai.djl.pytorch.jni.IValue;
import ai.djl.pytorch.jni.JniUtils;
import ai.djl.pytorch.jni.TrainingMethodInvoker;
import java.io.OutputStream;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The one home of gradbridge's calls into DJL's PyTorch engine internals ({@code JniUtils},
 * {@code Pt*}, {@code IValue}, {@link TrainingMethodInvoker}): starting the engine, preparing
 * calling threads, loading a TorchScript module, running its methods with autograd on and
 * converting arguments and results, saving it. Everything else in gradbridge uses DJL's public
 * {@link NDArray}/{@link NDManager} API and this class; a DJL upgrade is checked here.
 */
final class ScriptedModule implements AutoCloseable {

    private static final String OFFLINE = "ai.djl.offline";
    private static final String GRAPH_OPTIMIZER = "ai.djl.pytorch.graph_optimizer";

    private final Path path;
    private final PtNDManager manager;
    private final PtSymbolBlock block;
    private final Set<String> methodNames;

    private ScriptedModule(Path path, PtNDManager manager, PtSymbolBlock block) {
        this.path = path;
        this.manager = manager;
        this.block = block;
        this.methodNames =
                Collections.unmodifiableSet(new LinkedHashSet<>(Arrays.asList(JniUtils.getMethodNames(block))));
    }

    /**
     * Returns the PyTorch engine, starting it on first use. Offline unless the caller said
     * otherwise: a missing native library must be an error, never a download.
     */
    static synchronized Engine engine() {
        if (System.getProperty(OFFLINE) == null && System.getenv("DJL_OFFLINE") == null) {
            System.setProperty(OFFLINE, "true");
        }
        if (System.getProperty(GRAPH_OPTIMIZER) == null) {
            System.setProperty(GRAPH_OPTIMIZER, "false"); // see prepareCallingThread
        }
        try {
            return Engine.getEngine("PyTorch");
        } catch (RuntimeException e) {
            throw new GradbridgeException(
                    "cannot start DJL's PyTorch engine: "
                            + e.getMessage()
                            + ". Put ai.djl.pytorch:pytorch-native-cpu and pytorch-jni on the"
                            + " classpath, or set PYTORCH_LIBRARY_PATH to a libtorch folder.",
                    e);
        }
    }

    /** Seeds libtorch's process-wide CPU generator (what dropout draws from). */
    static void seed(long seed) {
        JniUtils.setSeed(seed);
    }

    /**
     * Grad mode and the graph-executor setting are thread-local in libtorch, and DJL turns grad
     * mode off on the thread that starts the engine. Set both before every call, on the calling
     * thread: autograd on; the optimizing executor off, because its differentiable subgraphs
     * drift from eager autograd in the last bits after the second call.
     */
    static void prepareCallingThread() {
        JniUtils.setGradMode(true);
        JniUtils.setGraphExecutorOptimize(false);
    }

    /**
     * Loads a TorchScript file in training mode, on a manager of its own.
     *
     * @throws EngineException when libtorch cannot load it (nothing stays allocated)
     */
    static ScriptedModule load(Path file) {
        engine();
        PtNDManager manager = (PtNDManager) NDManager.newBaseManager(null, "PyTorch");
        try {
            PtSymbolBlock block = JniUtils.loadModule(manager, file, true, new String[0], new String[0], true);
            JniUtils.enableTrainingMode(block);
            prepareCallingThread();
            return new ScriptedModule(file, manager, block);
        } catch (RuntimeException e) {
            manager.close();
            throw e;
        }
    }

    Set<String> methodNames() {
        return methodNames;
    }

    NDManager manager() {
        return manager;
    }

    /** Training mode on (BatchNorm updates statistics, dropout drops) or off (eval). */
    void setTraining(boolean training) {
        if (training) {
            JniUtils.enableTrainingMode(block);
        } else {
            JniUtils.enableInferenceMode(block);
        }
    }

    /** Writes the module with its current attributes as a TorchScript archive (no extra files). */
    void write(OutputStream out) {
        JniUtils.writeModule(block, out, false);
    }

    /**
     * Runs a scripted method with autograd on and converts its result (see {@link
     * TrainingModule#call} for the types).
     *
     * @param resultManager the manager result tensors are attached to
     */
    Object invoke(String method, NDManager resultManager, Object... args) {
        if (!methodNames.contains(method)) {
            Set<String> publicMethods = new TreeSet<>();
            for (String name : methodNames) {
                if (!name.startsWith("_")) {
                    publicMethods.add(name);
                }
            }
            throw new ProtocolException(path + " has no method '" + method + "'; its methods: " + publicMethods);
        }
        List<IValue> inputs = new ArrayList<>(args.length);
        try {
            for (int i = 0; i < args.length; i++) {
                inputs.add(toIValue(method, i, args[i]));
            }
            prepareCallingThread();
            try (IValue result =
                    TrainingMethodInvoker.runWithAutograd(block, method, inputs.toArray(new IValue[0]))) {
                return fromIValue(result, (PtNDManager) resultManager);
            }
        } catch (EngineException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        } finally {
            for (IValue input : inputs) {
                input.close();
            }
        }
    }

    /** Whether an array belongs to DJL's PyTorch engine (the only kind a method accepts). */
    static boolean isTorchArray(NDArray array) {
        return array instanceof PtNDArray;
    }

    /** libtorch's messages put the TorchScript traceback first and the actual error last. */
    static String libtorchSummary(Throwable e) {
        String message = String.valueOf(e.getMessage()).trim();
        return message.substring(message.lastIndexOf('\n') + 1).trim();
    }

    private static IValue toIValue(String method, int index, Object arg) {
        if (arg instanceof PtNDArray) {
            return IValue.from((PtNDArray) arg);
        } else if (arg instanceof Double || arg instanceof Float) {
            return IValue.from(((Number) arg).doubleValue());
        } else if (arg instanceof Long || arg instanceof Integer) {
            return IValue.from(((Number) arg).longValue());
        } else if (arg instanceof Boolean) {
            return IValue.from((Boolean) arg);
        } else if (arg instanceof String) {
            return IValue.from((String) arg);
        } else if (arg instanceof List && allTorchArrays((List<?>) arg)) {
            return IValue.listFrom(((List<?>) arg).toArray(new PtNDArray[0]));
        }
        throw new InvalidInputException(
                method + "(): argument " + index + " has unsupported type "
                        + (arg == null ? "null" : arg.getClass().getName())
                        + "; expected a PyTorch NDArray, number, boolean, string or list of NDArrays");
    }

    private static boolean allTorchArrays(List<?> list) {
        for (Object item : list) {
            if (!(item instanceof PtNDArray)) {
                return false;
            }
        }
        return true;
    }

    private static Object fromIValue(IValue value, PtNDManager resultManager) {
        if (value.isTensor()) {
            return value.toTensor(resultManager);
        } else if (value.isTensorList()) {
            return Arrays.asList((NDArray[]) value.toTensorArray(resultManager));
        } else if (value.isDouble()) {
            return value.toDouble();
        } else if (value.isLong()) {
            return value.toLong();
        } else if (value.isBoolean()) {
            return value.toBoolean();
        } else if (value.isString()) {
            return value.toStringValue();
        } else if (value.isList() || value.isTuple()) {
            IValue[] items = value.isList() ? value.toIValueArray() : value.toIValueTuple();
            List<Object> converted = new ArrayList<>(items.length);
            for (IValue item : items) {
                try (IValue owned = item) {
                    converted.add(fromIValue(owned, resultManager));
                }
            }
            return converted;
        } else if (value.isMap()) {
            Map<String, Object> converted = new LinkedHashMap<>();
            for (Map.Entry<String, IValue> entry : value.toIValueMap().entrySet()) {
                try (IValue owned = entry.getValue()) {
                    converted.put(entry.getKey(), fromIValue(owned, resultManager));
                }
            }
            return converted;
        } else if ("None".equals(value.getType()) || "NoneType".equals(value.getType())) {
            return null;
        }
        throw new UnsupportedOperationException("unsupported result type " + value.getType());
    }

    /** Frees the module and every tensor attached to its manager. */
    @Override
    public void close() {
        block.close();
        manager.close();
    }
}
