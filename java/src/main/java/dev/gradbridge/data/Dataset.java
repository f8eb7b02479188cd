package dev.gradbridge.data;

import dev.gradbridge.DType;
import dev.gradbridge.Digests;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Messages;
import dev.gradbridge.Metadata;
import dev.gradbridge.Tensor;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.ZipEntry;
import java.util.zip.ZipException;
import java.util.zip.ZipFile;

/**
 * Inputs {@code x} and targets {@code y} for training or validation, as {@link Tensor}s. Read
 * from {@code .npz} (arrays named {@code x} and {@code y}) or two {@code .npy} files, or wrapped
 * around existing tensors or buffers. {@link #check} compares them with a module's metadata
 * before any training starts.
 */
public final class Dataset implements AutoCloseable {

    private final String source;
    private final Tensor x;
    private final Tensor y;
    private final boolean owned;

    private Dataset(String source, Tensor x, Tensor y, boolean owned) {
        this.source = source;
        this.x = x;
        this.y = y;
        this.owned = owned;
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
        Tensor xs = Tensor.fromBuffer(x, dataType(source, "x", xType), xShape);
        try {
            return new Dataset(source, xs, Tensor.fromBuffer(y, dataType(source, "y", yType), yShape), true);
        } catch (RuntimeException e) {
            xs.close();
            throw e;
        }
    }

    /**
     * Reads {@code x} and {@code y} from an {@code .npz} file.
     *
     * @param file the .npz
     * @return the dataset (close it to free the tensors)
     * @throws InvalidInputException when the file is missing, unreadable or lacks x or y
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
            Tensor x = arrays.remove("x");
            Tensor y = arrays.remove("y");
            if (x == null || y == null) {
                if (x != null) {
                    x.close();
                }
                if (y != null) {
                    y.close();
                }
                throw new InvalidInputException(
                        file + ": missing array '" + (x == null ? "x" : "y") + "'; the file holds " + names
                                + " (save with numpy.savez(path, x=..., y=...))");
            }
            return new Dataset(file.toString(), x, y, true);
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

    /** One array: its header checked ({@link NpyHeader}), then its data read into native memory. */
    private static Tensor readArray(InputStream in, long totalBytes, String source, String array) throws IOException {
        NpyHeader header = NpyHeader.check(in, totalBytes, source, array);
        DType dtype = DType.ofNumpy(header.descr);
        if (dtype == null) {
            throw new InvalidInputException(source + ": " + array + " has numpy dtype " + header.descr
                    + ", which gradbridge does not read; save it as float32, float64 or int64");
        }
        long count = 1;
        for (long dim : header.shape) {
            count = Math.multiplyExact(count, dim);
        }
        ByteBuffer data = ByteBuffer.allocateDirect(Math.toIntExact(count * dtype.size())).order(ByteOrder.nativeOrder());
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

    /** @return the inputs */
    public Tensor getX() {
        return x;
    }

    /** @return the targets */
    public Tensor getY() {
        return y;
    }

    /** @return the number of samples */
    public int size() {
        return Math.toIntExact(x.size(0));
    }

    /**
     * Checks the data against a module's metadata: dtypes, shapes (every dimension but the
     * batch), equal sample counts, at least one sample, only finite values.
     *
     * @param metadata the module's metadata
     * @throws InvalidInputException naming the file, the array and expected versus actual
     */
    public void check(Metadata metadata) {
        checkArray("x", x, metadata.getInput("x"));
        checkArray("y", y, metadata.getInput("y"));
        long n = x.size(0);
        if (n == 0) {
            throw new InvalidInputException(source + ": the dataset is empty (0 samples)");
        }
        if (y.size(0) != n) {
            throw new InvalidInputException(source + ": x has " + n + " samples but y has " + y.size(0));
        }
    }

    private void checkArray(String name, Tensor array, Metadata.TensorSpec spec) {
        String dtype = array.dtype().torchName();
        long[] shape = array.shape();
        if (!spec.accepts(dtype, shape)) {
            throw new InvalidInputException(
                    Messages.tensorSpec(source, name, spec.getDtype(), spec.getShape(), dtype, shape));
        }
        if (!array.allFinite()) {
            throw new InvalidInputException(source + ": " + name + " holds NaN or infinite values; clean the data first");
        }
    }

    /**
     * Identifies the data a run trains on, for checkpoints: SHA-256 of x's bytes, then y's.
     *
     * @return lowercase hex digest
     */
    public String fingerprint() {
        MessageDigest sha = Digests.sha256();
        sha.update(x.buffer());
        sha.update(y.buffer());
        return Digests.hex(sha.digest());
    }

    /** Frees tensors this dataset read or wrapped itself; the caller's tensors stay. */
    @Override
    public void close() {
        if (owned) {
            x.close();
            y.close();
        }
    }
}
