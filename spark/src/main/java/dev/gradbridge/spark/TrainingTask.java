package dev.gradbridge.spark;

import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.RunStart;
import dev.gradbridge.internal.SeededDraws;
import dev.gradbridge.History;
import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Shuffle;
import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import org.apache.spark.BarrierTaskContext;
import org.apache.spark.SparkEnv;
import org.apache.spark.api.java.JavaFutureAction;
import org.apache.spark.api.java.JavaRDD;
import scala.concurrent.Future;
import scala.concurrent.Promise;
import scala.concurrent.Promise$;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractFunction1;

/**
 * One partition's whole run, as a task of the run's one barrier stage: it asks the driver for the
 * state to start from ({@link DriverState}: the last epoch end the driver holds), loads its replica
 * and keeps it, with its partition, for every epoch. For every step it computes the gradients of the
 * rows of the step's batch it holds, combines them with every other task's ({@link
 * GradientExchange}: in partition order, the same on every task) and runs the exported optimizer;
 * at each epoch's end every task runs the schedule step on the epoch's loss. Every replica thus takes
 * the same steps on the same bits (their dropout draws from libtorch's generator seeded with {@link
 * SeededDraws#seed} of the run's seed, the step's number in the run and the partition; the trained
 * buffers of the step's first partition with rows become every replica's). Partition 0 hands each
 * epoch's end state (a checkpoint archive and the epoch's losses and its history record's inputs) to
 * the driver, from a snapshot and on a thread of its own while the next epoch's steps run, without
 * ending the stage.
 *
 * <p>A failed task fails the stage; Spark retries the stage as a whole, and the retry starts from the
 * last epoch end the driver holds, so it repeats that epoch exactly.
 */
final class TrainingTask extends AbstractFunction1<scala.collection.Iterator<Shard>, scala.collection.Iterator<TrainingTask.Result>>
        implements Serializable {
    private static final long serialVersionUID = 1L;

    /**
     * @return the run's results, one per partition, from a barrier stage over {@code shards}, as a
     *     job running in the background; the stage ends in a shuffle because Spark retries a failed
     *     barrier stage only when it is a shuffle map stage (a failed barrier result stage fails the job)
     */
    static JavaFutureAction<List<Result>> startStage(JavaRDD<Shard> shards, TrainingTask task) {
        ClassTag<Result> tag = ClassTag$.MODULE$.apply(Result.class);
        return JavaRDD.fromRDD(shards.rdd().barrier().mapPartitions(task, false, tag), tag).repartition(1)
                .collectAsync();
    }

    /** The run: what every task needs. */
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
        /** The most gradient bytes a task receives in one Gloo round ({@link GradientExchange#ONE_ROUND_SETTING}). */
        final long oneRoundBytes;
        /** Each task's libtorch intra-op threads ({@link SparkSettings#THREADS_SETTING}); 0: the task's cores. */
        final int threads;
        /** Where the tasks meet: the driver's relay endpoint (relay) or its {@link RunStore} (gloo); null for K = 1. */
        final String meeting;
        /**
         * The run's secret, which every request to the driver's endpoints carries ({@link DriverEndpoint}); null
         * when {@code spark.authenticate} is on (Spark's own secret is the run's then).
         */
        final byte[] secret;
        /** The driver's {@link DriverState} endpoint. */
        final String driverState;
        /** The epoch after the run's last. */
        final int endEpoch;
        /** Whether the history keeps parameter values (else digests only). */
        final boolean recordValues;

        Run(long seed, boolean shuffle, int batch, long rows, String mode, long[] xShape, long[] yShape,
                String shardsSha256, List<String> dtypes, long[] sizes, String fault, int shardsRdd, String exchange,
                long oneRoundBytes, int threads, String meeting, byte[] secret, String driverState, int endEpoch,
                boolean recordValues) {
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
            this.oneRoundBytes = oneRoundBytes;
            this.threads = threads;
            this.meeting = meeting;
            this.secret = secret;
            this.driverState = driverState;
            this.endEpoch = endEpoch;
            this.recordValues = recordValues;
        }

        int stepsPerEpoch() {
            return (int) ((rows + batch - 1) / batch);
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

    /** What one task reports at the end of the run (its stage attempt's part of it). */
    static final class Result implements Serializable {
        private static final long serialVersionUID = 1L;
        int partition;
        int stageAttempt;
        String executor;
        /** libtorch's intra-op threads on this task's thread. */
        int threads;
        /** The epoch this attempt started from. */
        int firstEpoch;
        /** The epoch whose combined loss was not finite (the same on every task), or -1. */
        int divergedEpoch = -1;
        /** That epoch's combined step losses, up to and including the non-finite one; else null. */
        double[] divergedLosses;
        long loadNanos;
        /** Per step of the attempt: this task's compute (its rows' forward and backward, reading the gradients). */
        long[] computeNanos;
        /** Per step of the attempt: the whole step, compute to optimizer step. */
        long[] stepNanos;
        long exchangeNanos;
        /** Per {@link GradientExchange#PHASES} entry: this task's time in it, all steps. */
        long[] exchangePhaseNanos;
        long optimizerNanos;
        /**
         * Partition 0: its epoch ends' time on the step path (the snapshot, and waiting for the previous
         * end's hand-over; the archive and the record are made off it).
         */
        long endNanos;
        long bytesSent;
        long bytesReceived;
    }

    private final Run run;

    TrainingTask(Run run) {
        this.run = run;
    }

    @Override
    public scala.collection.Iterator<Result> apply(scala.collection.Iterator<Shard> shards) {
        try {
            return SparkLine.asScala(call(SparkLine.asJava(shards)));
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
        // before any libtorch work on this thread: tasks sharing an executor's cores each take their share
        ModuleAccess.setIntraOpThreads(run.threads > 0 ? run.threads : context.cpus());
        DriverEndpoint.Caller driver = new DriverEndpoint.Caller(run.driverState, run.secret);
        String executor = SparkEnv.get().executorId();
        Object[] start = RelayExchange.await(driver.ask(
                new Object[] {DriverState.START, context.stageAttemptNumber(), shard.partition, executor},
                Object[].class));
        // closed however the task ends: a failed task's peers waiting in the exchange fail at once
        try (GradientExchange exchange = exchange(context, shard)) {
            return train(shard, context, exchange, driver, executor, (Integer) start[0], (byte[]) start[1]);
        }
    }

    private GradientExchange exchange(BarrierTaskContext context, Shard shard) {
        if (shard.partitions == 1) {
            return new SoloExchange(run.dtypes, run.sizes);
        }
        if (GradientExchange.RELAY.equals(run.exchange)) {
            return new RelayExchange(run.meeting, run.secret, context.stageId() + "." + context.stageAttemptNumber(),
                    shard.partition, shard.partitions, run.dtypes, run.sizes);
        }
        return GlooExchange.join(context, run.meeting, run.secret, shard.partition, shard.partitions, run.oneRoundBytes,
                run.dtypes, run.sizes);
    }

    private Iterator<Result> train(Shard shard, BarrierTaskContext context, GradientExchange exchange,
            DriverEndpoint.Caller driver, String executor, int firstEpoch, byte[] archive) throws IOException {
        int perEpoch = run.stepsPerEpoch();
        int attempt = context.stageAttemptNumber();
        Result result = newResult(shard, attempt, executor, firstEpoch, perEpoch);
        int taken = 0;
        Future<Object> handover = null; // partition 0's last epoch end, on its way to the driver
        ExecutorService ender = shard.partition == 0 ? Executors.newSingleThreadExecutor(TrainingTask::endThread) : null;
        long loading = System.nanoTime();
        // the batch's rows of this partition, reused every step (a step's inputs are not garbage every step)
        byte[][] columns = new byte[shard.columns.length][];
        for (int c = 0; c < columns.length; c++) {
            columns[c] = new byte[Math.toIntExact((long) Math.min(run.batch, shard.rows) * shard.rowBytes[c])];
        }
        try (Replica replica = Replica.load(archive)) {
            result.loadNanos = System.nanoTime() - loading;
            for (int epoch = firstEpoch; epoch < run.endEpoch; epoch++) {
                double[] losses = new double[perEpoch];
                int steps = epochSteps(shard, replica, exchange, columns, result, epoch, losses, taken);
                taken += steps;
                if (steps > 0 && !Double.isFinite(losses[steps - 1])) { // diverged: every task stops at that step
                    result.divergedEpoch = epoch;
                    result.divergedLosses = Arrays.copyOf(losses, steps);
                    break;
                }
                double loss = RunStart.epochLoss(losses);
                replica.scheduleEpoch(loss);
                if (shard.partition == 0) {
                    long ending = System.nanoTime();
                    handover = endEpoch(replica.module(), attempt, epoch, losses, loss, result.threads, driver, handover,
                            ender);
                    result.endNanos += System.nanoTime() - ending;
                }
            }
        } finally {
            if (ender != null) {
                ender.shutdown(); // a hand-over under way ends; a failed task's is of no use but harmless
            }
        }
        awaitHandover(handover);
        result.computeNanos = Arrays.copyOf(result.computeNanos, taken);
        result.stepNanos = Arrays.copyOf(result.stepNanos, taken);
        result.exchangePhaseNanos = exchange.phaseNanos();
        result.bytesSent = exchange.bytesSent();
        result.bytesReceived = exchange.bytesReceived();
        return Collections.singletonList(result).iterator();
    }

    /** A task's result before its first step: who ran it, with room for every step's times. */
    private Result newResult(Shard shard, int attempt, String executor, int firstEpoch, int perEpoch) {
        Result result = new Result();
        result.partition = shard.partition;
        result.stageAttempt = attempt;
        result.executor = executor;
        result.threads = ModuleAccess.intraOpThreads();
        result.firstEpoch = firstEpoch;
        int total = Math.max(0, run.endEpoch - firstEpoch) * perEpoch;
        result.computeNanos = new long[total];
        result.stepNanos = new long[total];
        return result;
    }

    /**
     * One epoch's steps, each loss into {@code losses} and each step's times into {@code result} from index
     * {@code taken} on.
     *
     * @return the steps taken: all of the epoch's, or up to and including the first whose loss is not finite
     *     (every task sees the same loss and stops at the same step)
     */
    private int epochSteps(Shard shard, Replica replica, GradientExchange exchange, byte[][] columns, Result result,
            int epoch, double[] losses, int taken) throws IOException {
        int perEpoch = losses.length;
        long[] order = run.order(epoch);
        int step = 0;
        for (int start = 0; start < run.rows; step++, start += run.batch) {
            long t0 = System.nanoTime();
            int end = (int) Math.min(run.rows, (long) start + run.batch);
            long seed = replica.draws() ? SeededDraws.seed(run.seed, (long) epoch * perEpoch + step, shard.partition)
                    : 0;
            ShardResult mine = slice(shard, order, start, end, replica, exchange, columns, seed);
            long t1 = System.nanoTime();
            injectFault(epoch, shard.partition, step, result.stageAttempt);
            GradientCombiner.Combined combined = exchange.combine(mine);
            if (replica.writesBuffers() && shard.partitions > 1) {
                replica.shareBuffers(shard.partition, firstWithRows(order, start, end, shard.partitions), exchange);
            }
            long t2 = System.nanoTime();
            replica.step(combined);
            long t3 = System.nanoTime();
            result.computeNanos[taken + step] = t1 - t0;
            result.stepNanos[taken + step] = t3 - t0;
            result.exchangeNanos += t2 - t1;
            result.optimizerNanos += t3 - t2;
            losses[step] = combined.loss;
            if (Double.isNaN(combined.loss) || Double.isInfinite(combined.loss)) {
                return step + 1;
            }
        }
        return step;
    }

    /**
     * Partition 0's end of an epoch: a snapshot of the replica (a memory copy) on the step path, and
     * off it, on {@code ender}, its archive, its history record's inputs and their hand-over to the
     * driver, while the next epoch's steps run. The previous end is handed over first (the driver
     * takes them in order, and at most one snapshot waits). A module whose tensors share a storage
     * cannot be copied apart, so its end is saved on the step path.
     *
     * @return the hand-over under way
     */
    private Future<Object> endEpoch(TrainingModule module, int attempt, int epoch, double[] losses, double loss,
            int threads, DriverEndpoint.Caller driver, Future<Object> previous, ExecutorService ender) {
        Optional<TrainingModule> snapshot = ModuleAccess.snapshot(module);
        try {
            awaitHandover(previous);
        } catch (RuntimeException | Error e) {
            snapshot.ifPresent(TrainingModule::close);
            throw e;
        }
        if (!snapshot.isPresent()) {
            handOver(module, attempt, epoch, losses, loss, threads, driver);
            return null;
        }
        // a Scala promise, so that the wait for it is the exchanges' own (RelayExchange.await)
        Promise<Object> done = Promise$.MODULE$.apply();
        ender.execute(() -> {
            try (TrainingModule copy = snapshot.get()) {
                handOver(copy, attempt, epoch, losses, loss, threads, driver);
                done.success(null);
            } catch (Throwable e) {
                done.tryFailure(e); // a close that fails after success leaves the success
            }
        });
        return done.future();
    }

    /** Saves {@code module}'s archive and its history record's inputs and hands them to the driver. */
    private void handOver(TrainingModule module, int attempt, int epoch, double[] losses, double loss, int threads,
            DriverEndpoint.Caller driver) {
        byte[] state = ModuleAccess.checkpointArchive(module, Metadata.Checkpoint.sharded(epoch + 1, run.seed, run.batch, run.mode,
                run.xShape, run.yShape, run.shardsSha256));
        History.EpochRecord record = ModuleAccess.epochRecord(module, epoch, loss, null, 0.0, run.recordValues);
        Object[] end = {DriverState.END, attempt, epoch, losses, state, new LinkedHashMap<>(record.getDigests()),
            new LinkedHashMap<>(record.getParameters()), record.getLrs(), threads};
        RelayExchange.await(driver.ask(end, Boolean.class));
    }

    private static Thread endThread(Runnable run) {
        Thread thread = new Thread(run, "gradbridge-epoch-end");
        thread.setDaemon(true);
        return thread;
    }

    /** Waits for a hand-over; its failure fails the task (the stage retries from the last end the driver holds). */
    private static void awaitHandover(Future<Object> handover) {
        if (handover != null) {
            RelayExchange.await(handover);
        }
    }

    /**
     * This partition's rows of the batch {@code order[start..end)} (copied into {@code columns}), and
     * their gradients (into {@code exchange}).
     */
    private static ShardResult slice(Shard shard, long[] order, int start, int end, Replica replica,
            GradientExchange exchange, byte[][] columns, long seed) {
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
        int r = 0;
        for (int i = start; i < end; i++) {
            long row = order[i];
            if (Shard.partitionOf(row, k) == shard.partition) {
                int j = (int) (row / k);
                for (int c = 0; c < columns.length; c++) {
                    int bytes = shard.rowBytes[c];
                    System.arraycopy(shard.columns[c], j * bytes, columns[c], r * bytes, bytes);
                }
                r++;
            }
        }
        return replica.gradients(shard.partition, columns, count, exchange, seed);
    }

    /** @return the lowest partition holding a row of the batch {@code order[start..end)} */
    private static int firstWithRows(long[] order, int start, int end, int partitions) {
        int first = partitions - 1;
        for (int i = start; i < end && first > 0; i++) {
            first = Math.min(first, Shard.partitionOf(order[i], partitions));
        }
        return first;
    }

    /**
     * Test hooks, first stage attempt of the run only, after the task's gradients of that epoch's step: {@code task}
     * fails the task; {@code executor} also drops this JVM's cached partitions of the data, so the
     * retried stage rebuilds them as after a lost executor; {@code kill} ends the executor's JVM
     * with SIGKILL (a cluster only: in local mode that JVM is the driver's).
     */
    private void injectFault(int epoch, int partition, int step, int stageAttempt) throws IOException {
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
            SparkInternals.dropCachedPartitions(run.shardsRdd);
        }
        throw new IllegalStateException(
                "injected " + kind[0] + " fault at epoch " + epoch + ", step " + step + ", partition " + partition);
    }
}
