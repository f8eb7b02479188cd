package dev.gradbridge.spark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import org.junit.Test;

/**
 * The combine's arithmetic (torch's {@code g.mul(w)} then {@code G.add(term)}, each rounded to the
 * dtype, in partition order) over buffers the caller owns, read and written in place.
 */
public class GradientCombinerTest {

    private static ByteBuffer floats(float... values) {
        ByteBuffer b = Buffers.direct(4L * values.length);
        b.asFloatBuffer().put(values);
        return b;
    }

    private static ByteBuffer doubles(double... values) {
        ByteBuffer b = Buffers.direct(8L * values.length);
        b.asDoubleBuffer().put(values);
        return b;
    }

    private static float[] floatsOf(ByteBuffer b) {
        float[] out = new float[b.limit() / 4];
        b.asFloatBuffer().get(out);
        return out;
    }

    @Test
    public void partitionOrderDecidesTheRounding() {
        // w = 1/3 each; in partition order (1e8/3 - 1e8/3) + 1/3 keeps the small term, another order loses it
        float[][] g = {{1e8f}, {-1e8f}, {1f}};
        ByteBuffer[][] inputs = {{floats(g[0])}, {floats(g[1])}, {floats(g[2])}};
        ByteBuffer out = floats(Float.NaN);
        GradientCombiner combiner =
                new GradientCombiner(Collections.singletonList("float32"), new int[] {0}, inputs, new ByteBuffer[] {out});
        int[] rows = {2, 2, 2};
        boolean[][] flags = {{true}, {true}, {true}};
        assertTrue(combiner.combine(0, rows, flags));
        float w = (float) (2.0 / 6);
        float expected = g[0][0] * w;
        expected = expected + g[1][0] * w;
        expected = expected + g[2][0] * w;
        float otherOrder = (g[2][0] * w + g[0][0] * w) + g[1][0] * w;
        assertTrue("the case tells orders apart", Float.floatToIntBits(expected) != Float.floatToIntBits(otherOrder));
        assertEquals(Float.floatToIntBits(expected), Float.floatToIntBits(floatsOf(out)[0]));
    }

    @Test
    public void skipsPartitionsWithoutRowsOrGradientAndZeroesAPieceNobodyHas() {
        ByteBuffer[][] inputs = {{floats(1f, 2f), floats(5f)}, {floats(3f, 4f), floats(6f)},
            {floats(Float.NaN, Float.NaN), floats(Float.NaN)}};
        ByteBuffer[] outputs = {floats(9f, 9f), floats(9f)};
        GradientCombiner combiner =
                new GradientCombiner(Arrays.asList("float32", "float32"), new int[] {0, 1}, inputs, outputs);
        int[] rows = {1, 3, 0}; // partition 2 holds no rows: its (NaN) bytes are never read
        boolean[][] flags = {{true, false}, {true, false}, {true, true}};
        double[] losses = {2.0, 4.0, Double.NaN};
        GradientCombiner.Combined combined = new GradientCombiner.Combined(outputs, new boolean[2]);
        combiner.combine(rows, losses, flags, combined);
        float w0 = (float) (1.0 / 4);
        float w1 = (float) (3.0 / 4);
        assertArrayEquals(new float[] {1f * w0 + 3f * w1, 2f * w0 + 4f * w1}, floatsOf(outputs[0]), 0f);
        assertArrayEquals(new float[] {0f}, floatsOf(outputs[1]), 0f); // no gradient: zeros, not the old 9
        assertArrayEquals(new boolean[] {true, false}, combined.flags);
        assertEquals(1.0 / 4 * 2.0 + 3.0 / 4 * 4.0, combined.loss, 0.0);
        assertEquals(4, combined.rows);
    }

    @Test
    public void float64UsesTheDoubleWeight() {
        ByteBuffer out = doubles(0.0);
        GradientCombiner combiner = new GradientCombiner(Collections.singletonList("float64"), new int[] {0},
                new ByteBuffer[][] {{doubles(0.1)}, {doubles(0.2)}}, new ByteBuffer[] {out});
        combiner.combine(0, new int[] {1, 2}, new boolean[][] {{true}, {true}});
        double expected = 0.1 * (1.0 / 3);
        expected = expected + 0.2 * (2.0 / 3);
        assertEquals(Double.doubleToLongBits(expected), Double.doubleToLongBits(out.getDouble(0)));
    }

    @Test
    public void piecesCombinedApartEqualWholeParameters() {
        long[] sizes = {7, 5, 4};
        List<String> dtypes = Arrays.asList("float32", "float64", "float32");
        int partitions = 3;
        Random random = new Random(7);
        ByteBuffer[][] gradients = new ByteBuffer[partitions][sizes.length];
        for (int q = 0; q < partitions; q++) {
            for (int i = 0; i < sizes.length; i++) {
                gradients[q][i] = Buffers.direct(sizes[i] * ShardedData.bytesOf(dtypes.get(i)));
                for (int e = 0; e < sizes[i]; e++) {
                    if ("float32".equals(dtypes.get(i))) {
                        gradients[q][i].putFloat(4 * e, (float) random.nextGaussian());
                    } else {
                        gradients[q][i].putDouble(8 * e, random.nextGaussian());
                    }
                }
            }
        }
        int[] rows = {3, 5, 2};
        boolean[][] flags = {{true, true, false}, {true, false, true}, {true, true, true}};
        ByteBuffer[] whole = new ByteBuffer[sizes.length];
        ByteBuffer[] pieced = new ByteBuffer[sizes.length];
        for (int i = 0; i < sizes.length; i++) {
            whole[i] = Buffers.direct(gradients[0][i].limit());
            pieced[i] = Buffers.direct(gradients[0][i].limit());
        }
        GradientCombiner.Combined all = new GradientCombiner.Combined(whole, new boolean[sizes.length]);
        new GradientCombiner(dtypes, new int[] {0, 1, 2}, gradients, whole).combine(rows, new double[3], flags, all);
        Chunks chunks = new Chunks(dtypes, sizes, 4);
        for (int c = 0; c < chunks.count(); c++) {
            ByteBuffer[][] inputs = new ByteBuffer[partitions][];
            for (int q = 0; q < partitions; q++) {
                inputs[q] = chunks.cut(c, gradients[q]);
            }
            GradientCombiner combiner =
                    new GradientCombiner(chunks.dtypes(c, dtypes), chunks.parameters(c), inputs, chunks.cut(c, pieced));
            for (int j = 0; j < combiner.pieces(); j++) {
                combiner.combine(j, rows, flags);
            }
        }
        for (int i = 0; i < sizes.length; i++) {
            assertEquals("parameter " + i, whole[i], pieced[i]);
        }
        assertArrayEquals(new boolean[] {true, true, true}, all.flags);
    }

    private static ByteBuffer words(int... values) {
        ByteBuffer b = Buffers.direct(2L * values.length);
        for (int v : values) {
            b.putShort((short) v);
        }
        b.flip();
        return b;
    }

    private static void sixteenBit(String dtype, int[][] g, int[] expected) {
        ByteBuffer[][] inputs = {{words(g[0])}, {words(g[1])}, {words(g[2])}};
        ByteBuffer out = words(new int[expected.length]);
        GradientCombiner combiner =
                new GradientCombiner(Collections.singletonList(dtype), new int[] {0}, inputs, new ByteBuffer[] {out});
        assertTrue(combiner.combine(0, new int[] {3, 1, 3}, new boolean[][] {{true}, {true}, {true}}));
        for (int i = 0; i < expected.length; i++) {
            assertEquals(dtype + " element " + i, (short) expected[i], out.getShort(2 * i));
        }
    }

    @Test
    public void sixteenBitGradientsRoundEveryOpAsTorch() {
        // reference.combine_shards on torch's bfloat16 and float16 tensors (torch 2.7): each mul and add computed in
        // float32 and rounded to the dtype; rounding only the sum would differ in 4 (bfloat16) and 2 (float16) elements
        sixteenBit("bfloat16", new int[][] {{0x4081, 0x3f60, 0x3ee4, 0xc044, 0x3e6c, 0xc0db},
            {0x3fd8, 0x40a2, 0xc0e6, 0x409c, 0x4027, 0x40c6}, {0xc08a, 0x3fbf, 0x4006, 0xbecc, 0x4094, 0x4083}},
                new int[] {0x3df0, 0x3fde, 0x3d88, 0xbf4a, 0x401d, 0xbe9c});
        sixteenBit("float16", new int[][] {{0x40f4, 0xba93, 0xc2c8, 0xc54c, 0x437a, 0x3cc7},
            {0xbfd8, 0x3a14, 0xc5eb, 0x4158, 0xc741, 0xc24b}, {0x3a2d, 0xbcf6, 0x4089, 0x2bbd, 0x46b6, 0x474f}},
                new int[] {0x3c73, 0xba34, 0xbd4f, 0xbf72, 0x42e3, 0x4264});
    }

    @Test
    public void refusesADtypeWithoutGradients() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class, () -> new GradientCombiner(
                Collections.singletonList("int64"), new int[] {0}, new ByteBuffer[][] {{floats(1f)}},
                new ByteBuffer[] {floats(0f)}));
        assertEquals("parameter dtype int64 cannot hold a gradient", e.getMessage());
    }
}
