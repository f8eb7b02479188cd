package dev.gradbridge;

import dev.gradbridge.internal.Messages;
import java.util.Arrays;
import java.util.List;

/** Tensors against their metadata specs, shapes' element counts, and the clean-up of result tensors. */
final class Tensors {

    private Tensors() {}

    /**
     * {@link #checkSpec}'s test without allocating, for checks on every training call (the
     * spec's dtype and shape are copied once).
     */
    static final class SpecCheck {
        private final String dtype;
        private final long[] shape;

        SpecCheck(Metadata.TensorSpec spec) {
            this.dtype = spec.getDtype();
            this.shape = spec.getShape();
        }

        /** Whether {@link #checkSpec} would pass {@code tensor} (with {@code nonEmpty}). */
        boolean fits(Tensor tensor) {
            long[] dims = tensor.dims();
            if (!dtype.equals(tensor.dtype().torchName()) || dims.length != shape.length || shape.length == 0
                    || dims[0] == 0) {
                return false;
            }
            for (int i = 1; i < shape.length; i++) {
                if (shape[i] != dims[i]) {
                    return false;
                }
            }
            return true;
        }
    }

    /**
     * Checks dtype and every dimension but the first; with {@code nonEmpty}, at least one sample.
     *
     * @param source the file or module, for the message
     * @param name the tensor's name in the message
     * @throws InvalidInputException worded by {@link Messages#tensorSpec}
     */
    static void checkSpec(String source, String name, Tensor tensor, Metadata.TensorSpec spec, boolean nonEmpty) {
        String dtype = tensor.dtype().torchName();
        long[] shape = tensor.shape();
        if (!spec.accepts(dtype, shape) || (nonEmpty && (shape.length == 0 || shape[0] == 0))) {
            throw new InvalidInputException(
                    Messages.tensorSpec(source, name, spec.getDtype(), spec.getShape(), dtype, shape));
        }
    }

    /** A shape as messages write it: {@code (2, 3)}. */
    static String shapeText(long[] shape) {
        StringBuilder text = new StringBuilder("(");
        for (int i = 0; i < shape.length; i++) {
            text.append(i == 0 ? "" : ", ").append(shape[i]);
        }
        return text.append(')').toString();
    }

    /** Closes every tensor in a method's result list (other items are left alone). */
    static void closeAll(List<?> values) {
        for (Object value : values) {
            if (value instanceof Tensor) {
                ((Tensor) value).close();
            }
        }
    }

    /** A shape's element count; a negative dimension, or a count past a long, is refused. */
    static long count(long[] shape) {
        long count = 1;
        for (long dim : shape) {
            if (dim < 0) {
                throw new InvalidInputException("tensor shape " + Arrays.toString(shape) + " has a negative dimension");
            }
            count = Math.multiplyExact(count, dim);
        }
        return count;
    }
}
