package dev.gradbridge;

import dev.gradbridge.internal.Messages;
import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.LocalDateTime;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;
import java.util.zip.ZipOutputStream;

/**
 * A protocol-3 module: a training step captured with torch.export as gradbridge's op lists, run op by op
 * over libtorch's dispatcher by the native layer ({@code native/gradbridge_exported.cpp}), which owns the
 * state tensors (parameters, buffers, gradients, optimizer state) and the host's counters (steps, learning
 * rates, the schedule's state). The second implementation of the engine boundary; the protocol's methods
 * map onto the native module's. A checkpoint is the same zip with the state tensors and counters as they
 * are now.
 */
final class ExportedModule extends ScriptedModule {

    private static final Gson PRETTY = new GsonBuilder().setPrettyPrinting().create();
    private static final LocalDateTime ZIP_TIME = LocalDateTime.of(1980, 1, 1, 0, 0);

    private final Metadata metadata;
    private final List<String> parameterNames = new ArrayList<>();
    private final List<String> bufferNames = new ArrayList<>();
    /** The optimizer's parameters in group order (torch.optim's state order). */
    private final List<String> trainableNames;
    /** Each graph's entry in the zip and its op list, written back unchanged into checkpoints. */
    private final Map<String, String> graphFiles;

    private ExportedModule(Path path, long handle, Metadata metadata, List<String> trainableNames,
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

    /**
     * Reads the zip (program, op lists, state) as data, checked by {@link ProgramCheck} before the native layer
     * sees any of it (strict JSON, the operator allow-list, the limits, every field's range), and builds the
     * native module; one line for what is wrong.
     */
    static ExportedModule load(Path file, Metadata metadata, String device) {
        NativeLibrary.load();
        List<Tensor> state = new ArrayList<>();
        try (ZipFile archive = new ZipFile(file.toFile())) {
            JsonElement root = StrictJson.read(readBytes(archive, file, Protocol.METADATA_FILE, StrictJson.JSON_BYTES),
                    Protocol.METADATA_FILE);
            JsonObject program = member(root.getAsJsonObject(), Protocol.PROGRAM_KEY, file, Protocol.PROGRAM_KEY);
            JsonElement version = program.get("oplist_version");
            if (!StrictJson.isInt(version) || version.getAsLong() != Protocol.OPLIST_VERSION) {
                throw new ProtocolException(Messages.programVersion(file.toString(), StrictJson.shown(String.valueOf(version)),
                        Protocol.OPLIST_VERSION));
            }
            JsonObject training = member(program, "training", file, Protocol.PROGRAM_KEY + ".training");
            JsonObject counters = member(program, "counters", file, Protocol.PROGRAM_KEY + ".counters");
            ProgramCheck.training(training, counters, Protocol.PROGRAM_KEY);
            List<String> trainable = new ArrayList<>();
            for (JsonElement group : training.getAsJsonArray("groups")) {
                for (JsonElement name : group.getAsJsonObject().getAsJsonArray("params")) {
                    trainable.add(name.getAsString());
                }
            }
            StringBuilder text = new StringBuilder("{\"parameters\":").append(names(metadata.getParameters()))
                    .append(",\"inputs\":").append(strings(metadata.getInputNames()))
                    .append(",\"training\":").append(training)
                    .append(",\"counters\":").append(counters)
                    .append(",\"limits\":").append(StrictJson.nativeLimits())
                    .append(",\"graphs\":{");
            Map<String, String> graphFiles = new LinkedHashMap<>();
            JsonObject graphs = member(program, "graphs", file, Protocol.PROGRAM_KEY + ".graphs");
            for (Map.Entry<String, JsonElement> graph : graphs.entrySet()) {
                String where = "op list " + StrictJson.shown(graph.getKey());
                JsonElement name = graph.getValue();
                if (!name.isJsonPrimitive() || !name.getAsJsonPrimitive().isString()
                        || archive.getEntry(name.getAsString()) == null) {
                    throw new ProtocolException(Messages.programEntryMissing(file.toString(), StrictJson.shown(name)));
                }
                byte[] bytes = readBytes(archive, file, name.getAsString(), StrictJson.JSON_BYTES);
                JsonElement opList = StrictJson.read(bytes, where);
                ProgramCheck.graph(opList, where);
                ProgramCheck.role(graph.getKey(), opList.getAsJsonObject(), where);
                // the native layer reads what passed, as Gson writes it
                text.append(graphFiles.isEmpty() ? "" : ",").append(new JsonPrimitive(graph.getKey())).append(':')
                        .append(opList);
                graphFiles.put(name.getAsString(), new String(bytes, StandardCharsets.UTF_8));
            }
            ProgramCheck.required(graphs, Protocol.PROGRAM_KEY + ".graphs");
            text.append("}}");
            JsonElement entries = program.get("state");
            if (entries == null || !entries.isJsonArray()) {
                throw new ProtocolException(Messages.programEntryMissing(file.toString(), Protocol.PROGRAM_KEY + ".state"));
            }
            String[] stateNames = new String[entries.getAsJsonArray().size()];
            long[] handles = new long[stateNames.length];
            for (int i = 0; i < stateNames.length; i++) {
                JsonElement entry = entries.getAsJsonArray().get(i);
                long bytes = ProgramCheck.stateEntry(entry, Protocol.PROGRAM_KEY + ".state[" + i + "]");
                Tensor tensor = stateTensor(archive, file, metadata, entry.getAsJsonObject(), bytes);
                state.add(tensor);
                stateNames[i] = entry.getAsJsonObject().get("name").getAsString();
                handles[i] = tensor.handle();
            }
            long module;
            try {
                module = Native.exportedLoad(text.toString(), stateNames, handles, device);
            } catch (NativeException e) {
                throw new ProtocolException(file + ": " + libtorchSummary(e));
            }
            try {
                return new ExportedModule(file, module, metadata, Collections.unmodifiableList(trainable),
                        Collections.unmodifiableMap(graphFiles), device);
            } catch (RuntimeException e) {
                Native.exportedFree(module);
                throw e;
            }
        } catch (StrictJson.Refusal e) {
            throw new ProtocolException(file + ": " + e.getMessage());
        } catch (IOException | IllegalStateException | ClassCastException | NullPointerException
                | UnsupportedOperationException e) {
            throw new ProtocolException(Messages.programUnreadable(file.toString(), StrictJson.shown(String.valueOf(e.getMessage()))));
        } finally {
            Tensors.closeAll(state);
        }
    }

    private static JsonObject member(JsonObject object, String key, Path file, String entry) {
        JsonElement value = object.get(key);
        if (value == null || !value.isJsonObject()) {
            throw new ProtocolException(Messages.programEntryMissing(file.toString(), entry));
        }
        return value.getAsJsonObject();
    }

    /** One state entry's tensor (its entry checked, {@code needed} bytes), checked against the dtype and shape its name calls for and its file's size. */
    private static Tensor stateTensor(ZipFile archive, Path file, Metadata metadata, JsonObject entry, long needed)
            throws IOException {
        String name = entry.get("name").getAsString();
        String entryFile = entry.get("file").getAsString();
        JsonArray dims = entry.getAsJsonArray("shape");
        long[] shape = new long[dims.size()];
        for (int d = 0; d < shape.length; d++) {
            shape[d] = dims.get(d).getAsLong();
        }
        String dtypeName = entry.get("dtype").getAsString();
        String actual = dtypeName + " " + Arrays.toString(shape);
        if (archive.getEntry(entryFile) == null) {
            throw new ProtocolException(Messages.programEntryMissing(file.toString(), entryFile));
        }
        String expected = expectedSpec(metadata, name);
        DType dtype;
        try {
            dtype = DType.of(dtypeName);
        } catch (InvalidInputException e) {
            throw new ProtocolException(Messages.programStateMismatch(file.toString(), name,
                    expected == null ? "a constant" : expected, actual));
        }
        if (expected != null && !expected.equals(actual) && !FrozenSharing.leftOut(metadata, name, shape)) {
            throw new ProtocolException(Messages.programStateMismatch(file.toString(), name, expected, actual));
        }
        byte[] bytes = readBytes(archive, file, entryFile, needed);
        if (bytes.length != needed) {
            long size = Math.max(bytes.length, archive.getEntry(entryFile).getSize());
            throw new ProtocolException(Messages.programStateBytes(file.toString(), entryFile, size, name, actual,
                    needed));
        }
        ByteBuffer buffer = ByteBuffer.allocateDirect(Math.max(bytes.length, 1)).order(ByteOrder.LITTLE_ENDIAN);
        buffer.put(bytes).flip();
        return Tensor.fromBuffer(buffer, dtype, shape);
    }

    /**
     * The dtype and shape a state entry must have ({@code float32 [3, 4]}): a parameter's or buffer's as the
     * metadata declares it, an optimizer state's as its parameter's ({@code step}: a float32 scalar); null
     * for a tensor constant the model makes (python: aten_export._entry_spec).
     */
    private static String expectedSpec(Metadata metadata, String name) {
        String[] parts = name.split(":", 3);
        List<Metadata.TensorSpec> specs = null;
        String tensor = parts.length > 1 ? parts[1] : "";
        if ("state".equals(parts[0]) && parts.length == 3) {
            if ("step".equals(parts[1])) {
                return "float32 []";
            }
            specs = metadata.getParameters();
            tensor = parts[2];
        } else if ("param".equals(parts[0])) {
            specs = metadata.getParameters();
        } else if ("buffer".equals(parts[0])) {
            specs = metadata.getBuffers();
        }
        if (specs != null) {
            for (Metadata.TensorSpec spec : specs) {
                if (spec.getName().equals(tensor)) {
                    return spec.getDtype() + " " + Arrays.toString(spec.getShape());
                }
            }
        }
        return null;
    }

    /**
     * An entry's bytes, at most {@code limit} + 1 of them read whatever its header says (an op list past the
     * limit is refused here, a state file past its size by its caller), its CRC-32 checked when read whole.
     */
    private static byte[] readBytes(ZipFile archive, Path file, String name, long limit) throws IOException {
        ZipEntry entry = archive.getEntry(name);
        if (entry == null) {
            throw new ProtocolException(Messages.programEntryMissing(file.toString(), name));
        }
        byte[] bytes;
        try (InputStream in = archive.getInputStream(entry)) {
            bytes = in.readNBytes((int) Math.min(limit + 1, Integer.MAX_VALUE - 8));
        }
        if (bytes.length > limit) {
            if (limit == StrictJson.JSON_BYTES) {
                throw new ProtocolException(file + ": " + name + ": inflates past the limit of " + limit + " bytes");
            }
            return bytes;
        }
        CRC32 crc = new CRC32(); // Java's ZipFile checks none
        crc.update(bytes);
        if (entry.getCrc() != -1 && crc.getValue() != entry.getCrc()) {
            throw new ProtocolException(Messages.programUnreadable(file.toString(),
                    "its entry " + name + " does not match its checksum"));
        }
        return bytes;
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
     * The module as it is now, as a protocol-3 zip: {@code metadataJson} (the metadata and its checkpoint
     * entry) with the program's state entries and counters as they are now, the op lists as loaded, and
     * each state tensor but the gradients (a step starts with {@code zero_grad}).
     */
    @Override
    void save(Path file, String metadataName, String metadataJson) throws IOException {
        JsonObject document = JsonParser.parseString(metadataJson).getAsJsonObject();
        JsonObject program = document.getAsJsonObject(Protocol.PROGRAM_KEY);
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
            JsonArray entries = new JsonArray();
            for (int i = 0; i < names.size(); i++) {
                JsonObject entry = new JsonObject();
                entry.addProperty("name", names.get(i));
                entry.addProperty("dtype", tensors.get(i).dtype().torchName());
                JsonArray shape = new JsonArray();
                for (long d : tensors.get(i).shape()) {
                    shape.add(d);
                }
                entry.add("shape", shape);
                entry.addProperty("file", "state/" + i + ".bin");
                entries.add(entry);
            }
            program.add("state", entries);
            program.add("counters", JsonParser.parseString(Native.exportedCounters(handle())));
            // tensor by tensor into the file: the archive is never in memory whole
            try (OutputStream out = new BufferedOutputStream(Files.newOutputStream(file), 1 << 16);
                    ZipOutputStream zip = new ZipOutputStream(out)) {
                put(zip, metadataName, PRETTY.toJson(document).getBytes(StandardCharsets.UTF_8));
                for (Map.Entry<String, String> graph : graphFiles.entrySet()) {
                    put(zip, graph.getKey(), graph.getValue().getBytes(StandardCharsets.UTF_8));
                }
                byte[] chunk = new byte[1 << 20];
                for (int i = 0; i < tensors.size(); i++) {
                    ZipEntry entry = new ZipEntry("state/" + i + ".bin");
                    entry.setTimeLocal(ZIP_TIME);
                    zip.putNextEntry(entry);
                    ByteBuffer values = tensors.get(i).buffer();
                    while (values.hasRemaining()) {
                        int n = Math.min(chunk.length, values.remaining());
                        values.get(chunk, 0, n);
                        zip.write(chunk, 0, n);
                    }
                    zip.closeEntry();
                }
            }
        } finally {
            Tensors.closeAll(tensors);
        }
    }

    private static void put(ZipOutputStream zip, String name, byte[] content) throws IOException {
        ZipEntry entry = new ZipEntry(name);
        entry.setTimeLocal(ZIP_TIME); // the same state saves as the same bytes
        zip.putNextEntry(entry);
        zip.write(content);
        zip.closeEntry();
    }

    @Override
    ScriptedModule snapshot() {
        long copy = Native.exportedSnapshot(handle());
        try {
            return new ExportedModule(path, copy, metadata, trainableNames, graphFiles, device());
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
