package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.util.List;

/**
 * The step's gradient: the sample-weighted sum of the shard gradients, in partition order.
 *
 * <p>With {@code N} rows in the global mini-batch and {@code n_k} of them in partition {@code k},
 * the shard's weight is {@code w_k = n_k / N} (a double division, then rounded to the
 * parameter's dtype, as torch rounds a Python float multiplying a tensor). For each parameter, over
 * the partitions {@code k} that hold rows and produced a gradient for it, in increasing {@code k}:
 * {@code G = g_first * w_first}, then {@code G = G + g_k * w_k}, every multiplication and addition
 * rounded to the dtype (Java's float arithmetic is IEEE 754 without fused multiply-add; torch's
 * {@code mul} and {@code add} kernels are too). A parameter no shard has a gradient for has none.
 * The step loss is {@code sum_k w_k * loss_k} in double, in the same order. Python's twin:
 * {@code gradbridge.reference.combine_shards}.
 */
final class GradientCombiner {

    private GradientCombiner() {}

    static final class Combined {
        final byte[][] gradients;
        final boolean[] flags;
        final double loss;
        final int rows;

        Combined(byte[][] gradients, boolean[] flags, double loss, int rows) {
            this.gradients = gradients;
            this.flags = flags;
            this.loss = loss;
            this.rows = rows;
        }
    }

    /**
     * {@link #combine} of one result, without its arithmetic or copies: its weight is
     * {@code rows / rows = 1.0} exactly and IEEE 754 {@code x * 1} is {@code x} (a NaN stays NaN), so
     * the combined gradient is the result's own; a parameter without a gradient gets zeros, as there.
     */
    static Combined alone(ShardResult mine, List<String> dtypes, long[] sizes) {
        int count = dtypes.size();
        byte[][] gradients = new byte[count][];
        boolean[] flags = new boolean[count];
        for (int i = 0; i < count; i++) {
            if (!"float32".equals(dtypes.get(i)) && !"float64".equals(dtypes.get(i))) {
                throw noGradient(dtypes.get(i));
            }
            flags[i] = mine.rows > 0 && mine.flags[i];
            gradients[i] = flags[i] ? mine.gradients[i] : zeros(dtypes.get(i), sizes[i]);
        }
        return new Combined(gradients, flags, mine.rows > 0 ? mine.loss : 0.0, mine.rows);
    }

    /**
     * @param results one per partition, in partition order
     * @param dtypes each parameter's dtype ({@code float32} or {@code float64})
     * @param sizes each parameter's number of elements
     */
    static Combined combine(List<ShardResult> results, List<String> dtypes, long[] sizes) {
        int total = 0;
        for (ShardResult r : results) {
            total += r.rows;
        }
        double loss = 0.0;
        boolean first = true;
        for (ShardResult r : results) {
            if (r.rows == 0) {
                continue;
            }
            double w = (double) r.rows / total;
            loss = first ? w * r.loss : loss + w * r.loss;
            first = false;
        }
        int count = dtypes.size();
        byte[][] gradients = new byte[count][];
        boolean[] flags = new boolean[count];
        for (int i = 0; i < count; i++) {
            int n = Math.toIntExact(sizes[i]);
            if ("float64".equals(dtypes.get(i))) {
                double[] acc = null;
                for (ShardResult r : results) {
                    if (r.rows == 0 || !r.flags[i]) {
                        continue;
                    }
                    double w = (double) r.rows / total;
                    DoubleBuffer g = ByteBuffer.wrap(r.gradients[i]).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer();
                    if (acc == null) {
                        acc = new double[n];
                        for (int j = 0; j < n; j++) {
                            acc[j] = g.get(j) * w;
                        }
                    } else {
                        for (int j = 0; j < n; j++) {
                            acc[j] = acc[j] + g.get(j) * w;
                        }
                    }
                }
                flags[i] = acc != null;
                ByteBuffer out = ByteBuffer.allocate(n * 8).order(ByteOrder.LITTLE_ENDIAN);
                if (acc != null) {
                    out.asDoubleBuffer().put(acc);
                }
                gradients[i] = out.array();
            } else if ("float32".equals(dtypes.get(i))) {
                float[] acc = null;
                for (ShardResult r : results) {
                    if (r.rows == 0 || !r.flags[i]) {
                        continue;
                    }
                    float w = (float) ((double) r.rows / total);
                    FloatBuffer g = ByteBuffer.wrap(r.gradients[i]).order(ByteOrder.LITTLE_ENDIAN).asFloatBuffer();
                    if (acc == null) {
                        acc = new float[n];
                        for (int j = 0; j < n; j++) {
                            acc[j] = g.get(j) * w;
                        }
                    } else {
                        for (int j = 0; j < n; j++) {
                            acc[j] = acc[j] + g.get(j) * w;
                        }
                    }
                }
                flags[i] = acc != null;
                ByteBuffer out = ByteBuffer.allocate(n * 4).order(ByteOrder.LITTLE_ENDIAN);
                if (acc != null) {
                    out.asFloatBuffer().put(acc);
                }
                gradients[i] = out.array();
            } else {
                throw noGradient(dtypes.get(i));
            }
        }
        return new Combined(gradients, flags, loss, total);
    }

    /** @return a zeroed array for the whole gradient of a parameter of {@code elements} {@code dtype} values */
    static byte[] zeros(String dtype, long elements) {
        return new byte[Math.toIntExact(elements * ShardedData.bytesOf(dtype))];
    }

    private static IllegalArgumentException noGradient(String dtype) {
        return new IllegalArgumentException("parameter dtype " + dtype + " cannot hold a gradient");
    }
}
