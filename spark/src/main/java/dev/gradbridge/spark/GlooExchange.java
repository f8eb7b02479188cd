package dev.gradbridge.spark;

import java.nio.ByteBuffer;
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
 * (rows, loss, every parameter's flag, padded to 8 bytes, then chunk c of the gradient, left unread
 * when the task has no rows), so every rank knows every split beforehand. Owner c combines the K
 * records in partition order with {@link GradientCombiner} (hence the relay's bits), and round 2 is
 * {@code allgather} of the combined chunks, each padded to the longest chunk.
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

    private final GlooGroup group;
    private final int partition;
    private final int partitions;
    /** Whether this run's gradient goes in one all-gather of whole records ({@link #oneRound}). */
    private final boolean whole;
    /** A record's header: rows (int), loss (double), one flag byte per parameter, padded to 8 bytes. */
    private final int header;
    private final int parameters;
    /** Where each record starts in {@link #send} (one per owner; one in all when whole). */
    private final long[] recordOffsets;
    private final long[] sendSplits;
    private final long[] receiveSplits;
    private final ByteBuffer send;
    /** By chunk: my chunk's K records, in partition order (none when whole). */
    private final ByteBuffer receive;
    private final ByteBuffer gathered;
    private final long gatherBytes;
    /** By chunk: my slot of {@link #gathered}, where my combined chunk is written (the all-gather's input). */
    private final ByteBuffer mineCombined;
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

    /** Sizes every buffer and makes every view once, for the run's parameters. */
    GlooExchange(GlooGroup group, int partition, int partitions, long oneRoundBytes, List<String> dtypes,
            long[] sizes) {
        this.group = group;
        this.partition = partition;
        this.partitions = partitions;
        parameters = sizes.length;
        long[] offsets = new long[parameters];
        long[] bytes = new long[parameters];
        long gradientBytes = 0;
        boolean oneDtype = true;
        for (int i = 0; i < parameters; i++) {
            GradientCombiner.requireFloating(dtypes.get(i));
            offsets[i] = gradientBytes;
            bytes[i] = sizes[i] * ShardedData.bytesOf(dtypes.get(i));
            gradientBytes += bytes[i];
            oneDtype &= dtypes.get(i).equals(dtypes.get(0));
        }
        header = (4 + 8 + parameters + 7) / 8 * 8;
        rows = new int[partitions];
        losses = new double[partitions];
        flags = new boolean[partitions][parameters];
        whole = oneRound(gradientBytes, partitions, oneRoundBytes);
        List<List<int[]>> puts = new ArrayList<>();
        for (int i = 0; i < parameters; i++) {
            puts.add(new ArrayList<>());
        }
        ByteBuffer[][] inputs = new ByteBuffer[partitions][];
        ByteBuffer[] outputs;
        if (whole) {
            long record = header + gradientBytes;
            recordOffsets = new long[] {0};
            sendSplits = null;
            receiveSplits = null;
            send = Buffers.direct(record);
            receive = null;
            gatherBytes = record;
            gathered = Buffers.direct(record * partitions);
            mineCombined = null;
            headers = gathered;
            headerStride = record;
            for (int i = 0; i < parameters; i++) {
                puts.get(i).add(new int[] {Math.toIntExact(header + offsets[i]), 0, Math.toIntExact(bytes[i])});
            }
            for (int q = 0; q < partitions; q++) {
                inputs[q] = new ByteBuffer[parameters];
                for (int i = 0; i < parameters; i++) {
                    inputs[q][i] = Buffers.view(gathered, record * q + header + offsets[i], bytes[i]);
                }
            }
            ByteBuffer out = Buffers.direct(gradientBytes);
            outputs = new ByteBuffer[parameters];
            int[] identity = new int[parameters];
            for (int i = 0; i < parameters; i++) {
                outputs[i] = Buffers.view(out, offsets[i], bytes[i]);
                identity[i] = i;
            }
            combiner = new GradientCombiner(dtypes, identity, inputs, outputs);
            combined = new GradientCombiner.Combined(outputs, new boolean[parameters]);
            chunks = null;
            gatheredPieces = null;
        } else {
            chunks = new Chunks(dtypes, sizes, partitions);
            recordOffsets = new long[partitions];
            sendSplits = new long[partitions];
            long longest = 0;
            long total = 0;
            for (int c = 0; c < partitions; c++) {
                recordOffsets[c] = total;
                sendSplits[c] = header + chunks.bytes(c);
                total += sendSplits[c];
                longest = Math.max(longest, chunks.bytes(c));
                long within = 0;
                for (Chunks.Piece piece : chunks.pieces(c)) {
                    puts.get(piece.parameter).add(new int[] {Math.toIntExact(recordOffsets[c] + header + within),
                        chunks.offset(piece), chunks.bytes(piece)});
                    within += chunks.bytes(piece);
                }
            }
            send = Buffers.direct(total);
            long mine = sendSplits[partition];
            receiveSplits = new long[partitions];
            Arrays.fill(receiveSplits, mine);
            receive = Buffers.direct(mine * partitions);
            gatherBytes = longest;
            gathered = Buffers.direct(longest * partitions);
            mineCombined = Buffers.view(gathered, longest * partition, longest);
            headers = receive;
            headerStride = mine;
            List<Chunks.Piece> minePieces = chunks.pieces(partition);
            outputs = new ByteBuffer[minePieces.size()];
            for (int q = 0; q < partitions; q++) {
                inputs[q] = new ByteBuffer[minePieces.size()];
            }
            long within = 0;
            for (int j = 0; j < minePieces.size(); j++) {
                int length = chunks.bytes(minePieces.get(j));
                for (int q = 0; q < partitions; q++) {
                    inputs[q][j] = Buffers.view(receive, mine * q + header + within, length);
                }
                outputs[j] = Buffers.view(gathered, longest * partition + within, length);
                within += length;
            }
            combiner = new GradientCombiner(chunks.dtypes(partition, dtypes), chunks.parameters(partition), inputs,
                    outputs);
            boolean flat = oneDtype;
            for (int c = 0; c < partitions - 1; c++) {
                flat &= chunks.bytes(c) == longest;
            }
            ByteBuffer[] gradients = new ByteBuffer[parameters];
            for (int i = 0; i < parameters; i++) {
                gradients[i] = flat ? Buffers.view(gathered, offsets[i], bytes[i]) : Buffers.direct(bytes[i]);
            }
            combined = new GradientCombiner.Combined(gradients, new boolean[parameters]);
            gatheredPieces = flat ? null : new ByteBuffer[partitions][];
            for (int c = 0; !flat && c < partitions; c++) {
                List<Chunks.Piece> pieces = chunks.pieces(c);
                gatheredPieces[c] = new ByteBuffer[pieces.size()];
                long at = 0;
                for (int j = 0; j < pieces.size(); j++) {
                    gatheredPieces[c][j] = Buffers.view(gathered, longest * c + at, chunks.bytes(pieces.get(j)));
                    at += chunks.bytes(pieces.get(j));
                }
            }
        }
        putAt = new int[parameters][];
        putFrom = new int[parameters][];
        putBytes = new int[parameters][];
        for (int i = 0; i < parameters; i++) {
            List<int[]> at = puts.get(i);
            putAt[i] = new int[at.size()];
            putFrom[i] = new int[at.size()];
            putBytes[i] = new int[at.size()];
            for (int j = 0; j < at.size(); j++) {
                putAt[i][j] = at.get(j)[0];
                putFrom[i][j] = at.get(j)[1];
                putBytes[i][j] = at.get(j)[2];
            }
        }
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
        String host = SparkEnv.get().blockManager().blockManagerId().host();
        String attempt = "gradbridge/" + context.stageId() + "." + context.stageAttemptNumber();
        try (GlooGroup.Store client = GlooGroup.Store.over(new RunStore.Client(store, secret), TIMEOUT)) {
            return new GlooExchange(GlooGroup.join(client, attempt, host, partition, partitions, TIMEOUT), partition,
                    partitions, oneRoundBytes, dtypes, sizes);
        }
    }

    /**
     * @return whether a gradient of {@code gradientBytes} goes in one all-gather among {@code
     *     partitions} tasks: when each would receive at most {@code oneRoundBytes} of it
     */
    static boolean oneRound(long gradientBytes, int partitions, long oneRoundBytes) {
        return gradientBytes * (partitions - 1) <= oneRoundBytes;
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
        long t0 = System.nanoTime();
        if (whole) {
            group.allgather(send, gathered, gatherBytes, GlooExchange::checkKilled);
            sent += gatherBytes * (partitions - 1);
            received += gatherBytes * (partitions - 1);
            long t1 = System.nanoTime();
            readHeaders();
            combiner.combine(rows, losses, flags, combined);
            phases[3] += t1 - t0;
            phases[2] += System.nanoTime() - t1;
            return combined;
        }
        // Round 1: to each owner c, my record for chunk c; from each partition, its record of my chunk.
        group.alltoall(send, sendSplits, receive, receiveSplits, GlooExchange::checkKilled);
        sent += sumExcept(sendSplits, partition);
        received += receiveSplits[partition] * (partitions - 1);
        long t1 = System.nanoTime();
        readHeaders();
        for (int p = 0; p < parameters; p++) {
            boolean any = false;
            for (int q = 0; q < partitions; q++) {
                any |= flags[q][p]; // a task without rows sent no flag
            }
            combined.flags[p] = any;
        }
        for (int j = 0; j < combiner.pieces(); j++) {
            combiner.combine(j, rows, flags);
        }
        combined.loss = GradientCombiner.loss(rows, losses);
        combined.rows = GradientCombiner.total(rows);
        long t2 = System.nanoTime();
        // Round 2: every combined chunk, each padded to the longest.
        group.allgather(mineCombined, gathered, gatherBytes, GlooExchange::checkKilled);
        sent += gatherBytes * (partitions - 1);
        received += gatherBytes * (partitions - 1);
        long t3 = System.nanoTime();
        if (gatheredPieces != null) {
            for (int c = 0; c < partitions; c++) {
                chunks.paste(c, gatheredPieces[c], combined.gradients);
            }
        }
        phases[1] += t1 - t0;
        phases[2] += t2 - t1;
        phases[3] += t3 - t2;
        phases[4] += System.nanoTime() - t3;
        return combined;
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

    /** Leaves the group: a peer still waiting in a collective with this task fails at once. */
    @Override
    public void close() {
        group.close();
    }
}
