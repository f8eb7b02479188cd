package dev.gradbridge.spark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import java.util.Random;
import java.util.UUID;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.Test;

/**
 * The Gloo exchange over direct buffers, ranks on threads of this JVM over 127.0.0.1: every rank gets
 * the bits of one whole-parameter combine in partition order, by chunk and in one round, with one
 * dtype (the all-gather's output read in place) and mixed ones (copied out), step after step with the
 * same buffers (a task without rows, a parameter without a gradient).
 */
public class GlooExchangeTest {

    private static final Duration TIMEOUT = Duration.ofSeconds(30);

    /** One step's contributions: per partition its rows, loss, flags and gradient bytes per parameter. */
    private static final class Step {
        final int[] rows;
        final double[] losses;
        final boolean[][] flags;
        final ByteBuffer[][] gradients;

        Step(int[] rows, boolean[][] flags, List<String> dtypes, long[] sizes, Random random) {
            this.rows = rows;
            this.flags = flags;
            losses = new double[rows.length];
            gradients = new ByteBuffer[rows.length][sizes.length];
            for (int q = 0; q < rows.length; q++) {
                losses[q] = random.nextDouble();
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
        }

        /** @return the whole-parameter combine, in partition order */
        GradientCombiner.Combined expected(List<String> dtypes) {
            ByteBuffer[] out = new ByteBuffer[dtypes.size()];
            int[] identity = new int[dtypes.size()];
            for (int i = 0; i < out.length; i++) {
                out[i] = Buffers.direct(gradients[0][i].limit());
                identity[i] = i;
            }
            GradientCombiner.Combined combined = new GradientCombiner.Combined(out, new boolean[out.length]);
            new GradientCombiner(dtypes, identity, gradients, out).combine(rows, losses, flags, combined);
            return combined;
        }
    }

    private static void exchange(List<String> dtypes, long[] sizes, long oneRoundBytes, int slices)
            throws Exception {
        exchange(3, dtypes, sizes, oneRoundBytes, slices);
    }

    private static void exchange(int partitions, List<String> dtypes, long[] sizes, long oneRoundBytes, int slices)
            throws Exception {
        Random random = new Random(11);
        List<Step> steps = Arrays.asList(
                new Step(Arrays.copyOf(new int[] {4, 3, 5}, partitions), Arrays.copyOf(new boolean[][] {
                    repeat(true, sizes.length), repeat(true, sizes.length), repeat(true, sizes.length)}, partitions),
                        dtypes, sizes, random),
                // partition 1 holds no rows; no partition has a gradient for parameter 0
                new Step(Arrays.copyOf(new int[] {2, 0, 6}, partitions), Arrays.copyOf(new boolean[][] {
                    flags(sizes.length, 0), repeat(true, sizes.length), flags(sizes.length, 0)}, partitions),
                        dtypes, sizes, random));
        ExecutorService pool = Executors.newFixedThreadPool(partitions);
        try {
            List<GlooGroup> groups = join(partitions, pool);
            List<Future<Integer>> ranks = new ArrayList<>();
            for (int r = 0; r < partitions; r++) {
                int rank = r;
                ranks.add(pool.submit(() -> {
                    int checked = 0;
                    try (GlooExchange exchange =
                            new GlooExchange(groups.get(rank), rank, partitions, oneRoundBytes, slices, dtypes,
                                    sizes)) {
                        for (Step step : steps) {
                            if (step.rows[rank] > 0) {
                                for (int i = 0; i < sizes.length; i++) {
                                    exchange.put(i, step.gradients[rank][i]);
                                }
                            }
                            GradientCombiner.Combined combined = exchange.combine(new ShardResult(
                                    rank, step.rows[rank], step.losses[rank], null, step.flags[rank]));
                            GradientCombiner.Combined expected = step.expected(dtypes);
                            assertArrayEquals(expected.flags, combined.flags);
                            assertEquals(Double.doubleToLongBits(expected.loss), Double.doubleToLongBits(combined.loss));
                            assertEquals(expected.rows, combined.rows);
                            for (int i = 0; i < sizes.length; i++) {
                                assertEquals("rank " + rank + ", parameter " + i, expected.gradients[i],
                                        combined.gradients[i]);
                            }
                            checked++;
                        }
                    }
                    return checked;
                }));
            }
            for (Future<Integer> rank : ranks) {
                assertEquals(steps.size(), (int) rank.get(60, TimeUnit.SECONDS));
            }
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void byChunkWithOneDtypeEqualsTheWholeCombine() throws Exception {
        exchange(Collections.nCopies(3, "float32"), new long[] {1001, 7, 333}, 0, 1);
    }

    /** Slices: each combined while the next ones' all-to-alls are in flight, its all-gather started behind them. */
    @Test
    public void bySlicesWithOneDtypeEqualsTheWholeCombine() throws Exception {
        exchange(Collections.nCopies(3, "float32"), new long[] {1001, 7, 333}, 0, 3);
    }

    @Test
    public void bySlicesWithMixedDtypesEqualsTheWholeCombine() throws Exception {
        exchange(Arrays.asList("float32", "float64", "float32"), new long[] {1001, 7, 333}, 0, 4);
    }

    @Test
    public void slicesKeepAtLeastSliceBytesEach() {
        assertEquals(1, GlooExchange.slices(4L << 20, 2)); // the 1.05M-parameter MLP: one slice
        assertEquals(1, GlooExchange.slices(32L << 20, 16));
        assertEquals(4, GlooExchange.slices(32L << 20, 2));
        assertEquals(GlooExchange.MAX_SLICES, GlooExchange.slices(1L << 30, 2));
        assertEquals(3, GlooExchange.slices(3 * 2 * GlooExchange.SLICE_BYTES + 1, 2));
    }

    /** Two partitions (the benchmark's K=2: round 2 straight into the other's slot), by slice and by chunk. */
    @Test
    public void twoPartitionsBySlicesAndByChunkEqualTheWholeCombine() throws Exception {
        exchange(2, Collections.nCopies(3, "float32"), new long[] {1001, 7, 333}, 0, 3);
        exchange(2, Collections.nCopies(3, "float32"), new long[] {1001, 7, 333}, 0, 1);
        exchange(2, Arrays.asList("float32", "float64", "float32"), new long[] {1001, 7, 333}, 0, 1);
    }

    @Test
    public void byChunkWithMixedDtypesEqualsTheWholeCombine() throws Exception {
        exchange(Arrays.asList("float32", "float64", "float32"), new long[] {1001, 7, 333}, 0, 1);
    }

    @Test
    public void inOneRoundEqualsTheWholeCombine() throws Exception {
        exchange(Arrays.asList("float32", "float64", "float32"), new long[] {101, 7, 33}, 1L << 20, 1);
    }

    private static boolean[] repeat(boolean value, int n) {
        boolean[] out = new boolean[n];
        Arrays.fill(out, value);
        return out;
    }

    /** @return every flag set but {@code unset}'s */
    private static boolean[] flags(int n, int unset) {
        boolean[] out = repeat(true, n);
        out[unset] = false;
        return out;
    }

    /** Ranks 0..size-1, each on a thread, joined through one store that this thread serves. */
    private static List<GlooGroup> join(int size, ExecutorService pool) throws Exception {
        String prefix = UUID.randomUUID().toString();
        try (GlooGroup.Store server = GlooGroup.Store.serve(TIMEOUT)) {
            int port = server.port();
            List<Future<GlooGroup>> joins = new ArrayList<>();
            for (int r = 0; r < size; r++) {
                int rank = r;
                joins.add(pool.submit(() -> {
                    try (GlooGroup.Store store = GlooGroup.Store.connect("127.0.0.1", port, TIMEOUT)) {
                        return GlooGroup.join(store, prefix, "127.0.0.1", rank, size, TIMEOUT);
                    }
                }));
            }
            List<GlooGroup> groups = new ArrayList<>();
            for (Future<GlooGroup> join : joins) {
                groups.add(join.get(60, TimeUnit.SECONDS));
            }
            return groups;
        }
    }
}
