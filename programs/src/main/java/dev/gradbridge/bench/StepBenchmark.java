package dev.gradbridge.bench;

import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.Tensor;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;

/**
 * Java-side timing loops for {@code gradbridge bench}: the loop and the clock live in Java, so
 * the figures carry no JPype call overhead.
 *
 * <p>As a program it is one of the benchmark's <em>workers</em> (the protocol of
 * benchmarks/native/train_loop.cpp): it loads the module and the data, prints one JSON line
 * describing its settings, then answers each {@code run N} line on stdin with {@code
 * {"seconds": S}}, the wall time of N calls, until {@code quit} or end of input. The harness
 * interleaves the blocks of every variant in rounds.
 *
 * <p>{@code breakdown} mode (bench only) times, interleaved in one JVM, what a training call is
 * made of: the bare native method call and {@link TrainingModule#trainStep}.
 */
public final class StepBenchmark {

    private StepBenchmark() {}

    /**
     * {@code MODEL.pt DATA.npz step|fused BATCH}: a worker (see above); {@code breakdown MODEL.pt
     * DATA.npz ROUNDS CALLS}: the per-call breakdown, one JSON line.
     *
     * @param args see above
     * @throws IOException when stdin fails
     */
    public static void main(String[] args) throws IOException {
        if (args.length == 5 && "breakdown".equals(args[0])) {
            System.out.println(breakdown(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4])));
            return;
        }
        if (args.length != 4 || !("step".equals(args[2]) || "fused".equals(args[2]))) {
            System.err.println("usage: StepBenchmark MODEL.pt DATA.npz step|fused BATCH"
                    + " | StepBenchmark breakdown MODEL.pt DATA.npz ROUNDS CALLS");
            System.exit(2);
        }
        boolean fused = "fused".equals(args[2]);
        int batch = Integer.parseInt(args[3]);
        try (TrainingModule module = TrainingModule.load(Paths.get(args[0]));
                Dataset data = Dataset.loadNpz(Paths.get(args[1]));
                Tensor perm = Tensor.arange(data.size())) {
            System.out.println(environment());
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            for (String line = in.readLine(); line != null && !"quit".equals(line.trim()); line = in.readLine()) {
                int calls = Integer.parseInt(line.trim().substring("run ".length()));
                double seconds = fused
                        ? trainEpoch(module, data.getX(), data.getY(), perm, batch, 0, 1, calls)[0]
                        : trainStep(module, data.getX(), data.getY(), 0, 1, calls)[0];
                System.out.println(String.format(Locale.ROOT, "{\"seconds\": %.9f}", seconds));
            }
        }
    }

    /** This JVM's settings as one JSON line: what the harness records for the variant. */
    static String environment() {
        List<String> gcs = new ArrayList<>();
        for (GarbageCollectorMXBean gc : ManagementFactory.getGarbageCollectorMXBeans()) {
            gcs.add(quote(gc.getName()));
        }
        List<String> options = new ArrayList<>();
        for (String option : ManagementFactory.getRuntimeMXBean().getInputArguments()) {
            options.add(quote(option));
        }
        return "{\"ready\": true, \"intra_op_threads\": " + ModuleAccess.intraOpThreads()
                + ", \"interop_threads\": " + ModuleAccess.interopThreads()
                + ", \"java\": " + quote(System.getProperty("java.vm.name") + " " + System.getProperty("java.version"))
                + ", \"available_processors\": " + Runtime.getRuntime().availableProcessors()
                + ", \"max_heap_bytes\": " + Runtime.getRuntime().maxMemory()
                + ", \"native_memory\": " + quote(ModuleAccess.nativeMemory())
                + ", \"gc\": " + gcs + ", \"jvm_options\": " + options + "}";
    }

    private static String quote(String text) {
        return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    /**
     * Times {@link TrainingModule#trainStep} on one batch.
     *
     * @param module the module
     * @param x one batch of inputs
     * @param y its targets
     * @param warmup untimed calls first
     * @param repeats timed blocks
     * @param calls calls per block
     * @return seconds per block
     */
    public static double[] trainStep(TrainingModule module, Tensor x, Tensor y, int warmup, int repeats, int calls) {
        for (int i = 0; i < warmup; i++) {
            module.trainStep(x, y);
        }
        double[] seconds = new double[repeats];
        for (int r = 0; r < repeats; r++) {
            long start = System.nanoTime();
            for (int i = 0; i < calls; i++) {
                module.trainStep(x, y);
            }
            seconds[r] = (System.nanoTime() - start) / 1e9;
        }
        return seconds;
    }

    /**
     * Times {@link TrainingModule#trainEpoch}: one native call per epoch.
     *
     * @param module the module
     * @param x all inputs
     * @param y all targets
     * @param perm int64 sample order
     * @param batchSize samples per batch
     * @param warmup untimed calls first
     * @param repeats timed blocks
     * @param calls epochs per block
     * @return seconds per block
     */
    public static double[] trainEpoch(
            TrainingModule module, Tensor x, Tensor y, Tensor perm, int batchSize, int warmup, int repeats,
            int calls) {
        for (int i = 0; i < warmup; i++) {
            module.trainEpoch(x, y, perm, batchSize);
        }
        double[] seconds = new double[repeats];
        for (int r = 0; r < repeats; r++) {
            long start = System.nanoTime();
            for (int i = 0; i < calls; i++) {
                module.trainEpoch(x, y, perm, batchSize);
            }
            seconds[r] = (System.nanoTime() - start) / 1e9;
        }
        return seconds;
    }

    /**
     * What one {@code train_step} call costs, layer by layer, in rounds that interleave the ways
     * of calling it (so that load on the machine hits all alike): {@code bare}, the native method
     * call alone on a second copy of the module (what the native loop does, plus one JNI
     * crossing); {@code train_step}, {@link TrainingModule#trainStep} (checks, thread guard, exact
     * loss).
     *
     * @return JSON: per-call seconds of each way in each round
     */
    static String breakdown(String model, String data, int rounds, int calls) {
        try (TrainingModule module = TrainingModule.load(Paths.get(model));
                Dataset batch = Dataset.loadNpz(Paths.get(data));
                ModuleAccess.BareCall bare = ModuleAccess.bareTrainStep(Paths.get(model), batch.getX(), batch.getY())) {
            Tensor x = batch.getX();
            Tensor y = batch.getY();
            Runnable trainStep = () -> module.trainStep(x, y);
            String[] names = {"bare", "train_step"};
            Runnable[] ways = {bare, trainStep};
            for (Runnable way : ways) { // warm-up: JIT, allocator
                for (int i = 0; i < Math.max(calls, 2000); i++) {
                    way.run();
                }
            }
            double[][] seconds = new double[ways.length][rounds];
            for (int r = 0; r < rounds; r++) {
                for (int k = 0; k < ways.length; k++) {
                    int w = (k + r) % ways.length; // rotate the order
                    long start = System.nanoTime();
                    for (int i = 0; i < calls; i++) {
                        ways[w].run();
                    }
                    seconds[w][r] = (System.nanoTime() - start) / 1e9 / calls;
                }
            }
            StringBuilder json = new StringBuilder("{\"calls_per_block\": " + calls + ", \"per_call_seconds\": {");
            for (int k = 0; k < ways.length; k++) {
                json.append(k == 0 ? "" : ", ").append(quote(names[k])).append(": [");
                for (int r = 0; r < rounds; r++) {
                    json.append(r == 0 ? "" : ", ").append(String.format(Locale.ROOT, "%.9g", seconds[k][r]));
                }
                json.append("]");
            }
            return json.append("}}").toString();
        }
    }
}
