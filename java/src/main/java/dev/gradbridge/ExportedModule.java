package dev.gradbridge;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

/**
 * A protocol-3 module: a training step captured with torch.export as gradbridge's op lists, run op by op
 * over libtorch's dispatcher by the native layer ({@code native/gradbridge_exported.cpp}), which owns the
 * state tensors (parameters, buffers, gradients, optimizer state). The second implementation of the
 * engine boundary; the protocol's methods map onto the native module's. Checkpoints, snapshots and
 * {@code load_optimizer_state} are refused in one line for now.
 */
final class ExportedModule extends ScriptedModule {

    private final Path path;
    private final AtomicLong handle;
    private final Set<String> methodNames;
    private final List<String> parameterNames = new ArrayList<>();
    private final List<String> bufferNames = new ArrayList<>();

    private ExportedModule(Path path, long handle, Metadata metadata) {
        this.path = path;
        this.handle = new AtomicLong(handle);
        this.methodNames = Collections.unmodifiableSet(new LinkedHashSet<>(metadata.getMethods()));
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            parameterNames.add(spec.getName());
        }
        for (Metadata.TensorSpec spec : metadata.getBuffers()) {
            bufferNames.add(spec.getName());
        }
    }

    /** Reads the zip (program, op lists, state) and builds the native module; one line for what is wrong. */
    static ExportedModule load(Path file, Metadata metadata) {
        NativeLibrary.load();
        List<Tensor> state = new ArrayList<>();
        try (ZipFile archive = new ZipFile(file.toFile())) {
            JsonObject document = JsonParser.parseString(read(archive, file, Protocol.METADATA_FILE)).getAsJsonObject();
            JsonElement programElement = document.get(Protocol.PROGRAM_KEY);
            if (programElement == null || !programElement.isJsonObject()) {
                throw new ProtocolException(Messages.programEntryMissing(file.toString(), Protocol.PROGRAM_KEY));
            }
            JsonObject program = programElement.getAsJsonObject();
            StringBuilder text = new StringBuilder("{\"optimizer\":").append(document.get("optimizer"))
                    .append(",\"min_batch\":").append(program.get("min_batch"))
                    .append(",\"parameters\":").append(names(metadata.getParameters()))
                    .append(",\"inputs\":").append(strings(metadata.getInputNames()))
                    .append(",\"graphs\":{");
            boolean first = true;
            for (Map.Entry<String, JsonElement> graph : program.getAsJsonObject("graphs").entrySet()) {
                text.append(first ? "" : ",").append(new com.google.gson.JsonPrimitive(graph.getKey())).append(':')
                        .append(read(archive, file, graph.getValue().getAsString()));
                first = false;
            }
            text.append("}}");
            JsonArray entries = program.getAsJsonArray("state");
            String[] stateNames = new String[entries.size()];
            long[] handles = new long[entries.size()];
            for (int i = 0; i < entries.size(); i++) {
                JsonObject entry = entries.get(i).getAsJsonObject();
                stateNames[i] = entry.get("name").getAsString();
                JsonArray dims = entry.getAsJsonArray("shape");
                long[] shape = new long[dims.size()];
                for (int d = 0; d < shape.length; d++) {
                    shape[d] = dims.get(d).getAsLong();
                }
                DType dtype = DType.of(entry.get("dtype").getAsString());
                byte[] bytes = readBytes(archive, file, entry.get("file").getAsString());
                long expected = dtype.size();
                for (long d : shape) {
                    expected *= d;
                }
                if (bytes.length != expected) {
                    throw new ProtocolException(file + ": " + entry.get("file").getAsString() + " holds " + bytes.length
                            + " bytes, " + stateNames[i] + " (" + dtype + " " + Arrays.toString(shape) + ") needs " + expected);
                }
                ByteBuffer buffer = ByteBuffer.allocateDirect(Math.max(bytes.length, 1)).order(ByteOrder.LITTLE_ENDIAN);
                buffer.put(bytes).flip();
                Tensor tensor = Tensor.fromBuffer(buffer, dtype, shape);
                state.add(tensor);
                handles[i] = tensor.handle();
            }
            long module;
            try {
                module = Native.exportedLoad(text.toString(), stateNames, handles);
            } catch (NativeException e) {
                throw new ProtocolException(file + ": " + libtorchSummary(e));
            }
            try {
                return new ExportedModule(file, module, metadata);
            } catch (RuntimeException e) {
                Native.exportedFree(module);
                throw e;
            }
        } catch (IOException | IllegalStateException | ClassCastException | NullPointerException e) {
            throw new ProtocolException(file + ": not a readable protocol-3 module: " + e.getMessage());
        } finally {
            Tensors.closeAll(state);
        }
    }

    private static String read(ZipFile archive, Path file, String name) throws IOException {
        return new String(readBytes(archive, file, name), StandardCharsets.UTF_8);
    }

    private static byte[] readBytes(ZipFile archive, Path file, String name) throws IOException {
        ZipEntry entry = archive.getEntry(name);
        if (entry == null) {
            throw new ProtocolException(Messages.programEntryMissing(file.toString(), name));
        }
        try (InputStream in = archive.getInputStream(entry)) {
            return in.readAllBytes();
        }
    }

    private static String names(List<Metadata.TensorSpec> specs) {
        List<String> names = new ArrayList<>();
        for (Metadata.TensorSpec spec : specs) {
            names.add(spec.getName());
        }
        return strings(names);
    }

    private static String strings(List<String> names) {
        JsonArray array = new JsonArray();
        for (String name : names) {
            array.add(name);
        }
        return array.toString();
    }

    private long handle() {
        long value = handle.get();
        if (value == 0) {
            throw new IllegalStateException(path + " is closed");
        }
        return value;
    }

    @Override
    Set<String> methodNames() {
        return methodNames;
    }

    @Override
    void setTraining(boolean training) {
        // the graphs carry their mode: train (training mode), forward and loss (eval mode)
    }

    @Override
    byte[] save(String metadataName, String metadataJson) {
        throw new ProtocolException(Messages.protocol3Refuses(path.toString(), "checkpoints"));
    }

    @Override
    ScriptedModule snapshot() {
        throw new ProtocolException(Messages.protocol3Refuses(path.toString(), "snapshots"));
    }

    @Override
    Object invoke(String method, Object... args) {
        if (!methodNames.contains(method)) {
            throw new ProtocolException(path + " has no method '" + method + "'; its methods: " + methodNames);
        }
        try {
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
                    return Native.exportedLr(handle());
                case Protocol.GET_LRS:
                    return new ArrayList<>(Collections.singletonList(Native.exportedLr(handle())));
                case Protocol.SET_LR:
                    Native.exportedSetLr(handle(), ((Number) args[0]).doubleValue());
                    return null;
                case Protocol.SET_GROUP_LR:
                    Native.exportedSetLr(handle(), ((Number) args[1]).doubleValue());
                    return null;
                case Protocol.SGD_STEP:
                    Native.exportedSgdStep(handle(), ((Number) args[0]).doubleValue());
                    return null;
                case Protocol.OPTIMIZER_STATE:
                    return optimizerState();
                default:
                    throw new ProtocolException(Messages.protocol3Refuses(path.toString(), method + "()"));
            }
        } catch (NativeException e) {
            throw new MethodCallException(path + ": " + method + "() failed: " + libtorchSummary(e), e);
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
        String[] keys = new String[names.size()];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = prefix + names.get(i);
        }
        List<Tensor> tensors = new ArrayList<>();
        for (long h : Native.exportedGet(handle(), keys)) {
            tensors.add(new Tensor(h));
        }
        return tensors;
    }

    private void set(String prefix, List<String> names, List<?> values) {
        String[] keys = new String[names.size()];
        long[] tensors = new long[names.size()];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = prefix + names.get(i);
            tensors[i] = ((Tensor) values.get(i)).handle();
        }
        Native.exportedSet(handle(), keys, tensors);
    }

    /** torch.optim's state keys (exp_avg, step, momentum_buffer...) to one tensor per parameter. */
    private Map<String, List<Tensor>> optimizerState() {
        Map<String, List<Tensor>> state = new LinkedHashMap<>();
        Set<String> held = new LinkedHashSet<>(Arrays.asList(Native.exportedStateNames(handle())));
        Set<String> keys = new LinkedHashSet<>();
        for (String name : held) {
            if (name.startsWith("state:")) {
                keys.add(name.substring(6, name.indexOf(':', 6)));
            }
        }
        for (String key : keys) {
            state.put(key, get("state:" + key + ":", parameterNames));
        }
        return state;
    }

    @Override
    Tensor infer(String method, Tensor x) {
        return (Tensor) invoke(method, x);
    }

    @Override
    boolean allFinite(String method) {
        @SuppressWarnings("unchecked")
        List<Tensor> tensors = (List<Tensor>) invoke(method);
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
        long value = handle.getAndSet(0);
        if (value != 0) {
            Native.exportedFree(value);
        }
    }
}
