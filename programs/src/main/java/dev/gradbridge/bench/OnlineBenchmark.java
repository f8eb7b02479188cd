package dev.gradbridge.bench;

import com.google.gson.GsonBuilder;
import dev.gradbridge.Metadata;
import dev.gradbridge.DType;
import dev.gradbridge.Tensor;
import dev.gradbridge.Trainer;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import dev.gradbridge.online.FsyncPolicy;
import dev.gradbridge.online.HostTensor;
import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.QueueFullException;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The online learner's figures in a JVM of its own (for {@code gradbridge online-bench}): predict
 * latency (p50, p99) with training off and with feedback clients keeping the trainer busy, one
 * sample of each per round (pooled, and per round); and
 * learning throughput (events applied per second) in interleaved rounds on the same events and
 * micro-batch size: the {@link OnlineLearner} fed B-row {@code learn} calls from FEEDERS threads,
 * each waiting for its own acknowledgement as a client does (log written; fsync never, and always;
 * loss validation off), {@link Trainer} in step mode (one {@code
 * train_step} call per micro-batch) and the fused {@code train_epoch} (one call for all), plus
 * the learner's time per phase per micro-batch ({@link dev.gradbridge.online.PhaseTimes}). The
 * batch loops run on a thread of their own, as the learner's training does. Prints one JSON object.
 *
 * <p>Usage: {@code OnlineBenchmark MODEL.pt WORK_DIR CLASSES EVENTS BATCH PREDICTIONS PREDICT_THREADS
 * FEEDBACK_THREADS PUBLISH_EVERY [ROUNDS [VARIANTS [FEEDERS [PREDICT_WARMUP]]]]}; x is float32 (standard normal), y
 * int64 in {@code 0..CLASSES-1}; PREDICTIONS 0 skips the latency part; VARIANTS is a comma-separated
 * subset of {@code online_never,online_always,trainer_step,fused_epoch,host_step} ({@code host_step}:
 * a {@code train_step} per B-row host chunk, no queue or log); FEEDERS (default 1) concurrent
 * clients feed the online variants, feeder t the chunks t, t+FEEDERS, ...: the same events and the
 * same number of micro-batches as the baselines, in the order the log records them (under fsync
 * always, their acknowledgements share the group commit's fsyncs); PREDICT_WARMUP (default
 * PREDICTIONS / 4) untimed predictions come first.
 */
public final class OnlineBenchmark {

    private OnlineBenchmark() {}

    /**
     * Runs the benchmark and prints its JSON.
     *
     * @param args see the class comment
     * @throws Exception when the model or the folder cannot be used
     */
    public static void main(String[] args) throws Exception {
        Path model = Paths.get(args[0]);
        Path work = Paths.get(args[1]);
        int classes = Integer.parseInt(args[2]);
        int events = Integer.parseInt(args[3]);
        int batch = Integer.parseInt(args[4]);
        int predictions = Integer.parseInt(args[5]);
        int predictThreads = Integer.parseInt(args[6]);
        int feedbackThreads = Integer.parseInt(args[7]);
        int publishEvery = Integer.parseInt(args[8]);
        int rounds = args.length > 9 ? Integer.parseInt(args[9]) : 5;
        List<String> variants = Arrays.asList(args.length > 10 ? args[10].split(",") : VARIANTS);
        int feeders = args.length > 11 ? Integer.parseInt(args[11]) : 1;
        int predictWarmup = args.length > 12 ? Integer.parseInt(args[12]) : predictions / 4;

        Metadata metadata = Metadata.read(model);
        int features = (int) metadata.getInput("x").getShape()[1];
        Random random = new Random(0);
        float[] xs = new float[events * features];
        long[] ys = new long[events];
        for (int i = 0; i < xs.length; i++) {
            xs[i] = (float) random.nextGaussian();
        }
        for (int i = 0; i < events; i++) {
            ys[i] = random.nextInt(classes);
        }
        List<HostTensor[]> chunks = new ArrayList<>();
        for (int i = 0; i + batch <= events; i += batch) {
            chunks.add(new HostTensor[] {
                HostTensor.ofFloats(Arrays.copyOfRange(xs, i * features, (i + batch) * features), batch, features),
                HostTensor.ofLongs(Arrays.copyOfRange(ys, i, i + batch), batch)});
        }
        HostTensor one = HostTensor.ofFloats(Arrays.copyOfRange(xs, 0, features), 1, features);

        Map<String, Object> out = new LinkedHashMap<>();
        Files.createDirectories(work);
        if (predictions > 0) {
            latency(out, model, work, chunks, one, batch, predictions, predictWarmup, predictThreads, feedbackThreads,
                    publishEvery, rounds);
        }
        throughput(out, model, work, xs, ys, features, chunks, batch, publishEvery, rounds, variants, feeders);
        out.put("batch", batch);
        out.put("feeders", feeders);
        out.put("publish_every", publishEvery);
        out.put("events", chunks.size() * batch);
        System.out.println(new GsonBuilder().serializeSpecialFloatingPointValues().create().toJson(out));
    }

    private static OnlineLearner open(
            Path model, Path log, int batch, int predictors, int publishEvery, FsyncPolicy fsync) throws IOException {
        return OnlineLearner.builder().optMaxBatch(batch).optMaxWaitMillis(1).optPublishEvery(publishEvery)
                .optCheckpointEvery(1_000_000).optQueueCapacity(batch * 8).optPredictors(predictors)
                .optFsync(fsync).optValidateTargets(false).optTimePhases(true).open(model, log);
    }

    /**
     * Predict latency in {@code rounds} rounds, each a sample of {@code predictions} calls with
     * training off, then one with the feeders keeping the trainer busy: p50/p99 pooled over the
     * rounds and per round (a p99 over one short sample is one hiccup of the machine or not).
     */
    private static void latency(Map<String, Object> out, Path model, Path work, List<HostTensor[]> chunks,
            HostTensor one, int batch, int predictions, int warmup, int predictThreads, int feedbackThreads,
            int publishEvery, int rounds)
            throws Exception {
        try (OnlineLearner learner = open(model, work.resolve("latency"), batch, predictThreads, publishEvery,
                FsyncPolicy.NEVER)) {
            learner.learn(chunks.get(0)[0], chunks.get(0)[1]);
            learner.awaitIdle(60, TimeUnit.SECONDS);
            OnlineLoad.predictLatencies(learner, one, warmup, predictThreads); // the JIT compiles the predict path
            long[] idle = new long[predictions * rounds];
            long[] busy = new long[predictions * rounds];
            Map<String, List<Double>> byRound = new LinkedHashMap<>();
            for (String key : new String[] {"idle_p50_us", "idle_p99_us", "training_p50_us", "training_p99_us"}) {
                byRound.put(key, new ArrayList<>());
            }
            List<Long> updatesByRound = new ArrayList<>();
            // Round -1 is untimed and as long as the warm-up: the JIT was still compiling the
            // training-on path (feeders, trainer) in the first rounds with feeders, its C2 thread
            // taking 20-50% of a core from the predictors (perf sched).
            for (int round = -1; round < rounds; round++) {
                int calls = round < 0 ? Math.max(predictions, warmup) : predictions;
                long[] idleRound = OnlineLoad.predictLatencies(learner, one, calls, predictThreads);
                AtomicBoolean stop = new AtomicBoolean();
                List<Thread> feeders = startFeeders(learner, chunks, feedbackThreads, stop);
                long updatesBefore = learner.stats().getUpdates();
                long[] busyRound = OnlineLoad.predictLatencies(learner, one, calls, predictThreads);
                long updatesDuring = learner.stats().getUpdates() - updatesBefore;
                stop.set(true);
                for (Thread feeder : feeders) {
                    feeder.join();
                }
                learner.awaitIdle(120, TimeUnit.SECONDS);
                if (round < 0) {
                    continue;
                }
                updatesByRound.add(updatesDuring);
                System.arraycopy(idleRound, 0, idle, round * predictions, predictions);
                System.arraycopy(busyRound, 0, busy, round * predictions, predictions);
                byRound.get("idle_p50_us").add(percentile(idleRound, 0.50) / 1e3);
                byRound.get("idle_p99_us").add(percentile(idleRound, 0.99) / 1e3);
                byRound.get("training_p50_us").add(percentile(busyRound, 0.50) / 1e3);
                byRound.get("training_p99_us").add(percentile(busyRound, 0.99) / 1e3);
            }
            out.put("predict_idle_p50_us", percentile(idle, 0.50) / 1e3);
            out.put("predict_idle_p99_us", percentile(idle, 0.99) / 1e3);
            out.put("predict_training_p50_us", percentile(busy, 0.50) / 1e3);
            out.put("predict_training_p99_us", percentile(busy, 0.99) / 1e3);
            out.put("predict_by_round", byRound);
            out.put("updates_during_predictions", updatesByRound);
        }
    }

    /** {@code threads} threads offering the chunks round-robin, each from its own, until {@code stop}. */
    private static List<Thread> startFeeders(OnlineLearner learner, List<HostTensor[]> chunks, int threads,
            AtomicBoolean stop) {
        List<Thread> feeders = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int me = t;
            Thread feeder = new Thread(() -> {
                for (int i = me; !stop.get(); i = (i + threads) % chunks.size()) {
                    try {
                        learner.offer(chunks.get(i)[0], chunks.get(i)[1], null, 10, TimeUnit.MILLISECONDS);
                    } catch (QueueFullException e) {
                        // no room within 10 ms: try again (blocking, not spinning)
                    }
                }
            });
            feeder.start();
            feeders.add(feeder);
        }
        return feeders;
    }

    /** The learning-throughput variants, timed in interleaved rounds (the order rotates each round). */
    private static final String[] VARIANTS = {"online_never", "online_always", "trainer_step", "fused_epoch"};

    /**
     * Learning throughput, in {@code rounds} interleaved rounds on the same events: the online
     * learner (log written, fsync never, and fsync always: the default policy), {@link Trainer} in
     * step mode (one {@code train_step} call per micro-batch, the like-for-like), and the fused
     * {@code train_epoch} (one native call for all micro-batches). Medians, per-round ratios with
     * their spread, and the online learner's time per phase per micro-batch.
     */
    private static void throughput(Map<String, Object> out, Path model, Path work, float[] xs, long[] ys,
            int features, List<HostTensor[]> chunks, int batch, int publishEvery, int rounds, List<String> variants,
            int feeders) throws Exception {
        int n = chunks.size() * batch;
        ThroughputFigures figures = new ThroughputFigures();
        for (String variant : variants) {
            figures.perRound.put(variant, new ArrayList<>());
        }
        // The batch loops run on a thread of their own, as the online learner's training does (a
        // thread that is not the one that started the engine): the same conditions for both.
        ExecutorService baseline = Executors.newSingleThreadExecutor(r -> new Thread(r, "bench-batch-trainer"));
        try (TrainingModule stepModule = TrainingModule.load(model);
                TrainingModule fusedModule = TrainingModule.load(model);
                Tensor x = Tensor.of(Arrays.copyOf(xs, n * features), n, features);
                Tensor y = Tensor.of(Arrays.copyOf(ys, n), n);
                Tensor fx = Tensor.of(Arrays.copyOf(xs, n * features), n, features);
                Tensor fy = Tensor.of(Arrays.copyOf(ys, n), n);
                Tensor perm = Tensor.arange(n)) {
            Dataset dataset = Dataset.of("online-bench events", x, y);
            Trainer step = Trainer.builder().optEpochs(1).optBatchSize(batch).optMode(Trainer.Mode.STEP)
                    .optProgressBar(false).build();
            for (int i = 0; i < 3; i++) { // warm-up: JIT, and the graph executor's profiling runs
                onTrainingThread(baseline, () -> step.fit(stepModule, dataset));
                onTrainingThread(baseline, () -> fusedModule.trainEpoch(fx, fy, perm, batch));
            }
            for (String variant : variants) {
                if (variant.startsWith("online_")) {
                    warmUp(model, work.resolve("warm-up-" + variant), variant, batch, publishEvery, chunks, feeders);
                }
            }
            for (int round = 0; round < rounds; round++) {
                for (int k = 0; k < variants.size(); k++) {
                    String variant = variants.get((k + round) % variants.size());
                    double seconds;
                    switch (variant) {
                        case "trainer_step":
                            seconds = onTrainingThread(baseline, () -> step.fit(stepModule, dataset),
                                    figures.cpuNanos.computeIfAbsent(variant, v -> new long[1]));
                            break;
                        case "host_step":
                            seconds = onTrainingThread(baseline, () -> hostSteps(stepModule, chunks),
                                    figures.cpuNanos.computeIfAbsent(variant, v -> new long[1]));
                            break;
                        case "fused_epoch":
                            seconds = onTrainingThread(baseline, () -> fusedModule.trainEpoch(fx, fy, perm, batch),
                                    figures.cpuNanos.computeIfAbsent(variant, v -> new long[1]));
                            break;
                        default: {
                            Path dir = work.resolve("throughput-" + variant + "-" + round);
                            seconds = onlineRound(figures, variant, model, dir, batch, publishEvery, chunks, feeders);
                            deleteTree(dir);
                        }
                    }
                    figures.perRound.get(variant).add(n / seconds);
                }
            }
        } finally {
            baseline.shutdownNow();
        }
        figures.rates(out, variants, rounds);
        figures.phases(out, (long) rounds * chunks.size());
    }

    /**
     * An online variant's untimed round, as long as a timed one: otherwise the first timed rounds run the
     * learner's Java code interpreted while the JIT compiles it.
     */
    private static void warmUp(Path model, Path dir, String variant, int batch, int publishEvery,
            List<HostTensor[]> chunks, int feeders) throws Exception {
        try (OnlineLearner learner = open(model, dir, batch, 1, publishEvery, policyOf(variant))) {
            OnlineLoad.feed(learner, chunks, feeders);
            learner.awaitIdle(300, TimeUnit.SECONDS);
        }
        deleteTree(dir);
    }

    /**
     * One timed round of an online variant on a fresh log in {@code dir}: its phase times, CPU times and
     * calls into {@code figures}.
     *
     * @return the seconds it took to learn from every chunk
     */
    private static double onlineRound(ThroughputFigures figures, String variant, Path model, Path dir, int batch,
            int publishEvery, List<HostTensor[]> chunks, int feeders) throws Exception {
        try (OnlineLearner learner = open(model, dir, batch, 1, publishEvery, policyOf(variant))) {
            for (int i = 0; i < Math.min(16, chunks.size()); i++) { // warm-up
                learner.offer(chunks.get(i)[0], chunks.get(i)[1], null, 60, TimeUnit.SECONDS);
            }
            learner.awaitIdle(60, TimeUnit.SECONDS);
            Map<String, Long> before = learner.phaseTimes().nanos();
            Map<String, Long> cpuBefore = learner.phaseTimes().cpuNanos();
            long callsBefore = learner.phaseTimes().counts().get("train_step");
            long updatesBefore = learner.stats().getUpdates();
            long started = System.nanoTime();
            OnlineLoad.feed(learner, chunks, feeders);
            learner.awaitIdle(300, TimeUnit.SECONDS);
            long elapsed = System.nanoTime() - started;
            figures.onlineUpdates = learner.stats().getUpdates() - updatesBefore;
            Map<String, Long> sum = figures.phaseNanos.computeIfAbsent(variant, v -> new LinkedHashMap<>());
            for (Map.Entry<String, Long> e : learner.phaseTimes().nanos().entrySet()) {
                sum.merge(e.getKey(), e.getValue() - before.get(e.getKey()), Long::sum);
            }
            figures.phaseBatches.merge(variant, figures.onlineUpdates, Long::sum);
            Map<String, Long> cpuSum = figures.phaseCpu.computeIfAbsent(variant, v -> new LinkedHashMap<>());
            for (Map.Entry<String, Long> e : learner.phaseTimes().cpuNanos().entrySet()) {
                cpuSum.merge(e.getKey(), e.getValue() - cpuBefore.get(e.getKey()), Long::sum);
            }
            long calls = learner.phaseTimes().counts().get("train_step") - callsBefore;
            figures.trainCalls.merge(variant, calls, Long::sum);
            figures.wallNanos.merge(variant, elapsed, Long::sum);
            return elapsed / 1e9;
        }
    }

    private static FsyncPolicy policyOf(String onlineVariant) {
        return onlineVariant.equals("online_never") ? FsyncPolicy.NEVER : FsyncPolicy.ALWAYS;
    }

    /** One {@code train_step} per chunk, each made from its host bytes: the online step without queue or log. */
    private static Object hostSteps(TrainingModule module, List<HostTensor[]> chunks) {
        for (HostTensor[] chunk : chunks) {
            try (Tensor x = toTensor(chunk[0]);
                    Tensor y = toTensor(chunk[1])) {
                module.trainStep(x, y);
            }
        }
        return null;
    }

    private static Tensor toTensor(HostTensor tensor) {
        byte[] bytes = tensor.toBytes();
        java.nio.ByteBuffer buffer = java.nio.ByteBuffer.allocateDirect(bytes.length).order(java.nio.ByteOrder.nativeOrder());
        buffer.put(bytes).flip();
        return Tensor.fromBuffer(buffer, DType.of(tensor.getDtype()), tensor.getShape());
    }

    /** Runs {@code work} on {@code thread} and returns the seconds it took there. */
    private static double onTrainingThread(ExecutorService thread, Callable<?> work) throws Exception {
        return onTrainingThread(thread, work, null);
    }

    /** The same, adding the thread's CPU time in ns to {@code cpu[0]} when given. */
    private static double onTrainingThread(ExecutorService thread, Callable<?> work, long[] cpu) throws Exception {
        java.lang.management.ThreadMXBean threads = java.lang.management.ManagementFactory.getThreadMXBean();
        try {
            return thread.submit(() -> {
                long cpuStarted = threads.getCurrentThreadCpuTime();
                long started = System.nanoTime();
                work.call();
                double seconds = (System.nanoTime() - started) / 1e9;
                if (cpu != null) {
                    cpu[0] += threads.getCurrentThreadCpuTime() - cpuStarted;
                }
                return seconds;
            }).get();
        } catch (ExecutionException e) {
            throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
        }
    }

    static double median(List<Double> values) {
        List<Double> sorted = new ArrayList<>(values);
        sorted.sort(null);
        int m = sorted.size();
        return m == 0 ? Double.NaN : m % 2 == 1 ? sorted.get(m / 2) : (sorted.get(m / 2 - 1) + sorted.get(m / 2)) / 2;
    }

    private static void deleteTree(Path dir) throws IOException {
        try (java.util.stream.Stream<Path> walk = Files.walk(dir)) {
            for (Path p : (Iterable<Path>) walk.sorted(java.util.Comparator.reverseOrder())::iterator) {
                Files.deleteIfExists(p);
            }
        }
    }

    private static double percentile(long[] values, double q) {
        long[] sorted = values.clone();
        Arrays.sort(sorted);
        return sorted[Math.min(sorted.length - 1, (int) Math.floor(q * (sorted.length - 1) + 0.5))];
    }
}
