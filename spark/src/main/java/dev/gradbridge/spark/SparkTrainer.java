package dev.gradbridge.spark;

import dev.gradbridge.AtomicFiles;
import dev.gradbridge.DivergenceException;
import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Messages;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.ProtocolException;
import dev.gradbridge.DType;
import dev.gradbridge.Digests;
import dev.gradbridge.Tensor;
import dev.gradbridge.TensorScope;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Shuffle;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Synchronous data-parallel training of any exported module (protocol 2) on Apache Spark.
 *
 * <p>The data is dealt round-robin over K cached partitions ({@link ShardedData}). Each step takes
 * the next {@code batch} rows of the epoch's order (the single-process Trainer's order: {@link
 * Shuffle#permutation} with shuffling, else 0..n-1); every partition computes, on a module of its
 * executor (loaded once from broadcast bytes, {@link ExecutorModules}) set to the current
 * parameters, the gradients of the mean loss over the rows of the batch it holds; the driver
 * combines them in partition order ({@link GradientCombiner}: the sample-weighted sum), writes them
 * into its own module ({@code set_gradients}) and runs the exported optimizer once
 * ({@code optimizer_step}). The next step ships the new parameters with its tasks, so every
 * partition continues from the same parameters. A failed task is retried by Spark; since a task
 * only reads the parameters it was given and its result is used once, a retry changes nothing.
 *
 * <p>Histories and checkpoints are the single-process {@code Trainer}'s formats; a checkpoint's
 * {@code mode} is {@code spark:K:shuffle} or {@code spark:K:ordered}, so a resume continues the
 * same run or is refused.
 */
public final class SparkTrainer {

    private static final Logger logger = LoggerFactory.getLogger(SparkTrainer.class);

    private final int epochs;
    private final Integer batchSize;
    private final Long seed;
    private final Boolean shuffle;
    private final Path checkpoint;
    private final Path historyFile;
    private final boolean recordValues;
    private final boolean allowDifferentData;
    private final String fault;
    private final Stats stats = new Stats();

    private SparkTrainer(Builder b) {
        this.epochs = b.epochs;
        this.batchSize = b.batchSize;
        this.seed = b.seed;
        this.shuffle = b.shuffle;
        this.checkpoint = b.checkpoint;
        this.historyFile = b.historyFile;
        this.recordValues = b.recordValues;
        this.allowDifferentData = b.allowDifferentData;
        this.fault = b.fault;
    }

    /** @return a builder with the defaults: 1 epoch, batch 32, seed 0, shuffled */
    public static Builder builder() {
        return new Builder();
    }

    /** Options of a run; a resumed run takes each unset one from the checkpoint. */
    public static final class Builder {
        private int epochs = 1;
        private Integer batchSize;
        private Long seed;
        private Boolean shuffle;
        private Path checkpoint;
        private Path historyFile;
        private boolean recordValues = true;
        private boolean allowDifferentData;
        private String fault;

        /** @param epochs epochs to train now, at least 1 @return this */
        public Builder optEpochs(int epochs) {
            if (epochs < 1) {
                throw new InvalidInputException("epochs must be at least 1, got " + epochs);
            }
            this.epochs = epochs;
            return this;
        }

        /** @param batchSize global mini-batch size (rows over all partitions) @return this */
        public Builder optBatchSize(int batchSize) {
            this.batchSize = batchSize;
            return this;
        }

        /** @param seed the run's seed (batch order per epoch) @return this */
        public Builder optSeed(long seed) {
            this.seed = seed;
            return this;
        }

        /** @param shuffle shuffle each epoch (default) or take rows in order @return this */
        public Builder optShuffle(boolean shuffle) {
            this.shuffle = shuffle;
            return this;
        }

        /** @param checkpoint save the driver's module here after every epoch @return this */
        public Builder optCheckpoint(Path checkpoint) {
            this.checkpoint = checkpoint;
            return this;
        }

        /** @param historyFile write the history (JSON Lines) here after every epoch @return this */
        public Builder optHistory(Path historyFile) {
            this.historyFile = historyFile;
            return this;
        }

        /** @param recordValues keep parameter values, not only digests, in the history @return this */
        public Builder optRecordValues(boolean recordValues) {
            this.recordValues = recordValues;
            return this;
        }

        /** @param allow resume on data other than the checkpoint's @return this */
        public Builder optAllowDifferentData(boolean allow) {
            this.allowDifferentData = allow;
            return this;
        }

        /**
         * Test only: fail the first attempt of one task, {@code task@E:S:P} (epoch E, step S of the
         * epoch, partition P, after its gradients are computed) or {@code executor@E:S:P} (the same,
         * and the JVM forgets all its modules, as a lost executor would).
         *
         * @param fault the fault, or null
         * @return this
         */
        public Builder optFault(String fault) {
            if (fault != null && !fault.matches("(task|executor)@\\d+:\\d+:\\d+")) {
                throw new InvalidInputException("--inject-fault must be task@E:S:P or executor@E:S:P, got " + fault);
            }
            this.fault = fault;
            return this;
        }

        /** @return the trainer */
        public SparkTrainer build() {
            return new SparkTrainer(this);
        }
    }

    /** Counters and timings of the last run (for the benchmark and the tests). */
    public static final class Stats {
        /** Steps taken. */
        public long steps;
        /** Wall time of all steps, ns. */
        public long stepNanos;
        /** Time inside the Spark jobs (ship parameters, compute, collect gradients), ns. */
        public long jobNanos;
        /** Slowest partition's compute time per step, summed, ns. */
        public long computeNanos;
        /** Driver time combining gradients and stepping the optimizer, ns. */
        public long combineNanos;
        /** Parameter bytes shipped to partitions, all steps. */
        public long bytesDown;
        /** Gradient bytes collected from partitions, all steps. */
        public long bytesUp;
        /** Parameter bytes of the model (one copy). */
        public long parameterBytes;
        /** Tasks that loaded their module from the broadcast bytes. */
        public long moduleLoads;
        /** The steps ({@code "epoch:step"}) in which a task loaded its module, in order. */
        public final List<String> loadSteps = new ArrayList<>();
        /** Task attempts that failed (and were retried by Spark). */
        public int failedTasks;
        /** Modules closed because their task failed or their executor was lost (this JVM). */
        public int modulesDiscarded;
        /** Partitions. */
        public int partitions;

        /** @return the counters as a JSON object */
        public String toJson() {
            return String.format(
                    Locale.ROOT,
                    "{\"steps\": %d, \"step_s\": %.6f, \"job_s\": %.6f, \"compute_s\": %.6f, \"combine_s\": %.6f,"
                            + " \"bytes_down\": %d, \"bytes_up\": %d, \"parameter_bytes\": %d, \"module_loads\": %d,"
                            + " \"failed_tasks\": %d, \"modules_discarded\": %d, \"partitions\": %d,"
                            + " \"load_steps\": [%s]}",
                    steps, stepNanos / 1e9, jobNanos / 1e9, computeNanos / 1e9, combineNanos / 1e9, bytesDown,
                    bytesUp, parameterBytes, moduleLoads, failedTasks, modulesDiscarded, partitions,
                    loadSteps.isEmpty() ? "" : "\"" + String.join("\", \"", loadSteps) + "\"");
        }
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

    static String modeName(int partitions, boolean shuffle) {
        return "spark:" + partitions + ":" + (shuffle ? "shuffle" : "ordered");
    }

    /**
     * Trains {@code module} (the driver's copy: it holds the optimizer state) on {@code data}.
     *
     * @param jsc the Spark context
     * @param module a protocol-2 module, or a checkpoint of a Spark run to resume
     * @param data the partitioned data
     * @return one record per epoch trained now
     * @throws IOException when the checkpoint or history cannot be written
     */
    public History fit(JavaSparkContext jsc, TrainingModule module, ShardedData data) throws IOException {
        checkModule(module);
        Metadata metadata = module.getMetadata();
        Path from = module.getPath();
        Metadata.Checkpoint resumed = metadata.getCheckpoint();
        int k = data.getPartitions();
        long runSeed = resolve(from, resumed, "seed", seed, resumed == null ? null : resumed.getSeed(), 0L);
        String savedMode = resumed == null ? null : resumed.getMode();
        boolean runShuffle = shuffle != null ? shuffle : savedMode == null || !savedMode.endsWith(":ordered");
        String mode = resolve(from, resumed, "mode", modeName(k, runShuffle), savedMode, modeName(k, runShuffle));
        long n = data.getRows();
        int batch = resolve(from, resumed, "batch size", batchSize, resumed == null ? null : resumed.getBatchSize(), 32);
        if (batch < 1 || batch > n) {
            throw new InvalidInputException(
                    "batch size must be in 1.." + n + " (the number of samples in " + data.getSource() + "), got " + batch);
        }
        int first = resumed == null ? 0 : resumed.getEpochsCompleted();
        if (first < 0 || (long) first + epochs > Integer.MAX_VALUE) {
            throw new InvalidInputException(Messages.epochCount(from.toString(), first, epochs, Integer.MAX_VALUE));
        }
        if (resumed != null && !allowDifferentData) {
            checkSameData(from, resumed, data);
        }
        for (Path output : new Path[] {checkpoint, historyFile}) {
            if (output != null) {
                AtomicFiles.prepare(output);
            }
        }
        List<Metadata.TensorSpec> specs = metadata.getParameters();
        List<String> dtypes = new ArrayList<>();
        long[] sizes = new long[specs.size()];
        for (int i = 0; i < specs.size(); i++) {
            dtypes.add(specs.get(i).getDtype());
            sizes[i] = Arrays.stream(specs.get(i).getShape()).reduce(1, (a, b) -> a * b);
        }
        byte[] moduleBytes = Files.readAllBytes(from);
        String key = sha256(moduleBytes);
        Broadcast<byte[]> broadcast = jsc.broadcast(moduleBytes);
        AtomicInteger failed = new AtomicInteger();
        SparkListener listener =
                new SparkListener() {
                    @Override
                    public void onTaskEnd(SparkListenerTaskEnd end) {
                        if (!end.taskInfo().successful()) {
                            failed.incrementAndGet();
                        }
                    }
                };
        jsc.sc().addSparkListener(listener);
        int discardedBefore = ExecutorModules.discarded();
        logger.info("training {} on Spark for {} epochs from epoch {}: {} rows in {} partitions, batch {}, seed {}, {}",
                from.getFileName(), epochs, first, n, k, batch, runSeed, runShuffle ? "shuffled" : "in order");
        stats.partitions = k;
        History history = new History();
        long started = System.nanoTime();
        try {
            for (int epoch = first; epoch < first + epochs; epoch++) {
                long[] order = runShuffle ? Shuffle.permutation(runSeed, epoch, Math.toIntExact(n)) : identity(n);
                List<Double> losses = new ArrayList<>();
                for (int step = 0, start = 0; start < n; step++, start += batch) {
                    int end = (int) Math.min(n, (long) start + batch);
                    long[] rows = Arrays.copyOfRange(order, start, end);
                    double loss = step(jsc, module, data, broadcast, key, dtypes, sizes, rows, epoch, step);
                    if (Double.isNaN(loss) || Double.isInfinite(loss)) {
                        throw new DivergenceException(
                                Messages.divergence(loss, epoch, step, start, end - 1) + "; "
                                        + history.getRecords().size() + " completed epoch(s) kept",
                                epoch, step, history);
                    }
                    losses.add(loss);
                }
                double[] values = new double[losses.size()];
                for (int i = 0; i < values.length; i++) {
                    values[i] = losses.get(i);
                }
                double loss = History.epochLoss(values);
                module.scheduleEpoch(loss);
                history.add(History.record(module, epoch, loss, null, (System.nanoTime() - started) / 1e9, recordValues));
                if (checkpoint != null) {
                    module.saveCheckpoint(checkpoint, new Metadata.Checkpoint(epoch + 1, runSeed, batch, mode,
                            data.xShape(), data.yShape(), data.fingerprint()));
                }
                if (historyFile != null) {
                    history.save(historyFile);
                }
            }
        } finally {
            jsc.sc().removeSparkListener(listener);
            stats.failedTasks += failed.get();
            stats.modulesDiscarded += ExecutorModules.discarded() - discardedBefore;
        }
        return history;
    }

    private static long[] identity(long n) {
        long[] order = new long[Math.toIntExact(n)];
        for (int i = 0; i < order.length; i++) {
            order[i] = i;
        }
        return order;
    }

    private double step(JavaSparkContext jsc, TrainingModule module, ShardedData data, Broadcast<byte[]> broadcast,
            String key, List<String> dtypes, long[] sizes, long[] rows, int epoch, int step) {
        long t0 = System.nanoTime();
        List<byte[]> parameters = new ArrayList<>();
        long parameterBytes = 0;
        for (Object value : (List<?>) module.call(Protocol.GET_PARAMETERS)) {
            try (Tensor array = (Tensor) value) {
                byte[] bytes = array.toBytes();
                parameters.add(bytes);
                parameterBytes += bytes.length;
            }
        }
        long t1 = System.nanoTime();
        // The parameters as a broadcast of their own: serialized once, fetched once per executor, and
        // freed after the step (in the closure, Spark would serialize them for its closure check too).
        Broadcast<List<byte[]>> shipped = jsc.broadcast(parameters);
        List<ShardResult> results;
        try {
            results = new ArrayList<>(data.shards()
                    .mapPartitionsWithIndex(new StepTask(broadcast, key, shipped, rows, epoch, step, fault), true)
                    .collect());
        } finally {
            shipped.destroy();
        }
        long t2 = System.nanoTime();
        results.sort((a, b) -> Integer.compare(a.partition, b.partition));
        if (results.size() != data.getPartitions()) {
            throw new IllegalStateException("expected " + data.getPartitions() + " shard results, got " + results.size());
        }
        GradientCombiner.Combined combined = GradientCombiner.combine(results, dtypes, sizes);
        Metadata metadata = module.getMetadata();
        try (TensorScope scope = new TensorScope()) {
            List<Tensor> gradients = new ArrayList<>();
            for (int i = 0; i < combined.gradients.length; i++) {
                Metadata.TensorSpec spec = metadata.getParameters().get(i);
                gradients.add(create(scope, combined.gradients[i], spec.getShape(), spec.getDtype()));
            }
            Tensor flags = scope.add(Tensor.of(combined.flags, combined.flags.length));
            module.call(Protocol.SET_GRADIENTS, gradients, flags);
            module.call(Protocol.OPTIMIZER_STEP);
        }
        long t3 = System.nanoTime();
        long slowest = 0;
        boolean loaded = false;
        for (ShardResult r : results) {
            slowest = Math.max(slowest, r.computeNanos);
            stats.bytesUp += r.bytes();
            stats.moduleLoads += r.loadedModule ? 1 : 0;
            loaded |= r.loadedModule;
        }
        if (loaded) {
            stats.loadSteps.add(epoch + ":" + step);
        }
        stats.steps++;
        stats.parameterBytes = parameterBytes;
        stats.bytesDown += parameterBytes * data.getPartitions();
        stats.jobNanos += t2 - t1;
        stats.computeNanos += slowest;
        stats.combineNanos += (t1 - t0) + (t3 - t2);
        stats.stepNanos += t3 - t0;
        return combined.loss;
    }

    static Tensor create(TensorScope scope, byte[] bytes, long[] shape, String dtype) {
        ByteBuffer buffer = ByteBuffer.allocateDirect(bytes.length).order(ByteOrder.nativeOrder());
        buffer.put(bytes);
        buffer.rewind();
        return scope.add(Tensor.fromBuffer(buffer, DType.of(dtype), shape));
    }

    /** One partition's part of one step; runs on an executor. */
    static final class StepTask implements Function2<Integer, Iterator<Shard>, Iterator<ShardResult>> {
        private static final long serialVersionUID = 1L;
        private final Broadcast<byte[]> moduleBytes;
        private final String key;
        private final Broadcast<List<byte[]>> shippedParameters;
        private final long[] rows;
        private final int epoch;
        private final int step;
        private final String fault;

        StepTask(Broadcast<byte[]> moduleBytes, String key, Broadcast<List<byte[]>> parameters, long[] rows, int epoch,
                int step, String fault) {
            this.moduleBytes = moduleBytes;
            this.key = key;
            this.shippedParameters = parameters;
            this.rows = rows;
            this.epoch = epoch;
            this.step = step;
            this.fault = fault;
        }

        @Override
        public Iterator<ShardResult> call(Integer partition, Iterator<Shard> shards) {
            Shard shard = shards.next(); // one per partition; read to the end so Spark releases the block
            while (shards.hasNext()) {
                shards.next();
            }
            int k = shard.partitions;
            int count = 0;
            for (long row : rows) {
                if (Shard.partitionOf(row, k) == shard.partition) {
                    count++;
                }
            }
            if (count == 0) {
                return Collections.singletonList(ShardResult.empty(shard.partition)).iterator();
            }
            byte[] x = new byte[count * shard.xRowBytes];
            byte[] y = new byte[count * shard.yRowBytes];
            int i = 0;
            for (long row : rows) {
                if (Shard.partitionOf(row, k) == shard.partition) {
                    int j = (int) (row / k);
                    System.arraycopy(shard.x, j * shard.xRowBytes, x, i * shard.xRowBytes, shard.xRowBytes);
                    System.arraycopy(shard.y, j * shard.yRowBytes, y, i * shard.yRowBytes, shard.yRowBytes);
                    i++;
                }
            }
            List<byte[]> parameters = shippedParameters.value();
            try (ExecutorModules.Lease lease = ExecutorModules.borrow(key, moduleBytes)) {
                long t0 = System.nanoTime();
                TrainingModule module = lease.module;
                Metadata metadata = module.getMetadata();
                byte[][] gradients = new byte[parameters.size()][];
                boolean[] flags;
                double loss;
                try (TensorScope scope = new TensorScope()) {
                    List<Tensor> values = new ArrayList<>();
                    for (int p = 0; p < parameters.size(); p++) {
                        Metadata.TensorSpec spec = metadata.getParameters().get(p);
                        values.add(create(scope, parameters.get(p), spec.getShape(), spec.getDtype()));
                    }
                    module.call(Protocol.SET_PARAMETERS, values);
                    module.zeroGrad();
                    Metadata.TensorSpec xs = metadata.getInput("x");
                    Metadata.TensorSpec ys = metadata.getInput("y");
                    loss = module.calculateLossAndBackward(
                            create(scope, x, rowsShape(xs.getShape(), count), xs.getDtype()),
                            create(scope, y, rowsShape(ys.getShape(), count), ys.getDtype()));
                    List<?> grads = (List<?>) module.call(Protocol.GET_GRADIENTS);
                    for (int p = 0; p < grads.size(); p++) {
                        try (Tensor g = (Tensor) grads.get(p)) {
                            gradients[p] = g.toBytes();
                        }
                    }
                    try (Tensor f = (Tensor) module.call(Protocol.GRADIENT_FLAGS)) {
                        flags = f.toBooleanArray();
                    }
                }
                long computed = System.nanoTime() - t0;
                injectFault(shard.partition);
                lease.succeeded();
                return Collections.singletonList(
                        new ShardResult(shard.partition, count, loss, gradients, flags, lease.loaded, computed))
                        .iterator();
            }
        }

        private void injectFault(int partition) {
            if (fault == null) {
                return;
            }
            String[] kind = fault.split("@");
            String[] at = kind[1].split(":");
            TaskContext context = TaskContext.get();
            if (Integer.parseInt(at[0]) == epoch && Integer.parseInt(at[1]) == step
                    && Integer.parseInt(at[2]) == partition && context != null && context.attemptNumber() == 0) {
                if ("executor".equals(kind[0])) {
                    ExecutorModules.dropAll();
                }
                throw new IllegalStateException(
                        "injected " + kind[0] + " fault at epoch " + epoch + ", step " + step + ", partition " + partition);
            }
        }

        private static long[] rowsShape(long[] spec, int count) {
            long[] shape = spec.clone();
            shape[0] = count;
            return shape;
        }
    }

    private static <T> T resolve(Path from, Metadata.Checkpoint resumed, String what, T given, T saved, T fallback) {
        if (given != null && saved != null && !given.equals(saved)) {
            throw new InvalidInputException(Messages.resumeConflict(from.toString(), what, saved, given));
        }
        return given != null ? given : saved != null ? saved : fallback;
    }

    private static void checkSameData(Path from, Metadata.Checkpoint resumed, ShardedData data) {
        boolean sameShapes = (resumed.getXShape() == null || Arrays.equals(resumed.getXShape(), data.xShape()))
                && (resumed.getYShape() == null || Arrays.equals(resumed.getYShape(), data.yShape()));
        boolean sameBytes = resumed.getDataSha256() == null || resumed.getDataSha256().equals(data.fingerprint());
        if (!sameShapes || !sameBytes) {
            throw new InvalidInputException(Messages.differentData(data.getSource(), from.toString(),
                    "x " + Arrays.toString(resumed.getXShape()) + " y " + Arrays.toString(resumed.getYShape())
                            + " sha256 " + shortHash(resumed.getDataSha256()),
                    "x " + Arrays.toString(data.xShape()) + " y " + Arrays.toString(data.yShape())
                            + " sha256 " + shortHash(data.fingerprint())));
        }
    }

    private static String shortHash(String hash) {
        return hash == null ? "?" : hash.substring(0, Math.min(12, hash.length()));
    }

    static String sha256(byte[] bytes) {
        return Digests.sha256Hex(bytes);
    }
}
