package dev.gradbridge.online;

import dev.gradbridge.InvalidInputException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.Locale;

/**
 * An immutable tensor in Java memory: dtype, shape and little-endian bytes (the write-ahead
 * log's byte order). The first dimension is the batch: {@link OnlineLearner#learn} takes one
 * event per row. Supported dtypes: {@code float32}, {@code float64}, {@code int64}.
 */
public final class HostTensor {

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

    /**
     * A float32 tensor.
     *
     * @param values the values, row-major
     * @param shape the shape, batch dimension first
     * @return the tensor
     */
    public static HostTensor ofFloats(float[] values, long... shape) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 4).order(ByteOrder.LITTLE_ENDIAN);
        bytes.asFloatBuffer().put(values);
        return new HostTensor("float32", shape, bytes.array());
    }

    /**
     * A float64 tensor.
     *
     * @param values the values, row-major
     * @param shape the shape, batch dimension first
     * @return the tensor
     */
    public static HostTensor ofDoubles(double[] values, long... shape) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        bytes.asDoubleBuffer().put(values);
        return new HostTensor("float64", shape, bytes.array());
    }

    /**
     * An int64 tensor.
     *
     * @param values the values, row-major
     * @param shape the shape, batch dimension first
     * @return the tensor
     */
    public static HostTensor ofLongs(long[] values, long... shape) {
        ByteBuffer bytes = ByteBuffer.allocate(values.length * 8).order(ByteOrder.LITTLE_ENDIAN);
        bytes.asLongBuffer().put(values);
        return new HostTensor("int64", shape, bytes.array());
    }

    /**
     * Bytes per element of a dtype.
     *
     * @param dtype {@code float32}, {@code float64} or {@code int64}
     * @return 4 or 8
     * @throws InvalidInputException for any other dtype
     */
    public static int elementSize(String dtype) {
        switch (dtype) {
            case "float32":
                return 4;
            case "float64":
            case "int64":
                return 8;
            default:
                throw new InvalidInputException(
                        "dtype " + dtype + " is not supported; expected float32, float64 or int64");
        }
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
        requireDtype("float32");
        float[] values = new float[data.length / 4];
        ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer().get(values);
        return values;
    }

    /** @return the values as doubles (float64 only) */
    public double[] toDoubleArray() {
        requireDtype("float64");
        double[] values = new double[data.length / 8];
        ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer().get(values);
        return values;
    }

    /** @return the values as longs (int64 only) */
    public long[] toLongArray() {
        requireDtype("int64");
        long[] values = new long[data.length / 8];
        ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN).asLongBuffer().get(values);
        return values;
    }

    /** @return whether every value is finite (always true for int64) */
    public boolean allFinite() {
        ByteBuffer buffer = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
        if ("float32".equals(dtype)) {
            for (int i = 0; i < data.length; i += 4) {
                if (!Float.isFinite(buffer.getFloat(i))) {
                    return false;
                }
            }
        } else if ("float64".equals(dtype)) {
            for (int i = 0; i < data.length; i += 8) {
                if (!Double.isFinite(buffer.getDouble(i))) {
                    return false;
                }
            }
        }
        return true;
    }

    private void requireDtype(String wanted) {
        if (!wanted.equals(dtype)) {
            throw new IllegalStateException("tensor is " + dtype + ", not " + wanted);
        }
    }

    @Override
    public String toString() {
        return String.format(Locale.ROOT, "HostTensor(%s, %s)", dtype, Arrays.toString(shape));
    }
}
