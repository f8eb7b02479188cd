package dev.gradbridge;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.gradbridge.internal.Protocol3Messages;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
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
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;
import java.util.zip.ZipOutputStream;

/**
 * A protocol-3 file as data: the zip (program, op lists, state) read and checked by {@link StrictJson},
 * {@link ProgramCheck} and {@link Schedules} before the native layer sees any of it, which then gets the checked
 * program as {@link ProgramArrays} (typed arrays, never text); and a module's state written back as such a zip
 * ({@link OpListEngine#save}).
 */
final class OpListFile {

    private static final Gson PRETTY = new GsonBuilder().setPrettyPrinting().create();
    private static final LocalDateTime ZIP_TIME = LocalDateTime.of(1980, 1, 1, 0, 0);

    /** What becomes the module: the native handle, the optimizer's parameters in group order, the op lists as read. */
    interface Module<T> {
        T of(long handle, List<String> trainable, Map<String, String> graphFiles);
    }

    private OpListFile() {
    }

    /**
     * Reads the zip as data, checked before the native layer sees any of it (strict JSON, the operator allow-list,
     * the limits, every field's range), builds the native module from the checked program's arrays and hands it
     * to {@code module} (which owns it once it returns); one line for what is wrong.
     */
    static <T> T load(Path file, Metadata metadata, String device, Module<T> module) {
        NativeLibrary.load();
        List<Tensor> state = new ArrayList<>();
        try (ZipFile archive = new ZipFile(file.toFile())) {
            JsonElement root = StrictJson.read(readBytes(archive, file, Protocol.METADATA_FILE, StrictJson.JSON_BYTES),
                    Protocol.METADATA_FILE);
            JsonObject program = member(root.getAsJsonObject(), Protocol.PROGRAM_KEY, file, Protocol.PROGRAM_KEY);
            JsonElement version = program.get("oplist_version");
            if (!StrictJson.isInt(version) || version.getAsLong() != Protocol.OPLIST_VERSION) {
                throw new ProtocolException(Protocol3Messages.programVersion(file.toString(),
                        StrictJson.shown(String.valueOf(version)), Protocol.OPLIST_VERSION));
            }
            JsonObject training = member(program, "training", file, Protocol.PROGRAM_KEY + ".training");
            JsonObject counters = member(program, "counters", file, Protocol.PROGRAM_KEY + ".counters");
            ProgramCheck.training(training, counters, Protocol.PROGRAM_KEY);
            List<String> trainable = trainableNames(training);
            Map<String, String> graphFiles = new LinkedHashMap<>();
            Map<String, JsonObject> opLists = new LinkedHashMap<>();
            JsonObject graphs = member(program, "graphs", file, Protocol.PROGRAM_KEY + ".graphs");
            readGraphs(archive, file, graphs, opLists, graphFiles);
            ProgramCheck.required(graphs, Protocol.PROGRAM_KEY + ".graphs");
            // the native layer reads what passed, as typed arrays
            ProgramArrays arrays = ProgramArrays.of(names(metadata.getParameters()), metadata.getInputNames(), opLists,
                    training, counters);
            JsonElement entries = program.get("state");
            if (entries == null || !entries.isJsonArray()) {
                throw new ProtocolException(Protocol3Messages.programEntryMissing(file.toString(),
                        Protocol.PROGRAM_KEY + ".state"));
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
            long handle = nativeLoad(file, arrays, stateNames, handles, device);
            try {
                return module.of(handle, Collections.unmodifiableList(trainable), Collections.unmodifiableMap(graphFiles));
            } catch (RuntimeException e) {
                Native.exportedFree(handle);
                throw e;
            }
        } catch (StrictJson.Refusal e) {
            throw new ProtocolException(file + ": " + e.getMessage());
        } catch (IOException | IllegalStateException | ClassCastException | NullPointerException
                | UnsupportedOperationException e) {
            throw new ProtocolException(Protocol3Messages.programUnreadable(file.toString(),
                    StrictJson.shown(String.valueOf(e.getMessage()))));
        } finally {
            Tensors.closeAll(state);
        }
    }

    /** The names of the parameters that train: every optimizer group's {@code params}, in group order. */
    private static List<String> trainableNames(JsonObject training) {
        List<String> trainable = new ArrayList<>();
        for (JsonElement group : training.getAsJsonArray("groups")) {
            for (JsonElement name : group.getAsJsonObject().getAsJsonArray("params")) {
                trainable.add(name.getAsString());
            }
        }
        return trainable;
    }

    /** Each graph's op list read from its zip entry and checked, by role into {@code opLists}, its text by entry. */
    private static void readGraphs(ZipFile archive, Path file, JsonObject graphs, Map<String, JsonObject> opLists,
            Map<String, String> graphFiles) throws IOException {
        for (Map.Entry<String, JsonElement> graph : graphs.entrySet()) {
            String where = "op list " + StrictJson.shown(graph.getKey());
            JsonElement name = graph.getValue();
            if (!name.isJsonPrimitive() || !name.getAsJsonPrimitive().isString()
                    || archive.getEntry(name.getAsString()) == null) {
                throw new ProtocolException(Protocol3Messages.programEntryMissing(file.toString(),
                        StrictJson.shown(name)));
            }
            byte[] bytes = readBytes(archive, file, name.getAsString(), StrictJson.JSON_BYTES);
            JsonElement opList = StrictJson.read(bytes, where);
            ProgramCheck.graph(opList, where);
            ProgramCheck.role(graph.getKey(), opList.getAsJsonObject(), where);
            opLists.put(graph.getKey(), opList.getAsJsonObject());
            graphFiles.put(name.getAsString(), new String(bytes, StandardCharsets.UTF_8));
        }
    }

    /** The native module built from the checked arrays and state tensors; libtorch's refusal as one line. */
    private static long nativeLoad(Path file, ProgramArrays arrays, String[] stateNames, long[] handles,
            String device) {
        try {
            return Native.exportedLoad(arrays.integers(), arrays.doubles(), arrays.strings(), stateNames, handles,
                    device);
        } catch (NativeException e) {
            throw new ProtocolException(file + ": " + ModuleEngine.libtorchSummary(e));
        }
    }

    private static JsonObject member(JsonObject object, String key, Path file, String entry) {
        JsonElement value = object.get(key);
        if (value == null || !value.isJsonObject()) {
            throw new ProtocolException(Protocol3Messages.programEntryMissing(file.toString(), entry));
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
            throw new ProtocolException(Protocol3Messages.programEntryMissing(file.toString(), entryFile));
        }
        String expected = expectedSpec(metadata, name);
        DType dtype;
        try {
            dtype = DType.of(dtypeName);
        } catch (InvalidInputException e) {
            throw new ProtocolException(Protocol3Messages.programStateMismatch(file.toString(), name,
                    expected == null ? "a constant" : expected, actual));
        }
        if (expected != null && !expected.equals(actual) && !FrozenSharing.leftOut(metadata, name, shape)) {
            throw new ProtocolException(Protocol3Messages.programStateMismatch(file.toString(), name, expected,
                    actual));
        }
        byte[] bytes = readBytes(archive, file, entryFile, needed);
        if (bytes.length != needed) {
            long size = Math.max(bytes.length, archive.getEntry(entryFile).getSize());
            throw new ProtocolException(Protocol3Messages.programStateBytes(file.toString(), entryFile, size, name,
                    actual,
                    needed));
        }
        ByteBuffer buffer = ByteBuffer.allocateDirect(Math.max(bytes.length, 1)).order(ByteOrder.LITTLE_ENDIAN);
        buffer.put(bytes).flip();
        return Tensor.fromBuffer(buffer, dtype, shape);
    }

    /**
     * The dtype and shape a state entry must have ({@code float32 [3, 4]}): a parameter's or buffer's as the
     * metadata declares it, an optimizer state's as its parameter's ({@code step}: a float32 scalar); null
     * for a tensor constant the model makes (python: protocol3_capture._entry_spec).
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
            throw new ProtocolException(Protocol3Messages.programEntryMissing(file.toString(), name));
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
            throw new ProtocolException(Protocol3Messages.programUnreadable(file.toString(),
                    "its entry " + name + " does not match its checksum"));
        }
        return bytes;
    }

    private static List<String> names(List<Metadata.TensorSpec> specs) {
        List<String> names = new ArrayList<>();
        for (Metadata.TensorSpec spec : specs) {
            names.add(spec.getName());
        }
        return names;
    }

    /**
     * {@code document} (the metadata and its checkpoint entry) with the program's state entries for {@code tensors}
     * (bound to {@code names}) and {@code counters}, the op lists as loaded and each tensor, as a protocol-3 zip;
     * tensor by tensor into the file, the archive never in memory whole.
     */
    static void write(Path file, String metadataName, JsonObject document, Map<String, String> graphFiles,
            List<String> names, List<Tensor> tensors, JsonElement counters) throws IOException {
        JsonObject program = document.getAsJsonObject(Protocol.PROGRAM_KEY);
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
        program.add("counters", counters);
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
    }

    private static void put(ZipOutputStream zip, String name, byte[] content) throws IOException {
        ZipEntry entry = new ZipEntry(name);
        entry.setTimeLocal(ZIP_TIME); // the same state saves as the same bytes
        zip.putNextEntry(entry);
        zip.write(content);
        zip.closeEntry();
    }
}
