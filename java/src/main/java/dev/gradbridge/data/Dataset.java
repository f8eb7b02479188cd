package dev.gradbridge.data;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Tensor;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.InputMessages;
import dev.gradbridge.internal.LowPrecision;
import dev.gradbridge.internal.Messages;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.ZipEntry;
import java.util.zip.ZipException;
import java.util.zip.ZipFile;

/**
 * Inputs and targets {@code y} for training or validation, as {@link Tensor}s: one input {@code x},
 * or for a model of several inputs one tensor per input name. Read from {@code .npz} (arrays named
 * {@code x} and {@code y}, or one per input name and {@code y}) or two {@code .npy} files, or
 * wrapped around existing tensors or buffers. {@link #check} compares them with a module's
 * metadata before any training starts.
 */
public final class Dataset implements AutoCloseable {

    private final String source;
    /** The inputs by name; {@link #check} puts them in the module's order and drops the others. */
    private Map<String, Tensor> inputs;
    private Tensor y;
    private final boolean owned;
    /** Tensors the dataset made from the caller's (a 16-bit input cast from its carrier): freed on close. */
    private final List<Tensor> made = new ArrayList<>();
    /** The arrays' names as the source holds them (a file's order), for messages. */
    private final List<String> held;
    /** An .npz: {@link #check} refuses an array the module does not take. */
    private final boolean exact;

    private Dataset(String source, Map<String, Tensor> inputs, Tensor y, boolean owned, List<String> held,
            boolean exact) {
        this.source = source;
        this.inputs = new LinkedHashMap<>(inputs);
        this.y = y;
        this.owned = owned;
        this.held = held;
        this.exact = exact;
    }

    private Dataset(String source, Map<String, Tensor> inputs, Tensor y, boolean owned) {
        this(source, inputs, y, owned, withY(inputs.keySet()), false);
    }

    private Dataset(String source, Tensor x, Tensor y, boolean owned) {
        this(source, Collections.singletonMap("x", x), y, owned);
    }

    private static List<String> withY(java.util.Collection<String> names) {
        List<String> all = new ArrayList<>(names);
        all.add("y");
        return all;
    }

    /**
     * Wraps existing tensors (the caller keeps ownership).
     *
     * @param source a name for error messages
     * @param x inputs, batch dimension first
     * @param y targets, batch dimension first
     * @return the dataset
     */
    public static Dataset of(String source, Tensor x, Tensor y) {
        return new Dataset(source, x, y, false);
    }

    /**
     * Wraps existing tensors of a model's several inputs (the caller keeps ownership).
     *
     * @param source a name for error messages
     * @param inputs each input by name (as the module's metadata names them), batch dimension first
     * @param y targets, batch dimension first
     * @return the dataset
     */
    public static Dataset of(String source, Map<String, Tensor> inputs, Tensor y) {
        return new Dataset(source, inputs, y, false);
    }

    /**
     * Wraps direct buffers in native byte order without copying them (e.g. numpy arrays passed
     * through JPype); libtorch keeps the buffers referenced while it uses them.
     *
     * @param source a name for error messages
     * @param x the inputs' bytes
     * @param xShape the inputs' shape
     * @param xType the inputs' dtype name ({@code float32}, {@code float64}, {@code int64})
     * @param y the targets' bytes
     * @param yShape the targets' shape
     * @param yType the targets' dtype name
     * @return the dataset; closing it frees the tensors, not the buffers
     */
    public static Dataset fromBuffers(
            String source,
            ByteBuffer x, long[] xShape, String xType,
            ByteBuffer y, long[] yShape, String yType) {
        return fromBuffers(source, Arrays.asList("x", "y"), Arrays.asList(x, y), Arrays.asList(xShape, yShape),
                Arrays.asList(xType, yType));
    }

    /**
     * Wraps direct buffers of several named arrays, the inputs then {@code y}, without copying them
     * (as {@link #fromBuffers(String, ByteBuffer, long[], String, ByteBuffer, long[], String)}).
     *
     * @param source a name for error messages
     * @param names the arrays' names: the inputs, then {@code y}
     * @param data each array's bytes
     * @param shapes each array's shape
     * @param dtypes each array's dtype name ({@code float32}, {@code float64}, {@code int64})
     * @return the dataset; closing it frees the tensors, not the buffers
     */
    public static Dataset fromBuffers(
            String source, List<String> names, List<ByteBuffer> data, List<long[]> shapes, List<String> dtypes) {
        int count = names.size();
        if (count < 2 || !"y".equals(names.get(count - 1)) || data.size() != count || shapes.size() != count
                || dtypes.size() != count) {
            throw new InvalidInputException(source + ": expected the inputs then y, each with data, shape and dtype; got "
                    + names + " with " + data.size() + " buffers, " + shapes.size() + " shapes and " + dtypes.size()
                    + " dtypes");
        }
        Map<String, Tensor> tensors = new LinkedHashMap<>();
        try {
            for (int i = 0; i < count; i++) {
                tensors.put(names.get(i), Tensor.fromBuffer(data.get(i), dataType(source, names.get(i), dtypes.get(i)),
                        shapes.get(i)));
            }
            Tensor y = tensors.remove("y");
            return new Dataset(source, tensors, y, true);
        } catch (RuntimeException e) {
            for (Tensor tensor : tensors.values()) {
                tensor.close();
            }
            throw e;
        }
    }

    /**
     * Reads the arrays of an {@code .npz} file: {@code y} and the inputs ({@code x}, or one array
     * per input name: {@link #check} names one the module needs that the file lacks, and one it
     * does not take, as gradbridge-spark refuses such a Parquet column).
     *
     * @param file the .npz
     * @return the dataset (close it to free the tensors)
     * @throws InvalidInputException when the file is missing or unreadable
     */
    public static Dataset loadNpz(Path file) {
        Map<String, Tensor> arrays = new LinkedHashMap<>();
        try {
            if (!Files.exists(file)) {
                throw new NoSuchFileException(file.toString());
            }
            try (ZipFile archive = new ZipFile(file.toFile())) {
                Enumeration<? extends ZipEntry> entries = archive.entries();
                while (entries.hasMoreElements()) {
                    ZipEntry entry = entries.nextElement();
                    String name = entry.getName();
                    if (name.endsWith(".npy")) {
                        String array = name.substring(0, name.length() - 4);
                        try (InputStream in = archive.getInputStream(entry)) {
                            arrays.put(array, readArray(in, entry.getSize(), file.toString(), array));
                        }
                    }
                }
            }
            List<String> names = new ArrayList<>(arrays.keySet()); // the file's order, as Python lists them
            Tensor y = arrays.remove("y"); // null when missing: check names it, after any missing input
            Dataset data = new Dataset(file.toString(), arrays, y, true, names, true);
            arrays.clear(); // the dataset owns them now
            return data;
        } catch (NoSuchFileException e) {
            throw new InvalidInputException(file + ": no such data file");
        } catch (ZipException e) {
            throw new InvalidInputException(file + ": not a readable .npz file: " + e.getMessage());
        } catch (IOException | IllegalArgumentException e) {
            throw new InvalidInputException(file + ": not a readable .npz file: " + e.getMessage());
        } finally {
            for (Tensor unused : arrays.values()) {
                unused.close();
            }
        }
    }

    /**
     * Reads {@code x} and {@code y} from two {@code .npy} files.
     *
     * @param xFile inputs
     * @param yFile targets
     * @return the dataset (close it to free the tensors)
     */
    public static Dataset loadNpy(Path xFile, Path yFile) {
        Tensor x = readNpy(xFile);
        try {
            return new Dataset(xFile + " + " + yFile, x, readNpy(yFile), true);
        } catch (RuntimeException e) {
            x.close();
            throw e;
        }
    }

    private static Tensor readNpy(Path file) {
        String name = String.valueOf(file.getFileName()).replaceFirst("\\.npy$", "");
        try (InputStream in = Files.newInputStream(file)) {
            return readArray(in, Files.size(file), file.toString(), name);
        } catch (NoSuchFileException e) {
            throw new InvalidInputException(file + ": no such data file");
        } catch (IOException e) {
            throw new InvalidInputException(file + ": not a readable .npy file: " + e.getMessage());
        }
    }

    /** The largest array a data file may hold: a Java buffer's limit. */
    public static final long MAX_ARRAY_BYTES = Integer.MAX_VALUE - 8;

    /** One array: its header checked ({@link NpyHeader}), then its data read into native memory. */
    private static Tensor readArray(InputStream in, long totalBytes, String source, String array) throws IOException {
        NpyHeader header = NpyHeader.check(in, totalBytes, source, array);
        DType dtype = DType.ofNumpy(header.descr);
        if (dtype == null) {
            throw new InvalidInputException(source + ": " + array + " has numpy dtype " + header.descr
                    + ", which gradbridge does not read; save it as float32, float64 or int64");
        }
        long count = 1;
        long bytes = -1;
        try {
            for (long dim : header.shape) {
                count = Math.multiplyExact(count, dim);
            }
            bytes = Math.multiplyExact(count, (long) dtype.size());
        } catch (ArithmeticException e) {
            bytes = -1;
        }
        if (bytes < 0 || bytes > MAX_ARRAY_BYTES) { // one direct buffer per array: Java's limit
            throw new InvalidInputException(Messages.arrayTooLarge(source, array, header.shape, bytes, MAX_ARRAY_BYTES));
        }
        ByteBuffer data = ByteBuffer.allocateDirect((int) bytes).order(ByteOrder.nativeOrder());
        byte[] chunk = new byte[1 << 16];
        while (data.hasRemaining()) {
            int read = in.read(chunk, 0, Math.min(chunk.length, data.remaining()));
            if (read < 0) {
                throw new IOException(array + " ends early");
            }
            data.put(chunk, 0, read);
        }
        data.flip();
        return Tensor.fromBuffer(data, dtype, header.shape);
    }

    private static DType dataType(String source, String name, String dtype) {
        switch (dtype) {
            case "float32":
            case "float64":
            case "int64":
                return DType.of(dtype);
            default:
                throw new InvalidInputException(
                        source + ": " + name + " has dtype " + dtype + "; expected float32, float64 or int64");
        }
    }

    /** @return where the data came from, for messages */
    public String getSource() {
        return source;
    }

    /**
     * @return the one input {@code x} (a model of several inputs: {@link #getInputs()})
     * @throws InvalidInputException when the data has no array {@code x}
     */
    public Tensor getX() {
        Tensor x = inputs.get("x");
        if (x == null) {
            throw new InvalidInputException(InputMessages.inputMissing(source, "x", held, Arrays.asList("x", "y")));
        }
        return x;
    }

    /** @return the inputs by name; after {@link #check}, exactly the module's, in its order */
    public Map<String, Tensor> getInputs() {
        return Collections.unmodifiableMap(inputs);
    }

    /**
     * @return the targets
     * @throws InvalidInputException when the file has no array {@code y}
     */
    public Tensor getY() {
        if (y == null) {
            throw new InvalidInputException(InputMessages.inputMissing(source, "y", held, withY(inputs.keySet())));
        }
        return y;
    }

    /** @return the number of samples */
    public int size() {
        return Math.toIntExact(getY().size(0));
    }

    /**
     * Checks the data against a module's metadata: the arrays it takes (an {@code .npz}: no
     * others), dtypes, shapes (every dimension but the batch), equal sample counts, at least one
     * sample, only finite values.
     *
     * @param metadata the module's metadata
     * @throws InvalidInputException naming the file, the array and expected versus actual
     */
    public void check(Metadata metadata) {
        List<String> names = metadata.getInputNames();
        List<String> needs = withY(names);
        Map<String, Tensor> ordered = new LinkedHashMap<>();
        for (String name : names) {
            Tensor array = inputs.get(name);
            if (array == null) {
                throw new InvalidInputException(InputMessages.inputMissing(source, name, held, needs));
            }
            ordered.put(name, array);
        }
        if (y == null) {
            throw new InvalidInputException(InputMessages.inputMissing(source, "y", held, needs));
        }
        if (exact) { // an .npz holds what was saved for training: an array left out would be dropped unseen
            for (String name : held) {
                if (!needs.contains(name)) {
                    throw new InvalidInputException(InputMessages.unknownArray(source, name, names));
                }
            }
        }
        for (String name : names) {
            ordered.put(name, checkArray(name, ordered.get(name), metadata.getInput(name)));
        }
        y = checkArray("y", y, metadata.getInput("y"));
        String first = names.get(0);
        long n = ordered.get(first).size(0);
        if (n == 0) {
            throw new InvalidInputException(source + ": the dataset is empty (0 samples)");
        }
        for (String name : needs.subList(1, needs.size())) {
            Tensor array = "y".equals(name) ? y : ordered.get(name);
            if (array.size(0) != n) {
                throw new InvalidInputException(source + ": " + first + " has " + n + " samples but " + name + " has "
                        + array.size(0));
            }
        }
        if (owned) { // arrays of the file that the module does not take
            for (Map.Entry<String, Tensor> entry : inputs.entrySet()) {
                if (!ordered.containsKey(entry.getKey())) {
                    entry.getValue().close();
                }
            }
        }
        inputs = ordered;
    }

    /** The array checked against its spec; a 16-bit input's carrier ({@link DType#carrier}) cast to its dtype. */
    private Tensor checkArray(String name, Tensor array, Metadata.TensorSpec spec) {
        String dtype = array.dtype().torchName();
        long[] shape = array.shape();
        DType wanted = DType.of(spec.getDtype());
        boolean carried = wanted.carrier() != wanted && array.dtype() == wanted.carrier();
        if (!spec.accepts(carried ? spec.getDtype() : dtype, shape)) {
            throw new InvalidInputException(
                    Messages.tensorSpec(source, name, spec.getDtype(), spec.getShape(), dtype, shape));
        }
        if (!array.allFinite()) {
            throw new InvalidInputException(source + ": " + name + " holds NaN or infinite values; clean the data first");
        }
        if (!carried) {
            return array;
        }
        LowPrecision.checkExact(source, name, array.buffer().asFloatBuffer(), shape, wanted);
        Tensor cast = array.to(wanted);
        made.add(cast); // the dataset's; a caller's tensor stays theirs, one it read goes now
        if (owned) {
            array.close();
        }
        return cast;
    }

    /**
     * Identifies the data a run trains on, for checkpoints: SHA-256 of the inputs' bytes (x, or
     * each input in the module's order after {@link #check}), then y's.
     *
     * @return lowercase hex digest
     */
    public String fingerprint() {
        MessageDigest sha = Digests.sha256();
        for (Tensor input : inputs.values()) {
            sha.update(input.buffer());
        }
        sha.update(y.buffer());
        return Digests.hex(sha.digest());
    }

    /** Frees tensors this dataset read or wrapped itself; the caller's tensors stay. */
    @Override
    public void close() {
        for (Tensor tensor : made) {
            tensor.close();
        }
        if (owned) {
            for (Tensor input : inputs.values()) {
                input.close();
            }
            if (y != null) {
                y.close();
            }
        }
    }
}
