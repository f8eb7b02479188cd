package dev.gradbridge;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.types.DataType;
import java.util.Locale;

/** Tensors against their metadata specs, and tensor values as exact Java doubles. */
final class Tensors {

    private Tensors() {}

    /** @return the dtype as the metadata writes it ({@code float32}, {@code int64}, ...) */
    static String dtypeName(NDArray array) {
        return array.getDataType().name().toLowerCase(Locale.ROOT);
    }

    /**
     * Checks dtype and every dimension but the first; with {@code nonEmpty}, at least one sample.
     *
     * @param source the file or module, for the message
     * @param name the tensor's name in the message
     * @throws InvalidInputException worded by {@link Messages#tensorSpec}
     */
    static void checkSpec(String source, String name, NDArray array, Metadata.TensorSpec spec, boolean nonEmpty) {
        String dtype = dtypeName(array);
        long[] shape = array.getShape().getShape();
        if (!spec.accepts(dtype, shape) || (nonEmpty && (shape.length == 0 || shape[0] == 0))) {
            throw new InvalidInputException(
                    Messages.tensorSpec(source, name, spec.getDtype(), spec.getShape(), dtype, shape));
        }
    }

    /** A tensor's values as doubles, exactly (float32 widens without rounding). */
    static double[] exactDoubles(NDArray values) {
        if (values.getDataType() == DataType.FLOAT32) {
            float[] floats = values.toFloatArray();
            double[] widened = new double[floats.length];
            for (int i = 0; i < floats.length; i++) {
                widened[i] = floats[i];
            }
            return widened;
        }
        try (NDArray converted = values.toType(DataType.FLOAT64, false)) {
            return converted.toDoubleArray();
        }
    }

    /** A scalar tensor's value as a double, exactly (float32 widens without rounding). */
    static double exactDouble(NDArray scalar) {
        switch (scalar.getDataType()) {
            case FLOAT32:
                return scalar.getFloat();
            case FLOAT64:
                return scalar.getDouble();
            default:
                try (NDArray widened = scalar.toType(DataType.FLOAT64, false)) {
                    return widened.getDouble();
                }
        }
    }
}
