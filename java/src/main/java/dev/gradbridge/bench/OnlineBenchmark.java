package dev.gradbridge.bench;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.Shape;
import com.google.gson.GsonBuilder;
import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
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
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * The online learner's figures in a JVM of its own (for {@code gradbridge online-bench}): predict
 * latency (p50, p99) with training off and with feedback clients keeping the trainer busy, and
 * learning throughput (events applied per second, log and validation included) against the fused
 * {@code train_epoch} at the same micro-batch size. Prints one JSON object.
 *
 * <p>Usage: {@code OnlineBenchmark MODEL.pt WORK_DIR CLASSES EVENTS BATCH PREDICTIONS PREDICT_THREADS
 * FEEDBACK_THREADS PUBLISH_EVERY}; x is float32 (standard normal), y int64 in {@code 0..CLASSES-1}.
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
        try (OnlineLearner learner = open(model, work.resolve("latency"), batch, predictThreads, publishEvery)) {
            learner.learn(chunks.get(0)[0], chunks.get(0)[1]);
            learner.awaitIdle(60, TimeUnit.SECONDS);
            predictLatencies(learner, one, predictions / 4, predictThreads); // warm-up
            long[] idle = predictLatencies(learner, one, predictions, predictThreads);
            AtomicBoolean stop = new AtomicBoolean();
            List<Thread> feeders = new ArrayList<>();
            for (int t = 0; t < feedbackThreads; t++) {
                final int me = t;
                Thread feeder = new Thread(() -> {
                    for (int i = me; !stop.get(); i = (i + feedbackThreads) % chunks.size()) {
                        try {
                            learner.learn(chunks.get(i)[0], chunks.get(i)[1], 10, TimeUnit.MILLISECONDS);
                        } catch (QueueFullException e) {
                            // no room within 10 ms: try again (blocking, not spinning)
                        }
                    }
                });
                feeder.start();
                feeders.add(feeder);
            }
            long updatesBefore = learner.updates();
            long[] busy = predictLatencies(learner, one, predictions, predictThreads);
            long updatesDuring = learner.updates() - updatesBefore;
            stop.set(true);
            for (Thread feeder : feeders) {
                feeder.join();
            }
            learner.awaitIdle(120, TimeUnit.SECONDS);
            out.put("predict_idle_p50_us", percentile(idle, 0.50) / 1e3);
            out.put("predict_idle_p99_us", percentile(idle, 0.99) / 1e3);
            out.put("predict_training_p50_us", percentile(busy, 0.50) / 1e3);
            out.put("predict_training_p99_us", percentile(busy, 0.99) / 1e3);
            out.put("updates_during_predictions", updatesDuring);
        }

        try (OnlineLearner learner = open(model, work.resolve("throughput"), batch, 1, publishEvery)) {
            long started = System.nanoTime();
            for (HostTensor[] chunk : chunks) {
                learner.learn(chunk[0], chunk[1], 60, TimeUnit.SECONDS);
            }
            learner.awaitIdle(300, TimeUnit.SECONDS);
            double seconds = (System.nanoTime() - started) / 1e9;
            out.put("online_events_per_s", chunks.size() * batch / seconds);
            out.put("online_updates", learner.updates());
        }

        try (TrainingModule module = TrainingModule.load(model);
                NDManager data = module.getManager().newSubManager()) {
            int n = chunks.size() * batch;
            NDArray x = data.create(Arrays.copyOf(xs, n * features), new Shape(n, features));
            NDArray y = data.create(Arrays.copyOf(ys, n), new Shape(n));
            NDArray perm = data.arange(0L, (long) n, 1L, ai.djl.ndarray.types.DataType.INT64);
            module.trainEpoch(x, y, perm, batch); // warm-up
            long started = System.nanoTime();
            module.trainEpoch(x, y, perm, batch);
            double seconds = (System.nanoTime() - started) / 1e9;
            out.put("fused_events_per_s", n / seconds);
        }
        out.put("batch", batch);
        out.put("publish_every", publishEvery);
        out.put("events", chunks.size() * batch);
        System.out.println(new GsonBuilder().create().toJson(out));
    }

    private static OnlineLearner open(Path model, Path log, int batch, int predictors, int publishEvery)
            throws IOException {
        return OnlineLearner.builder().optMaxBatch(batch).optMaxWaitMillis(1).optPublishEvery(publishEvery)
                .optCheckpointEvery(1_000_000).optQueueCapacity(batch * 8).optPredictors(predictors)
                .optFsync(FsyncPolicy.NEVER).optValidateTargets(false).open(model, log);
    }

    private static long[] predictLatencies(OnlineLearner learner, HostTensor x, int total, int threads)
            throws InterruptedException {
        long[] latencies = new long[total];
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            final int me = t;
            Thread worker = new Thread(() -> {
                for (int i = me; i < total; i += threads) {
                    long started = System.nanoTime();
                    learner.predict(x);
                    latencies[i] = System.nanoTime() - started;
                }
            });
            worker.start();
            workers.add(worker);
        }
        for (Thread worker : workers) {
            worker.join();
        }
        return latencies;
    }

    private static double percentile(long[] values, double q) {
        long[] sorted = values.clone();
        Arrays.sort(sorted);
        return sorted[Math.min(sorted.length - 1, (int) Math.floor(q * (sorted.length - 1) + 0.5))];
    }
}
