package dev.gradbridge.spark;

import dev.gradbridge.DType;
import java.nio.ByteBuffer;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.ShortBuffer;
import java.util.Arrays;
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
 * {@code mul} and {@code add} kernels are too; for a 16-bit float, torch's CPU kernels compute each op in
 * float32 and round the result to the dtype, to nearest even, as {@link DType#round} does). A parameter no
 * shard has a gradient for has none
 * (zeros). The step loss is {@code sum_k w_k * loss_k} in double, in the same order. Python's twin:
 * {@code gradbridge.reference.combine_shards}.
 *
 * <p>One combiner per run and exchange: it reads the partitions' gradients from, and writes the
 * combined one into, buffers the exchange allocated once (views and arrays made here once), so a
 * step allocates nothing. Each piece (a parameter or part of one, {@link Chunks}) is combined on its own,
 * element by element, so an exchange may combine some pieces while others are still in flight.
 */
final class GradientCombiner {

    /** The step's combined gradient, loss and rows, in the exchange's buffers (its next step overwrites them). */
    static final class Combined {
        /** Per parameter: its combined gradient, little-endian, position 0, limit its bytes. */
        final ByteBuffer[] gradients;
        /** Per parameter: whether any partition had a gradient for it. */
        final boolean[] flags;
        double loss;
        int rows;

        Combined(ByteBuffer[] gradients, boolean[] flags) {
            this.gradients = gradients;
            this.flags = flags;
        }
    }

    private final int[] parameters;
    private final int[] lengths;
    private final FloatBuffer[][] floatsIn;
    private final DoubleBuffer[][] doublesIn;
    private final FloatBuffer[] floatsOut;
    private final DoubleBuffer[] doublesOut;
    /** 16-bit pieces (bfloat16, float16): their words, and their dtype (null for the others). */
    private final ShortBuffer[][] shortsIn;
    private final ShortBuffer[] shortsOut;
    private final DType[] halves;
    private final short[] shortTerm;
    /** The combine's arrays: the sum so far and one partition's gradient, as long as the longest piece. */
    private final float[] floatAcc;
    private final float[] floatTerm;
    private final double[] doubleAcc;
    private final double[] doubleTerm;

    /**
     * @param dtypes per piece: its dtype ({@code float32}, {@code float64}, {@code bfloat16} or {@code float16})
     * @param parameters per piece: its parameter (whose flag says whether a partition has a gradient for it)
     * @param inputs per partition, in partition order, per piece: where that partition's gradient of it is
     * @param outputs per piece: where its combined gradient goes
     */
    GradientCombiner(List<String> dtypes, int[] parameters, ByteBuffer[][] inputs, ByteBuffer[] outputs) {
        int pieces = dtypes.size();
        this.parameters = parameters.clone();
        lengths = new int[pieces];
        floatsIn = new FloatBuffer[inputs.length][pieces];
        doublesIn = new DoubleBuffer[inputs.length][pieces];
        floatsOut = new FloatBuffer[pieces];
        doublesOut = new DoubleBuffer[pieces];
        shortsIn = new ShortBuffer[inputs.length][pieces];
        shortsOut = new ShortBuffer[pieces];
        halves = new DType[pieces];
        for (int j = 0; j < pieces; j++) {
            String dtype = dtypes.get(j);
            if ("bfloat16".equals(dtype) || "float16".equals(dtype)) {
                halves[j] = DType.of(dtype);
                shortsOut[j] = outputs[j].asShortBuffer();
                lengths[j] = shortsOut[j].remaining();
                for (int q = 0; q < inputs.length; q++) {
                    shortsIn[q][j] = inputs[q][j].asShortBuffer();
                }
            } else if ("float32".equals(dtype)) {
                floatsOut[j] = outputs[j].asFloatBuffer();
                lengths[j] = floatsOut[j].remaining();
                for (int q = 0; q < inputs.length; q++) {
                    floatsIn[q][j] = inputs[q][j].asFloatBuffer();
                }
            } else if ("float64".equals(dtype)) {
                doublesOut[j] = outputs[j].asDoubleBuffer();
                lengths[j] = doublesOut[j].remaining();
                for (int q = 0; q < inputs.length; q++) {
                    doublesIn[q][j] = inputs[q][j].asDoubleBuffer();
                }
            } else {
                throw noGradient(dtype);
            }
        }
        int longestFloats = 0;
        int longestDoubles = 0;
        for (int j = 0; j < pieces; j++) {
            if (floatsOut[j] != null || halves[j] != null) {
                longestFloats = Math.max(longestFloats, lengths[j]);
            } else {
                longestDoubles = Math.max(longestDoubles, lengths[j]);
            }
        }
        floatAcc = new float[longestFloats];
        floatTerm = new float[longestFloats];
        shortTerm = new short[longestFloats];
        doubleAcc = new double[longestDoubles];
        doubleTerm = new double[longestDoubles];
    }

    /** @return the number of pieces */
    int pieces() {
        return lengths.length;
    }

    /**
     * Combines every piece ({@link #combine(int, int[], boolean[][])}), into {@code combined}'s flags
     * per parameter (whether any partition had a gradient for it), loss and rows.
     */
    void combine(int[] rows, double[] losses, boolean[][] flags, Combined combined) {
        for (int j = 0; j < lengths.length; j++) {
            combined.flags[parameters[j]] = combine(j, rows, flags);
        }
        combined.loss = loss(rows, losses);
        combined.rows = total(rows);
    }

    /**
     * Combines piece {@code j} into its output. The arithmetic runs on Java arrays, one bulk copy in per
     * partition and one out (made once per combiner): a loop over arrays is what the JIT vectorizes,
     * an element at a time through a buffer view ran ~10x slower.
     *
     * @param rows per partition: its rows of the step's batch (0: nothing to read)
     * @param flags per partition, per parameter: whether it has a gradient for it
     * @return whether any partition had a gradient for the piece (else its output is zeros)
     */
    boolean combine(int j, int[] rows, boolean[][] flags) {
        int total = total(rows);
        int n = lengths[j];
        boolean first = true;
        for (int q = 0; q < rows.length; q++) {
            if (rows[q] == 0 || !flags[q][parameters[j]]) {
                continue;
            }
            double weight = (double) rows[q] / total;
            if (halves[j] != null) {
                combineHalf(halves[j], shortsIn[q][j], (float) weight, n, first);
            } else if (floatsOut[j] != null) {
                float w = (float) weight;
                float[] acc = floatAcc;
                float[] g = floatTerm;
                floatsIn[q][j].get(0, g, 0, n);
                if (first) {
                    for (int i = 0; i < n; i++) {
                        acc[i] = g[i] * w;
                    }
                } else {
                    for (int i = 0; i < n; i++) {
                        acc[i] = acc[i] + g[i] * w;
                    }
                }
            } else {
                double[] acc = doubleAcc;
                double[] g = doubleTerm;
                doublesIn[q][j].get(0, g, 0, n);
                if (first) {
                    for (int i = 0; i < n; i++) {
                        acc[i] = g[i] * weight;
                    }
                } else {
                    for (int i = 0; i < n; i++) {
                        acc[i] = acc[i] + g[i] * weight;
                    }
                }
            }
            first = false;
        }
        if (halves[j] != null) {
            for (int i = 0; i < n; i++) { // exact: the sum holds values of the dtype
                shortTerm[i] = first ? 0 : halves[j].round(floatAcc[i]);
            }
            shortsOut[j].put(0, shortTerm, 0, n);
        } else if (floatsOut[j] != null) {
            if (first) { // no gradient: zeros, as a zeroed buffer holds (the buffer holds a previous step's)
                Arrays.fill(floatAcc, 0, n, 0f);
            }
            floatsOut[j].put(0, floatAcc, 0, n);
        } else {
            if (first) {
                Arrays.fill(doubleAcc, 0, n, 0d);
            }
            doublesOut[j].put(0, doubleAcc, 0, n);
        }
        return !first;
    }

    /**
     * One partition's 16-bit gradient into the sum (held widened in {@link #floatAcc}): {@code g * w} and
     * the addition each computed in float32 and rounded to {@code type}, as torch's CPU kernels do.
     */
    private void combineHalf(DType type, ShortBuffer in, float w, int n, boolean first) {
        in.get(0, shortTerm, 0, n);
        float[] acc = floatAcc;
        for (int i = 0; i < n; i++) {
            float term = type.widen(type.round(type.widen(shortTerm[i]) * w));
            acc[i] = first ? term : type.widen(type.round(acc[i] + term));
        }
    }

    /** @return the step loss: {@code sum_q w_q * loss_q} over the partitions with rows, in order */
    static double loss(int[] rows, double[] losses) {
        int total = total(rows);
        double loss = 0.0;
        boolean first = true;
        for (int q = 0; q < rows.length; q++) {
            if (rows[q] == 0) {
                continue;
            }
            double w = (double) rows[q] / total;
            loss = first ? w * losses[q] : loss + w * losses[q];
            first = false;
        }
        return loss;
    }

    static int total(int[] rows) {
        int total = 0;
        for (int r : rows) {
            total += r;
        }
        return total;
    }

    /** Refuses a dtype that cannot hold a gradient (the exchanges check every parameter's once per run). */
    static void requireFloating(String dtype) {
        if (!"float32".equals(dtype) && !"float64".equals(dtype) && !"bfloat16".equals(dtype)
                && !"float16".equals(dtype)) {
            throw noGradient(dtype);
        }
    }

    private static IllegalArgumentException noGradient(String dtype) {
        return new IllegalArgumentException("parameter dtype " + dtype + " cannot hold a gradient");
    }
}
