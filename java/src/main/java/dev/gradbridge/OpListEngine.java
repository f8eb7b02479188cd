package dev.gradbridge;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.gradbridge.internal.Protocol3Messages;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * A protocol-3 module: a training step captured with torch.export as gradbridge's op lists, run op by op
 * over libtorch's dispatcher by the native layer ({@code native/oplist_engine.h}), which owns the
 * state tensors (parameters, buffers, gradients, optimizer state) and the host's counters (steps, learning
 * rates, the schedule's state). The second implementation of the engine boundary; the protocol's methods
 * map onto the native module's. A checkpoint is the same zip with the state tensors and counters as they
 * are now.
 */
final class OpListEngine extends ModuleEngine {

    private final Metadata metadata;
    private final List<String> parameterNames = new ArrayList<>();
    private final List<String> bufferNames = new ArrayList<>();
    /** The optimizer's parameters in group order (torch.optim's state order). */
    private final List<String> trainableNames;
    /** Each graph's entry in the zip and its op list, written back unchanged into checkpoints. */
    private final Map<String, String> graphFiles;

    private OpListEngine(Path path, long handle, Metadata metadata, List<String> trainableNames,
            Map<String, String> graphFiles, String device) {
        super(path, handle, metadata.getMethods(), device);
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            parameterNames.add(spec.getName());
        }
        for (Metadata.TensorSpec spec : metadata.getBuffers()) {
            bufferNames.add(spec.getName());
        }
        this.trainableNames = trainableNames;
        this.graphFiles = graphFiles;
        this.metadata = metadata;
    }

    /** The module a protocol-3 file holds ({@link OpListFile#load}: read and checked as data first). */
    static OpListEngine load(Path file, Metadata metadata, String device) {
        return OpListFile.load(file, metadata, device,
                (handle, trainable, graphFiles) -> new OpListEngine(file, handle, metadata, trainable, graphFiles, device));
    }

    @Override
    void moveTo(String target) {
        Native.exportedTo(handle(), target);
        replace(handle(), target);
    }

    @Override
    void setTraining(boolean training) {
        // the graphs carry their mode: train (training mode), forward and loss (eval mode)
    }

    /**
     * The module as it is now, as a protocol-3 zip ({@link OpListFile#write}): {@code metadataJson} (the metadata
     * and its checkpoint entry) with the program's state entries and counters as they are now, the op lists as
     * loaded, and each state tensor but the gradients (a step starts with {@code zero_grad}).
     */
    @Override
    void save(Path file, String metadataName, String metadataJson) throws IOException {
        JsonObject document = JsonParser.parseString(metadataJson).getAsJsonObject();
        List<String> names = new ArrayList<>();
        for (String name : Native.exportedStateNames(handle())) {
            if (!name.startsWith("grad:")) {
                names.add(name);
            }
        }
        List<Tensor> tensors = new ArrayList<>();
        try {
            for (long h : Native.exportedGet(handle(), names.toArray(new String[0]))) {
                tensors.add(new Tensor(h));
            }
            OpListFile.write(file, metadataName, document, graphFiles, names, tensors,
                    JsonParser.parseString(Native.exportedCounters(handle())));
        } finally {
            Tensors.closeAll(tensors);
        }
    }

    @Override
    ModuleEngine snapshot() {
        long copy = Native.exportedSnapshot(handle());
        try {
            return new OpListEngine(path, copy, metadata, trainableNames, graphFiles, device());
        } catch (RuntimeException e) {
            Native.exportedFree(copy);
            throw e;
        }
    }

    @Override
    Object invoke(String method, Object... args) {
        if (!methodNames().contains(method)) {
            throw new ProtocolException(path + " has no method '" + method + "'; its methods: " + methodNames());
        }
        try {
            return stateCall(method, args);
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
        }
    }

    /** The protocol's calls on names, values and gradient flags; the others go on to {@link #stepCall}. */
    private Object stateCall(String method, Object[] args) {
        switch (method) {
            case Protocol.PARAMETER_NAMES:
                return new ArrayList<>(parameterNames);
            case Protocol.BUFFER_NAMES:
                return new ArrayList<>(bufferNames);
            case Protocol.GET_PARAMETERS:
                return get("param:", parameterNames);
            case Protocol.GET_BUFFERS:
                return get("buffer:", bufferNames);
            case Protocol.GET_GRADIENTS:
                return get("grad:", parameterNames);
            case Protocol.SET_PARAMETERS:
                set("param:", parameterNames, (List<?>) args[0]);
                return null;
            case Protocol.GET_STATE:
                return getState((List<?>) args[0]);
            case Protocol.SET_STATE:
                setState((List<?>) args[0], (List<?>) args[1]);
                return null;
            case Protocol.GRADIENT_FLAGS:
                return gradientFlags();
            case Protocol.SET_GRADIENTS:
                setGradients((List<?>) args[0], ((Tensor) args[1]).toBooleanArray());
                return null;
            default:
                return stepCall(method, args);
        }
    }

    /** The protocol's calls that run the program: steps, forward, the optimizer and its schedule. */
    private Object stepCall(String method, Object[] args) {
        switch (method) {
            case Protocol.ZERO_GRAD:
            case Protocol.OPTIMIZER_STEP:
                Native.exportedCall(handle(), method, new long[0], 0);
                return null;
            case Protocol.FORWARD:
                return call(method, args[0], null);
            case Protocol.TRAIN_STEP:
            case Protocol.CALCULATE_LOSS_AND_BACKWARD:
            case Protocol.EVALUATE:
                return call(method, args[0], (Tensor) args[1]);
            case Protocol.TRAIN_EPOCH:
                double[] losses = Native.exportedTrainEpoch(handle(), handles(args[0]), ((Tensor) args[1]).handle(),
                        ((Tensor) args[2]).handle(), ((Number) args[3]).longValue());
                return Tensor.of(losses, losses.length);
            case Protocol.GET_LR:
                return Native.exportedLrs(handle())[0];
            case Protocol.GET_LRS:
                List<Double> lrs = new ArrayList<>();
                for (double lr : Native.exportedLrs(handle())) {
                    lrs.add(lr);
                }
                return lrs;
            case Protocol.SET_LR:
                Native.exportedSetLr(handle(), -1, ((Number) args[0]).doubleValue());
                return null;
            case Protocol.SET_GROUP_LR:
                Native.exportedSetLr(handle(), ((Number) args[0]).intValue(), ((Number) args[1]).doubleValue());
                return null;
            case Protocol.SCHEDULE_EPOCH:
                Native.exportedScheduleEpoch(handle(), ((Number) args[0]).doubleValue());
                return null;
            case Protocol.SGD_STEP:
                Native.exportedSgdStep(handle(), ((Number) args[0]).doubleValue());
                return null;
            case Protocol.OPTIMIZER_STATE:
                return optimizerState();
            case Protocol.LOAD_OPTIMIZER_STATE:
                loadOptimizerState(args == null || args.length == 0 ? null : args[0]); // call(m, null): no array
                return null;
            default:
                throw new ProtocolException(Protocol3Messages.protocol3Refuses(path.toString(), method + "()"));
        }
    }

    private Tensor call(String method, Object x, Tensor y) {
        long[] results = Native.exportedCall(handle(), method, handles(x), y == null ? 0 : y.handle());
        return new Tensor(results[0]);
    }

    private static long[] handles(Object x) {
        if (x instanceof Tensor) {
            return new long[] {((Tensor) x).handle()};
        }
        List<?> tensors = (List<?>) x;
        long[] out = new long[tensors.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = ((Tensor) tensors.get(i)).handle();
        }
        return out;
    }

    private List<Tensor> get(String prefix, List<String> names) {
        return get(prefixed(prefix, names));
    }

    private static String[] prefixed(String prefix, List<String> names) {
        String[] keys = new String[names.size()];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = prefix + names.get(i);
        }
        return keys;
    }

    /** The state tensors bound to {@code keys} (copies owned by the caller). */
    private List<Tensor> get(String[] keys) {
        List<Tensor> tensors = new ArrayList<>();
        for (long h : Native.exportedGet(handle(), keys)) {
            tensors.add(new Tensor(h));
        }
        return tensors;
    }

    /** The state keys of named parameters and buffers ({@code param:NAME}, {@code buffer:NAME}), checked. */
    private String[] stateKeys(List<?> names, String method) {
        String[] keys = new String[names.size()];
        Set<String> seen = new LinkedHashSet<>();
        for (int i = 0; i < keys.length; i++) {
            String name = (String) names.get(i);
            if (!seen.add(name) || !(parameterNames.contains(name) || bufferNames.contains(name))) {
                throw new MethodCallException(method + ": " + name + " is not a parameter or buffer, or is named twice", null);
            }
            keys[i] = (parameterNames.contains(name) ? "param:" : "buffer:") + name;
        }
        return keys;
    }

    private List<Tensor> getState(List<?> names) {
        return get(stateKeys(names, Protocol.GET_STATE));
    }

    private void setState(List<?> names, List<?> values) {
        set(stateKeys(names, Protocol.SET_STATE), values);
    }

    private void set(String prefix, List<String> names, List<?> values) {
        set(prefixed(prefix, names), values);
    }

    /** Copies {@code values} (tensors, in order) into the state bound to {@code keys}. */
    private void set(String[] keys, List<?> values) {
        long[] tensors = new long[keys.length];
        for (int i = 0; i < keys.length; i++) {
            tensors[i] = ((Tensor) values.get(i)).handle();
        }
        Native.exportedSet(handle(), keys, tensors);
    }

    /** Which parameters hold a gradient (the native module holds {@code grad:NAME} only after a backward). */
    private Tensor gradientFlags() {
        Set<String> held = new LinkedHashSet<>(Arrays.asList(Native.exportedStateNames(handle())));
        boolean[] flags = new boolean[parameterNames.size()];
        for (int i = 0; i < flags.length; i++) {
            flags[i] = held.contains("grad:" + parameterNames.get(i));
        }
        return Tensor.of(flags, flags.length);
    }

    /**
     * The flagged parameters' gradients become {@code gradients}' (copies); the others hold none, as after
     * zero_grad. Checked as the TorchScript module's set_gradients checks them, changing nothing when refused.
     */
    private void setGradients(List<?> gradients, boolean[] flags) {
        int n = parameterNames.size();
        if (gradients.size() != n || flags.length != n) {
            throw refused("expected " + n + " tensors and " + n + " flags, got " + gradients.size() + " and "
                    + flags.length);
        }
        List<String> names = new ArrayList<>();
        List<Object> values = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            Metadata.TensorSpec spec = metadata.getParameters().get(i);
            Tensor gradient = (Tensor) gradients.get(i);
            if (!Arrays.equals(gradient.shape(), spec.getShape())
                    || !gradient.dtype().torchName().equals(spec.getDtype())) {
                throw refused(spec.getName() + " must have shape " + Arrays.toString(spec.getShape()) + " and dtype "
                        + spec.getDtype());
            }
            if (flags[i] && !trainableNames.contains(spec.getName())) {
                throw refused(spec.getName() + " is frozen and cannot hold a gradient");
            }
        }
        for (int i = 0; i < n; i++) {
            if (flags[i]) {
                names.add(parameterNames.get(i));
                values.add(gradients.get(i));
            }
        }
        Native.exportedCall(handle(), Protocol.ZERO_GRAD, new long[0], 0);
        set("grad:", names, values);
    }

    private MethodCallException refused(String reason) {
        return new MethodCallException(path + ": " + Protocol.SET_GRADIENTS + "() failed: set_gradients: " + reason,
                null);
    }

    /**
     * torch.optim's state keys (exp_avg, step, momentum_buffer...) to one tensor per parameter that holds the
     * key, in group order; a key no parameter holds yet (SGD's momentum_buffer before the first step) is left
     * out, as the TorchScript path's optimizer_state leaves it.
     */
    private Map<String, List<Tensor>> optimizerState() {
        Set<String> held = new LinkedHashSet<>(Arrays.asList(Native.exportedStateNames(handle())));
        Map<String, List<String>> layout = new LinkedHashMap<>();
        for (String binding : Native.exportedOptimizerLayout(handle())) {
            layout.computeIfAbsent(binding.substring(6, binding.indexOf(':', 6)), k -> new ArrayList<>()).add(binding);
        }
        Map<String, List<Tensor>> state = new LinkedHashMap<>();
        for (Map.Entry<String, List<String>> key : layout.entrySet()) {
            if (!Collections.disjoint(held, key.getValue())) {
                List<Tensor> tensors = new ArrayList<>();
                for (long h : Native.exportedGet(handle(), key.getValue().toArray(new String[0]))) {
                    tensors.add(new Tensor(h));
                }
                state.put(key.getKey(), tensors);
            }
        }
        return state;
    }

    /** torch.optim's load_state_dict of {@link #optimizerState}'s layout (see the native layer's checks). */
    private void loadOptimizerState(Object given) {
        String expected = path + ": load_optimizer_state() takes {key: [one tensor per parameter]}, got ";
        if (!(given instanceof Map)) {
            throw new InvalidInputException(expected + (given == null ? "null" : given.getClass().getSimpleName()));
        }
        Map<?, ?> state = (Map<?, ?>) given;
        String[] keys = new String[state.size()];
        long[] counts = new long[state.size()];
        List<Long> tensors = new ArrayList<>();
        int k = 0;
        for (Map.Entry<?, ?> entry : state.entrySet()) {
            keys[k] = String.valueOf(entry.getKey());
            if (!(entry.getValue() instanceof List)) {
                throw new InvalidInputException(expected + keys[k] + ": " + entry.getValue());
            }
            List<?> values = (List<?>) entry.getValue();
            counts[k] = values.size();
            for (Object value : values) {
                if (!(value instanceof Tensor)) {
                    String kind = value == null ? "null" : value.getClass().getSimpleName();
                    throw new InvalidInputException(expected + "a " + kind + " in " + keys[k]);
                }
                tensors.add(((Tensor) value).handle());
            }
            k++;
        }
        long[] handles = new long[tensors.size()];
        for (int i = 0; i < handles.length; i++) {
            handles[i] = tensors.get(i);
        }
        Native.exportedLoadOptimizerState(handle(), keys, counts, handles);
    }

    @Override
    Tensor infer(String method, Tensor x) {
        return (Tensor) invoke(method, x);
    }

    @Override
    boolean allFinite(String method) {
        Object result = invoke(method);
        List<Tensor> tensors = new ArrayList<>();
        for (Object list : result instanceof Map ? ((Map<?, ?>) result).values() : Collections.singletonList(result)) {
            for (Object tensor : (List<?>) list) {
                tensors.add((Tensor) tensor);
            }
        }
        try {
            for (Tensor t : tensors) {
                if (!t.allFinite()) {
                    return false;
                }
            }
            return true;
        } finally {
            Tensors.closeAll(tensors);
        }
    }

    @Override
    int stepWhileFinite(Tensor[] xs, Tensor[] ys, double[] losses, MethodCallException[] failure) {
        for (int i = 0; i < xs.length; i++) {
            try {
                invoke(Protocol.ZERO_GRAD);
                losses[i] = invokeToDouble(Protocol.CALCULATE_LOSS_AND_BACKWARD, xs[i], ys[i]);
                if (!Double.isFinite(losses[i]) || !allFinite(Protocol.GET_GRADIENTS)) {
                    return i;
                }
                invoke(Protocol.OPTIMIZER_STEP);
            } catch (MethodCallException e) {
                failure[0] = e;
                return i;
            }
        }
        return xs.length;
    }

    @Override
    double invokeToDouble(String method, Tensor x, Tensor y) {
        try (Tensor loss = (Tensor) invoke(method, x, y)) {
            return loss.toExactDoubles()[0];
        }
    }

    @Override
    double[] invokeToDoubles(String method, Tensor x, Tensor y, Tensor perm, long batch) {
        try (Tensor losses = (Tensor) invoke(method, x, y, perm, batch)) {
            return losses.toExactDoubles();
        }
    }

    @Override
    public void close() {
        long value = release();
        if (value != 0) {
            Native.exportedFree(value);
        }
    }
}
