package dev.gradbridge.cli;

import dev.gradbridge.History;
import dev.gradbridge.HistoryFile;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.RunSettings;
import dev.gradbridge.internal.RunStart;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Map;
import picocli.CommandLine.Option;

/**
 * The command-line options of every training command ({@code gradbridge-train},
 * {@code gradbridge-spark-train}): a picocli mixin that fills a trainer's {@link RunSettings}.
 */
public final class RunOptions {

    @Option(names = "--model", description = "exported training module (.pt)")
    private Path model;

    @Option(names = "--resume", description = "continue the run saved in this checkpoint (instead of --model)")
    private Path resume;

    @Option(names = "--epochs", defaultValue = "" + Protocol.DEFAULT_EPOCHS,
            description = "epochs to train now (default: ${DEFAULT-VALUE})")
    private int epochs;

    @Option(names = "--batch-size",
            description = "samples per optimizer step, over all partitions on Spark (default "
                    + Protocol.DEFAULT_BATCH_SIZE + ", or the checkpoint's)")
    private Integer batchSize;

    @Option(names = "--seed", description = "run seed: the batch order and torch seed per epoch (default "
            + Protocol.DEFAULT_SEED + ", or the checkpoint's)")
    private Long seed;

    @Option(names = "--allow-different-data",
            description = "resume on data other than the checkpoint's run was trained on")
    private boolean allowDifferentData;

    @Option(names = "--history",
            description = "write the per-epoch history here (JSON Lines; a model of over a million parameter values "
                    + "keeps them in FILE.values)")
    private Path history;

    @Option(names = "--checkpoint", description = "save the module with its optimizer state here after every epoch")
    private Path checkpoint;

    @Option(names = "--digests-only", description = "record parameter digests, not values, in the history")
    private boolean digestsOnly;

    /** @return the module to load: {@code --resume}'s checkpoint or {@code --model} (exactly one given) */
    public Path module() {
        if ((model == null) == (resume == null)) {
            throw new InvalidInputException("give exactly one of --model and --resume");
        }
        return resume != null ? resume : model;
    }

    /**
     * With {@code --resume}: refuses, in one line, a file that is not a whole checkpoint of a run
     * ({@link RunStart#checkResumable}); reads only its metadata. Without it, nothing to check.
     *
     * @param digestKeys the checkpoint keys that name the run's data, any one of them enough
     */
    public void checkResume(String... digestKeys) {
        if (resume != null) {
            RunStart.checkResumable(resume, Metadata.read(resume).getCheckpoint(), allowDifferentData, digestKeys);
        }
    }

    /** @return {@code --checkpoint}, or {@code null} */
    public Path checkpoint() {
        return checkpoint;
    }

    /**
     * @param builder a trainer's builder
     * @param <B> its type
     * @return {@code builder}, given these options (the unset ones left to the checkpoint or default)
     */
    public <B extends RunSettings.Builder<B>> B apply(B builder) {
        builder.optEpochs(epochs)
                .optAllowDifferentData(allowDifferentData)
                .optCheckpoint(checkpoint)
                .optHistory(history)
                .optRecordValues(!digestsOnly && history != null); // values only where they are written
        if (batchSize != null) {
            builder.optBatchSize(batchSize);
        }
        if (seed != null) {
            builder.optSeed(seed);
        }
        return builder;
    }

    /**
     * Refuses, before anything is read or written, outputs that would overwrite an input or each other:
     * {@code --history} (and its values file), {@code --checkpoint} against each other and against the
     * named inputs (a checkpoint over the module it resumes is fine: it is replaced whole, atomically).
     *
     * @param inputs option name to file, e.g. {@code --data} to the training data (null values are skipped)
     * @throws InvalidInputException naming both options and the file
     */
    public void checkOutputs(Map<String, Path> inputs) {
        Map<String, Path> outputs = new LinkedHashMap<>();
        outputs.put("--history", history);
        outputs.put("--history's values file", history == null ? null : new HistoryFile(history).valuesPath());
        outputs.put("--checkpoint", checkpoint);
        Map<String, Path> seen = new LinkedHashMap<>(inputs);
        for (Map.Entry<String, Path> output : outputs.entrySet()) {
            if (output.getValue() == null) {
                continue;
            }
            for (Map.Entry<String, Path> other : seen.entrySet()) {
                if (other.getValue() != null && same(output.getValue(), other.getValue())) {
                    throw new InvalidInputException(output.getKey() + " " + output.getValue() + " is the same file as "
                            + other.getKey() + " " + other.getValue() + ": writing it would overwrite that; give another file");
                }
            }
            seen.put(output.getKey(), output.getValue());
        }
    }

    private static boolean same(Path a, Path b) {
        if (a.toAbsolutePath().normalize().equals(b.toAbsolutePath().normalize())) {
            return true;
        }
        try {
            return Files.exists(a) && Files.exists(b) && Files.isSameFile(a, b); // links
        } catch (IOException e) {
            return false;
        }
    }

    /**
     * Prints where a finished run's files are.
     *
     * @param result the run's history
     */
    public void printOutputs(History result) {
        if (history != null) {
            System.out.println("history: " + history.toAbsolutePath());
            Path values = new HistoryFile(history).valuesPath();
            if (!result.getRecords().isEmpty() && HistoryFile.valuesAside(result.getRecords().get(0))) {
                System.out.println("history values: " + values.toAbsolutePath() + " (over "
                        + HistoryFile.INLINE_VALUES_LIMIT + " values per epoch: float64, where each line's \"values\" says)");
            }
        }
        if (checkpoint != null && !result.getRecords().isEmpty()) {
            System.out.println("checkpoint: " + checkpoint.toAbsolutePath());
        }
    }
}
