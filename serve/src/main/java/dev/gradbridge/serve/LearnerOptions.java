package dev.gradbridge.serve;

import dev.gradbridge.GradbridgeException;
import dev.gradbridge.online.FsyncPolicy;
import dev.gradbridge.online.HoldPolicy;
import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.OnlineLearnerBuilder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import picocli.CommandLine.Option;

/**
 * The online learner's options of {@code gradbridge-serve} (a picocli mixin of {@link ServeCommand}):
 * their defaults are {@link OnlineLearnerBuilder}'s, {@link ServeCommand} checks them among its own
 * before anything is created, and {@link #builder} hands them to the learner.
 */
final class LearnerOptions {

    /** Largest --max-batch (its rows are one buffer per input) and --queue-capacity (events held in memory). */
    static final int MAX_BATCH = 1_000_000;
    static final int MAX_EVENTS = 10_000_000;
    static final int MAX_PREDICTORS = 256;

    @Option(names = "--max-batch", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_MAX_BATCH, description = "largest micro-batch B (default ${DEFAULT-VALUE})")
    int maxBatch;

    @Option(names = "--max-wait-ms", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_MAX_WAIT_MILLIS, description = "micro-batch wait T in ms (default ${DEFAULT-VALUE})")
    long maxWaitMillis;

    @Option(names = "--publish-every", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_PUBLISH_EVERY, description = "a version every N updates (default ${DEFAULT-VALUE})")
    int publishEvery;

    @Option(names = "--checkpoint-every", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_CHECKPOINT_EVERY, description = "a checkpoint every K versions (default ${DEFAULT-VALUE})")
    int checkpointEvery;

    @Option(names = "--queue-capacity", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_QUEUE_CAPACITY, description = "events waiting before 429 (default ${DEFAULT-VALUE})")
    int queueCapacity;

    @Option(names = "--predictors",
            description = "concurrent predictions (default " + OnlineLearnerBuilder.DEFAULT_PREDICTORS + ", at most the cores)")
    Integer predictors; // null: the learner's default

    @Option(names = "--fsync", defaultValue = OnlineLearnerBuilder.DEFAULT_FSYNC, description = "always or never (default ${DEFAULT-VALUE})")
    String fsync;

    @Option(names = "--group-commit-ms", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_GROUP_COMMIT_MILLIS,
            description = "with --fsync always, the longest a new version waits for the fsync that publishes it;"
                    + " one fsync covers the micro-batches applied meanwhile (default ${DEFAULT-VALUE})")
    long groupCommitMillis;

    @Option(names = "--max-grad-norm", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_MAX_GRAD_NORM,
            description = "quarantine updates whose gradient norm exceeds this; 0: no limit (default ${DEFAULT-VALUE})")
    double maxGradNorm;

    @Option(names = "--seed", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_SEED,
            description = "the run's seed, kept in a new log's header: a model with dropout draws each micro-batch's"
                    + " from it and the micro-batch's first event, so the replay draws the same (default ${DEFAULT-VALUE})")
    long seed;

    @Option(names = "--gate-data", paramLabel = "FILE",
            description = "publish gate: a version is published only when its loss on this .npz (the training data's"
                    + " format; evaluate, eval mode) is at most the serving version's plus --gate-max-regression")
    Path gateData;

    @Option(names = "--gate-max-regression", paramLabel = "X",
            description = "the largest rise of the gate loss a published version may have (default 0: no worse)")
    Double gateMaxRegression; // null: not given

    @Option(names = "--gate-on-hold", paramLabel = "POLICY",
            description = "continue (training goes on from a held-back version) or rollback (the learner returns to the"
                    + " serving version: parameters and optimizer state); default continue")
    String gateOnHold;

    @Option(names = "--keep-versions", paramLabel = "N",
            description = "published versions kept in memory for POST /admin/rollback (default "
                    + OnlineLearnerBuilder.DEFAULT_KEEP_VERSIONS + ")")
    Integer keepVersions;

    @Option(names = "--max-input-abs", paramLabel = "A",
            description = "refuse feedback and predictions with a floating-point feature of larger magnitude (400);"
                    + " 0: no limit (default ${DEFAULT-VALUE})", defaultValue = "" + OnlineLearnerBuilder.DEFAULT_MAX_INPUT_ABS)
    double maxInputAbs;

    @Option(names = "--op-library", paramLabel = "FILE",
            description = "custom-operator library the module calls, loaded before it (repeatable)")
    List<Path> opLibraries = new ArrayList<>();

    /** The learner's ranges. */
    void checkRanges() {
        ServeCommand.range("--max-batch", maxBatch, 1, MAX_BATCH);
        ServeCommand.range("--max-wait-ms", maxWaitMillis, 0, ServeCommand.HOUR_MS);
        ServeCommand.range("--publish-every", publishEvery, 1, Integer.MAX_VALUE);
        ServeCommand.range("--checkpoint-every", checkpointEvery, 1, Integer.MAX_VALUE);
        ServeCommand.range("--queue-capacity", queueCapacity, 1, MAX_EVENTS);
        if (predictors != null) {
            ServeCommand.range("--predictors", predictors, 1, MAX_PREDICTORS);
        }
        ServeCommand.range("--group-commit-ms", groupCommitMillis, 0, ServeCommand.HOUR_MS);
    }

    /** The gate's options only with its data, and its data a file. */
    void checkGate() {
        if (gateData == null && (gateMaxRegression != null || gateOnHold != null || keepVersions != null)) {
            throw new GradbridgeException((gateMaxRegression != null ? "--gate-max-regression" : gateOnHold != null
                    ? "--gate-on-hold" : "--keep-versions") + " needs --gate-data (the data versions are gated on)");
        }
        if (gateData != null && !Files.isRegularFile(gateData)) {
            throw new GradbridgeException("--gate-data " + gateData.toAbsolutePath() + ": no such file");
        }
    }

    /** Every --op-library a file. */
    void checkLibraries() {
        for (Path library : opLibraries) {
            if (!Files.isRegularFile(library)) {
                throw new GradbridgeException("--op-library " + library.toAbsolutePath() + ": no such file");
            }
        }
    }

    /** @return the learner's options set from these; a value the builder refuses is one line */
    OnlineLearnerBuilder builder() {
        OnlineLearnerBuilder builder;
        try {
            builder = OnlineLearner.builder().optMaxBatch(maxBatch).optMaxWaitMillis(maxWaitMillis)
                    .optPublishEvery(publishEvery).optCheckpointEvery(checkpointEvery).optQueueCapacity(queueCapacity)
                    .optFsync(FsyncPolicy.parse(fsync)).optGroupCommitMillis(groupCommitMillis)
                    .optMaxGradNorm(maxGradNorm).optMaxInputAbs(maxInputAbs).optSeed(seed);
            if (predictors != null) {
                builder.optPredictors(predictors);
            }
            if (gateData != null) {
                builder.optGate(gateData, gateMaxRegression == null
                                ? OnlineLearnerBuilder.DEFAULT_GATE_MAX_REGRESSION : gateMaxRegression)
                        .optGateOnHold(HoldPolicy.parse(gateOnHold == null
                                ? OnlineLearnerBuilder.DEFAULT_GATE_ON_HOLD : gateOnHold));
                if (keepVersions != null) {
                    builder.optKeepVersions(keepVersions);
                }
            }
        } catch (IllegalArgumentException e) {
            throw new GradbridgeException(e.getMessage());
        }
        return builder.optOpLibraries(opLibraries);
    }
}
