package dev.gradbridge.online;

import dev.gradbridge.Protocol;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * The options of an {@link OnlineLearner}, each with its default ({@link OnlineLearner#builder}),
 * and {@link #open}, which assembles and starts the learner.
 */
public final class OnlineLearnerBuilder {

    /** Predictor copies when not set, on a machine with at least as many cores. */
    public static final int DEFAULT_PREDICTORS = 2;
    /** Published versions kept for rollbacks when not set (with a publish gate). */
    public static final int DEFAULT_KEEP_VERSIONS = 8;
    /** Most published versions a learner may keep. */
    public static final int MAX_KEEP_VERSIONS = 10_000;
    /** Largest absolute value of a floating-point input when not set ({@link #optMaxInputAbs}). */
    public static final double DEFAULT_MAX_INPUT_ABS = 1e6;
    /** Largest micro-batch when not set ({@link #optMaxBatch}). */
    public static final int DEFAULT_MAX_BATCH = 32;
    /** Micro-batch wait in ms when not set ({@link #optMaxWaitMillis}). */
    public static final long DEFAULT_MAX_WAIT_MILLIS = 10;
    /** Updates per published version when not set ({@link #optPublishEvery}). */
    public static final int DEFAULT_PUBLISH_EVERY = 1;
    /** Versions per checkpoint when not set ({@link #optCheckpointEvery}). */
    public static final int DEFAULT_CHECKPOINT_EVERY = 100;
    /** Events waiting before a refusal when not set ({@link #optQueueCapacity}). */
    public static final int DEFAULT_QUEUE_CAPACITY = 10_000;
    /** The log's fsync policy when not set ({@link #optFsync}), as {@link FsyncPolicy#parse} reads it. */
    public static final String DEFAULT_FSYNC = "always";
    /** Group commit window in ms when not set ({@link #optGroupCommitMillis}). */
    public static final long DEFAULT_GROUP_COMMIT_MILLIS = 2;
    /** The run's seed when not set ({@link #optSeed}): a trainer's, {@link Protocol#DEFAULT_SEED}. */
    public static final long DEFAULT_SEED = Protocol.DEFAULT_SEED;
    /** Gradient norm limit when not set ({@link #optMaxGradNorm}): 0, no limit. */
    public static final double DEFAULT_MAX_GRAD_NORM = 0;
    /** The publish gate's largest rise of the gate loss when not given (gradbridge-serve): 0, no worse. */
    public static final double DEFAULT_GATE_MAX_REGRESSION = 0;
    /** What a held-back version does when not set ({@link #optGateOnHold}), as {@link HoldPolicy#parse} reads. */
    public static final String DEFAULT_GATE_ON_HOLD = "continue";

    /** @return predictor copies when not set: {@value #DEFAULT_PREDICTORS}, at most the cores */
    public static int defaultPredictors() {
        return Math.max(1, Math.min(DEFAULT_PREDICTORS, Runtime.getRuntime().availableProcessors()));
    }

    int maxBatch = DEFAULT_MAX_BATCH;
    long maxWaitMillis = DEFAULT_MAX_WAIT_MILLIS;
    int publishEvery = DEFAULT_PUBLISH_EVERY;
    int checkpointEvery = DEFAULT_CHECKPOINT_EVERY;
    int queueCapacity = DEFAULT_QUEUE_CAPACITY;
    int predictors = defaultPredictors();
    FsyncPolicy fsync = FsyncPolicy.parse(DEFAULT_FSYNC);
    long groupCommitMillis = DEFAULT_GROUP_COMMIT_MILLIS;
    double maxGradNorm = DEFAULT_MAX_GRAD_NORM;
    boolean validateTargets = true;
    boolean timePhases;
    List<Path> opLibraries = Collections.emptyList();
    Path gateData;
    double gateMaxRegression = DEFAULT_GATE_MAX_REGRESSION;
    HoldPolicy gateOnHold = HoldPolicy.parse(DEFAULT_GATE_ON_HOLD);
    int keepVersions = DEFAULT_KEEP_VERSIONS;
    double maxInputAbs = DEFAULT_MAX_INPUT_ABS;
    long seed = DEFAULT_SEED;

    OnlineLearnerBuilder() {}

    /**
     * @param seed the run's seed, kept in a new log's header (a log resumes with its own): a module
     *     that draws random numbers (dropout) draws each micro-batch's from libtorch's generator seeded
     *     from it and the micro-batch's first event's sequence number, so the replay draws the same;
     *     default {@value #DEFAULT_SEED}
     * @return this
     */
    public OnlineLearnerBuilder optSeed(long seed) {
        this.seed = seed;
        return this;
    }

    /**
     * A publish gate: a version is published to predictors only when its loss on {@code data}
     * (the module's {@code evaluate}, in eval mode, on the whole file at once) is at most the
     * serving version's plus {@code maxRegression}; otherwise it is held back (logged with both
     * losses, counted) and training continues, or returns to the serving version ({@link
     * #optGateOnHold}). Checked at open: the file must fit the module and give a finite loss.
     * Kept in the log's header (a restart with another gate is refused). Each version costs one
     * {@code evaluate} of the data on the training thread: a large file slows learning.
     *
     * @param data an {@code .npz} of the training data's format (x, or one array per input, and y)
     * @param maxRegression the largest rise of the gate loss a published version may have, >= 0
     * @return this
     */
    public OnlineLearnerBuilder optGate(Path data, double maxRegression) {
        if (!(maxRegression >= 0) || Double.isInfinite(maxRegression)) {
            throw new InvalidInputException("--gate-max-regression must be a finite number >= 0, got " + maxRegression);
        }
        this.gateData = data;
        this.gateMaxRegression = maxRegression;
        return this;
    }

    /**
     * @param policy what a held-back version does to the learner (default {@value #DEFAULT_GATE_ON_HOLD})
     * @return this
     */
    public OnlineLearnerBuilder optGateOnHold(HoldPolicy policy) {
        this.gateOnHold = policy;
        return this;
    }

    /**
     * @param versions published versions kept (the serving one included) for {@link
     *     OnlineLearner#rollback}, default {@value #DEFAULT_KEEP_VERSIONS}; each holds its
     *     parameters, and under {@link HoldPolicy#ROLLBACK} a copy of the learner
     * @return this
     */
    public OnlineLearnerBuilder optKeepVersions(int versions) {
        if (versions < 1 || versions > MAX_KEEP_VERSIONS) {
            throw new InvalidInputException("--keep-versions must be in 1.." + MAX_KEEP_VERSIONS + ", got " + versions);
        }
        this.keepVersions = versions;
        return this;
    }

    /**
     * @param limit refuse feedback and predictions whose floating-point inputs hold a value of
     *     larger magnitude (finite but absurd features can ruin a model in one update), default
     *     {@value #DEFAULT_MAX_INPUT_ABS}; 0 for no limit. Integer inputs (ids) are
     *     the model's to check (an embedding's range).
     * @return this
     */
    public OnlineLearnerBuilder optMaxInputAbs(double limit) {
        if (!(limit >= 0) || Double.isInfinite(limit)) {
            throw new InvalidInputException("--max-input-abs must be a finite number >= 0 (0: no limit), got " + limit);
        }
        this.maxInputAbs = limit;
        return this;
    }

    /**
     * @param libraries custom-operator libraries the module calls, loaded before it (as
     *     {@link TrainingModule#load(Path, List)}); default none
     * @return this
     */
    public OnlineLearnerBuilder optOpLibraries(List<Path> libraries) {
        this.opLibraries = new ArrayList<>(libraries);
        return this;
    }

    /**
     * @param time record where the time goes, per phase ({@link OnlineLearner#phaseTimes}),
     *     for benchmarks and debugging; default false
     * @return this
     */
    public OnlineLearnerBuilder optTimePhases(boolean time) {
        this.timePhases = time;
        return this;
    }

    /**
     * @param events largest micro-batch (B), default 32
     * @return this
     */
    public OnlineLearnerBuilder optMaxBatch(int events) {
        this.maxBatch = positive("max batch", events);
        return this;
    }

    /**
     * @param millis longest wait for a micro-batch to fill after its first event (T), default
     *     10; 0 takes what is queued
     * @return this
     */
    public OnlineLearnerBuilder optMaxWaitMillis(long millis) {
        if (millis < 0) {
            throw new InvalidInputException("max wait must be >= 0 ms, got " + millis);
        }
        this.maxWaitMillis = millis;
        return this;
    }

    /**
     * @param updates publish a version every this many micro-batches (N), default 1
     * @return this
     */
    public OnlineLearnerBuilder optPublishEvery(int updates) {
        this.publishEvery = positive("publish every", updates);
        return this;
    }

    /**
     * @param versions write a checkpoint every this many versions (K), default 100
     * @return this
     */
    public OnlineLearnerBuilder optCheckpointEvery(int versions) {
        this.checkpointEvery = positive("checkpoint every", versions);
        return this;
    }

    /**
     * @param events most events waiting for training; more feedback is refused, default 10000
     * @return this
     */
    public OnlineLearnerBuilder optQueueCapacity(int events) {
        this.queueCapacity = positive("queue capacity", events);
        return this;
    }

    /**
     * @param count predictor copies of the module, i.e. predictions that run at once (default
     *     {@link #defaultPredictors()})
     * @return this
     */
    public OnlineLearnerBuilder optPredictors(int count) {
        this.predictors = positive("predictors", count);
        return this;
    }

    /**
     * @param policy when the log is forced to disk, default {@link FsyncPolicy#ALWAYS}
     * @return this
     */
    public OnlineLearnerBuilder optFsync(FsyncPolicy policy) {
        this.fsync = policy;
        return this;
    }

    /**
     * @param millis under {@link FsyncPolicy#ALWAYS}, the longest a new version waits before
     *     the fsync that makes it durable and publishes it (group commit: one fsync covers the
     *     micro-batches applied meanwhile, and training does not wait for it), default 2; 0
     *     forces as soon as a version is logged. Predictions lag training by at most this plus
     *     one fsync. Feedback is still acknowledged only once its events are durable.
     * @return this
     */
    public OnlineLearnerBuilder optGroupCommitMillis(long millis) {
        if (millis < 0) {
            throw new InvalidInputException("group commit must be >= 0 ms, got " + millis);
        }
        this.groupCommitMillis = millis;
        return this;
    }

    /**
     * @param norm quarantine micro-batches whose gradient L2 norm exceeds this (see {@link
     *     UpdateGuard} for the trade-off); 0 (the default) for no limit. Non-finite losses and
     *     gradients are always quarantined. Kept in the log's header.
     * @return this
     */
    public OnlineLearnerBuilder optMaxGradNorm(double norm) {
        if (!(norm >= 0) || Double.isInfinite(norm)) {
            throw new InvalidInputException("max grad norm must be a finite number >= 0, got " + norm);
        }
        this.maxGradNorm = norm;
        return this;
    }

    /**
     * @param validate run the loss on a predictor before accepting feedback, so that e.g. a
     *     class index out of range is refused instead of failing training later (default true)
     * @return this
     */
    public OnlineLearnerBuilder optValidateTargets(boolean validate) {
        this.validateTargets = validate;
        return this;
    }

    private static int positive(String what, int value) {
        if (value < 1) {
            throw new InvalidInputException(what + " must be >= 1, got " + value);
        }
        return value;
    }

    /**
     * Loads the module, opens (or resumes) the log in {@code logDir} and starts training.
     *
     * @param modelPath the exported training module
     * @param logDir the log folder: created when missing, resumed when it holds a log
     * @return the running learner
     * @throws IOException when the log folder cannot be read or written
     * @throws LogCorruptException when the log or checkpoint does not fit the module or itself
     */
    public OnlineLearner open(Path modelPath, Path logDir) throws IOException {
        return new OnlineLearner(Assembly.assemble(modelPath.toAbsolutePath(), logDir.toAbsolutePath(), this));
    }
}
