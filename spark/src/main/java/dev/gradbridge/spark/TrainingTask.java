package dev.gradbridge.spark;

import dev.gradbridge.History;
import dev.gradbridge.Metadata;
import dev.gradbridge.data.Shuffle;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.broadcast.Broadcast;
import scala.jdk.javaapi.CollectionConverters;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractFunction1;

/**
 * One partition's whole epoch, as a task of a barrier stage: it loads its replica from the state
 * the driver holds, then for every step computes the gradients of the rows of the step's batch it
 * holds, combines them with every other task's ({@link GradientExchange}: in partition order, the
 * same on every task) and runs the exported optimizer. Every replica thus takes the same steps on
 * the same bits. Partition 0 ends the epoch with the schedule step and sends its module back as a
 * checkpoint archive: the driver's state for the next epoch (and the checkpoint file).
 *
 * <p>A failed task fails the stage; Spark retries the stage as a whole from the same broadcast
 * state, so a retry repeats the same epoch exactly.
 */
final class TrainingTask extends AbstractFunction1<scala.collection.Iterator<Shard>, scala.collection.Iterator<TrainingTask.Result>>
        implements Serializable {
    private static final long serialVersionUID = 1L;

    /**
     * @return the epoch's results, one per partition, from a barrier stage over {@code shards}; the
     *     stage ends in a shuffle because Spark retries a failed barrier stage only when it is a
     *     shuffle map stage (a failed barrier result stage fails the job)
     */
    static List<Result> runStage(JavaRDD<Shard> shards, TrainingTask task) {
        ClassTag<Result> tag = ClassTag$.MODULE$.apply(Result.class);
        return JavaRDD.fromRDD(shards.rdd().barrier().mapPartitions(task, false, tag), tag).repartition(1).collect();
    }

    /** The run: what every task of every epoch's stage needs. */
    static final class Run implements Serializable {
        private static final long serialVersionUID = 1L;
        final long seed;
        final boolean shuffle;
        final int batch;
        final long rows;
        final String mode;
        final long[] xShape;
        final long[] yShape;
        final String shardsSha256;
        final List<String> dtypes;
        final long[] sizes;
        final String fault;
        final int shardsRdd;
        /** {@link GradientExchange#GLOO} or {@link GradientExchange#RELAY} */
        final String exchange;
        /** Where the tasks meet: the driver's relay endpoint (relay) or its TCPStore's host:port (gloo); null for K = 1. */
        final String meeting;

        Run(long seed, boolean shuffle, int batch, long rows, String mode, long[] xShape, long[] yShape,
                String shardsSha256, List<String> dtypes, long[] sizes, String fault, int shardsRdd, String exchange,
                String meeting) {
            this.seed = seed;
            this.shuffle = shuffle;
            this.batch = batch;
            this.rows = rows;
            this.mode = mode;
            this.xShape = xShape;
            this.yShape = yShape;
            this.shardsSha256 = shardsSha256;
            this.dtypes = dtypes;
            this.sizes = sizes;
            this.fault = fault;
            this.shardsRdd = shardsRdd;
            this.exchange = exchange;
            this.meeting = meeting;
        }

        long[] order(int epoch) {
            int n = Math.toIntExact(rows);
            if (shuffle) {
                return Shuffle.permutation(seed, epoch, n);
            }
            long[] order = new long[n];
            for (int i = 0; i < n; i++) {
                order[i] = i;
            }
            return order;
        }
    }

    /** What one task reports at the end of its epoch. */
    static final class Result implements Serializable {
        private static final long serialVersionUID = 1L;
        int partition;
        int stageAttempt;
        String executor;
        /** The combined step losses (the same on every task), up to and including a non-finite one. */
        double[] losses;
        /** Partition 0: the module after the epoch, a checkpoint archive; else null. */
        byte[] state;
        long loadNanos;
        /** Per step: this task's compute (its rows' forward and backward, reading the gradients). */
        long[] computeNanos;
        /** Per step: the whole step, compute to optimizer step. */
        long[] stepNanos;
        long exchangeNanos;
        long optimizerNanos;
        long bytesSent;
        long bytesReceived;
    }

    private final Broadcast<byte[]> state;
    private final Run run;
    private final int epoch;

    TrainingTask(Broadcast<byte[]> state, Run run, int epoch) {
        this.state = state;
        this.run = run;
        this.epoch = epoch;
    }

    @Override
    public scala.collection.Iterator<Result> apply(scala.collection.Iterator<Shard> shards) {
        try {
            return CollectionConverters.asScala(call(CollectionConverters.asJava(shards)));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    private Iterator<Result> call(Iterator<Shard> shards) throws IOException {
        QuietLogging.executor();
        Shard shard = shards.next(); // one per partition; read to the end so Spark releases the block
        while (shards.hasNext()) {
            shards.next();
        }
        BarrierTaskContext context = BarrierTaskContext.get();
        // closed however the task ends: a failed task's peers waiting in the exchange fail at once
        try (GradientExchange exchange = exchange(context, shard)) {
            return epoch(shard, context, exchange);
        }
    }

    private GradientExchange exchange(BarrierTaskContext context, Shard shard) {
        if (shard.partitions == 1) {
            return new SoloExchange();
        }
        if (GradientExchange.RELAY.equals(run.exchange)) {
            return new RelayExchange(run.meeting, context.stageId() + "." + context.stageAttemptNumber(), shard.partition,
                    shard.partitions);
        }
        return GlooExchange.join(context, run.meeting, shard.partition, shard.partitions);
    }

    private Iterator<Result> epoch(Shard shard, BarrierTaskContext context, GradientExchange exchange)
            throws IOException {
        long[] order = run.order(epoch);
        int steps = (int) ((run.rows + run.batch - 1) / run.batch);
        Result result = new Result();
        result.partition = shard.partition;
        result.stageAttempt = context.stageAttemptNumber();
        result.executor = SparkEnv.get().executorId();
        result.computeNanos = new long[steps];
        result.stepNanos = new long[steps];
        double[] losses = new double[steps];
        long loading = System.nanoTime();
        try (Replica replica = Replica.load(state.value())) {
            result.loadNanos = System.nanoTime() - loading;
            int step = 0;
            boolean diverged = false;
            for (int start = 0; start < run.rows; step++, start += run.batch) {
                long t0 = System.nanoTime();
                int end = (int) Math.min(run.rows, (long) start + run.batch);
                ShardResult mine = slice(shard, order, start, end, replica);
                long t1 = System.nanoTime();
                injectFault(shard.partition, step, context.stageAttemptNumber());
                GradientCombiner.Combined combined = exchange.combine(mine, run.dtypes, run.sizes);
                long t2 = System.nanoTime();
                replica.step(combined);
                long t3 = System.nanoTime();
                result.computeNanos[step] = t1 - t0;
                result.stepNanos[step] = t3 - t0;
                result.exchangeNanos += t2 - t1;
                result.optimizerNanos += t3 - t2;
                losses[step] = combined.loss;
                if (Double.isNaN(combined.loss) || Double.isInfinite(combined.loss)) {
                    diverged = true;
                    step++;
                    break; // every task sees the same loss and stops at the same step
                }
            }
            result.losses = Arrays.copyOf(losses, step);
            if (shard.partition == 0 && !diverged) {
                replica.scheduleEpoch(History.epochLoss(result.losses));
                result.state = replica.save(Metadata.Checkpoint.sharded(epoch + 1, run.seed, run.batch, run.mode,
                        run.xShape, run.yShape, run.shardsSha256));
            }
        }
        result.bytesSent = exchange.bytesSent();
        result.bytesReceived = exchange.bytesReceived();
        return Collections.singletonList(result).iterator();
    }

    /** This partition's rows of the batch {@code order[start..end)}, and their gradients. */
    private static ShardResult slice(Shard shard, long[] order, int start, int end, Replica replica) {
        int k = shard.partitions;
        int count = 0;
        for (int i = start; i < end; i++) {
            if (Shard.partitionOf(order[i], k) == shard.partition) {
                count++;
            }
        }
        if (count == 0) {
            return ShardResult.empty(shard.partition);
        }
        byte[] x = new byte[count * shard.xRowBytes];
        byte[] y = new byte[count * shard.yRowBytes];
        int r = 0;
        for (int i = start; i < end; i++) {
            long row = order[i];
            if (Shard.partitionOf(row, k) == shard.partition) {
                int j = (int) (row / k);
                System.arraycopy(shard.x, j * shard.xRowBytes, x, r * shard.xRowBytes, shard.xRowBytes);
                System.arraycopy(shard.y, j * shard.yRowBytes, y, r * shard.yRowBytes, shard.yRowBytes);
                r++;
            }
        }
        return replica.gradients(shard.partition, x, y, count);
    }

    /**
     * Test hooks, first stage attempt only, after the task's gradients of that step: {@code task}
     * fails the task; {@code executor} also drops this JVM's cached partitions of the data, so the
     * retried stage rebuilds them as after a lost executor; {@code kill} ends the executor's JVM
     * with SIGKILL (a cluster only: in local mode that JVM is the driver's).
     */
    private void injectFault(int partition, int step, int stageAttempt) throws IOException {
        if (run.fault == null || stageAttempt != 0) {
            return;
        }
        String[] kind = run.fault.split("@");
        String[] at = kind[1].split(":");
        if (Integer.parseInt(at[0]) != epoch || Integer.parseInt(at[1]) != step || Integer.parseInt(at[2]) != partition) {
            return;
        }
        if ("kill".equals(kind[0])) {
            new ProcessBuilder("kill", "-9", Long.toString(ProcessHandle.current().pid())).inheritIO().start();
            try {
                Thread.sleep(60_000);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        if ("executor".equals(kind[0])) {
            SparkEnv.get().blockManager().removeRdd(run.shardsRdd);
        }
        throw new IllegalStateException(
                "injected " + kind[0] + " fault at epoch " + epoch + ", step " + step + ", partition " + partition);
    }
}
