package dev.gradbridge.examples;

import dev.gradbridge.DivergenceException;
import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Tensor;
import dev.gradbridge.Trainer;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import dev.gradbridge.cli.ConsoleLogging;
import java.io.IOException;
import java.io.PrintStream;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.Callable;
import dev.gradbridge.cli.OneLineErrors;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;

/**
 * The seed's driver: fit {@code y = w*x + b} from Java on an exported training module.
 *
 * <p>Data: {@code java.util.Random(42)}, x uniform in [0, 10), y = 2x + 1 + uniform noise in
 * [-1, 1). A thin use of the general {@link Trainer}: full-batch mode, the exported optimizer at
 * {@code --lr}; a line every {@code --log-every} epochs and the final weight and bias.
 */
@Command(
        name = "LinearRegressionTraining",
        mixinStandardHelpOptions = true,
        description = "Train the seed's linear regression from Java on an exported module.")
public final class LinearRegressionTraining implements Callable<History> {

    @Option(names = "--model", required = true, description = "exported training module (.pt)")
    private Path model;

    @Option(names = "--op-library", paramLabel = "FILE",
            description = "load this custom-operator library before the module (repeatable)")
    private List<Path> opLibraries = new ArrayList<>();

    @Option(names = "--epochs", defaultValue = "100", description = "epochs (default: ${DEFAULT-VALUE})")
    private int epochs;

    @Option(names = "--lr", defaultValue = "0.01", description = "learning rate (default: ${DEFAULT-VALUE})")
    private double lr;

    @Option(names = "--history", description = "write the per-epoch history here (JSON Lines)")
    private Path history;

    @Option(names = "--samples", defaultValue = "100", description = "samples (default: ${DEFAULT-VALUE})")
    private int samples;

    @Option(names = "--data-seed", defaultValue = "42", description = "java.util.Random seed (default: ${DEFAULT-VALUE})")
    private long dataSeed;

    @Option(names = "--log-every", defaultValue = "20", description = "log every N epochs (default: ${DEFAULT-VALUE})")
    private int logEvery;

    /** The generated data set: x and y, each {@code n} floats (a column of shape [n, 1]). */
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
     * Generates the seed's data, exactly as the seed does (float arithmetic, same draw order).
     *
     * @param seed the {@code java.util.Random} seed (the seed uses 42)
     * @param n the number of samples
     * @return x in [0, 10) and y = 2x + 1 + noise in [-1, 1)
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

    /**
     * Trains {@code module} on (x, y) with the general {@link Trainer} in full-batch mode: each
     * epoch is one {@code train_step} of the exported optimizer, at learning rate {@code lr}.
     *
     * @param module a linear-regression training module (parameters {@code weight}, {@code bias})
     * @param x inputs
     * @param y targets, as many as inputs
     * @param epochs number of epochs, at least 1
     * @param lr learning rate (set on the exported optimizer first)
     * @param log where the seed-style lines go, or {@code null} for none
     * @param logEvery log every this many epochs
     * @param historyFile written after every epoch, or {@code null}
     * @return the per-epoch history
     * @throws IOException when the history file cannot be written
     */
    public static History train(
            TrainingModule module, float[] x, float[] y, int epochs, double lr, PrintStream log, int logEvery,
            Path historyFile) throws IOException {
        if (!module.getParameterNames().contains("weight") || !module.getParameterNames().contains("bias")) {
            throw new InvalidInputException(
                    module.getPath() + " is not the seed's linear regression: parameters "
                            + module.getParameterNames() + ", expected [weight, bias]");
        }
        if (x.length != y.length || x.length == 0) {
            throw new InvalidInputException(
                    "x and y must be non-empty and equally long, got " + x.length + " and " + y.length);
        }
        if (epochs < 1 || logEvery < 1) {
            throw new InvalidInputException("epochs and log-every must be at least 1");
        }
        module.setLr(lr);
        Trainer trainer = Trainer.builder()
                .optEpochs(epochs)
                .optMode(Trainer.Mode.FULL)
                .optHistory(historyFile)
                .optEpochListener(record -> {
                    int epoch = record.getEpoch();
                    if (log != null && (epoch % logEvery == 0 || epoch == epochs - 1)) {
                        Map<String, double[]> params = record.getParameters();
                        log.printf(
                                "Epoch [%3d], Loss: %.4f, Weight: %.4f, Bias: %.4f%n",
                                epoch, record.getLoss(), params.get("weight")[0], params.get("bias")[0]);
                    }
                })
                .build();
        try (Tensor xs = Tensor.of(x, x.length, 1);
                Tensor ys = Tensor.of(y, y.length, 1);
                Dataset dataset = Dataset.of("seed data", xs, ys)) {
            return trainer.fit(module, dataset);
        } catch (DivergenceException e) {
            throw new DivergenceException(
                    e.getMessage() + "; learning rate " + lr + ": try a smaller --lr", e.getEpoch(), e.getBatch(),
                    e.getHistory());
        }
    }

    /** Runs with the parsed options; returns the history. */
    @Override
    public History call() throws IOException {
        SeedData dataset = generateData(dataSeed, samples);
        History result;
        try (TrainingModule module = TrainingModule.load(model, opLibraries)) {
            System.out.println("Model loaded: " + module.getPath());
            result = train(module, dataset.x, dataset.y, epochs, lr, System.out, logEvery, history);
            System.out.println("Training finished.");
            Map<String, double[]> last = module.getParameters();
            System.out.printf(
                    "Final parameters -> Weight: %.4f, Bias: %.4f%n", last.get("weight")[0], last.get("bias")[0]);
        }
        if (history != null) {
            System.out.println("History written: " + history.toAbsolutePath());
        }
        return result;
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

    /**
     * Command-line entry: exit code 0 on success, 1 with one line on stderr for bad input.
     *
     * @param args see {@code --help}
     */
    public static void main(String[] args) {
        ConsoleLogging.applyDefaults();
        CommandLine cli = OneLineErrors.install(new CommandLine(new LinearRegressionTraining()));
        System.exit(cli.execute(args));
    }
}
