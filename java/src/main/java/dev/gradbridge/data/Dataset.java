package dev.gradbridge.data;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDList;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Messages;
import dev.gradbridge.Metadata;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Enumeration;
import java.util.Locale;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;

/**
 * Inputs {@code x} and targets {@code y} for training or validation, as NDArrays of the PyTorch
 * engine. Read from {@code .npz} (arrays named {@code x} and {@code y}) or two {@code .npy} files
 * with DJL's numpy reader, or wrapped around existing arrays. {@link #check} compares them with a
 * module's metadata before any training starts.
 */
public final class Dataset implements AutoCloseable {

    private final String source;
    private final NDArray x;
    private final NDArray y;
    private final NDManager owned;

    private Dataset(String source, NDArray x, NDArray y, NDManager owned) {
        this.source = source;
        this.x = x;
        this.y = y;
        this.owned = owned;
    }

    /**
     * Wraps existing arrays (the caller keeps ownership).
     *
     * @param source a name for error messages
     * @param x inputs, batch dimension first
     * @param y targets, batch dimension first
     * @return the dataset
     */
    public static Dataset of(String source, NDArray x, NDArray y) {
        return new Dataset(source, x, y, null);
    }

    /**
     * Wraps native little-endian buffers without copying them (e.g. numpy arrays passed
     * through JPype); the buffers must outlive the dataset.
     *
     * @param manager where the arrays live; closing it releases them
     * @param source a name for error messages
     * @param x the inputs' bytes
     * @param xShape the inputs' shape
     * @param xType the inputs' dtype name ({@code float32}, {@code float64}, {@code int64})
     * @param y the targets' bytes
     * @param yShape the targets' shape
     * @param yType the targets' dtype name
     * @return the dataset
     */
    public static Dataset fromBuffers(
            NDManager manager, String source,
            ByteBuffer x, long[] xShape, String xType,
            ByteBuffer y, long[] yShape, String yType) {
        NDManager scope = manager.newSubManager();
        NDArray xs = scope.create(x.order(ByteOrder.nativeOrder()), new Shape(xShape), dataType(source, "x", xType));
        NDArray ys = scope.create(y.order(ByteOrder.nativeOrder()), new Shape(yShape), dataType(source, "y", yType));
        return new Dataset(source, xs, ys, scope);
    }

    /**
     * Reads {@code x} and {@code y} from an {@code .npz} file.
     *
     * @param file the .npz
     * @param manager where the arrays live (a sub-manager is used; closing the dataset frees it)
     * @return the dataset
     * @throws InvalidInputException when the file is missing, unreadable or lacks x or y
     */
    public static Dataset loadNpz(Path file, NDManager manager) {
        NDManager scope = manager.newSubManager();
        try (InputStream in = Files.newInputStream(file)) {
            checkNpzHeaders(file);
            NDList arrays = NDList.decode(scope, in);
            NDArray x = arrays.get("x");
            NDArray y = arrays.get("y");
            if (x == null || y == null) {
                List<String> names = new ArrayList<>();
                for (NDArray array : arrays) {
                    names.add(array.getName());
                }
                throw new InvalidInputException(
                        file + ": missing array '" + (x == null ? "x" : "y") + "'; the file holds " + names
                                + " (save with numpy.savez(path, x=..., y=...))");
            }
            return new Dataset(file.toString(), x, y, scope);
        } catch (NoSuchFileException e) {
            scope.close();
            throw new InvalidInputException(file + ": no such data file");
        } catch (IOException | IllegalArgumentException e) {
            scope.close();
            throw new InvalidInputException(file + ": not a readable .npz file: " + e.getMessage());
        } catch (RuntimeException e) {
            scope.close();
            throw e;
        }
    }

    /**
     * Reads {@code x} and {@code y} from two {@code .npy} files.
     *
     * @param xFile inputs
     * @param yFile targets
     * @param manager where the arrays live
     * @return the dataset
     */
    public static Dataset loadNpy(Path xFile, Path yFile, NDManager manager) {
        NDManager scope = manager.newSubManager();
        try {
            return new Dataset(xFile + " + " + yFile, readNpy(xFile, scope), readNpy(yFile, scope), scope);
        } catch (RuntimeException e) {
            scope.close();
            throw e;
        }
    }

    /** Every array's header, before DJL decodes (see {@link NpyHeader}). */
    private static void checkNpzHeaders(Path file) throws IOException {
        try (ZipFile archive = new ZipFile(file.toFile())) {
            Enumeration<? extends ZipEntry> entries = archive.entries();
            while (entries.hasMoreElements()) {
                ZipEntry entry = entries.nextElement();
                String name = entry.getName();
                if (name.endsWith(".npy")) {
                    try (InputStream in = archive.getInputStream(entry)) {
                        NpyHeader.check(in, entry.getSize(), file.toString(), name.substring(0, name.length() - 4));
                    }
                }
            }
        }
    }

    private static NDArray readNpy(Path file, NDManager manager) {
        try (InputStream in = Files.newInputStream(file)) {
            String name = String.valueOf(file.getFileName()).replaceFirst("\\.npy$", "");
            try (InputStream header = Files.newInputStream(file)) {
                NpyHeader.check(header, Files.size(file), file.toString(), name);
            }
            NDList arrays = NDList.decode(manager, in);
            return arrays.singletonOrThrow();
        } catch (NoSuchFileException e) {
            throw new InvalidInputException(file + ": no such data file");
        } catch (IOException | IllegalArgumentException e) {
            throw new InvalidInputException(file + ": not a readable .npy file: " + e.getMessage());
        }
    }

    private static DataType dataType(String source, String name, String dtype) {
        switch (dtype) {
            case "float32":
                return DataType.FLOAT32;
            case "float64":
                return DataType.FLOAT64;
            case "int64":
                return DataType.INT64;
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
    public NDArray getX() {
        return x;
    }

    /** @return the targets */
    public NDArray getY() {
        return y;
    }

    /** @return the number of samples */
    public int size() {
        return Math.toIntExact(x.getShape().get(0));
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
        long n = x.getShape().get(0);
        if (n == 0) {
            throw new InvalidInputException(source + ": the dataset is empty (0 samples)");
        }
        if (y.getShape().get(0) != n) {
            throw new InvalidInputException(
                    source + ": x has " + n + " samples but y has " + y.getShape().get(0));
        }
    }

    private void checkArray(String name, NDArray array, Metadata.TensorSpec spec) {
        String dtype = array.getDataType().name().toLowerCase(Locale.ROOT);
        long[] shape = array.getShape().getShape();
        if (!spec.accepts(dtype, shape)) {
            throw new InvalidInputException(
                    Messages.tensorSpec(source, name, spec.getDtype(), spec.getShape(), dtype, shape));
        }
        if (array.getDataType().isFloating() && shape.length > 0 && shape[0] > 0) {
            try (NDArray infinite = array.isInfinite();
                    NDArray nan = array.isNaN();
                    NDArray bad = infinite.logicalOr(nan);
                    NDArray any = bad.any()) {
                if (any.getBoolean()) {
                    throw new InvalidInputException(
                            source + ": " + name + " holds NaN or infinite values; clean the data first");
                }
            }
        }
    }

    /**
     * Identifies the data a run trains on, for checkpoints: SHA-256 of x's bytes, then y's.
     *
     * @return lowercase hex digest
     */
    public String fingerprint() {
        try {
            MessageDigest sha = MessageDigest.getInstance("SHA-256");
            sha.update(x.toByteArray());
            sha.update(y.toByteArray());
            StringBuilder hex = new StringBuilder();
            for (byte b : sha.digest()) {
                hex.append(String.format("%02x", b));
            }
            return hex.toString();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
    }

    /** Frees arrays this dataset read or wrapped itself; wrapped caller arrays stay. */
    @Override
    public void close() {
        if (owned != null) {
            owned.close();
        }
    }
}
