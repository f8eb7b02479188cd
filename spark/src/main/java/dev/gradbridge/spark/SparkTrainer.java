package dev.gradbridge.spark;

import dev.gradbridge.AtomicFiles;
import dev.gradbridge.DivergenceException;
import dev.gradbridge.GlooGroup;
import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Messages;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.ProtocolException;
import dev.gradbridge.RunSettings;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Shuffle;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Synchronous data-parallel training of any exported module (protocol 2) on Apache Spark.
 *
 * <p>The data is dealt round-robin over K cached partitions ({@link ShardedData}). Each epoch is one
 * barrier stage of K tasks that run together ({@link TrainingTask}); each task loads its replica of
 * the module from the state the driver holds and keeps it, with its partition, for the whole epoch.
 * Each step takes the next {@code batch} rows of the epoch's order (the single-process Trainer's
 * order: {@link Shuffle#permutation} with shuffling, else 0..n-1); every task computes the gradients
 * of the mean loss over the rows of the batch it holds, the tasks exchange them among themselves
 * ({@link GradientExchange}) and each combines them in partition order ({@link GradientCombiner}: the
 * sample-weighted sum) and runs the exported optimizer once ({@code set_gradients},
 * {@code optimizer_step}). So every replica holds the same bits after every step, and no Spark job
 * runs per step. Partition 0 sends its module back at the end of the epoch: the driver's state for
 * the next epoch, the checkpoint and the history record. A failed task fails the stage, and Spark
 * retries the stage from the same state, so a retry repeats the epoch exactly.
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
    private final Stats stats = new Stats();
    private byte[] trainedState;

    private SparkTrainer(Builder b) {
        this.settings = b.settings();
        this.shuffle = b.shuffle;
        this.fault = b.fault;
    }

    /** @return a builder with the defaults: 1 epoch, batch 32, seed 0, shuffled */
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

        /** @param shuffle shuffle each epoch (default) or take rows in order @return this */
        public Builder optShuffle(boolean shuffle) {
            this.shuffle = shuffle;
            return this;
        }

        /**
         * Test only: in the first attempt of the stage of epoch E, after partition P computed its
         * gradients of step S: {@code task@E:S:P} fails the task; {@code executor@E:S:P} also drops
         * the cached partitions of that JVM, as a lost executor would; {@code kill@E:S:P} ends the
         * executor's JVM with SIGKILL (a cluster only).
         *
         * @param fault the fault, or null
         * @return this
         */
        public Builder optFault(String fault) {
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

    /** Counters and timings summed over every run of this trainer (for the benchmark and the tests). */
    public static final class Stats {
        /** Steps taken. */
        public long steps;
        /** Per step the slowest task's whole step (compute, exchange, optimizer), summed, ns. */
        public long stepNanos;
        /** Per step the slowest task's compute (its rows' forward and backward), summed, ns. */
        public long computeNanos;
        /** The slowest task's time in the gradient exchange, all steps, ns. */
        public long exchangeNanos;
        /** The slowest task's time combining nothing but setting gradients and stepping the optimizer, ns. */
        public long optimizerNanos;
        /** The driver's time in the epochs' barrier stages (launch, module loads, steps, results), ns. */
        public long stageNanos;
        /** The slowest module load at a stage's start, summed over epochs, ns. */
        public long loadNanos;
        /** Bytes the busiest task sent in the exchange, all steps. */
        public long bytesSent;
        /** Bytes the busiest task received in the exchange, all steps. */
        public long bytesReceived;
        /** Parameter bytes of the model (one copy). */
        public long parameterBytes;
        /** Replicas loaded by the stages that succeeded (K per epoch). */
        public long moduleLoads;
        /** Task attempts that failed. */
        public int failedTasks;
        /** Barrier stage attempts that failed and were retried as a whole. */
        public int stagesRetried;
        /** Partitions. */
        public int partitions;
        /** Per epoch trained, the executors its tasks ran on, in partition order. */
        public final List<List<String>> executors = new ArrayList<>();
        /** The exchange in use. */
        public String exchange;

        /** @return the counters as a JSON object */
        public String toJson() {
            return String.format(
                    Locale.ROOT,
                    "{\"steps\": %d, \"step_s\": %.6f, \"compute_s\": %.6f, \"exchange_s\": %.6f,"
                            + " \"optimizer_s\": %.6f, \"stage_s\": %.6f, \"load_s\": %.6f, \"bytes_sent\": %d,"
                            + " \"bytes_received\": %d, \"parameter_bytes\": %d, \"module_loads\": %d,"
                            + " \"failed_tasks\": %d, \"stages_retried\": %d, \"partitions\": %d, \"exchange\": \"%s\","
                            + " \"executors\": %s}",
                    steps, stepNanos / 1e9, computeNanos / 1e9, exchangeNanos / 1e9, optimizerNanos / 1e9,
                    stageNanos / 1e9, loadNanos / 1e9, bytesSent, bytesReceived, parameterBytes, moduleLoads,
                    failedTasks, stagesRetried, partitions, exchange, executorsJson());
        }

        private String executorsJson() {
            List<String> epochs = new ArrayList<>();
            for (List<String> ids : executors) {
                epochs.add(ids.isEmpty() ? "[]" : "[\"" + String.join("\", \"", ids) + "\"]");
            }
            return "[" + String.join(", ", epochs) + "]";
        }
    }

    /** @return the module archive (a checkpoint .pt's bytes) after the last epoch of {@link #fit}, or null */
    public byte[] getTrainedState() {
        return trainedState == null ? null : trainedState.clone();
    }

    /** @return counters and timings of the last {@link #fit} */
    public Stats getStats() {
        return stats;
    }

    /**
     * Refuses, with one line, a module that data-parallel training cannot run: protocol-1 modules
     * (no {@code gradient_flags}/{@code set_gradients}), modules with buffers, gradient accumulation.
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
            throw new ProtocolException(Messages.dataParallelMethods(path, metadata.getProtocolVersion(), missing));
        }
        if (!module.getBufferNames().isEmpty()) {
            throw new InvalidInputException(Messages.dataParallelBuffers(path, module.getBufferNames()));
        }
        Map<String, Object> tuning = metadata.getFineTuning();
        Object accumulate = tuning == null ? null : tuning.get("accumulate");
        if (accumulate instanceof Number && ((Number) accumulate).longValue() != 1) {
            throw new InvalidInputException(Messages.dataParallelAccumulate(path, ((Number) accumulate).longValue()));
        }
    }

    /** @return the exchange the Spark setting {@value GradientExchange#SETTING} names (default gloo) */
    private static String exchangeOf(JavaSparkContext jsc) {
        String exchange = jsc.getConf().get(GradientExchange.SETTING, GradientExchange.GLOO);
        if (!GradientExchange.GLOO.equals(exchange) && !GradientExchange.RELAY.equals(exchange)) {
            throw new InvalidInputException(GradientExchange.SETTING + " must be " + GradientExchange.GLOO + " or "
                    + GradientExchange.RELAY + ", got " + exchange);
        }
        return exchange;
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
        checkModule(module);
        String exchange = exchangeOf(jsc);
        Metadata metadata = module.getMetadata();
        Path from = module.getPath();
        Metadata.Checkpoint resumed = metadata.getCheckpoint();
        RunSettings.Run start = settings.start(from, resumed);
        int k = data.getPartitions();
        long runSeed = start.seed();
        String savedMode = resumed == null ? null : resumed.getMode();
        boolean runShuffle = shuffle != null ? shuffle : savedMode == null || !savedMode.endsWith(":ordered");
        String mode = start.resolve("mode", modeName(k, runShuffle), savedMode, modeName(k, runShuffle));
        long n = data.getRows();
        int batch = start.batchSize(n, data.getSource());
        int first = start.firstEpoch();
        int epochs = settings.getEpochs();
        // older gradbridge-spark checkpoints wrote the partitions' digest as data_sha256
        String savedDigest = resumed == null ? null
                : resumed.getShardsSha256() != null ? resumed.getShardsSha256() : resumed.getDataSha256();
        start.checkSameData(data.getSource(), data.xShape(), data.yShape(), savedDigest, data.fingerprint());
        start.prepareOutputs();
        List<Metadata.TensorSpec> specs = metadata.getParameters();
        List<String> dtypes = new ArrayList<>();
        long[] sizes = new long[specs.size()];
        for (int i = 0; i < specs.size(); i++) {
            dtypes.add(specs.get(i).getDtype());
            sizes[i] = Arrays.stream(specs.get(i).getShape()).reduce(1, (a, b) -> a * b);
            stats.parameterBytes += sizes[i] * ShardedData.bytesOf(dtypes.get(i));
        }
        // Where the tasks meet: the relay's endpoint, or a TCPStore for Gloo's rendezvous (a few keys per
        // stage attempt; the gradients go task to task).
        ExchangeRelay relay = k > 1 && GradientExchange.RELAY.equals(exchange) ? ExchangeRelay.start() : null;
        GlooGroup.Store store = k > 1 && relay == null ? GlooGroup.Store.serve(GlooExchange.TIMEOUT) : null;
        String meeting = relay != null ? relay.name()
                : store != null ? jsc.getConf().get("spark.driver.host") + ":" + store.port() : null;
        TrainingTask.Run run = new TrainingTask.Run(runSeed, runShuffle, batch, n, mode, data.xShape(), data.yShape(),
                data.fingerprint(), dtypes, sizes, fault, data.shards().id(), exchange, meeting);
        // The state the driver holds: the module archive at the start of the next epoch.
        byte[] state = Files.readAllBytes(from);
        AtomicInteger failed = new AtomicInteger();
        AtomicInteger retried = new AtomicInteger();
        SparkListener listener =
                new SparkListener() {
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
                };
        jsc.sc().addSparkListener(listener);
        logger.info("training {} on Spark for {} epochs from epoch {}: {} rows in {} partitions, batch {}, seed {}, {}",
                from.getFileName(), epochs, first, n, k, batch, runSeed, runShuffle ? "shuffled" : "in order");
        stats.partitions = k;
        stats.exchange = k == 1 ? "none (one partition)"
                : relay != null ? "relay reduce-scatter + all-gather" : "gloo all-to-all + all-gather";
        History history = new History();
        long started = System.nanoTime();
        try {
            for (int epoch = first; epoch < first + epochs; epoch++) {
                List<TrainingTask.Result> results = epoch(jsc, data, state, run, epoch);
                TrainingTask.Result lead = results.get(0);
                double[] losses = lead.losses;
                double last = losses.length == 0 ? 0 : losses[losses.length - 1];
                if (lead.state == null) {
                    int step = losses.length - 1;
                    long from0 = (long) step * batch;
                    throw new DivergenceException(
                            Messages.divergence(last, epoch, step, from0, Math.min(n, from0 + batch) - 1) + "; "
                                    + history.getRecords().size() + " completed epoch(s) kept",
                            epoch, step, history);
                }
                state = lead.state;
                trainedState = state;
                double loss = History.epochLoss(losses);
                History.EpochRecord record;
                try (Replica replica = Replica.load(state)) {
                    record = History.record(replica.module(), epoch, loss, null, (System.nanoTime() - started) / 1e9,
                            settings.isRecordValues());
                }
                history.add(record);
                byte[] saved = state;
                start.endEpoch(history, record, target -> AtomicFiles.write(target, saved));
            }
        } finally {
            if (relay != null) {
                relay.close();
            }
            if (store != null) {
                store.close();
            }
            jsc.sc().removeSparkListener(listener);
            stats.failedTasks += failed.get();
            stats.stagesRetried += retried.get();
        }
        return history;
    }

    /** One epoch as one barrier stage: one task per partition, all running together. */
    private List<TrainingTask.Result> epoch(JavaSparkContext jsc, ShardedData data, byte[] state,
            TrainingTask.Run run, int epoch) {
        long t0 = System.nanoTime();
        Broadcast<byte[]> shipped = jsc.broadcast(state);
        List<TrainingTask.Result> results;
        boolean done = false;
        try {
            results = new ArrayList<>(TrainingTask.runStage(data.shards(), new TrainingTask(shipped, run, epoch)));
            done = true;
        } finally {
            // Blocking once the stage succeeded, so that no removal request to an executor is still in
            // flight when the application stops (Spark logs that as an ERROR); not after a failure.
            shipped.destroy(done);
        }
        results.sort((a, b) -> Integer.compare(a.partition, b.partition));
        if (results.size() != data.getPartitions() || results.get(0).partition != 0) {
            throw new IllegalStateException("expected " + data.getPartitions() + " task results, got " + results.size());
        }
        stats.stageNanos += System.nanoTime() - t0;
        int steps = results.get(0).losses.length;
        long load = 0;
        long exchange = 0;
        long optimizer = 0;
        long sent = 0;
        long received = 0;
        List<String> executors = new ArrayList<>();
        for (TrainingTask.Result r : results) {
            executors.add(r.executor);
            load = Math.max(load, r.loadNanos);
            exchange = Math.max(exchange, r.exchangeNanos);
            optimizer = Math.max(optimizer, r.optimizerNanos);
            sent = Math.max(sent, r.bytesSent);
            received = Math.max(received, r.bytesReceived);
        }
        for (int s = 0; s < steps; s++) {
            long compute = 0;
            long step = 0;
            for (TrainingTask.Result r : results) {
                compute = Math.max(compute, r.computeNanos[s]);
                step = Math.max(step, r.stepNanos[s]);
            }
            stats.computeNanos += compute;
            stats.stepNanos += step;
        }
        stats.steps += steps;
        stats.loadNanos += load;
        stats.exchangeNanos += exchange;
        stats.optimizerNanos += optimizer;
        stats.bytesSent += sent;
        stats.bytesReceived += received;
        stats.moduleLoads += results.size();
        stats.executors.add(executors);
        return results;
    }
}
