package dev.gradbridge.spark;

import dev.gradbridge.DivergenceException;
import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.ProtocolException;
import dev.gradbridge.RunSettings;
import dev.gradbridge.ShardedRun;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Shuffle;
import dev.gradbridge.internal.AtomicFiles;
import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.RunStart;
import dev.gradbridge.internal.ShardedMessages;
import dev.gradbridge.internal.ValueRanges;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.api.java.JavaFutureAction;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Synchronous data-parallel training of any exported module (protocol 2) on Apache Spark.
 *
 * <p>The data is dealt round-robin over K cached partitions ({@link ShardedData}). The run is one
 * barrier stage of K tasks that run together ({@link TrainingTask}); each task loads its replica of
 * the module from the state the driver holds and keeps it, with its partition, for every epoch.
 * Each step takes the next {@code batch} rows of the epoch's order (the single-process Trainer's
 * order: {@link Shuffle#permutation} with shuffling, else 0..n-1); every task computes the gradients
 * of the mean loss over the rows of the batch it holds, the tasks exchange them among themselves
 * ({@link GradientExchange}) and each combines them in partition order ({@link GradientCombiner}: the
 * sample-weighted sum) and runs the exported optimizer once ({@code set_gradients},
 * {@code optimizer_step}). So every replica holds the same bits after every step, and no Spark job
 * runs per step or per epoch. At each epoch's end partition 0 hands its module to the driver without
 * ending the stage ({@link DriverState}, over Spark's RPC): the driver's state, the checkpoint and the
 * history record. A failed task fails the stage, and Spark retries the stage, which starts from the
 * last epoch end the driver holds, so a retry repeats that epoch exactly.
 *
 * <p>{@link #fit} leaves the module it is given as it was (it is the start state); the trained state
 * is in the checkpoint ({@link Builder#optCheckpoint}) and in {@link #getTrainedState()}. Histories
 * and checkpoints are the single-process {@code Trainer}'s formats; a checkpoint's {@code mode} is
 * {@code spark:K:shuffle} or {@code spark:K:ordered}, so a resume continues the same run or is refused.
 */
public final class SparkTrainer {

    private static final Logger logger = LoggerFactory.getLogger(SparkTrainer.class);

    private final RunSettings settings;
    private final Boolean shuffle;
    private final String fault;
    private final SparkStats stats = new SparkStats();
    private byte[] trainedState;

    private SparkTrainer(Builder b) {
        this.settings = b.settings();
        this.shuffle = b.shuffle;
        this.fault = b.fault;
    }

    /**
     * @return a builder with the defaults: {@value Protocol#DEFAULT_EPOCHS} epoch, batch
     *     {@value Protocol#DEFAULT_BATCH_SIZE}, seed {@value Protocol#DEFAULT_SEED}, shuffled
     */
    public static Builder builder() {
        return new Builder();
    }

    /**
     * Options of a run: the {@link RunSettings} every trainer has (the batch size counts rows over
     * all partitions), and these; a resumed run takes each unset one from the checkpoint.
     */
    public static final class Builder extends RunSettings.Builder<Builder> {
        private Boolean shuffle;
        private String fault;

        @Override
        protected Builder self() {
            return this;
        }

        /**
         * @param shuffle shuffle each epoch (default) or take rows in order
         * @return this
         */
        public Builder optShuffle(boolean shuffle) {
            this.shuffle = shuffle;
            return this;
        }

        /**
         * Test only: in the first attempt of the run's stage, after partition P computed its
         * gradients of step S: {@code task@E:S:P} fails the task; {@code executor@E:S:P} also drops
         * the cached partitions of that JVM, as a lost executor would; {@code kill@E:S:P} ends the
         * executor's JVM with SIGKILL (a cluster only).
         *
         * @param fault the fault, or null
         * @return this
         */
        Builder optFault(String fault) {
            if (fault != null && !fault.matches("(task|executor|kill)@\\d+:\\d+:\\d+")) {
                throw new InvalidInputException(
                        "--inject-fault must be task@E:S:P, executor@E:S:P or kill@E:S:P, got " + fault);
            }
            this.fault = fault;
            return this;
        }

        /** @return the trainer */
        public SparkTrainer build() {
            return new SparkTrainer(this);
        }
    }

    /** @return the module archive (a checkpoint .pt's bytes) after the last epoch of {@link #fit}, or null */
    public byte[] getTrainedState() {
        return trainedState == null ? null : trainedState.clone();
    }

    /** @return counters and timings of the last {@link #fit} */
    SparkStats getStats() {
        return stats;
    }

    /**
     * Refuses, with one line, a module that data-parallel training cannot run: protocol-1 modules
     * (no {@code gradient_flags}/{@code set_gradients}), modules whose training writes buffers but that
     * lack {@code set_state} (exported before it), gradient accumulation.
     *
     * @param module the module
     */
    public static void checkModule(TrainingModule module) {
        Metadata metadata = module.getMetadata();
        String path = module.getPath().toString();
        List<String> missing = new ArrayList<>();
        for (String method : Protocol.DATA_PARALLEL_METHODS) {
            if (!module.getMethodNames().contains(method)) {
                missing.add(method);
            }
        }
        if (!missing.isEmpty()) {
            throw new ProtocolException(ShardedMessages.dataParallelMethods(path, metadata.getProtocolVersion(),
                    missing));
        }
        List<String> trained = module.getMetadata().getTrainedBufferNames();
        if (!trained.isEmpty() && !module.getMethodNames().contains(Protocol.SET_STATE)) {
            throw new ProtocolException(ShardedMessages.dataParallelBuffers(path, trained));
        }
        Map<String, Object> tuning = metadata.getFineTuning();
        Object accumulate = tuning == null ? null : tuning.get("accumulate");
        if (accumulate instanceof Number && ((Number) accumulate).longValue() != 1) {
            throw new InvalidInputException(ShardedMessages.dataParallelAccumulate(path,
                    ((Number) accumulate).longValue()));
        }
    }

    static String modeName(int partitions, boolean shuffle) {
        return "spark:" + partitions + ":" + (shuffle ? "shuffle" : "ordered");
    }

    /**
     * Trains from {@code module}'s state on {@code data}; {@code module} itself is not changed.
     *
     * @param jsc the Spark context
     * @param module a protocol-2 module, or a checkpoint of a Spark run to resume
     * @param data the partitioned data
     * @return one record per epoch trained now
     * @throws IOException when the checkpoint or history cannot be written
     */
    public History fit(JavaSparkContext jsc, TrainingModule module, ShardedData data) throws IOException {
        SparkSettings.checkLine();
        checkModule(module);
        String exchange = SparkSettings.exchange(jsc.getConf());
        long oneRoundBytes = SparkSettings.oneRoundBytes(jsc.getConf());
        int threads = SparkSettings.threads(jsc.getConf());
        Metadata metadata = module.getMetadata();
        Path from = module.getPath();
        Metadata.Checkpoint resumed = metadata.getCheckpoint();
        RunStart start = new RunStart(settings, from, resumed);
        int k = data.getPartitions();
        long runSeed = start.seed();
        String savedMode = resumed == null ? null : resumed.getMode();
        boolean runShuffle = shuffle != null ? shuffle : savedMode == null || !savedMode.endsWith(":ordered");
        String mode = start.resolve("mode", modeName(k, runShuffle), savedMode, modeName(k, runShuffle));
        long n = data.getRows();
        int batch = start.batchSize(n, data.getSource());
        int first = start.firstEpoch();
        int epochs = settings.getEpochs();
        checkData(start, module, data, resumed);
        start.prepareOutputs();
        List<String> dtypes = new ArrayList<>();
        long[] sizes = parameterSizes(metadata.getParameters(), dtypes);
        byte[] archive = Files.readAllBytes(from);
        Endpoints endpoints = Endpoints.start(jsc, k, exchange, first, archive);
        TrainingTask.Run run = new TrainingTask.Run(runSeed, runShuffle, batch, n, mode, data.xShape(), data.yShape(),
                data.fingerprint(), dtypes, sizes, fault, data.shards().id(), exchange, oneRoundBytes, threads,
                endpoints.meeting, endpoints.carried, endpoints.held.name(), first + epochs, settings.isRecordValues());
        logger.info("training {} on Spark for {} epochs from epoch {}: {} rows in {} partitions, batch {}, seed {}, {}",
                from.getFileName(), epochs, first, n, k, batch, runSeed, runShuffle ? "shuffled" : "in order");
        stats.partitions = k;
        stats.oneRoundBytes = oneRoundBytes;
        stats.exchange = exchangeName(k, endpoints.relay != null, stats.parameterBytes, oneRoundBytes);
        return train(jsc, data, run, start, endpoints);
    }

    /**
     * The data against a resumed run's, and every id and label against the model's ranges: an id or label
     * the model cannot take would fail a task at its first step, and the stage at every retry, each with
     * its executor's errors; refused here, on the driver, in one line naming the column.
     */
    private static void checkData(RunStart start, TrainingModule module, ShardedData data, Metadata.Checkpoint resumed) {
        // older gradbridge-spark checkpoints wrote the partitions' digest as data_sha256
        String savedDigest = resumed == null ? null
                : resumed.getShardsSha256() != null ? resumed.getShardsSha256() : resumed.getDataSha256();
        start.checkSameData(data.getSource(), data.xShape(), data.yShape(), savedDigest, data.fingerprint());
        String outOfRange = ValueRanges.check(module, data.getSource(), data.ranges());
        if (outOfRange != null) {
            throw new InvalidInputException(outOfRange);
        }
    }

    /** @return each parameter's number of elements, its dtype added to {@code dtypes}, its bytes to the stats */
    private long[] parameterSizes(List<Metadata.TensorSpec> specs, List<String> dtypes) {
        long[] sizes = new long[specs.size()];
        for (int i = 0; i < specs.size(); i++) {
            dtypes.add(specs.get(i).getDtype());
            sizes[i] = Arrays.stream(specs.get(i).getShape()).reduce(1, (a, b) -> a * b);
            stats.parameterBytes += sizes[i] * ShardedData.bytesOf(dtypes.get(i));
        }
        return sizes;
    }

    /**
     * The run's endpoints on the driver, all on its RPC (no socket of their own), behind the secret every
     * request of the run's tasks carries ({@link DriverEndpoint}): where the tasks meet (the relay's
     * endpoint, or the store of Gloo's rendezvous, a few keys per stage attempt, the gradients going task
     * to task; neither for one partition) and the state the driver holds (the module archive at the
     * start of the next epoch to train).
     */
    private static final class Endpoints {
        final byte[] carried;
        final RelayEndpoint relay;
        final RunStore store;
        final String meeting;
        final DriverState held;

        private Endpoints(byte[] carried, RelayEndpoint relay, RunStore store, DriverState held) {
            this.carried = carried;
            this.relay = relay;
            this.store = store;
            this.meeting = relay != null ? relay.name() : store != null ? store.name() : null;
            this.held = held;
        }

        static Endpoints start(JavaSparkContext jsc, int k, String exchange, int first, byte[] archive) {
            byte[] carried = DriverEndpoint.runSecret(jsc.getConf());
            byte[] secret = DriverEndpoint.secretOf(carried);
            RelayEndpoint relay = k > 1 && GradientExchange.RELAY.equals(exchange) ? RelayEndpoint.start(secret) : null;
            RunStore store = k > 1 && relay == null ? RunStore.start(secret) : null;
            return new Endpoints(carried, relay, store, DriverState.start(k, first, archive, secret));
        }

        void close() {
            held.close();
            if (relay != null) {
                relay.close();
            }
            if (store != null) {
                store.close();
            }
        }
    }

    /** Counts the run's failed tasks and retried stages (its stats). */
    private static final class TaskFailures extends SparkListener {
        final AtomicInteger failed = new AtomicInteger();
        final AtomicInteger retried = new AtomicInteger();

        @Override
        public void onTaskEnd(SparkListenerTaskEnd end) {
            if (end.taskInfo().failed()) {
                failed.incrementAndGet();
            }
        }

        @Override
        public void onStageCompleted(SparkListenerStageCompleted completed) {
            if (completed.stageInfo().failureReason().isDefined()) {
                retried.incrementAndGet();
            }
        }
    }

    /** Runs the barrier stage to its end; whatever happens, the stage is cancelled and the endpoints closed. */
    private History train(JavaSparkContext jsc, ShardedData data, TrainingTask.Run run, RunStart start,
            Endpoints endpoints) throws IOException {
        TaskFailures failures = new TaskFailures();
        jsc.sc().addSparkListener(failures);
        History history = new History();
        long started = System.nanoTime();
        JavaFutureAction<List<TrainingTask.Result>> job = null;
        try {
            job = TrainingTask.startStage(data.shards(), new TrainingTask(run));
            ShardedRun sharded = new ShardedRun(data.getPartitions(), run.batch, run.seed, run.shuffle,
                    Protocol.SHARDED_RULE, run.shardsSha256);
            receiveEpochs(job, endpoints.held, start, history, started, sharded);
            List<TrainingTask.Result> results = results(job, data.getPartitions());
            stats.stageNanos += System.nanoTime() - started;
            checkDiverged(results.get(0), run.batch, run.rows, history);
        } finally {
            if (job != null && !job.isDone()) {
                job.cancel(true);
            }
            endpoints.close();
            jsc.sc().removeSparkListener(failures);
            stats.failedTasks += failures.failed.get();
            stats.stagesRetried += failures.retried.get();
        }
        return history;
    }

    /**
     * The epochs' ends arrive while the stage goes on: each one's record and checkpoint are written as it
     * comes, so a run that fails later keeps them.
     */
    private void receiveEpochs(JavaFutureAction<List<TrainingTask.Result>> job, DriverState held, RunStart start,
            History history, long started, ShardedRun sharded) throws IOException {
        while (true) {
            boolean done = job.isDone(); // once done, every end it handed over is queued
            DriverState.EpochEnd end = held.next(done ? 0 : 50);
            if (end == null && done) {
                break;
            }
            if (end != null) {
                trainedState = end.archive;
                History.EpochRecord record = new History.EpochRecord(end.epoch, RunStart.epochLoss(end.losses), null,
                        (System.nanoTime() - started) / 1e9, end.values, end.digests, end.lrs)
                        .withThreads(end.threads).withSharded(sharded);
                history.add(record);
                stats.executors.add(end.executors);
                byte[] saved = end.archive;
                start.endEpoch(history, record, target -> AtomicFiles.write(target, saved));
            }
        }
    }

    /** Partition 0's divergence, if any: one line naming the epoch, step and rows, with the epochs kept. */
    private void checkDiverged(TrainingTask.Result lead, int batch, long n, History history) {
        if (lead.divergedEpoch >= 0) {
            double[] losses = lead.divergedLosses;
            int step = losses.length - 1;
            long from0 = (long) step * batch;
            throw new DivergenceException(
                    Messages.divergence(losses[step], lead.divergedEpoch, step, from0, Math.min(n, from0 + batch) - 1)
                            + "; " + RunStart.kept(settings, history),
                    lead.divergedEpoch, step, history);
        }
    }

    /** @return the exchange of a run, in words (its stats) */
    private static String exchangeName(int partitions, boolean relay, long parameterBytes, long oneRoundBytes) {
        return partitions == 1 ? "none (one partition)"
                : relay ? "relay reduce-scatter + all-gather"
                : GlooExchange.oneRound(parameterBytes, partitions, oneRoundBytes) ? "gloo all-gather of whole records"
                : "gloo all-to-all + all-gather";
    }

    /** The run's results, one per partition in partition order, from the attempt that succeeded. */
    private List<TrainingTask.Result> results(JavaFutureAction<List<TrainingTask.Result>> job, int partitions) {
        List<TrainingTask.Result> results;
        try {
            results = new ArrayList<>(job.get());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException("interrupted while training", e);
        } catch (ExecutionException e) {
            Throwable cause = e.getCause();
            throw cause instanceof RuntimeException ? (RuntimeException) cause : new IllegalStateException(cause);
        }
        results.sort((a, b) -> Integer.compare(a.partition, b.partition));
        if (results.size() != partitions || results.get(0).partition != 0) {
            throw new IllegalStateException("expected " + partitions + " task results, got " + results.size());
        }
        int steps = results.get(0).stepNanos.length;
        long load = 0;
        long exchange = 0;
        long optimizer = 0;
        long sent = 0;
        long received = 0;
        for (TrainingTask.Result r : results) {
            load = Math.max(load, r.loadNanos);
            exchange = Math.max(exchange, r.exchangeNanos);
            optimizer = Math.max(optimizer, r.optimizerNanos);
            sent = Math.max(sent, r.bytesSent);
            received = Math.max(received, r.bytesReceived);
        }
        for (int s = 0; s < steps; s++) {
            long compute = 0;
            long fastest = Long.MAX_VALUE;
            long step = 0;
            for (TrainingTask.Result r : results) {
                compute = Math.max(compute, r.computeNanos[s]);
                fastest = Math.min(fastest, r.computeNanos[s]);
                step = Math.max(step, r.stepNanos[s]);
            }
            stats.computeNanos += compute;
            stats.computeSpreadNanos += compute - fastest;
            stats.stepNanos += step;
        }
        stats.steps += steps;
        stats.loadNanos += load;
        stats.epochEndNanos += results.get(0).endNanos;
        stats.exchangeNanos += exchange;
        for (TrainingTask.Result r : results) {
            while (stats.exchangePhaseNanos.size() <= r.partition) {
                stats.exchangePhaseNanos.add(new long[GradientExchange.PHASES.length]);
            }
            for (int f = 0; f < r.exchangePhaseNanos.length; f++) {
                stats.exchangePhaseNanos.get(r.partition)[f] += r.exchangePhaseNanos[f];
            }
        }
        stats.optimizerNanos += optimizer;
        stats.bytesSent += sent;
        stats.bytesReceived += received;
        stats.moduleLoads += results.size();
        stats.threads = results.stream().mapToInt(r -> r.threads).toArray();
        return results;
    }
}
