package dev.gradbridge.bench;

import ai.djl.ndarray.NDArray;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.Locale;

/**
 * Java-side timing loops for {@code gradbridge bench}: the loop and the clock live in Java, so
 * the figures carry no JPype call overhead. Each method runs {@code warmup} untimed calls, then
 * {@code repeats} timed blocks of {@code calls} calls, and returns the seconds of each block.
 */
public final class StepBenchmark {

    private StepBenchmark() {}

    /**
     * Times one variant in this JVM and prints {@code {"calls_per_repeat": N, "repeat_seconds":
     * [...]}}, the format of benchmarks/native/train_loop.cpp.
     *
     * <p>Arguments: {@code MODEL.pt DATA.npz step|fused WARMUP REPEATS CALLS BATCH}; in step mode
     * every call is one train_step on all of DATA, in fused mode one train_epoch in order.
     *
     * @param args see above
     */
    public static void main(String[] args) {
        if (args.length != 7) {
            System.err.println("usage: StepBenchmark MODEL.pt DATA.npz step|fused WARMUP REPEATS CALLS BATCH");
            System.exit(2);
        }
        int warmup = Integer.parseInt(args[3]);
        int repeats = Integer.parseInt(args[4]);
        int calls = Integer.parseInt(args[5]);
        int batch = Integer.parseInt(args[6]);
        try (TrainingModule module = TrainingModule.load(Paths.get(args[0]));
                Dataset data = Dataset.loadNpz(Paths.get(args[1]), module.getManager())) {
            double[] seconds;
            if ("fused".equals(args[2])) {
                long[] order = new long[data.size()];
                Arrays.setAll(order, i -> i);
                NDArray perm = module.getManager().create(order);
                seconds = trainEpoch(module, data.getX(), data.getY(), perm, batch, warmup, repeats, calls);
            } else {
                seconds = trainStep(module, data.getX(), data.getY(), warmup, repeats, calls);
            }
            StringBuilder json = new StringBuilder("{\"calls_per_repeat\": " + calls + ", \"repeat_seconds\": [");
            for (int i = 0; i < seconds.length; i++) {
                json.append(i == 0 ? "" : ", ").append(String.format(Locale.ROOT, "%.9f", seconds[i]));
            }
            System.out.println(json.append("]}"));
        }
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
    public static double[] trainStep(TrainingModule module, NDArray x, NDArray y, int warmup, int repeats, int calls) {
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
            TrainingModule module, NDArray x, NDArray y, NDArray perm, int batchSize, int warmup, int repeats,
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
}
