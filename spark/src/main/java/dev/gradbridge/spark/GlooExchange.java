package dev.gradbridge.spark;

import dev.gradbridge.GlooGroup;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;

/**
 * The reduce-scatter by chunk then all-gather of {@link RelayExchange}, task to task over
 * libtorch's c10d Gloo ({@link GlooGroup}): the driver is not in the path of the gradients. The
 * tasks meet at each stage attempt's start through the run's store on the driver ({@link RunStore}:
 * c10d's store kept behind the driver's RPC and the run's secret, no socket of its own; its name
 * travels in the task): each task publishes its Gloo address under the stage attempt's keys, so a
 * retry never meets a failed attempt's tasks. Each task's Gloo sockets listen on its executor's
 * Spark host (the block manager's), never on every interface. (Not through Spark's barrier
 * all-gather: every caller sleeps at least a second in it.)
 *
 * <p>Per step, round 1 is Gloo's {@code alltoall_base}: to each owner c a record of fixed size
 * (rows, loss, every parameter's flag, then chunk c of the gradient, left unread when the task has no
 * rows), so every rank knows every split beforehand. Owner c combines the K records in partition
 * order with {@link GradientCombiner} (hence the relay's bits), and round 2 is {@code allgather}
 * of the combined chunks, each padded to the longest chunk. Every task sees every task's rows,
 * losses and flags in round 1, so each computes the step's loss and flags itself, identically.
 * Per step a task sends (K-1)/K of the gradient in each round (the all-gather is Gloo's ring):
 * about 2P(K-1)/K bytes, whatever K is.
 *
 * <p>A small gradient goes in one round instead ({@link #oneRound}: when a task would receive at
 * most {@link GradientExchange#ONE_ROUND_SETTING} bytes of it, (K-1) P): an {@code allgather} of
 * every task's whole record, and every task combines all K in partition order (the same arithmetic
 * element by element, so the same bits). Such a step is bound by the collectives' latency, not its
 * bytes: one collective instead of two saves more than the extra bytes cost, and the bound keeps
 * those bytes from growing with K (a larger K goes by chunk).
 *
 * <p>A task that fails closes its group, which fails the collective its peers wait in; a task
 * Spark killed gets out of the wait within {@link GlooGroup#CHECK_MILLIS} ms.
 */
final class GlooExchange implements GradientExchange {

    /** How long a collective (or the rendezvous) waits for a peer that neither answers nor dies. */
    static final Duration TIMEOUT = Duration.ofMinutes(10);
    private static final int HEADER = 4 + 8; // rows (int), loss (double)

    private final GlooGroup group;
    private final int partition;
    private final int partitions;
    private final long oneRoundBytes;
    private Chunks chunks;
    /** Whether this run's gradient goes in one all-gather of whole records ({@link #oneRound}). */
    private boolean whole;
    /** Per partition, its gradient in the whole-record round (reused every step). */
    private byte[][][] wholeFromAll;
    private long[] recordBytes;
    private long[] chunkBytes;
    private long gatherBytes;
    private ByteBuffer send;
    private ByteBuffer receive;
    private ByteBuffer mineCombined;
    private ByteBuffer gathered;
    /** Per partition q, the pieces of my chunk q sent me (reused every step). */
    private byte[][][] incoming;
    /** The combined gradient, whole parameters (reused every step: the caller sets it before the next). */
    private byte[][] combined;
    private long sent;
    private long received;

    private GlooExchange(GlooGroup group, int partition, int partitions, long oneRoundBytes) {
        this.group = group;
        this.oneRoundBytes = oneRoundBytes;
        this.partition = partition;
        this.partitions = partitions;
    }

    /**
     * Joins the stage attempt's group (every task of the stage calls it at its start), meeting the
     * others through the run's store on the driver.
     *
     * @param store the driver's {@link RunStore} endpoint
     * @param secret the secret the stage carried ({@link DriverEndpoint.Caller})
     * @param oneRoundBytes the most gradient bytes a task receives in one all-gather of whole records
     */
    static GlooExchange join(BarrierTaskContext context, String store, byte[] secret, int partition, int partitions,
            long oneRoundBytes) {
        String host = SparkEnv.get().blockManager().blockManagerId().host();
        String attempt = "gradbridge/" + context.stageId() + "." + context.stageAttemptNumber();
        try (GlooGroup.Store client = GlooGroup.Store.over(new RunStore.Client(store, secret), TIMEOUT)) {
            return new GlooExchange(GlooGroup.join(client, attempt, host, partition, partitions, TIMEOUT), partition,
                    partitions, oneRoundBytes);
        }
    }

    /**
     * @return whether a gradient of {@code gradientBytes} goes in one all-gather among {@code
     *     partitions} tasks: when each would receive at most {@code oneRoundBytes} of it
     */
    static boolean oneRound(long gradientBytes, int partitions, long oneRoundBytes) {
        return gradientBytes * (partitions - 1) <= oneRoundBytes;
    }

    /** Sizes every buffer once per run (the first step's). */
    private void layout(List<String> dtypes, long[] sizes) {
        long gradientBytes = 0;
        for (int i = 0; i < sizes.length; i++) {
            gradientBytes += sizes[i] * ShardedData.bytesOf(dtypes.get(i));
        }
        whole = oneRound(gradientBytes, partitions, oneRoundBytes);
        if (whole) {
            long record = HEADER + dtypes.size() + gradientBytes;
            send = direct(record);
            gathered = direct(record * partitions);
            gatherBytes = record;
            wholeFromAll = new byte[partitions][dtypes.size()][];
            for (int q = 0; q < partitions; q++) {
                for (int i = 0; i < sizes.length; i++) {
                    wholeFromAll[q][i] = GradientCombiner.zeros(dtypes.get(i), sizes[i]);
                }
            }
            return;
        }
        chunks = new Chunks(dtypes, sizes, partitions);
        recordBytes = new long[partitions];
        chunkBytes = new long[partitions];
        for (int c = 0; c < partitions; c++) {
            long[] pieces = chunks.sizes(c);
            List<String> types = chunks.dtypes(c, dtypes);
            for (int j = 0; j < pieces.length; j++) {
                chunkBytes[c] += pieces[j] * ShardedData.bytesOf(types.get(j));
            }
            recordBytes[c] = HEADER + dtypes.size() + chunkBytes[c];
            gatherBytes = Math.max(gatherBytes, chunkBytes[c]);
        }
        long out = 0;
        for (long r : recordBytes) {
            out += r;
        }
        send = direct(out);
        incoming = new byte[partitions][][];
        List<Chunks.Piece> minePieces = chunks.pieces(partition);
        for (int q = 0; q < partitions; q++) {
            incoming[q] = new byte[minePieces.size()][];
            for (int j = 0; j < minePieces.size(); j++) {
                incoming[q][j] = new byte[chunks.bytes(minePieces.get(j))];
            }
        }
        combined = new byte[dtypes.size()][];
        for (int i = 0; i < combined.length; i++) {
            combined[i] = GradientCombiner.zeros(dtypes.get(i), sizes[i]);
        }
        receive = direct(recordBytes[partition] * partitions);
        mineCombined = direct(gatherBytes);
        gathered = direct(gatherBytes * partitions);
    }

    @Override
    public GradientCombiner.Combined combine(ShardResult mine, List<String> dtypes, long[] sizes) {
        if (send == null) {
            layout(dtypes, sizes);
        }
        if (whole) {
            return combineWhole(mine, dtypes, sizes);
        }
        int count = dtypes.size();
        // Round 1: to each owner c, my record for chunk c.
        send.clear();
        for (int c = 0; c < partitions; c++) {
            send.putInt(mine.rows).putDouble(mine.loss);
            for (int i = 0; i < count; i++) {
                send.put((byte) (mine.rows > 0 && mine.flags[i] ? 1 : 0));
            }
            if (mine.rows > 0) {
                for (Chunks.Piece piece : chunks.pieces(c)) {
                    send.put(mine.gradients[piece.parameter], chunks.offset(piece), chunks.bytes(piece));
                }
            } else {
                send.position(send.position() + Math.toIntExact(chunkBytes[c])); // no rows: never read
            }
        }
        long[] receiveSplits = new long[partitions];
        Arrays.fill(receiveSplits, recordBytes[partition]);
        group.alltoall(send, recordBytes, receive, receiveSplits, GlooExchange::checkKilled);
        sent += sumExcept(recordBytes, partition);
        received += recordBytes[partition] * (partitions - 1);
        // Every partition's record of my chunk, in partition order.
        List<ShardResult> mineFromAll = new ArrayList<>();
        boolean[] flags = new boolean[count];
        for (int q = 0; q < partitions; q++) {
            receive.position(Math.toIntExact(recordBytes[partition] * q));
            int rows = receive.getInt();
            double loss = receive.getDouble();
            boolean[] all = new boolean[count];
            for (int i = 0; i < count; i++) {
                all[i] = receive.get() != 0;
                flags[i] |= all[i];
            }
            byte[][] gradients = incoming[q];
            for (byte[] piece : gradients) {
                receive.get(piece);
            }
            mineFromAll.add(new ShardResult(q, rows, loss, gradients, chunks.flags(partition, all)));
        }
        GradientCombiner.Combined part =
                GradientCombiner.combine(mineFromAll, chunks.dtypes(partition, dtypes), chunks.sizes(partition));
        // Round 2: every combined chunk, each padded to the longest.
        mineCombined.clear();
        for (byte[] piece : part.gradients) {
            mineCombined.put(piece);
        }
        group.allgather(mineCombined, gathered, gatherBytes, GlooExchange::checkKilled);
        sent += gatherBytes * (partitions - 1);
        received += gatherBytes * (partitions - 1);
        for (int c = 0; c < partitions; c++) {
            gathered.position(Math.toIntExact(gatherBytes * c));
            for (Chunks.Piece piece : chunks.pieces(c)) {
                gathered.get(combined[piece.parameter], chunks.offset(piece), chunks.bytes(piece));
            }
        }
        return new GradientCombiner.Combined(combined, flags, part.loss, part.rows);
    }

    /** The one-round exchange of small gradients: every task's whole record to every task. */
    private GradientCombiner.Combined combineWhole(ShardResult mine, List<String> dtypes, long[] sizes) {
        int count = dtypes.size();
        send.clear();
        send.putInt(mine.rows).putDouble(mine.loss);
        for (int i = 0; i < count; i++) {
            send.put((byte) (mine.rows > 0 && mine.flags[i] ? 1 : 0));
        }
        if (mine.rows > 0) {
            for (byte[] gradient : mine.gradients) {
                send.put(gradient);
            }
        }
        group.allgather(send, gathered, gatherBytes, GlooExchange::checkKilled);
        sent += gatherBytes * (partitions - 1);
        received += gatherBytes * (partitions - 1);
        List<ShardResult> all = new ArrayList<>();
        for (int q = 0; q < partitions; q++) {
            gathered.position(Math.toIntExact(gatherBytes * q));
            int rows = gathered.getInt();
            double loss = gathered.getDouble();
            boolean[] flags = new boolean[count];
            for (int i = 0; i < count; i++) {
                flags[i] = gathered.get() != 0;
            }
            if (rows > 0) {
                for (byte[] gradient : wholeFromAll[q]) {
                    gathered.get(gradient);
                }
            }
            all.add(new ShardResult(q, rows, loss, wholeFromAll[q], flags));
        }
        return GradientCombiner.combine(all, dtypes, sizes);
    }

    private static void checkKilled() {
        TaskContext task = TaskContext.get();
        if (task != null) {
            task.killTaskIfInterrupted();
        }
    }

    private static long sumExcept(long[] values, int skip) {
        long sum = 0;
        for (int i = 0; i < values.length; i++) {
            sum += i == skip ? 0 : values[i];
        }
        return sum;
    }

    private static ByteBuffer direct(long bytes) {
        return ByteBuffer.allocateDirect(Math.toIntExact(Math.max(1, bytes))).order(ByteOrder.LITTLE_ENDIAN);
    }

    @Override
    public long bytesSent() {
        return sent;
    }

    @Override
    public long bytesReceived() {
        return received;
    }

    /** Leaves the group: a peer still waiting in a collective with this task fails at once. */
    @Override
    public void close() {
        group.close();
    }
}
