package dev.gradbridge.internal;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import java.nio.FloatBuffer;

/**
 * The 16-bit inputs' carrier ({@link DType#carrier}): float32 values that must be exactly the
 * input's bfloat16 or float16 ones before they are cast. Python: {@code data._check_exact}, the
 * same element and line.
 */
public final class LowPrecision {

    private LowPrecision() {
    }

    /**
     * @param values float32 values, row-major
     * @param dtype the 16-bit dtype they are cast to
     * @return the flat index of the first value {@code dtype} does not hold, or -1
     */
    public static long firstInexact(FloatBuffer values, DType dtype) {
        for (int i = 0; i < values.limit(); i++) {
            if (!dtype.holds(values.get(i))) {
                return i;
            }
        }
        return -1;
    }

    /**
     * Refuses a carried value that the input's dtype does not hold.
     *
     * @param source the data, for the message (empty for a request)
     * @param name the input
     * @param values its float32 values, row-major
     * @param shape its shape
     * @param dtype the input's 16-bit dtype
     * @throws InvalidInputException naming the first such element
     */
    public static void checkExact(String source, String name, FloatBuffer values, long[] shape, DType dtype) {
        long at = firstInexact(values, dtype);
        if (at >= 0) {
            throw new InvalidInputException(
                    Messages.notExact(source, name, unravel(at, shape), values.get((int) at), dtype.torchName()));
        }
    }

    /** @return the index of flat element {@code flat} of a row-major array of {@code shape} */
    public static long[] unravel(long flat, long[] shape) {
        long[] index = new long[shape.length];
        for (int d = shape.length - 1; d >= 0; d--) {
            index[d] = shape[d] == 0 ? 0 : flat % shape[d];
            flat = shape[d] == 0 ? flat : flat / shape[d];
        }
        return index;
    }
}
