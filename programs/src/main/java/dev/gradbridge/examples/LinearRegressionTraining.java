package dev.gradbridge.examples;

import dev.gradbridge.DivergenceException;
import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Tensor;
import dev.gradbridge.Trainer;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.cli.ConsoleLogging;
import dev.gradbridge.cli.OneLineErrors;
import dev.gradbridge.data.Dataset;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * The seed's listing on gradbridge: fit {@code y = w*x + b} from Java on a module exported from
 * Python. Where the seed called {@code calculate_loss_and_backward} and {@code sgd_step} itself,
 * the general {@link Trainer} calls {@code train_step} (loss, backward, the exported optimizer's
 * step) on all samples once per epoch, so the run is the same training as Python's
 * {@code reference.train(..., mode="full")}, bit for bit.
 */
@Command(name = "LinearRegressionTraining", mixinStandardHelpOptions = true,
        description = "Train the seed's linear regression from Java on an exported module.")
public final class LinearRegressionTraining implements Callable<History> {

    @Option(names = "--model", required = true, description = "exported training module (.pt)") Path model;
    @Option(names = "--op-library", paramLabel = "FILE", description = "custom-operator library to load first")
    List<Path> opLibraries = new ArrayList<>();
    @Option(names = "--epochs", defaultValue = "100", description = "default: ${DEFAULT-VALUE}") int epochs;
    @Option(names = "--lr", defaultValue = "0.01", description = "learning rate, default: ${DEFAULT-VALUE}") double lr;
    @Option(names = "--history", description = "write the per-epoch history here (JSON Lines)") Path history;
    @Option(names = "--samples", defaultValue = "100", description = "default: ${DEFAULT-VALUE}") int samples;
    @Option(names = "--data-seed", defaultValue = "42", description = "default: ${DEFAULT-VALUE}") long dataSeed;
    @Option(names = "--log-every", defaultValue = "20", description = "default: ${DEFAULT-VALUE}") int logEvery;

    /** The generated data: x and y, {@code n} floats each (columns of shape [n, 1]). */
    public static final class SeedData {
        private final float[] x;
        private final float[] y;

        SeedData(float[] x, float[] y) {
            this.x = x;
            this.y = y;
        }

        /** @return inputs */
        public float[] getX() {
            return x.clone();
        }

        /** @return targets */
        public float[] getY() {
            return y.clone();
        }
    }

    /**
     * The seed's data, drawn as the seed draws it: x uniform in [0, 10), y = 2x + 1 + noise in [-1, 1).
     *
     * @param seed the {@code java.util.Random} seed (the seed's is 42)
     * @param n the number of samples
     * @return x and y
     */
    public static SeedData generateData(long seed, int n) {
        if (n < 1) {
            throw new InvalidInputException("the number of samples must be at least 1, got " + n);
        }
        Random rand = new Random(seed);
        float[] x = new float[n];
        float[] y = new float[n];
        for (int i = 0; i < n; i++) {
            x[i] = rand.nextFloat() * 10.0f;
            y[i] = 2.0f * x[i] + 1.0f + (rand.nextFloat() - 0.5f) * 2.0f;
        }
        return new SeedData(x, y);
    }

    /** Runs with the parsed options; returns the history. */
    @Override
    public History call() throws IOException {
        if (epochs < 1 || logEvery < 1) {
            throw new InvalidInputException("--epochs and --log-every must be at least 1");
        }
        SeedData data = generateData(dataSeed, samples);
        try (TrainingModule module = TrainingModule.load(model, opLibraries)) {
            System.out.println("Model loaded: " + module.getPath());
            if (!module.getParameterNames().containsAll(Arrays.asList("weight", "bias"))) {
                throw new InvalidInputException(module.getPath() + " is not the seed's linear regression: parameters "
                        + module.getParameterNames() + ", expected [weight, bias]");
            }
            module.setLr(lr);
            Trainer trainer = Trainer.builder().optEpochs(epochs).optMode(Trainer.Mode.FULL).optHistory(history)
                    .optEpochListener(record -> {
                        if (record.getEpoch() % logEvery == 0 || record.getEpoch() == epochs - 1) {
                            Map<String, double[]> p = record.getParameters();
                            System.out.printf("Epoch [%3d], Loss: %.4f, Weight: %.4f, Bias: %.4f%n",
                                    record.getEpoch(), record.getLoss(), p.get("weight")[0], p.get("bias")[0]);
                        }
                    })
                    .build();
            History result;
            try (Tensor x = Tensor.of(data.getX(), samples, 1);
                    Tensor y = Tensor.of(data.getY(), samples, 1);
                    Dataset dataset = Dataset.of("seed data", x, y)) {
                result = trainer.fit(module, dataset);
            } catch (DivergenceException e) {
                throw new DivergenceException(e.getMessage() + "; learning rate " + lr + ": try a smaller --lr",
                        e.getEpoch(), e.getBatch(), e.getHistory());
            }
            System.out.println("Training finished.");
            Map<String, double[]> last = module.getParameters();
            System.out.printf("Final parameters -> Weight: %.4f, Bias: %.4f%n", last.get("weight")[0], last.get("bias")[0]);
            if (history != null) {
                System.out.println("History written: " + history.toAbsolutePath());
            }
            return result;
        }
    }

    /**
     * Parses {@code args} and runs, for tests and embedding; errors propagate as exceptions.
     *
     * @param args the command-line arguments
     * @return the per-epoch history
     * @throws Exception on bad arguments or a failed run
     */
    public static History runExample(String... args) throws Exception {
        LinearRegressionTraining command = new LinearRegressionTraining();
        new CommandLine(command).parseArgs(args);
        return command.call();
    }

    /** @param args see {@code --help}; exit code 0, or 1 with one line on stderr for bad input */
    public static void main(String[] args) {
        ConsoleLogging.applyDefaults();
        System.exit(OneLineErrors.install(new CommandLine(new LinearRegressionTraining())).execute(args));
    }
}
