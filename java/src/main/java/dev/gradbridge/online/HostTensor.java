package dev.gradbridge.online;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.internal.LowPrecision;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.Locale;
import java.util.Set;

/**
 * An immutable tensor in Java memory: dtype, shape and little-endian bytes (the write-ahead
 * log's byte order). The first dimension is the batch: {@link OnlineLearner#learn} takes one
 * event per row. Supported dtypes: {@code float32}, {@code float64}, {@code int64}, and the
 * 16-bit floats {@code bfloat16} and {@code float16} (their 2-byte words), which the learner
 * also takes as float32 values that are exactly theirs ({@link DType#carrier}).
 */
public final class HostTensor {

    /** The dtypes a host tensor holds (what the online learner's log and models take). */
    private static final Set<DType> SUPPORTED =
            EnumSet.of(DType.FLOAT32, DType.FLOAT64, DType.INT64, DType.BFLOAT16, DType.FLOAT16);

    private final String dtype;
    private final long[] shape;
    private final byte[] data;

    private HostTensor(String dtype, long[] shape, byte[] data) {
        this.dtype = dtype;
        this.shape = shape.clone();
        this.data = data;
        long count = 1;
        for (long dim : shape) {
            if (dim < 0) {
                throw new InvalidInputException("tensor shape " + Arrays.toString(shape) + " has a negative dimension");
            }
            count *= dim;
        }
        if (count * elementSize(dtype) != data.length) {
            throw new InvalidInputException(
                    "a " + dtype + " tensor of shape " + Arrays.toString(shape) + " needs "
                            + count * elementSize(dtype) + " bytes, got " + data.length);
        }
    }

    /**
     * Wraps little-endian bytes (copied).
     *
     * @param dtype {@code float32}, {@code float64}, {@code int64}, {@code bfloat16} or {@code float16}
     * @param shape the shape, batch dimension first
     * @param littleEndian the values, row-major
     * @return the tensor
     * @throws InvalidInputException for an unknown dtype or a byte count that does not fit the shape
     */
    public static HostTensor of(String dtype, long[] shape, byte[] littleEndian) {
        return new HostTensor(dtype, shape, littleEndian.clone());
    }

    /** Wraps little-endian bytes without a copy, for this package (the caller gives them up). */
    static HostTensor wrap(String dtype, long[] shape, byte[] littleEndian) {
        return new HostTensor(dtype, shape, littleEndian);
    }

    /**
     * A float32 tensor.
     *
     * @param values the values, row-major
     * @param shape the shape, batch dimension first
     * @return the tensor
     */
    public static HostTensor ofFloats(float[] values, long... shape) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 4).order(DType.FILE_ORDER);
        bytes.asFloatBuffer().put(values);
        return new HostTensor(DType.FLOAT32.torchName(), shape, bytes.array());
    }

    /**
     * A float64 tensor.
     *
     * @param values the values, row-major
     * @param shape the shape, batch dimension first
     * @return the tensor
     */
    public static HostTensor ofDoubles(double[] values, long... shape) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 8).order(DType.FILE_ORDER);
        bytes.asDoubleBuffer().put(values);
        return new HostTensor(DType.FLOAT64.torchName(), shape, bytes.array());
    }

    /**
     * An int64 tensor.
     *
     * @param values the values, row-major
     * @param shape the shape, batch dimension first
     * @return the tensor
     */
    public static HostTensor ofLongs(long[] values, long... shape) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 8).order(DType.FILE_ORDER);
        bytes.asLongBuffer().put(values);
        return new HostTensor(DType.INT64.torchName(), shape, bytes.array());
    }

    /**
     * Bytes per element of a dtype.
     *
     * @param dtype {@code float32}, {@code float64}, {@code int64}, {@code bfloat16} or {@code float16}
     * @return 4, 8 or 2
     * @throws InvalidInputException for any other dtype
     */
    public static int elementSize(String dtype) {
        return supported(dtype).size();
    }

    private static DType supported(String dtype) {
        for (DType type : SUPPORTED) {
            if (type.torchName().equals(dtype)) {
                return type;
            }
        }
        throw new InvalidInputException(
                "dtype " + dtype + " is not supported; expected float32, float64, int64, bfloat16 or float16");
    }

    /** @return the dtype name (torch's spelling) */
    public String getDtype() {
        return dtype;
    }

    /** @return a copy of the shape */
    public long[] getShape() {
        return shape.clone();
    }

    /** @return the number of rows (the first dimension), 1 for a scalar */
    public long rows() {
        return shape.length == 0 ? 1 : shape[0];
    }

    /** @return a copy of the little-endian bytes */
    public byte[] toBytes() {
        return data.clone();
    }

    /** The bytes without a copy, for this package (never modified). */
    byte[] bytes() {
        return data;
    }

    /** @return the values as floats (float32, or the 16-bit floats widened exactly) */
    public float[] toFloatArray() {
        DType type = supported(dtype);
        if (type.carrier() != type) {
            float[] values = new float[data.length / type.size()];
            ByteBuffer buffer = ByteBuffer.wrap(data).order(DType.FILE_ORDER);
            for (int i = 0; i < values.length; i++) {
                values[i] = type.widen(buffer.getShort(i * type.size()));
            }
            return values;
        }
        requireDtype(DType.FLOAT32);
        float[] values = new float[data.length / DType.FLOAT32.size()];
        ByteBuffer.wrap(data).order(DType.FILE_ORDER).asFloatBuffer().get(values);
        return values;
    }

    /**
     * A float32 tensor's values as the 16-bit input dtype {@code dtype} that it carries ({@link
     * DType#carrier}), which must hold each exactly; this tensor for any other pair of dtypes.
     *
     * @param dtype the input's dtype in the module's metadata
     * @param name the input, for the message
     * @return the tensor of {@code dtype}'s words, or this
     * @throws InvalidInputException naming the first value {@code dtype} does not hold
     */
    public HostTensor carriedAs(String dtype, String name) {
        DType wanted = supported(dtype);
        if (wanted.carrier() == wanted || !this.dtype.equals(wanted.carrier().torchName())) {
            return this;
        }
        java.nio.FloatBuffer values = ByteBuffer.wrap(data).order(DType.FILE_ORDER).asFloatBuffer();
        LowPrecision.checkExact("", name, values, shape, wanted);
        ByteBuffer words = ByteBuffer.allocate(values.limit() * wanted.size()).order(DType.FILE_ORDER);
        for (int i = 0; i < values.limit(); i++) {
            wanted.put(words, values.get(i));
        }
        return new HostTensor(dtype, shape, words.array());
    }

    /** @return the values as doubles (float64 only) */
    public double[] toDoubleArray() {
        requireDtype(DType.FLOAT64);
        double[] values = new double[data.length / DType.FLOAT64.size()];
        ByteBuffer.wrap(data).order(DType.FILE_ORDER).asDoubleBuffer().get(values);
        return values;
    }

    /** @return the values as longs (int64 only) */
    public long[] toLongArray() {
        requireDtype(DType.INT64);
        long[] values = new long[data.length / DType.INT64.size()];
        ByteBuffer.wrap(data).order(DType.FILE_ORDER).asLongBuffer().get(values);
        return values;
    }

    /** @return whether every value is finite (always true for int64) */
    public boolean allFinite() {
        ByteBuffer buffer = ByteBuffer.wrap(data).order(DType.FILE_ORDER);
        DType type = supported(dtype);
        if (type.isFloating()) {
            for (int i = 0; i < data.length; i += type.size()) {
                if (!Double.isFinite(value(buffer, type, i))) {
                    return false;
                }
            }
        }
        return true;
    }

    /** The value at byte {@code at}, widened exactly (int64 up to 2^53). */
    private static double value(ByteBuffer buffer, DType type, int at) {
        switch (type) {
            case FLOAT32: return buffer.getFloat(at);
            case FLOAT64: return buffer.getDouble(at);
            case BFLOAT16: case FLOAT16: return type.widen(buffer.getShort(at));
            default: return buffer.getLong(at);
        }
    }

    /**
     * @param limit a magnitude
     * @return the flat index of the first value whose absolute value exceeds {@code limit}, or -1
     *     (always -1 for int64)
     */
    public long firstAbove(double limit) {
        ByteBuffer buffer = ByteBuffer.wrap(data).order(DType.FILE_ORDER);
        DType type = supported(dtype);
        if (type.isFloating()) {
            for (int i = 0; i < data.length; i += type.size()) {
                double value = value(buffer, type, i);
                if (!(Math.abs(value) <= limit)) {
                    return i / type.size();
                }
            }
        }
        return -1;
    }

    /** @return the value at flat index {@code index} as a double (floats exactly; int64 exactly up to 2^53) */
    public double valueAt(long index) {
        DType type = supported(dtype);
        return value(ByteBuffer.wrap(data).order(DType.FILE_ORDER), type, Math.toIntExact(index * type.size()));
    }

    /** @return the index of flat element {@code index} in this shape, e.g. {@code [2, 1]} */
    public String indexOf(long index) {
        long[] at = new long[shape.length];
        for (int d = shape.length - 1; d >= 0; d--) {
            at[d] = shape[d] == 0 ? 0 : index % shape[d];
            index = shape[d] == 0 ? index : index / shape[d];
        }
        return Arrays.toString(at);
    }

    private void requireDtype(DType wanted) {
        if (!wanted.torchName().equals(dtype)) {
            throw new IllegalStateException("tensor is " + dtype + ", not " + wanted);
        }
    }

    @Override
    public String toString() {
        return String.format(Locale.ROOT, "HostTensor(%s, %s)", dtype, Arrays.toString(shape));
    }
}
