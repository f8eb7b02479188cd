package dev.gradbridge.bench;

import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.HostTensor;
import dev.gradbridge.online.Prediction;
import dev.gradbridge.online.QueueFullException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Drives an {@link OnlineLearner} from several Java threads at once: feedback clients that send
 * every row of a data set (retrying when the queue is full) and predict clients that record what
 * they were told. For tests (the Python suite checks every prediction against its version) and
 * load measurements.
 */
public final class OnlineLoad {

    private OnlineLoad() {}

    /** What the clients saw. */
    public static final class Result {
        private final long refusals;
        private final long[] predictedRows;
        private final long[] versions;
        private final byte[][] outputs;
        private final long[] latenciesNanos;

        Result(long refusals, long[] predictedRows, long[] versions, byte[][] outputs, long[] latenciesNanos) {
            this.refusals = refusals;
            this.predictedRows = predictedRows;
            this.versions = versions;
            this.outputs = outputs;
            this.latenciesNanos = latenciesNanos;
        }

        /** @return learn calls refused with {@link QueueFullException} (each was retried) */
        public long getRefusals() {
            return refusals;
        }

        /** @return for each prediction, the row of {@code x} it was asked about */
        public long[] getPredictedRows() {
            return predictedRows;
        }

        /** @return for each prediction, the version that answered */
        public long[] getVersions() {
            return versions;
        }

        /** @return for each prediction, the output's little-endian bytes */
        public byte[][] getOutputs() {
            return outputs;
        }

        /** @return for each prediction, its latency in nanoseconds */
        public long[] getLatenciesNanos() {
            return latenciesNanos;
        }
    }

    /**
     * Sends every row of (x, y) as feedback from {@code feedbackThreads} threads, {@code rowsPerCall}
     * rows per call (call {@code i} goes to thread {@code i % feedbackThreads}), while {@code
     * predictThreads} threads each ask for {@code predictionsPerThread} one-row predictions; returns
     * when all are done.
     *
     * @param learner the learner
     * @param x inputs, one event per row
     * @param y targets
     * @param feedbackThreads feedback clients (>= 1)
     * @param rowsPerCall rows per learn call (>= 1)
     * @param predictThreads predict clients (>= 0)
     * @param predictionsPerThread predictions per predict client
     * @return what the clients saw
     * @throws InterruptedException when interrupted
     */
    public static Result run(OnlineLearner learner, HostTensor x, HostTensor y, int feedbackThreads, int rowsPerCall,
            int predictThreads, int predictionsPerThread) throws InterruptedException {
        int n = (int) x.rows();
        List<HostTensor> xChunks = chunks(x, rowsPerCall);
        List<HostTensor> yChunks = chunks(y, rowsPerCall);
        AtomicLong refusals = new AtomicLong();
        List<Throwable> errors = new ArrayList<>();
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < feedbackThreads; t++) {
            threads.add(feedbackClient(learner, xChunks, yChunks, t, feedbackThreads, refusals));
        }
        int total = predictThreads * predictionsPerThread;
        long[] rows = new long[total];
        long[] versions = new long[total];
        byte[][] outputs = new byte[total][];
        long[] latencies = new long[total];
        List<HostTensor> single = chunks(x, 1);
        for (int t = 0; t < predictThreads; t++) {
            final int me = t;
            threads.add(new Thread(() -> {
                for (int i = 0; i < predictionsPerThread; i++) {
                    int slot = me * predictionsPerThread + i;
                    int row = (int) ((slot * 7919L) % n);
                    long started = System.nanoTime();
                    Prediction prediction = learner.predict(single.get(row));
                    latencies[slot] = System.nanoTime() - started;
                    rows[slot] = row;
                    versions[slot] = prediction.getVersion();
                    outputs[slot] = prediction.getOutput().toBytes();
                }
            }, "predict-" + t));
        }
        for (Thread thread : threads) {
            thread.setUncaughtExceptionHandler((th, e) -> {
                synchronized (errors) {
                    errors.add(e);
                }
            });
            thread.start();
        }
        for (Thread thread : threads) {
            thread.join();
        }
        if (!errors.isEmpty()) {
            throw new IllegalStateException("a client thread failed: " + errors.get(0), errors.get(0));
        }
        return new Result(refusals.get(), rows, versions, outputs, latencies);
    }

    /** Feedback client {@code me} of {@code clients}: every such chunk by {@code learn}, backing off when refused. */
    private static Thread feedbackClient(OnlineLearner learner, List<HostTensor> xChunks, List<HostTensor> yChunks,
            int me, int clients, AtomicLong refusals) {
        return new Thread(() -> {
            for (int i = me; i < xChunks.size(); i += clients) {
                while (true) {
                    try {
                        learner.learn(xChunks.get(i), yChunks.get(i));
                        break;
                    } catch (QueueFullException e) {
                        refusals.incrementAndGet();
                        try {
                            Thread.sleep(1); // a client backing off, not spinning
                        } catch (InterruptedException interrupted) {
                            Thread.currentThread().interrupt();
                            return;
                        }
                    }
                }
            }
        }, "feedback-" + me);
    }

    /**
     * Feeds every chunk to the learner from {@code feeders} threads (feeder t: chunks t, t+feeders,
     * ...), each call waiting for its acknowledgement, as concurrent clients do; returns when all
     * are acknowledged.
     */
    static void feed(OnlineLearner learner, List<HostTensor[]> chunks, int feeders) throws Exception {
        if (feeders == 1) {
            for (HostTensor[] chunk : chunks) {
                learner.offer(chunk[0], chunk[1], null, 60, TimeUnit.SECONDS);
            }
            return;
        }
        ExecutorService pool = Executors.newFixedThreadPool(feeders, r -> new Thread(r, "bench-feeder"));
        try {
            List<java.util.concurrent.Future<?>> done = new ArrayList<>();
            for (int t = 0; t < feeders; t++) {
                final int me = t;
                done.add(pool.submit(() -> {
                    for (int i = me; i < chunks.size(); i += feeders) {
                        learner.offer(chunks.get(i)[0], chunks.get(i)[1], null, 60, TimeUnit.SECONDS);
                    }
                    return null;
                }));
            }
            for (java.util.concurrent.Future<?> f : done) {
                try {
                    f.get();
                } catch (ExecutionException e) {
                    throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
                }
            }
        } finally {
            pool.shutdownNow();
        }
    }

    /** Nanoseconds of each of {@code total} predictions of {@code x}, made by {@code threads} threads at once. */
    static long[] predictLatencies(OnlineLearner learner, HostTensor x, int total, int threads)
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

    /** Rows of a tensor in chunks of {@code size} (the last may be smaller). */
    static List<HostTensor> chunks(HostTensor tensor, int size) {
        long[] shape = tensor.getShape();
        long n = shape[0];
        byte[] bytes = tensor.toBytes();
        int rowBytes = (int) (bytes.length / Math.max(1, n));
        List<HostTensor> chunks = new ArrayList<>();
        for (long start = 0; start < n; start += size) {
            long count = Math.min(size, n - start);
            long[] chunkShape = shape.clone();
            chunkShape[0] = count;
            chunks.add(HostTensor.of(tensor.getDtype(), chunkShape,
                    Arrays.copyOfRange(bytes, (int) (start * rowBytes), (int) ((start + count) * rowBytes))));
        }
        return chunks;
    }
}
