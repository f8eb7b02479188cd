package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.spark.TaskContext;
import scala.concurrent.Await;
import scala.concurrent.Future;
import scala.concurrent.duration.Duration;
import scala.concurrent.duration.FiniteDuration;

/**
 * A reduce-scatter then an all-gather, both in partition order, over Spark's RPC through the
 * driver's {@link RelayEndpoint}. The gradient is cut into K chunks ({@link Chunks}); task c owns
 * chunk c. Round 1: each task sends chunk c of its gradient (with its row count, loss and flags) to
 * task c, and receives its own chunk from every task; it combines that chunk in partition order
 * ({@link GradientCombiner}, element by element as for whole parameters). Round 2: each task sends
 * its combined chunk to all and receives every combined chunk. A task's own slice and own combined
 * chunk never leave it. Per step a task sends and receives about twice the gradient's bytes times
 * (K-1)/K, whatever K is; the driver forwards K times that.
 */
final class RelayExchange implements GradientExchange {

    private static final byte[] NOTHING = new byte[0];
    /** How often a waiting task checks whether Spark killed it (a sibling failed the stage). */
    private static final FiniteDuration CHECK = FiniteDuration.apply(200, TimeUnit.MILLISECONDS);

    private final DriverEndpoint.Caller relay;
    private final String stage;
    private final int partition;
    private final int partitions;
    private final Chunks chunks;
    /** My gradient, one direct buffer per parameter ({@link #put}). */
    private final ByteBuffer[] own;
    /** Per partition but mine, its pieces of my chunk, copied out of its message; mine: views of {@link #own}. */
    private final ByteBuffer[][] mineFromAll;
    /** My combined chunk, per piece. */
    private final ByteBuffer[] part;
    private final GradientCombiner combiner;
    private final GradientCombiner.Combined combined;
    private final long[] phases = new long[PHASES.length];
    private int step;
    private long sent;
    private long received;

    /**
     * @param relayName the driver's relay endpoint
     * @param secret the secret the stage carried ({@link DriverEndpoint.Caller})
     * @param stage names the stage attempt (rounds of different attempts never mix)
     * @param dtypes each parameter's dtype
     * @param sizes each parameter's number of elements
     */
    RelayExchange(String relayName, byte[] secret, String stage, int partition, int partitions, List<String> dtypes,
            long[] sizes) {
        this.relay = new DriverEndpoint.Caller(relayName, secret);
        this.stage = stage;
        this.partition = partition;
        this.partitions = partitions;
        chunks = new Chunks(dtypes, sizes, partitions);
        own = new ByteBuffer[sizes.length];
        ByteBuffer[] gradients = new ByteBuffer[sizes.length];
        for (int i = 0; i < sizes.length; i++) {
            GradientCombiner.requireFloating(dtypes.get(i));
            own[i] = Buffers.direct(sizes[i] * ShardedData.bytesOf(dtypes.get(i)));
            gradients[i] = Buffers.direct(sizes[i] * ShardedData.bytesOf(dtypes.get(i)));
        }
        combined = new GradientCombiner.Combined(gradients, new boolean[sizes.length]);
        List<Chunks.Piece> pieces = chunks.pieces(partition);
        mineFromAll = new ByteBuffer[partitions][];
        for (int q = 0; q < partitions; q++) {
            mineFromAll[q] = q == partition ? chunks.cut(partition, own) : new ByteBuffer[pieces.size()];
            for (int j = 0; q != partition && j < pieces.size(); j++) {
                mineFromAll[q][j] = Buffers.direct(chunks.bytes(pieces.get(j)));
            }
        }
        part = new ByteBuffer[pieces.size()];
        for (int j = 0; j < part.length; j++) {
            part[j] = Buffers.direct(chunks.bytes(pieces.get(j)));
        }
        combiner = new GradientCombiner(chunks.dtypes(partition, dtypes), chunks.parameters(partition), mineFromAll,
                part);
    }

    @Override
    public void put(int parameter, ByteBuffer values) {
        long t0 = System.nanoTime();
        own[parameter].put(0, values, 0, own[parameter].limit());
        phases[0] += System.nanoTime() - t0;
    }

    /**
     * Over Spark's RPC, whose messages are Java arrays: the records are encoded and decoded per step,
     * and the received pieces copied into buffers the run's combiner reads.
     */
    @Override
    public GradientCombiner.Combined combine(ShardResult mine) {
        int count = combined.flags.length;
        byte[][] toOwners = new byte[partitions][];
        ShardResult mySlice = null;
        for (int c = 0; c < partitions; c++) {
            ShardResult slice = mine.rows == 0 ? mine
                    : new ShardResult(mine.partition, mine.rows, mine.loss, chunks.cut(c, own), mine.flags);
            if (c == partition) {
                mySlice = slice; // my own slice stays here: the relay gets an empty placeholder for it
                toOwners[c] = NOTHING;
            } else {
                toOwners[c] = slice.encode();
            }
        }
        // Round 1: every partition's slice of my chunk, in partition order.
        long t0 = System.nanoTime();
        byte[][] slices = exchange("scatter", toOwners);
        long t1 = System.nanoTime();
        int[] rows = new int[partitions];
        double[] losses = new double[partitions];
        boolean[][] flags = new boolean[partitions][count];
        received(slices, mySlice, rows, losses, flags);
        for (int j = 0; j < part.length; j++) {
            combiner.combine(j, rows, flags);
        }
        double loss = GradientCombiner.loss(rows, losses);
        int total = GradientCombiner.total(rows);
        for (int i = 0; i < count; i++) {
            boolean any = false;
            for (int q = 0; q < partitions; q++) {
                any |= rows[q] > 0 && flags[q][i];
            }
            combined.flags[i] = any;
        }
        // Round 2: every combined chunk.
        long t2 = System.nanoTime();
        ShardResult combinedChunk = new ShardResult(partition, total, loss, part, combined.flags);
        byte[][] all = exchange("gather", new byte[][] {combinedChunk.encode()});
        long t3 = System.nanoTime();
        for (int c = 0; c < partitions; c++) {
            ShardResult r = c == partition ? combinedChunk : ShardResult.decode(all[c]);
            if (r.rows > 0) {
                chunks.paste(c, r.gradients, combined.gradients);
            }
        }
        combined.loss = loss;
        combined.rows = total;
        step++;
        phases[1] += t1 - t0;
        phases[2] += t2 - t1;
        phases[3] += t3 - t2;
        phases[4] += System.nanoTime() - t3;
        return combined;
    }

    /**
     * Round 1's records decoded: each partition's rows, loss and flags, and the gradients of my chunk it
     * sent copied into the buffers the combiner reads (my own slice, {@code mine}, is already there).
     */
    private void received(byte[][] slices, ShardResult mine, int[] rows, double[] losses, boolean[][] flags) {
        for (int q = 0; q < partitions; q++) {
            ShardResult r = q == partition ? mine : ShardResult.decode(slices[q]);
            rows[q] = r.rows;
            losses[q] = r.loss;
            if (r.rows > 0) {
                for (int i = 0; i < flags[q].length; i++) {
                    flags[q][i] = r.flags[i];
                }
                for (int j = 0; q != partition && j < part.length; j++) {
                    mineFromAll[q][j].put(0, r.gradients[j], 0, mineFromAll[q][j].limit());
                }
            }
        }
    }

    /** Through the relay: the source's bytes to every task (the others send nothing). */
    @Override
    public void broadcast(int source, ByteBuffer values) {
        byte[] mine = NOTHING;
        if (partition == source) {
            mine = new byte[values.limit()];
            values.get(0, mine);
        }
        byte[][] all = exchange("buffers", new byte[][] {mine});
        if (partition != source) {
            values.put(0, all[source]);
        }
    }

    private byte[][] exchange(String round, byte[][] payloads) {
        for (byte[] p : payloads) {
            sent += p.length;
        }
        Object[] request = {stage + "/" + step + "/" + round, partition, partitions, payloads};
        Future<byte[][]> answer = relay.ask(request, byte[][].class);
        byte[][] result = await(answer);
        for (int q = 0; q < result.length; q++) {
            if (q != partition) {
                received += result[q].length;
            }
        }
        return result;
    }

    /** @return the driver's answer, checking meanwhile whether Spark killed the task (a sibling failed the stage) */
    static <T> T await(Future<T> answer) {
        TaskContext task = TaskContext.get();
        while (true) {
            try {
                return Await.result(answer, CHECK);
            } catch (Exception e) {
                if (!(e instanceof TimeoutException)) {
                    throw e instanceof RuntimeException ? (RuntimeException) e : new IllegalStateException(e);
                }
                if (task != null) {
                    task.killTaskIfInterrupted();
                }
            }
        }
    }

    @Override
    public long[] phaseNanos() {
        return phases.clone();
    }

    @Override
    public long bytesSent() {
        return sent;
    }

    @Override
    public long bytesReceived() {
        return received;
    }
}
