package dev.gradbridge;

import java.lang.ref.Cleaner;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;

/**
 * A libtorch tensor owned by Java: gradbridge's tensor type in its public API.
 *
 * <p>Ownership is explicit: whoever creates a tensor, or receives one from a method result,
 * closes it ({@code try (Tensor x = ...)}); closing twice is harmless, using a closed tensor
 * throws {@link IllegalStateException}. A tensor that becomes unreachable unclosed is freed by
 * the garbage collector eventually, which is a safety net, not a plan. A tensor made by {@link
 * #fromBuffer} uses the buffer's memory without copying it, and libtorch keeps the buffer
 * referenced for as long as any tensor uses that memory.
 *
 * <pre>{@code
 * try (Tensor x = Tensor.of(new float[] {1, 2, 3, 4}, 4, 1)) {
 *     double loss = module.trainStep(x, y);
 * }
 * }</pre>
 */
public final class Tensor implements AutoCloseable {

    private final TensorHandle handle;
    private final Cleaner.Cleanable cleanable;
    private DType dtype;
    private long[] shape;
    private ByteBuffer contiguous;
    private Tensor contiguousCopy;

    /** Takes ownership of a native tensor handle (called by the native library for results). */
    Tensor(long handle) {
        if (handle == 0) {
            throw new IllegalArgumentException("null tensor handle");
        }
        this.handle = new TensorHandle(handle);
        this.cleanable = this.handle.register(this);
    }

    private Tensor(long handle, DType dtype, long[] shape) {
        this(handle);
        this.dtype = dtype;
        this.shape = shape;
    }

    /**
     * A tensor over a direct buffer's memory (native byte order, row-major), without a copy.
     *
     * @param buffer a direct buffer; the values start at its position
     * @param dtype the element type
     * @param shape the shape
     * @return the tensor
     * @throws InvalidInputException when the buffer is not direct, too small or misaligned
     */
    public static Tensor fromBuffer(ByteBuffer buffer, DType dtype, long... shape) {
        if (buffer == null || !buffer.isDirect()) {
            throw new InvalidInputException("a tensor needs a direct ByteBuffer (ByteBuffer.allocateDirect), got "
                    + (buffer == null ? "null" : "a heap buffer"));
        }
        long bytes = Math.multiplyExact(Tensors.count(shape), dtype.size());
        if (bytes > buffer.remaining()) {
            throw new InvalidInputException("a " + dtype + " tensor of shape " + Arrays.toString(shape) + " needs "
                    + bytes + " bytes, the buffer has " + buffer.remaining());
        }
        long[] dims = shape.clone();
        NativeLibrary.load(); // a GradbridgeException naming what is missing, not a class initialization error
        return new Tensor(Native.tensorFromBuffer(buffer, buffer.position(), dtype.code(), dims), dtype, dims);
    }

    /**
     * A new uninitialized tensor; fill it through {@link #buffer()}.
     *
     * @param dtype the element type
     * @param shape the shape
     * @return the tensor
     */
    public static Tensor empty(DType dtype, long... shape) {
        long[] dims = shape.clone();
        Tensors.count(dims);
        NativeLibrary.load();
        return new Tensor(Native.tensorEmpty(dtype.code(), dims), dtype, dims);
    }

    /**
     * A float32 tensor (copied).
     *
     * @param values row-major values
     * @param shape the shape; its element count must equal {@code values.length}
     * @return the tensor
     */
    public static Tensor of(float[] values, long... shape) {
        Tensor tensor = filled(DType.FLOAT32, values.length, shape);
        tensor.buffer().asFloatBuffer().put(values);
        return tensor;
    }

    /**
     * A float64 tensor (copied).
     *
     * @param values row-major values
     * @param shape the shape; its element count must equal {@code values.length}
     * @return the tensor
     */
    public static Tensor of(double[] values, long... shape) {
        Tensor tensor = filled(DType.FLOAT64, values.length, shape);
        tensor.buffer().asDoubleBuffer().put(values);
        return tensor;
    }

    /**
     * An int64 tensor (copied).
     *
     * @param values row-major values
     * @param shape the shape; its element count must equal {@code values.length}
     * @return the tensor
     */
    public static Tensor of(long[] values, long... shape) {
        Tensor tensor = filled(DType.INT64, values.length, shape);
        tensor.buffer().asLongBuffer().put(values);
        return tensor;
    }

    /**
     * A bool tensor (copied).
     *
     * @param values row-major values
     * @param shape the shape; its element count must equal {@code values.length}
     * @return the tensor
     */
    public static Tensor of(boolean[] values, long... shape) {
        Tensor tensor = filled(DType.BOOL, values.length, shape);
        ByteBuffer bytes = tensor.buffer();
        for (int i = 0; i < values.length; i++) {
            bytes.put(i, values[i] ? (byte) 1 : (byte) 0);
        }
        return tensor;
    }

    /**
     * The int64 tensor {@code 0, 1, ..., n - 1} (e.g. the identity order of an epoch).
     *
     * @param n the length
     * @return the tensor
     */
    public static Tensor arange(long n) {
        Tensor tensor = empty(DType.INT64, n);
        java.nio.LongBuffer values = tensor.buffer().asLongBuffer();
        for (int i = 0; i < n; i++) {
            values.put(i, i);
        }
        return tensor;
    }

    /**
     * A tensor of any type from doubles, each rounded to the type as a C++ cast does (exact for
     * values the type can hold: what {@link TrainingModule#setParameters} needs).
     *
     * @param dtype the element type (floating or integer, not bool)
     * @param values row-major values
     * @param shape the shape
     * @return the tensor
     */
    public static Tensor ofDoubles(DType dtype, double[] values, long... shape) {
        if (dtype == DType.FLOAT64) {
            return of(values, shape);
        }
        if (dtype == DType.FLOAT32) {
            float[] narrowed = new float[values.length];
            for (int i = 0; i < values.length; i++) {
                narrowed[i] = (float) values[i];
            }
            return of(narrowed, shape);
        }
        try (Tensor wide = of(values, shape)) {
            return wide.to(dtype);
        }
    }

    private static Tensor filled(DType dtype, int length, long[] shape) {
        if (Tensors.count(shape) != length) {
            throw new InvalidInputException(
                    length + " values do not fill shape " + Arrays.toString(shape) + " (" + Tensors.count(shape) + " elements)");
        }
        return empty(dtype, shape);
    }

    /** The native handle, for the native library; throws when closed. */
    long handle() {
        long value = handle.value;
        if (value == 0) {
            throw new IllegalStateException("the tensor is closed");
        }
        return value;
    }

    /** @return the element type */
    public DType dtype() {
        if (dtype == null) {
            int code = Native.tensorScalarType(handle());
            dtype = DType.ofCode(code);
            if (dtype == null) {
                throw new UnsupportedOperationException("libtorch scalar type " + code + " has no gradbridge DType");
            }
        }
        return dtype;
    }

    /** @return a copy of the shape */
    public long[] shape() {
        return dims().clone();
    }

    /** The shape without a copy (never modified), for this package. */
    long[] dims() {
        if (shape == null) {
            shape = Native.tensorShape(handle());
        }
        return shape;
    }

    /** @return the number of dimensions */
    public int dim() {
        return dims().length;
    }

    /**
     * @param dimension a dimension, 0-based
     * @return its size
     */
    public long size(int dimension) {
        return dims()[dimension];
    }

    /** @return the number of elements */
    public long numel() {
        return Tensors.count(dims());
    }

    /**
     * The values' memory, row-major in native byte order: the tensor's own memory when it is
     * contiguous (writes change the tensor), else a contiguous copy made once. Valid until the
     * tensor is closed.
     *
     * @return a direct buffer positioned at 0
     */
    public ByteBuffer buffer() {
        if (contiguous == null) {
            long own = handle();
            if (Native.tensorIsContiguous(own)) {
                contiguous = Native.tensorBuffer(own);
            } else {
                contiguousCopy = new Tensor(Native.tensorContiguous(own));
                contiguous = Native.tensorBuffer(contiguousCopy.handle());
            }
            contiguous.order(ByteOrder.nativeOrder());
        }
        return contiguous.duplicate().order(ByteOrder.nativeOrder());
    }

    /** @return the values (float32 only) */
    public float[] toFloatArray() {
        require(DType.FLOAT32);
        float[] values = new float[Math.toIntExact(numel())];
        buffer().asFloatBuffer().get(values);
        return values;
    }

    /** @return the values (float64 only) */
    public double[] toDoubleArray() {
        require(DType.FLOAT64);
        double[] values = new double[Math.toIntExact(numel())];
        buffer().asDoubleBuffer().get(values);
        return values;
    }

    /** @return the values (int64 only) */
    public long[] toLongArray() {
        require(DType.INT64);
        long[] values = new long[Math.toIntExact(numel())];
        buffer().asLongBuffer().get(values);
        return values;
    }

    /** @return the values (bool only) */
    public boolean[] toBooleanArray() {
        require(DType.BOOL);
        ByteBuffer bytes = buffer();
        boolean[] values = new boolean[bytes.remaining()];
        for (int i = 0; i < values.length; i++) {
            values[i] = bytes.get(i) != 0;
        }
        return values;
    }

    /** @return the values as doubles, exactly for float32/float64 (libtorch converts other types) */
    public double[] toExactDoubles() {
        DType type = dtype();
        if (type == DType.FLOAT64) {
            return toDoubleArray();
        }
        if (type == DType.FLOAT32) {
            // widened straight from the tensor's memory: no float[] copy of a large parameter between
            java.nio.FloatBuffer floats = buffer().asFloatBuffer();
            double[] widened = new double[floats.limit()];
            for (int i = 0; i < widened.length; i++) {
                widened[i] = floats.get(i);
            }
            return widened;
        }
        try (Tensor wide = to(DType.FLOAT64)) {
            return wide.toDoubleArray();
        }
    }

    /**
     * The values as {@link #toExactDoubles()} gives them, in a new direct buffer (native order):
     * widened by libtorch and copied once, no Java array (an epoch's record of a large model).
     */
    ByteBuffer exactDoubleBuffer() {
        try (Tensor wide = dtype() == DType.FLOAT64 ? null : to(DType.FLOAT64)) {
            ByteBuffer values = (wide == null ? this : wide).buffer();
            ByteBuffer copy = ByteBuffer.allocateDirect(values.remaining()).order(ByteOrder.nativeOrder());
            copy.put(values).flip();
            return copy;
        }
    }

    /** @return a copy of the values' bytes, row-major in native byte order */
    public byte[] toBytes() {
        ByteBuffer values = buffer();
        byte[] bytes = new byte[values.remaining()];
        values.get(bytes);
        return bytes;
    }

    /** @return whether every value is finite (always true for integer and bool tensors) */
    public boolean allFinite() {
        DType type = dtype();
        if (type == DType.FLOAT32) {
            java.nio.FloatBuffer values = buffer().asFloatBuffer();
            for (int i = 0; i < values.limit(); i++) {
                if (!Float.isFinite(values.get(i))) {
                    return false;
                }
            }
            return true;
        }
        if (type == DType.FLOAT64) {
            java.nio.DoubleBuffer values = buffer().asDoubleBuffer();
            for (int i = 0; i < values.limit(); i++) {
                if (!Double.isFinite(values.get(i))) {
                    return false;
                }
            }
            return true;
        }
        if (type.isFloating()) {
            try (Tensor wide = to(DType.FLOAT64)) {
                return wide.allFinite();
            }
        }
        return true;
    }

    /**
     * Rows by index ({@code index_select(0, indices)}), a new tensor.
     *
     * @param indices a 1-d int64 tensor of row numbers
     * @return the selected rows, in the order given
     */
    public Tensor index(Tensor indices) {
        return new Tensor(Native.tensorIndexSelect(handle(), indices.handle()));
    }

    /**
     * Rows {@code start} (inclusive) to {@code end} (exclusive): a view sharing this tensor's
     * memory ({@code narrow(0, start, end - start)}); close it too.
     *
     * @param start the first row
     * @param end one past the last row
     * @return the view
     */
    public Tensor rows(long start, long end) {
        return new Tensor(Native.tensorNarrow(handle(), start, end - start));
    }

    /** A copy in page-locked memory, which a copy to a CUDA device reads directly (this tensor's values). */
    Tensor pinned() {
        return new Tensor(Native.tensorPinned(handle()));
    }

    /**
     * A copy with memory of its own (e.g. to keep values past the buffer a tensor was made on).
     *
     * @return the copy
     */
    public Tensor copy() {
        return new Tensor(Native.tensorClone(handle()));
    }

    /**
     * This tensor converted to another type by libtorch, a new tensor.
     *
     * @param type the element type
     * @return the converted copy
     */
    public Tensor to(DType type) {
        return new Tensor(Native.tensorTo(handle(), type.code()));
    }

    private void require(DType wanted) {
        if (dtype() != wanted) {
            throw new IllegalStateException("tensor is " + dtype() + ", not " + wanted);
        }
    }

    /** @return whether {@link #close} was called */
    public boolean isClosed() {
        return handle.value == 0;
    }

    /** Frees the native tensor (and a contiguous copy made by {@link #buffer}). Idempotent. */
    @Override
    public void close() {
        if (contiguousCopy != null) {
            contiguousCopy.close();
        }
        contiguous = null;
        cleanable.clean();
    }

    @Override
    public String toString() {
        return isClosed() ? "Tensor(closed)" : "Tensor(" + dtype() + ", " + Arrays.toString(dims()) + ")";
    }
}
