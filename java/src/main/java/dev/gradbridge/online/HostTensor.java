package dev.gradbridge.online;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.EnumSet;
import java.util.Locale;
import java.util.Set;

/**
 * An immutable tensor in Java memory: dtype, shape and little-endian bytes (the write-ahead
 * log's byte order). The first dimension is the batch: {@link OnlineLearner#learn} takes one
 * event per row. Supported dtypes: {@code float32}, {@code float64}, {@code int64}.
 */
public final class HostTensor {

    /** The dtypes a host tensor holds (what the online learner's log and models take). */
    private static final Set<DType> SUPPORTED = EnumSet.of(DType.FLOAT32, DType.FLOAT64, DType.INT64);

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
     * @param dtype {@code float32}, {@code float64} or {@code int64}
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
     * @param dtype {@code float32}, {@code float64} or {@code int64}
     * @return 4 or 8
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
        throw new InvalidInputException("dtype " + dtype + " is not supported; expected float32, float64 or int64");
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

    /** @return the values as floats (float32 only) */
    public float[] toFloatArray() {
        requireDtype(DType.FLOAT32);
        float[] values = new float[data.length / DType.FLOAT32.size()];
        ByteBuffer.wrap(data).order(DType.FILE_ORDER).asFloatBuffer().get(values);
        return values;
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
        if (type == DType.FLOAT32) {
            for (int i = 0; i < data.length; i += type.size()) {
                if (!Float.isFinite(buffer.getFloat(i))) {
                    return false;
                }
            }
        } else if (type == DType.FLOAT64) {
            for (int i = 0; i < data.length; i += type.size()) {
                if (!Double.isFinite(buffer.getDouble(i))) {
                    return false;
                }
            }
        }
        return true;
    }

    /**
     * @param limit a magnitude
     * @return the flat index of the first value whose absolute value exceeds {@code limit}, or -1
     *     (always -1 for int64)
     */
    public long firstAbove(double limit) {
        ByteBuffer buffer = ByteBuffer.wrap(data).order(DType.FILE_ORDER);
        DType type = supported(dtype);
        if (type == DType.FLOAT32 || type == DType.FLOAT64) {
            for (int i = 0; i < data.length; i += type.size()) {
                double value = type == DType.FLOAT32 ? buffer.getFloat(i) : buffer.getDouble(i);
                if (!(Math.abs(value) <= limit)) {
                    return i / type.size();
                }
            }
        }
        return -1;
    }

    /** @return the value at flat index {@code index} as a double (float32, float64; int64 exactly up to 2^53) */
    public double valueAt(long index) {
        ByteBuffer buffer = ByteBuffer.wrap(data).order(DType.FILE_ORDER);
        DType type = supported(dtype);
        int at = Math.toIntExact(index * type.size());
        return type == DType.FLOAT32 ? buffer.getFloat(at) : type == DType.FLOAT64 ? buffer.getDouble(at) : buffer.getLong(at);
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
