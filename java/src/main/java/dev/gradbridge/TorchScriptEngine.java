package dev.gradbridge;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentHashMap;

/**
 * A TorchScript module in libtorch, through gradbridge's native layer ({@link Native}): the
 * first implementation of the engine boundary ({@link OpListEngine} is the second).
 */
final class TorchScriptEngine extends ModuleEngine {

    /** {@link Native#plansStepWhileFinite}'s methods, in its order. */
    private static final String[] STEP_METHODS = {Protocol.ZERO_GRAD, Protocol.CALCULATE_LOSS_AND_BACKWARD,
        Protocol.GET_GRADIENTS, Protocol.OPTIMIZER_STEP};

    private final Map<String, Long> hotMethods = new ConcurrentHashMap<>(); // guarded for writes by itself
    private final Map<String, Long> plans = new ConcurrentHashMap<>(); // the same

    private TorchScriptEngine(Path path, long handle, String device) {
        super(path, handle, Arrays.asList(Native.moduleMethods(handle)), device);
    }

    static TorchScriptEngine load(Path file, String device) {
        NativeLibrary.load();
        long handle = Native.moduleLoad(file.toString(), device);
        try {
            return new TorchScriptEngine(file, handle, device);
        } catch (RuntimeException e) {
            Native.moduleFree(handle);
            throw e;
        }
    }

    @Override
    void moveTo(String target) {
        long moved = Native.moduleTo(handle(), target); // the module read back onto the device
        freeHandles(); // they call the old module
        Native.moduleFree(replace(moved, target));
    }

    @Override
    void setTraining(boolean training) {
        Native.moduleTrain(handle(), training);
    }

    @Override
    void save(Path file, String metadataName, String metadataJson) throws IOException {
        try {
            Native.moduleSaveFile(handle(), file.toString(), metadataName, metadataJson.getBytes(StandardCharsets.UTF_8));
        } catch (NativeException e) {
            throw new IOException(e.getMessage(), e); // the reason alone: AtomicFiles names the file
        }
    }

    @Override
    ModuleEngine snapshot() {
        long copy = Native.moduleSnapshot(handle());
        if (copy == 0) {
            return null;
        }
        try {
            return new TorchScriptEngine(path, copy, device());
        } catch (RuntimeException e) {
            Native.moduleFree(copy);
            throw e;
        }
    }

    @Override
    Object invoke(String method, Object... args) {
        requireMethod(method);
        for (int i = 0; i < args.length; i++) {
            checkArgument(method, i, args[i]);
        }
        try {
            return Native.moduleRun(handle(), method, args);
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        }
    }

    @Override
    Tensor infer(String method, Tensor x) {
        checkArgument(method, 0, x);
        long plan = cached(plans, method, Native::planOf);
        try {
            return new Tensor(Native.inferPlanRun(plan, x.handle()));
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        }
    }

    @Override
    boolean allFinite(String method) {
        long run = hotMethod(method);
        try {
            return Native.methodAllFinite(run);
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        }
    }

    @Override
    int stepWhileFinite(Tensor[] xs, Tensor[] ys, double[] losses, MethodCallException[] failure) {
        long[] steps = new long[STEP_METHODS.length];
        for (int i = 0; i < steps.length; i++) {
            steps[i] = cached(plans, STEP_METHODS[i], Native::planOf);
        }
        long[] x = new long[xs.length];
        long[] y = new long[ys.length];
        for (int i = 0; i < xs.length; i++) {
            x[i] = xs[i].handle();
            y[i] = ys[i].handle();
        }
        int[] failed = {-1};
        String[] error = new String[1];
        int stepped;
        try {
            stepped = Native.plansStepWhileFinite(steps, x, y, losses, failed, error);
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + Protocol.TRAIN_STEP + " calls failed: " + libtorchSummary(e), e);
        }
        if (failed[0] >= 0) {
            NativeException cause = new NativeException(error[0]);
            failure[0] = new MethodCallException(path + ": " + STEP_METHODS[failed[0]] + "() failed: "
                    + libtorchSummary(cause), cause);
        }
        return stepped;
    }

    @Override
    double invokeToDouble(String method, Tensor x, Tensor y) {
        long run = hotMethod(method);
        try {
            return Native.methodRunToDouble(run, x.handle(), y.handle());
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        }
    }

    @Override
    double[] invokeToDoubles(String method, Tensor x, Tensor y, Tensor perm, long batch) {
        long run = hotMethod(method);
        try {
            return Native.methodRunToDoubles(run, x.handle(), y.handle(), perm == null ? 0 : perm.handle(), batch);
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        }
    }

    /** The native method handle, looked up on first use and kept until close. */
    private long hotMethod(String method) {
        return cached(hotMethods, method, Native::methodOf);
    }

    /** A native handle made for {@code method} on first use ({@code make(module, method)}), kept until close. */
    private long cached(Map<String, Long> handles, String method, java.util.function.ToLongBiFunction<Long, String> make) {
        long module = handle();
        Long known = handles.get(method);
        if (known != null) {
            return known;
        }
        requireMethod(method);
        synchronized (handles) {
            known = handles.get(method);
            if (known == null) {
                try {
                    known = make.applyAsLong(module, method);
                } catch (NativeException e) {
                    throw new MethodCallException(path + ": " + method + "() cannot be prepared: " + libtorchSummary(e), e);
                }
                handles.put(method, known);
            }
            return known;
        }
    }

    private void requireMethod(String method) {
        if (!methodNames().contains(method)) {
            Set<String> publicMethods = new TreeSet<>();
            for (String name : methodNames()) {
                if (!name.startsWith("_")) {
                    publicMethods.add(name);
                }
            }
            throw new ProtocolException(path + " has no method '" + method + "'; its methods: " + publicMethods);
        }
    }

    /** The types the native conversion takes, refused here with a message naming the argument. */
    private static void checkArgument(String method, int index, Object arg) {
        if (arg == null || arg instanceof Tensor || arg instanceof Double || arg instanceof Float
                || arg instanceof Long || arg instanceof Integer || arg instanceof Boolean || arg instanceof String) {
            if (arg instanceof Tensor && ((Tensor) arg).isClosed()) {
                throw new InvalidInputException(method + "(): argument " + index + " is a closed Tensor");
            }
            return;
        }
        if (arg instanceof List) {
            for (Object item : (List<?>) arg) {
                if (item instanceof List || item instanceof Map || item == null) {
                    throw unsupported(method, index, arg);
                }
                checkArgument(method, index, item);
            }
            return;
        }
        if (arg instanceof Map) {
            for (Map.Entry<?, ?> entry : ((Map<?, ?>) arg).entrySet()) {
                if (!(entry.getKey() instanceof String) || !(entry.getValue() instanceof List)) {
                    throw unsupported(method, index, arg);
                }
                checkArgument(method, index, entry.getValue());
            }
            return;
        }
        throw unsupported(method, index, arg);
    }

    private static InvalidInputException unsupported(String method, int index, Object arg) {
        return new InvalidInputException(
                method + "(): argument " + index + " has unsupported type " + arg.getClass().getName()
                        + "; expected a Tensor, number, boolean, string, list of these or a String-keyed map of"
                        + " tensor lists");
    }

    @Override
    public void close() {
        long value = release();
        if (value != 0) {
            freeHandles();
            Native.moduleFree(value);
        }
    }

    /** Frees the methods and plans looked up so far. */
    private void freeHandles() {
        synchronized (hotMethods) {
            for (long method : hotMethods.values()) {
                Native.methodFree(method);
            }
            hotMethods.clear();
        }
        synchronized (plans) {
            for (long plan : plans.values()) {
                Native.planFree(plan);
            }
            plans.clear();
        }
    }
}
