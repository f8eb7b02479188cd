package dev.gradbridge.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.spark.TaskContext;
import org.apache.spark.rpc.RpcTimeout;
import scala.concurrent.Await;
import scala.concurrent.Future;
import scala.concurrent.duration.Duration;
import scala.concurrent.duration.FiniteDuration;

/**
 * A reduce-scatter then an all-gather, both in partition order, over Spark's RPC through the
 * driver's {@link ExchangeRelay}. The gradient is cut into K chunks ({@link Chunks}); task c owns
 * chunk c. Round 1: each task sends chunk c of its gradient (with its row count, loss and flags) to
 * task c, and receives its own chunk from every task; it combines that chunk in partition order
 * ({@link GradientCombiner}, element by element as for whole parameters). Round 2: each task sends
 * its combined chunk to all and receives every combined chunk. A task's own slice and own combined
 * chunk never leave it. Per step a task sends and receives about twice the gradient's bytes times
 * (K-1)/K, whatever K is; the driver forwards K times that.
 */
final class RelayExchange implements GradientExchange {

    private static final byte[] NOTHING = new byte[0];
    /** A request to the driver waits as long as it takes (a killed task gets out through {@link #await}). */
    static final RpcTimeout NO_TIMEOUT =
            new RpcTimeout(FiniteDuration.apply(365, TimeUnit.DAYS), "gradbridge exchange");
    /** How often a waiting task checks whether Spark killed it (a sibling failed the stage). */
    private static final FiniteDuration CHECK = FiniteDuration.apply(200, TimeUnit.MILLISECONDS);

    private final DriverEndpoint.Caller relay;
    private final String stage;
    private final int partition;
    private final int partitions;
    private Chunks chunks;
    private int step;
    private long sent;
    private long received;

    /**
     * @param relayName the driver's relay endpoint
     * @param secret the secret the stage carried ({@link DriverEndpoint.Caller})
     * @param stage names the stage attempt (rounds of different attempts never mix)
     */
    RelayExchange(String relayName, byte[] secret, String stage, int partition, int partitions) {
        this.relay = new DriverEndpoint.Caller(relayName, secret);
        this.stage = stage;
        this.partition = partition;
        this.partitions = partitions;
    }

    @Override
    public GradientCombiner.Combined combine(ShardResult mine, List<String> dtypes, long[] sizes) {
        if (chunks == null) {
            chunks = new Chunks(dtypes, sizes, partitions);
        }
        int count = dtypes.size();
        byte[][] toOwners = new byte[partitions][];
        ShardResult own = null;
        for (int c = 0; c < partitions; c++) {
            ShardResult slice = mine.rows == 0 ? mine
                    : new ShardResult(mine.partition, mine.rows, mine.loss, chunks.cut(c, mine.gradients), mine.flags);
            if (c == partition) {
                own = slice; // my own slice stays here: the relay gets an empty placeholder for it
                toOwners[c] = NOTHING;
            } else {
                toOwners[c] = slice.encode();
            }
        }
        // Round 1: every partition's slice of my chunk, in partition order.
        List<ShardResult> mineFromAll = new ArrayList<>();
        boolean[] flags = new boolean[count];
        byte[][] slices = exchange("scatter", toOwners);
        for (int q = 0; q < partitions; q++) {
            ShardResult r = q == partition ? own : ShardResult.decode(slices[q]);
            if (r.rows > 0) {
                for (int i = 0; i < count; i++) {
                    flags[i] |= r.flags[i];
                }
                r = new ShardResult(r.partition, r.rows, r.loss, r.gradients, chunks.flags(partition, r.flags));
            }
            mineFromAll.add(r);
        }
        GradientCombiner.Combined part =
                GradientCombiner.combine(mineFromAll, chunks.dtypes(partition, dtypes), chunks.sizes(partition));
        // Round 2: every combined chunk.
        ShardResult combinedChunk = new ShardResult(partition, part.rows, part.loss, part.gradients, part.flags);
        byte[][] gradients = new byte[count][];
        for (int i = 0; i < count; i++) {
            gradients[i] = GradientCombiner.zeros(dtypes.get(i), sizes[i]);
        }
        byte[][] all = exchange("gather", new byte[][] {combinedChunk.encode()});
        for (int c = 0; c < partitions; c++) {
            ShardResult r = c == partition ? combinedChunk : ShardResult.decode(all[c]);
            if (r.rows > 0) {
                chunks.paste(c, r.gradients, gradients);
            }
        }
        step++;
        return new GradientCombiner.Combined(gradients, flags, part.loss, part.rows);
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
    public long bytesSent() {
        return sent;
    }

    @Override
    public long bytesReceived() {
        return received;
    }
}
