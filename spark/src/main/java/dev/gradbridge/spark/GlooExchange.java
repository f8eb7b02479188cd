package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.List;
import org.apache.spark.BarrierTaskContext;
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
 * (rows, loss, every parameter's flag, padded to 8 bytes, then chunk c of the gradient, left unread
 * when the task has no rows), so every rank knows every split beforehand. Owner c combines the K
 * records in partition order with {@link GradientCombiner} (hence the relay's bits), and round 2 is
 * {@code allgather} of the combined chunks, each padded to the longest chunk. Two tasks send their
 * combined chunk straight into the other's slot instead, an {@code alltoall_base} with nothing to
 * itself: the same bytes, and at 2.1 MB Gloo's all-gather took 3.6-6.5 ms where that took ~2 (two
 * processes, torch.distributed); in spark_bench's 1.05M MLP at K=2 round 2 went from 4.1-4.6 to
 * 2.8-3.0 ms a step, and K=2 from 0.77 to 0.82 of the ceiling (the two run by turns, 5 rounds).
 *
 * <p>Direct buffers end to end, sized once per run: {@link #put} copies each gradient from libtorch's
 * tensor straight into its records (a parameter cut by a chunk's end into two), the combine reads the
 * received records in place and writes the owner's combined chunk into its slot of the all-gather's
 * output, and when every parameter has one dtype (every chunk but the last then has the same bytes,
 * {@link Chunks}) that output is the combined gradient laid end to end, which the optimizer reads in
 * place: one copy in, none out, no Java array or object per step. (Parameters of mixed dtypes take
 * one more copy, out of the chunks into a buffer per parameter.) Every task sees every task's rows,
 * losses and flags in round 1, so each computes the step's loss and flags itself, identically.
 * Per step a task sends (K-1)/K of the gradient in each round (the all-gather is Gloo's ring):
 * about 2P(K-1)/K bytes, whatever K is.
 *
 * <p>The combine overlaps the collectives: a large gradient's chunks are cut again into S slices
 * ({@link #slices}), the K·S chunks of {@link Chunks} over the gradient, chunk {@code s·K + c} being
 * slice s of owner c. The task's thread starts the S all-to-alls at once (Gloo's thread runs a
 * group's collectives one at a time, in the order started: the same on every rank), waits for slice
 * s, combines it while the later slices' all-to-alls are in flight, and starts its all-gather, which
 * Gloo runs after them. No thread of the exchange's own: every hand-over between two threads is a
 * wake-up, and on a loaded machine each one waits for a core. Every element's sum is still taken over the
 * partitions in order (the combine is element by element), so the bits do not change; the slices
 * of one all-gather are adjacent in the gradient, so its output is still the gradient laid end to
 * end.
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

    /**
     * The least bytes of a slice of an owner's chunk ({@link #slices}). Each slice costs two more
     * collectives, each with its fixed latency (thread wake-ups on every rank, which on a loaded
     * machine wait for a core) that the overlap must pay for: 4 MiB take ~3 ms at 10 Gb/s. On the
     * 2-core test machine the 1.05M-parameter MLP's 2.1 MB chunk took 24-32 ms a step cut into 4
     * slices of 512 KiB and 11-20 ms whole (the exchange alone, load 11-15).
     */
    static final long SLICE_BYTES = 4L * 1024 * 1024;

    /** The most slices: each one more costs two collectives' latency. */
    static final int MAX_SLICES = 4;

    private final GlooGroup group;
    private final int partition;
    private final int partitions;
    /** Whether this run's gradient goes in one all-gather of whole records ({@link #oneRound}). */
    private final boolean whole;
    /** A record's header: rows (int), loss (double), one flag byte per parameter, padded to 8 bytes. */
    private final int header;
    private final int parameters;
    /** Where each record with a header starts in {@link #send} (slice 0's, one per owner; one in all when whole). */
    private final long[] recordOffsets;
    /** By chunk: the number of slices S (1 when whole). */
    private final int slices;
    /** By chunk, per slice: what it sends to each owner, its part of {@link #send}, and what it receives. */
    private final long[][] sendSplits;
    private final ByteBuffer[] sendSlices;
    private final long[][] receiveSplits;
    private final ByteBuffer[] receiveSlices;
    private final ByteBuffer send;
    private final ByteBuffer gathered;
    private final long gatherBytes;
    /** By chunk, per slice: my slot of {@link #gathered} (my combined chunk: the all-gather's input), and its output. */
    private final ByteBuffer[] mineCombined;
    private final ByteBuffer[] gatheredSlices;
    /**
     * Two tasks by chunk: round 2 sends my combined chunk straight into the other's slot, an all-to-all
     * with nothing to itself ({@link #pairSplits}); per slice, the other's slot of {@link #gathered}.
     */
    private final ByteBuffer[] otherCombined;
    private final long[] pairSplits;
    /** By chunk, per slice: its first piece in {@link #combiner}, and S + 1 entries. */
    private final int[] slicePieces;
    /** Where the K headers are read: {@link #receive} by chunk, {@link #gathered} when whole. */
    private final ByteBuffer headers;
    private final long headerStride;
    /** Per parameter, per piece of it: its index in {@link #send}, its offset in the parameter, its bytes. */
    private final int[][] putAt;
    private final int[][] putFrom;
    private final int[][] putBytes;
    private final GradientCombiner combiner;
    private final GradientCombiner.Combined combined;
    /** Mixed dtypes by chunk only: per chunk, views of its pieces in {@link #gathered}, pasted out. */
    private final Chunks chunks;
    private final ByteBuffer[][] gatheredPieces;
    private final int[] rows;
    private final double[] losses;
    private final boolean[][] flags;
    private final long[] phases = new long[PHASES.length];
    private long sent;
    private long received;
    /** {@link #broadcast}'s all-gather output, K slots (sized at its first call). */
    private ByteBuffer everyones;
    /** By chunk, per slice: its all-to-all and its all-gather under way on Gloo's thread (0: none). */
    private final long[] alltoalls;
    private final long[] allgathers;
    private final Runnable killed = this::checkKilled;
    /** The task the exchange serves (null outside Spark): a wait in a collective checks whether it was killed. */
    private final TaskContext task = TaskContext.get();

    /** Sizes every buffer and makes every view once, for the run's parameters ({@link GlooLayout}). */
    GlooExchange(GlooGroup group, int partition, int partitions, long oneRoundBytes, int slices, List<String> dtypes,
            long[] sizes) {
        this.group = group;
        this.partition = partition;
        this.partitions = partitions;
        parameters = sizes.length;
        GlooLayout layout = new GlooLayout(partition, partitions, dtypes, sizes);
        header = layout.header;
        rows = new int[partitions];
        losses = new double[partitions];
        flags = new boolean[partitions][parameters];
        whole = oneRound(layout.gradientBytes, partitions, oneRoundBytes);
        if (whole) {
            layout.whole();
        } else {
            layout.byChunk(slices);
        }
        this.slices = layout.slices;
        recordOffsets = layout.recordOffsets;
        sendSplits = layout.sendSplits;
        sendSlices = layout.sendSlices;
        receiveSplits = layout.receiveSplits;
        receiveSlices = layout.receiveSlices;
        send = layout.send;
        gathered = layout.gathered;
        gatherBytes = layout.gatherBytes;
        mineCombined = layout.mineCombined;
        gatheredSlices = layout.gatheredSlices;
        otherCombined = layout.otherCombined;
        pairSplits = layout.pairSplits;
        slicePieces = layout.slicePieces;
        headers = layout.headers;
        headerStride = layout.headerStride;
        combiner = layout.combiner;
        combined = layout.combined;
        chunks = layout.chunks;
        gatheredPieces = layout.gatheredPieces;
        alltoalls = layout.alltoalls;
        allgathers = layout.allgathers;
        putAt = layout.puts(0);
        putFrom = layout.puts(1);
        putBytes = layout.puts(2);
    }

    /**
     * Joins the stage attempt's group (every task of the stage calls it at its start), meeting the
     * others through the run's store on the driver.
     *
     * @param store the driver's {@link RunStore} endpoint
     * @param secret the secret the stage carried ({@link DriverEndpoint.Caller})
     * @param oneRoundBytes the most gradient bytes a task receives in one all-gather of whole records
     * @param dtypes each parameter's dtype
     * @param sizes each parameter's number of elements
     */
    static GlooExchange join(BarrierTaskContext context, String store, byte[] secret, int partition, int partitions,
            long oneRoundBytes, List<String> dtypes, long[] sizes) {
        String host = SparkInternals.executorHost();
        String attempt = "gradbridge/" + context.stageId() + "." + context.stageAttemptNumber();
        try (GlooGroup.Store client = GlooGroup.Store.over(new RunStore.Client(store, secret), TIMEOUT)) {
            long gradientBytes = 0;
            for (int i = 0; i < sizes.length; i++) {
                gradientBytes += sizes[i] * ShardedData.bytesOf(dtypes.get(i));
            }
            return new GlooExchange(GlooGroup.join(client, attempt, host, partition, partitions, TIMEOUT), partition,
                    partitions, oneRoundBytes, slices(gradientBytes, partitions), dtypes, sizes);
        }
    }

    /**
     * @return whether a gradient of {@code gradientBytes} goes in one all-gather among {@code
     *     partitions} tasks: when each would receive at most {@code oneRoundBytes} of it
     */
    static boolean oneRound(long gradientBytes, int partitions, long oneRoundBytes) {
        return gradientBytes * (partitions - 1) <= oneRoundBytes;
    }

    /**
     * @return how many slices an owner's chunk of a gradient of {@code gradientBytes} is cut into: as
     *     many as leave each at least {@link #SLICE_BYTES}, at most {@link #MAX_SLICES}, at least one
     */
    static int slices(long gradientBytes, int partitions) {
        return (int) Math.max(1, Math.min(MAX_SLICES, gradientBytes / partitions / SLICE_BYTES));
    }

    @Override
    public void put(int parameter, ByteBuffer values) {
        long t0 = System.nanoTime();
        for (int j = 0; j < putAt[parameter].length; j++) {
            send.put(putAt[parameter][j], values, putFrom[parameter][j], putBytes[parameter][j]);
        }
        phases[0] += System.nanoTime() - t0;
    }

    @Override
    public GradientCombiner.Combined combine(ShardResult mine) {
        for (long at : recordOffsets) {
            int i = Math.toIntExact(at);
            send.putInt(i, mine.rows).putDouble(i + 4, mine.loss);
            for (int p = 0; p < parameters; p++) {
                send.put(i + 12 + p, (byte) (mine.rows > 0 && mine.flags[p] ? 1 : 0));
            }
        }
        if (whole) {
            long t0 = System.nanoTime();
            group.allgather(send, gathered, gatherBytes, killed);
            sent += gatherBytes * (partitions - 1);
            received += gatherBytes * (partitions - 1);
            long t1 = System.nanoTime();
            readHeaders();
            combiner.combine(rows, losses, flags, combined);
            phases[3] += t1 - t0;
            phases[2] += System.nanoTime() - t1;
            return combined;
        }
        combineSlices();
        combined.loss = GradientCombiner.loss(rows, losses);
        combined.rows = GradientCombiner.total(rows);
        long t3 = System.nanoTime();
        if (gatheredPieces != null) {
            for (int c = 0; c < gatheredPieces.length; c++) {
                chunks.paste(c, gatheredPieces[c], combined.gradients);
            }
        }
        phases[4] += System.nanoTime() - t3;
        return combined;
    }

    /**
     * Every slice's all-to-all queued on Gloo's thread at once; each slice combined here as soon as it
     * has arrived (while the next ones are in flight), its all-gather queued behind them.
     */
    private void combineSlices() {
        try {
            for (int s = 0; s < slices; s++) {
                alltoalls[s] = group.startAlltoall(sendSlices[s], sendSplits[s], receiveSlices[s], receiveSplits[s]);
            }
            for (int s = 0; s < slices; s++) {
                long t0 = System.nanoTime();
                GlooGroup.finish(take(alltoalls, s), killed);
                sent += sumExcept(sendSplits[s], partition);
                received += receiveSplits[s][partition] * (partitions - 1);
                long t1 = System.nanoTime();
                phases[1] += t1 - t0;
                if (s == 0) {
                    readHeaders();
                    combineFlags();
                }
                for (int j = slicePieces[s]; j < slicePieces[s + 1]; j++) {
                    combiner.combine(j, rows, flags);
                }
                allgathers[s] = otherCombined != null
                        ? group.startAlltoall(mineCombined[s], pairSplits, otherCombined[s], pairSplits)
                        : group.startAllgather(mineCombined[s], gatheredSlices[s], gatherBytes);
                phases[2] += System.nanoTime() - t1;
            }
            long t2 = System.nanoTime();
            for (int s = 0; s < slices; s++) {
                GlooGroup.finish(take(allgathers, s), killed);
                sent += gatherBytes * (partitions - 1);
                received += gatherBytes * (partitions - 1);
            }
            phases[3] += System.nanoTime() - t2;
        } finally {
            dropAll(alltoalls); // a step left midway: the group is closed next (TrainingTask), failing the peers
            dropAll(allgathers);
        }
    }

    /** A parameter's combined flag: whether any task's is set (a task without rows sent none). */
    private void combineFlags() {
        for (int p = 0; p < parameters; p++) {
            boolean any = false;
            for (int q = 0; q < partitions; q++) {
                any |= flags[q][p];
            }
            combined.flags[p] = any;
        }
    }

    /** @return {@code works[s]}, now 0 (the caller waits for it and lets go of it) */
    private static long take(long[] works, int s) {
        long work = works[s];
        works[s] = 0;
        return work;
    }

    /** Lets go of every operation still held (none after a whole step). */
    private static void dropAll(long[] works) {
        for (int s = 0; s < works.length; s++) {
            if (works[s] != 0) {
                GlooGroup.drop(take(works, s));
            }
        }
    }

    /** Every partition's rows, loss and flags, from the records' headers, in partition order. */
    private void readHeaders() {
        for (int q = 0; q < partitions; q++) {
            int at = Math.toIntExact(headerStride * q);
            rows[q] = headers.getInt(at);
            losses[q] = headers.getDouble(at + 4);
            for (int p = 0; p < parameters; p++) {
                flags[q][p] = headers.get(at + 12 + p) != 0;
            }
        }
    }

    /** Throws if Spark killed the task. */
    private void checkKilled() {
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

    @Override
    public long[] phaseNanos() {
        return phases.clone();
    }

    /** An all-gather of every task's bytes (a few KB: BatchNorm statistics), the source's slot kept. */
    @Override
    public void broadcast(int source, ByteBuffer values) {
        long each = values.limit();
        if (everyones == null || everyones.limit() != each * partitions) {
            everyones = Buffers.direct(each * partitions);
        }
        group.allgather(values, everyones, each, killed);
        sent += each * (partitions - 1);
        received += each * (partitions - 1);
        if (partition != source) {
            values.put(0, everyones, Math.toIntExact(source * each), Math.toIntExact(each));
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

    /** Leaves the group: a peer still waiting in a collective with this task fails at once. */
    @Override
    public void close() {
        group.close();
    }
}
