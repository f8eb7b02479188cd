package dev.gradbridge.cli;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.RunStart;
import dev.gradbridge.DivergenceException;
import dev.gradbridge.History;
import dev.gradbridge.Protocol;
import dev.gradbridge.Trainer;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.data.Dataset;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Locale;
import java.util.concurrent.Callable;
import picocli.CommandLine;
import picocli.CommandLine.ArgGroup;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;

/**
 * {@code gradbridge-train}: train any exported module on data files from the command line.
 *
 * <p>Every input is checked before training starts; any bad input ends the program with exit
 * code 1 and one line on stderr, and writes nothing.
 */
@Command(
        name = "gradbridge-train",
        mixinStandardHelpOptions = true,
        description = "Train an exported gradbridge module on .npz/.npy data with the Java Trainer.")
public final class TrainCommand implements Callable<Integer> {

    @Mixin
    private RunOptions run;

    @Option(names = "--op-library", paramLabel = "FILE",
            description = "load this custom-operator library before the module (repeatable)")
    private List<Path> opLibraries = new ArrayList<>();

    @ArgGroup(exclusive = true, multiplicity = "1")
    private Data data;

    static final class Data {
        @Option(names = "--data", required = true, description = ".npz with arrays x and y")
        Path npz;

        @ArgGroup(exclusive = false)
        NpyPair npy;
    }

    static final class NpyPair {
        @Option(names = "--x", required = true, description = "inputs as .npy")
        Path x;

        @Option(names = "--y", required = true, description = "targets as .npy")
        Path y;
    }

    @Option(names = "--val", description = ".npz with validation arrays x and y")
    private Path validation;

    @Option(names = "--mode", description = "full, step or fused (default " + Protocol.DEFAULT_MODE + ", or the checkpoint's)")
    private String mode;

    @Option(names = "--device", defaultValue = "cpu",
            description = "train on cpu, cuda or cuda:N (default: ${DEFAULT-VALUE}); on CUDA with libtorch's"
                    + " deterministic algorithms")
    private String device;

    @Option(names = "--progress", negatable = true,
            description = "show a progress bar (default: when the console is a terminal)")
    private Boolean progress;

    @Override
    public Integer call() throws IOException {
        Path modelFile = run.module();
        Map<String, Path> inputs = new LinkedHashMap<>();
        inputs.put("--data", data.npz);
        inputs.put("--x", data.npy == null ? null : data.npy.x);
        inputs.put("--y", data.npy == null ? null : data.npy.y);
        inputs.put("--val", validation);
        for (Path library : opLibraries) {
            inputs.put("--op-library", library);
        }
        run.checkOutputs(inputs);
        run.checkResume(RunStart.DATA_SHA256);
        Trainer.Mode trainingMode = mode == null ? null : Trainer.Mode.parse(mode);
        try (TrainingModule module = TrainingModule.load(modelFile, opLibraries, device);
                Dataset train = data.npz != null
                        ? Dataset.loadNpz(data.npz)
                        : Dataset.loadNpy(data.npy.x, data.npy.y);
                Dataset val = validation == null ? null : Dataset.loadNpz(validation)) {
            Trainer.Builder builder =
                    run.apply(Trainer.builder())
                            .optValidation(val)
                            .optProgressBar(progress != null ? progress : System.console() != null);
            if (trainingMode != null) {
                builder.optMode(trainingMode);
            }
            Trainer trainer = builder.build();
            StopSignals.install(trainer);
            History result;
            try {
                result = trainer.fit(module, train);
            } catch (DivergenceException e) {
                printEpochs(e.getHistory()); // the epochs before the divergent one are kept
                throw e;
            }
            printEpochs(result);
            run.printOutputs(result);
            if (trainer.wasStopped()) {
                System.err.println(
                        Messages.ERROR_PREFIX + StopSignals.received() + " received: stopped after epoch "
                                + last(result) + (run.checkpoint() == null ? "" : "; resume with --resume " + run.checkpoint()));
                return StopSignals.exitCode();
            }
        }
        return 0;
    }

    private static String last(History result) {
        List<History.EpochRecord> records = result.getRecords();
        return records.isEmpty() ? "none" : String.valueOf(records.get(records.size() - 1).getEpoch());
    }

    private static void printEpochs(History result) {
        for (History.EpochRecord record : result.getRecords()) {
            System.out.printf(
                    Locale.ROOT, "epoch %d: loss %.6g%s%n", record.getEpoch(), record.getLoss(),
                    record.getValLoss() == null ? "" : String.format(Locale.ROOT, ", validation %.6g", record.getValLoss()));
        }
    }

    /**
     * Runs the command; exit code 0 on success, 1 with one line on stderr on bad input.
     *
     * @param args see {@code --help}
     */
    public static void main(String[] args) {
        ConsoleLogging.applyDefaults();
        System.exit(execute(args));
    }

    static int execute(String... args) {
        CommandLine cli = OneLineErrors.install(new CommandLine(new TrainCommand()));
        return cli.execute(args);
    }
}
