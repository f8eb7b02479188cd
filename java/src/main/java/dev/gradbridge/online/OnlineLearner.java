package dev.gradbridge.online;

import dev.gradbridge.internal.Digests;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.internal.Messages;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

/**
 * Serves predictions while it learns from feedback: one exported training module, one training
 * thread, a write-ahead log ({@link LogFormat}), published versions.
 *
 * <ul>
 *   <li>{@link #learn} (any thread) validates the feedback, appends one event per row to the log
 *       in one write (all or nothing), forces it to disk as the {@link FsyncPolicy} says and
 *       queues it. The queue is bounded: when it is full the call throws {@link
 *       QueueFullException} and nothing is logged. A request may carry an idempotency key, kept in
 *       the log: a retry with the same key is answered with the first request's events and
 *       applies nothing again, across restarts.
 *   <li>The training thread takes events in arrival (log) order as micro-batches of up to {@code
 *       maxBatch} events, waiting at most {@code maxWaitMillis} after the first, logs the
 *       micro-batch, computes its loss and gradients and applies the exported optimizer's step
 *       unless the {@link UpdateGuard} refuses (a loss or gradient that is not finite, or above the
 *       optional norm limit): then the micro-batch is quarantined in the log with its reason.
 *   <li>Every {@code publishEvery} updates it snapshots the parameters into a new {@link
 *       ModelVersion}, logs the version with its digests and publishes it with one volatile
 *       write; every {@code checkpointEvery} versions it writes a checkpoint ({@link Checkpoints}).
 *   <li>{@link #predict} (any thread) runs {@code forward} on a predictor: a separate copy of the
 *       module whose parameters are set from the whole snapshot of the current version. Predictions
 *       never touch the training module, so they never see a half-applied step.
 * </ul>
 *
 * <p>Opening a log folder locks it and reads the whole log strictly before writing anything: a
 * damaged record, a log that contradicts the checkpoint, or a log or checkpoint of another model
 * refuses to start ({@link LogCorruptException}, naming the file and offset), changing nothing.
 * Only an incomplete last record (a torn tail) is cut. Then the last checkpoint is loaded, the
 * logged micro-batches after it are applied again exactly as logged (each logged version's digests
 * are checked) and the events acknowledged but not yet applied are queued again: bitwise the state
 * of a run that never stopped, which {@code gradbridge replay} reproduces with eager PyTorch.
 *
 * <p>The parts, one job each: {@link Builder} (options), {@link Recovery} (opening a log folder),
 * {@link Ingest} and {@link FeedbackQueue} (feedback in), {@link MicroBatcher} and {@link Updater}
 * (the training thread), {@link Publisher} (versions and checkpoints), {@link PredictorPool}
 * (predictions).
 *
 * <p>Buffers that training changes (BatchNorm's running statistics) are part of every version, with
 * the parameters; constant buffers stay as the module file has them. A module that draws random
 * numbers (dropout) draws each micro-batch's from libtorch's generator seeded from the log's seed
 * and the micro-batch's first event ({@link Builder#optSeed}); predictors stay in eval mode and draw
 * nothing. Modules with gradient accumulation are refused.
 */
public final class OnlineLearner implements AutoCloseable {

    /** The online checkpoint's descriptor in the log folder. */
    public static final String CHECKPOINT_FILE = Checkpoints.FILE;
    /** Predictor copies when not set, on a machine with at least as many cores. */
    public static final int DEFAULT_PREDICTORS = 2;
    /** Longest idempotency key. */
    public static final int MAX_KEY_LENGTH = Ingest.MAX_KEY_LENGTH;
    /** Published versions kept for rollbacks when not set (with a publish gate). */
    public static final int DEFAULT_KEEP_VERSIONS = 8;
    /** Most published versions a learner may keep. */
    public static final int MAX_KEEP_VERSIONS = 10_000;
    /** Largest absolute value of a floating-point input when not set ({@link Builder#optMaxInputAbs}). */
    public static final double DEFAULT_MAX_INPUT_ABS = 1e6;
    /** Largest micro-batch when not set ({@link Builder#optMaxBatch}). */
    public static final int DEFAULT_MAX_BATCH = 32;
    /** Micro-batch wait in ms when not set ({@link Builder#optMaxWaitMillis}). */
    public static final long DEFAULT_MAX_WAIT_MILLIS = 10;
    /** Updates per published version when not set ({@link Builder#optPublishEvery}). */
    public static final int DEFAULT_PUBLISH_EVERY = 1;
    /** Versions per checkpoint when not set ({@link Builder#optCheckpointEvery}). */
    public static final int DEFAULT_CHECKPOINT_EVERY = 100;
    /** Events waiting before a refusal when not set ({@link Builder#optQueueCapacity}). */
    public static final int DEFAULT_QUEUE_CAPACITY = 10_000;
    /** The log's fsync policy when not set ({@link Builder#optFsync}), as {@link FsyncPolicy#parse} reads it. */
    public static final String DEFAULT_FSYNC = "always";
    /** Group commit window in ms when not set ({@link Builder#optGroupCommitMillis}). */
    public static final long DEFAULT_GROUP_COMMIT_MILLIS = 2;
    /** The run's seed when not set ({@link Builder#optSeed}): a trainer's, {@link Protocol#DEFAULT_SEED}. */
    public static final long DEFAULT_SEED = Protocol.DEFAULT_SEED;
    /** Gradient norm limit when not set ({@link Builder#optMaxGradNorm}): 0, no limit. */
    public static final double DEFAULT_MAX_GRAD_NORM = 0;
    /** The publish gate's largest rise of the gate loss when not given (gradbridge-serve): 0, no worse. */
    public static final double DEFAULT_GATE_MAX_REGRESSION = 0;
    /** What a held-back version does when not set ({@link Builder#optGateOnHold}), as {@link HoldPolicy#parse} reads. */
    public static final String DEFAULT_GATE_ON_HOLD = "continue";

    private final Path logDir;
    private final Metadata metadata;
    private final Features features;
    private final LogWriter log;
    private final FeedbackQueue queue;
    private final Updater updater;
    private final Publisher publisher;
    private final PredictorPool predictors;
    private final Ingest ingest;
    private final Gate gate; // null: every version is published
    private final Thread trainer;
    private final AtomicLong quarantinedBatches = new AtomicLong();
    private final AtomicLong predictions = new AtomicLong();
    private final PhaseTimes phases; // null unless optTimePhases(true)

    /** @return predictor copies when not set: {@value #DEFAULT_PREDICTORS}, at most the cores */
    public static int defaultPredictors() {
        return Math.max(1, Math.min(DEFAULT_PREDICTORS, Runtime.getRuntime().availableProcessors()));
    }

    /** @return options with their defaults; {@link Builder#open} starts a learner */
    public static Builder builder() {
        return new Builder();
    }

    /** Options of an {@link OnlineLearner}. */
    public static final class Builder {
        private int maxBatch = DEFAULT_MAX_BATCH;
        private long maxWaitMillis = DEFAULT_MAX_WAIT_MILLIS;
        private int publishEvery = DEFAULT_PUBLISH_EVERY;
        private int checkpointEvery = DEFAULT_CHECKPOINT_EVERY;
        private int queueCapacity = DEFAULT_QUEUE_CAPACITY;
        private int predictors = defaultPredictors();
        private FsyncPolicy fsync = FsyncPolicy.parse(DEFAULT_FSYNC);
        private long groupCommitMillis = DEFAULT_GROUP_COMMIT_MILLIS;
        private double maxGradNorm = DEFAULT_MAX_GRAD_NORM;
        private boolean validateTargets = true;
        private boolean timePhases;
        private List<Path> opLibraries = Collections.emptyList();
        private Path gateData;
        private double gateMaxRegression = DEFAULT_GATE_MAX_REGRESSION;
        private HoldPolicy gateOnHold = HoldPolicy.parse(DEFAULT_GATE_ON_HOLD);
        private int keepVersions = DEFAULT_KEEP_VERSIONS;
        private double maxInputAbs = DEFAULT_MAX_INPUT_ABS;
        private long seed = DEFAULT_SEED;

        private Builder() {}

        /**
         * @param seed the run's seed, kept in a new log's header (a log resumes with its own): a module
         *     that draws random numbers (dropout) draws each micro-batch's from libtorch's generator seeded
         *     from it and the micro-batch's first event's sequence number, so the replay draws the same;
         *     default {@value OnlineLearner#DEFAULT_SEED}
         * @return this
         */
        public Builder optSeed(long seed) {
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
        public Builder optGate(Path data, double maxRegression) {
            if (!(maxRegression >= 0) || Double.isInfinite(maxRegression)) {
                throw new InvalidInputException("--gate-max-regression must be a finite number >= 0, got " + maxRegression);
            }
            this.gateData = data;
            this.gateMaxRegression = maxRegression;
            return this;
        }

        /**
         * @param policy what a held-back version does to the learner (default
         *     {@value OnlineLearner#DEFAULT_GATE_ON_HOLD})
         * @return this
         */
        public Builder optGateOnHold(HoldPolicy policy) {
            this.gateOnHold = policy;
            return this;
        }

        /**
         * @param versions published versions kept (the serving one included) for {@link
         *     OnlineLearner#rollback}, default {@value OnlineLearner#DEFAULT_KEEP_VERSIONS}; each holds its
         *     parameters, and under {@link HoldPolicy#ROLLBACK} a copy of the learner
         * @return this
         */
        public Builder optKeepVersions(int versions) {
            if (versions < 1 || versions > MAX_KEEP_VERSIONS) {
                throw new InvalidInputException("--keep-versions must be in 1.." + MAX_KEEP_VERSIONS + ", got " + versions);
            }
            this.keepVersions = versions;
            return this;
        }

        /**
         * @param limit refuse feedback and predictions whose floating-point inputs hold a value of
         *     larger magnitude (finite but absurd features can ruin a model in one update), default
         *     {@value OnlineLearner#DEFAULT_MAX_INPUT_ABS}; 0 for no limit. Integer inputs (ids) are
         *     the model's to check (an embedding's range).
         * @return this
         */
        public Builder optMaxInputAbs(double limit) {
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
        public Builder optOpLibraries(List<Path> libraries) {
            this.opLibraries = new ArrayList<>(libraries);
            return this;
        }

        /**
         * @param time record where the time goes, per phase ({@link OnlineLearner#phaseTimes}),
         *     for benchmarks and debugging; default false
         * @return this
         */
        public Builder optTimePhases(boolean time) {
            this.timePhases = time;
            return this;
        }

        /**
         * @param events largest micro-batch (B), default {@value OnlineLearner#DEFAULT_MAX_BATCH}
         * @return this
         */
        public Builder optMaxBatch(int events) {
            this.maxBatch = positive("max batch", events);
            return this;
        }

        /**
         * @param millis longest wait for a micro-batch to fill after its first event (T), default
         *     {@value OnlineLearner#DEFAULT_MAX_WAIT_MILLIS}; 0 takes what is queued
         * @return this
         */
        public Builder optMaxWaitMillis(long millis) {
            if (millis < 0) {
                throw new InvalidInputException("max wait must be >= 0 ms, got " + millis);
            }
            this.maxWaitMillis = millis;
            return this;
        }

        /**
         * @param updates publish a version every this many micro-batches (N), default
         *     {@value OnlineLearner#DEFAULT_PUBLISH_EVERY}
         * @return this
         */
        public Builder optPublishEvery(int updates) {
            this.publishEvery = positive("publish every", updates);
            return this;
        }

        /**
         * @param versions write a checkpoint every this many versions (K), default
         *     {@value OnlineLearner#DEFAULT_CHECKPOINT_EVERY}
         * @return this
         */
        public Builder optCheckpointEvery(int versions) {
            this.checkpointEvery = positive("checkpoint every", versions);
            return this;
        }

        /**
         * @param events most events waiting for training; more feedback is refused, default
         *     {@value OnlineLearner#DEFAULT_QUEUE_CAPACITY}
         * @return this
         */
        public Builder optQueueCapacity(int events) {
            this.queueCapacity = positive("queue capacity", events);
            return this;
        }

        /**
         * @param count predictor copies of the module, i.e. predictions that run at once (default
         *     {@link OnlineLearner#defaultPredictors()})
         * @return this
         */
        public Builder optPredictors(int count) {
            this.predictors = positive("predictors", count);
            return this;
        }

        /**
         * @param policy when the log is forced to disk, default {@value OnlineLearner#DEFAULT_FSYNC}
         * @return this
         */
        public Builder optFsync(FsyncPolicy policy) {
            this.fsync = policy;
            return this;
        }

        /**
         * @param millis under {@link FsyncPolicy#ALWAYS}, the longest a new version waits before
         *     the fsync that makes it durable and publishes it (group commit: one fsync covers the
         *     micro-batches applied meanwhile, and training does not wait for it), default
         *     {@value OnlineLearner#DEFAULT_GROUP_COMMIT_MILLIS}; 0
         *     forces as soon as a version is logged. Predictions lag training by at most this plus
         *     one fsync. Feedback is still acknowledged only once its events are durable.
         * @return this
         */
        public Builder optGroupCommitMillis(long millis) {
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
        public Builder optMaxGradNorm(double norm) {
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
        public Builder optValidateTargets(boolean validate) {
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
            return new OnlineLearner(modelPath, logDir, this);
        }
    }

    private OnlineLearner(Path modelPath, Path logDir, Builder options) throws IOException {
        modelPath = modelPath.toAbsolutePath();
        this.logDir = logDir.toAbsolutePath();
        this.phases = options.timePhases ? new PhaseTimes() : null;
        List<AutoCloseable> opened = new ArrayList<>();
        try {
            if (Files.isRegularFile(modelPath)) {
                String damage = ModuleArchives.problem(modelPath);
                if (damage != null) {
                    throw new InvalidInputException("training module " + modelPath + " " + damage);
                }
            }
            TrainingModule original = TrainingModule.load(modelPath, options.opLibraries);
            opened.add(original);
            this.metadata = original.getMetadata();
            checkSupported(modelPath, original);
            String modelSha256 = Digests.sha256Hex(modelPath);
            this.features = new Features(metadata);
            Metadata.TensorSpec ySpec = metadata.getInput("y");
            // Sized now, before the log folder is created: a B too large for its buffers is one line.
            ModuleCalls calls = new ModuleCalls(features, ySpec, options.maxBatch, Ingest.rowBytes(ySpec));
            LogHeader wanted = logHeader(metadata, modelSha256, options, features, ySpec).withSeed(options.seed);
            if (options.gateData != null) {
                this.gate = Gate.open(options.gateData, options.gateMaxRegression, options.gateOnHold, options.keepVersions,
                        original);
                opened.add(gate);
                wanted.withGate(gate.settings());
            } else {
                this.gate = null;
            }

            // Everything is read and checked before the first write: a refused start changes nothing.
            boolean hasLog = Recovery.checkUnlocked(this.logDir);
            Files.createDirectories(this.logDir);
            this.log = LogWriter.lock(this.logDir, options.fsync, !hasLog);
            opened.add(log);
            Recovery recovery = Recovery.read(this.logDir, log, wanted, modelSha256);
            TrainingModule training = original;
            if (recovery.checkpointModule() != null) {
                training = TrainingModule.load(recovery.checkpointModule(), options.opLibraries);
                opened.add(training);
                opened.remove(original);
                original.close();
            }
            this.updater = new Updater(training, calls, new UpdateGuard(options.maxGradNorm), phases, recovery.runSeed());
            this.predictors = new PredictorPool(modelPath, options.predictors);
            opened.add(predictors);
            this.queue = new FeedbackQueue(options.queueCapacity);
            this.publisher = new Publisher(this.logDir, log, queue, updater, modelSha256, options.publishEvery,
                    options.checkpointEvery, phases, gate);
            opened.add(publisher::close);
            List<Path> libraries = options.opLibraries;
            recovery.replay(updater, options.publishEvery, queue, publisher, quarantinedBatches,
                    file -> TrainingModule.load(file, libraries));
            log.startGroupCommit(options.groupCommitMillis, queue::fail);
            this.ingest = new Ingest(features, ySpec, options.queueCapacity, options.validateTargets ? predictors : null,
                    queue, log, queue::fail, phases, options.maxInputAbs);
        } catch (IOException | RuntimeException e) {
            for (int i = opened.size() - 1; i >= 0; i--) {
                try {
                    opened.get(i).close();
                } catch (Exception suppressed) {
                    e.addSuppressed(suppressed);
                }
            }
            if (e instanceof IOException && !(e instanceof FileSystemException)) {
                // A write to the log (e.g. "No space left on device"): say which file.
                FileSystemException named = new FileSystemException(LogReader.file(this.logDir).toString(), null,
                        e.getMessage());
                named.initCause(e);
                throw named;
            }
            throw e;
        }
        this.trainer = new Thread(new MicroBatcher(this.logDir, log, queue, updater, publisher, options.maxBatch,
                options.maxWaitMillis, quarantinedBatches, phases), "gradbridge-online-trainer");
        trainer.setDaemon(true);
        trainer.start();
    }

    /**
     * The header a new log gets: per-sample x and y; for a module of several inputs x is the raw
     * bytes of one event (each input's row in metadata order) and {@code inputs} says how they split.
     */
    private static LogHeader logHeader(Metadata metadata, String modelSha256, Builder options, Features features,
            Metadata.TensorSpec ySpec) {
        if (!features.named()) {
            Metadata.TensorSpec xSpec = features.specs().get(0);
            return new LogHeader(metadata.getModel(), modelSha256, options.publishEvery, options.maxGradNorm, 0, 0,
                    xSpec.getDtype(), Ingest.sampleShape(xSpec), ySpec.getDtype(), Ingest.sampleShape(ySpec));
        }
        LogHeader header = new LogHeader(metadata.getModel(), modelSha256, options.publishEvery, options.maxGradNorm, 0, 0,
                LogHeader.NAMED_INPUTS, new long[] {features.rowTotal()}, ySpec.getDtype(), Ingest.sampleShape(ySpec));
        List<LogHeader.InputSpec> inputs = new ArrayList<>();
        for (int i = 0; i < features.names().size(); i++) {
            inputs.add(new LogHeader.InputSpec(features.names().get(i), features.specs().get(i).getDtype(),
                    features.sampleShape(i)));
        }
        return header.withInputs(inputs);
    }

    /**
     * Modules with gradient accumulation are refused, modules whose trained buffers cannot be set on a predictor
     * (exported before {@code set_state}), and protocol-3 modules that cannot run a
     * batch of one (a micro-batch or a prediction may hold one event).
     */
    private static void checkSupported(Path modelPath, TrainingModule module) {
        if (module.getMetadata().getMinBatch() > 1) {
            throw new InvalidInputException(Messages.protocol3NoBatchOfOne(modelPath.toString(),
                    module.getMetadata().getMinBatch(), "online learning"));
        }
        if (!module.getMetadata().getTrainedBufferNames().isEmpty() && !module.getMethodNames().contains(Protocol.SET_STATE)) {
            throw new InvalidInputException(modelPath + " has buffers that training changes "
                    + module.getMetadata().getTrainedBufferNames() + " but no method " + Protocol.SET_STATE
                    + " (exported by an older gradbridge): export the model again");
        }
        Object accumulate = module.getMetadata().getFineTuning().get("accumulate");
        if (accumulate instanceof Number && ((Number) accumulate).intValue() > 1) {
            throw new InvalidInputException(modelPath + " accumulates gradients over " + accumulate
                    + " micro-batches; online learning applies one step per micro-batch (export without accumulate)");
        }
    }

    // ---- learning ----

    /**
     * Accepts feedback: one event per row of {@code x} and {@code y}, logged before this returns.
     *
     * @param x inputs, batch dimension first, matching the module's {@code x} spec
     * @param y targets, as many rows as {@code x}, matching the module's {@code y} spec
     * @return the sequence number of the first event (the others follow consecutively)
     * @throws InvalidInputException when x or y do not fit the module; nothing was logged
     * @throws QueueFullException when the queue has no room for every row; nothing was logged
     * @throws IllegalStateException when the learner is closing or training has failed
     * @throws UncheckedIOException when the log cannot be written; nothing was logged
     */
    public long learn(HostTensor x, HostTensor y) {
        return learn(x, y, null, 0, TimeUnit.NANOSECONDS);
    }

    /**
     * {@link #learn(HostTensor, HostTensor)} for a module of several inputs.
     *
     * @param x each of the module's inputs by name ({@link Metadata#getInputNames()}), batch dimension first
     * @param y targets, as many rows
     * @return the sequence number of the first event
     */
    public long learn(Map<String, HostTensor> x, HostTensor y) {
        return offer(x, y, null, 0, TimeUnit.NANOSECONDS).getFirstSeq();
    }

    /**
     * Like {@link #learn(HostTensor, HostTensor)}, but waits up to {@code timeout} for room in the
     * queue before refusing: back-pressure that blocks a producer inside the process.
     *
     * @param x inputs
     * @param y targets
     * @param timeout the longest wait for room (0: do not wait)
     * @param unit its unit
     * @return the sequence number of the first event
     */
    public long learn(HostTensor x, HostTensor y, long timeout, TimeUnit unit) {
        return learn(x, y, null, timeout, unit);
    }

    /**
     * Like {@link #learn(HostTensor, HostTensor)}, with an idempotency key: when a request with
     * the same key was accepted before (by this learner or one before it on the same log), nothing
     * is logged or applied again and its first sequence number is returned.
     *
     * @param x inputs
     * @param y targets
     * @param key 1 to {@value #MAX_KEY_LENGTH} visible ASCII characters, or null for none
     * @param timeout the longest wait for room (0: do not wait)
     * @param unit its unit
     * @return the sequence number of the (first request's) first event
     * @throws KeyConflictException when the key came with other x or y before; nothing was logged
     */
    public long learn(HostTensor x, HostTensor y, String key, long timeout, TimeUnit unit) {
        return offer(x, y, key, timeout, unit).getFirstSeq();
    }

    /**
     * Like {@link #learn(HostTensor, HostTensor, String, long, TimeUnit)}, and says whether the
     * request was this one's or answered from an earlier one with the same key (a retry): the
     * queue's own answer for this request, whatever other callers do meanwhile.
     *
     * @param x inputs
     * @param y targets
     * @param key 1 to {@value #MAX_KEY_LENGTH} visible ASCII characters, or null for none
     * @param timeout the longest wait for room (0: do not wait)
     * @param unit its unit
     * @return the request's events and whether it was a duplicate
     */
    public Receipt offer(HostTensor x, HostTensor y, String key, long timeout, TimeUnit unit) {
        return ingest.learn(features.single("learn", x), y, key, timeout, unit);
    }

    /**
     * {@link #offer(HostTensor, HostTensor, String, long, TimeUnit)} with the inputs by name: every
     * input of the module ({@code {x: tensor}} for a module of one input), each checked against its
     * spec; one that is missing, unknown or of another shape is refused naming it.
     *
     * @param x each input by name, batch dimension first, the same rows
     * @param y targets
     * @param key 1 to {@value #MAX_KEY_LENGTH} visible ASCII characters, or null for none
     * @param timeout the longest wait for room (0: do not wait)
     * @param unit its unit
     * @return the request's events and whether it was a duplicate
     */
    public Receipt offer(Map<String, HostTensor> x, HostTensor y, String key, long timeout, TimeUnit unit) {
        return ingest.learn(x, y, key, timeout, unit);
    }

    /** What became of one feedback request. */
    public static final class Receipt {
        private final long firstSeq;
        private final long events;
        private final boolean duplicate;

        Receipt(long firstSeq, long events, boolean duplicate) {
            this.firstSeq = firstSeq;
            this.events = events;
            this.duplicate = duplicate;
        }

        /** @return the sequence number of the (first request's) first event; the others follow consecutively */
        public long getFirstSeq() {
            return firstSeq;
        }

        /** @return the request's events (one per row) */
        public long getEvents() {
            return events;
        }

        /** @return whether the key was accepted before with this request, so nothing was logged again */
        public boolean isDuplicate() {
            return duplicate;
        }
    }

    // ---- learning from an external source (a Kafka topic) ----

    /**
     * Logs what one read of an external source gave, in one write with the source offsets it
     * consumed (a {@code P} record), and queues its events: exactly once, since a restart resumes
     * the source from {@link #sourcePositions} (the log), never from anywhere else. Each record is
     * checked as {@link #learn} checks a request; a record that fails (or whose key came with
     * other feedback before) is logged as refused, its offset consumed. A record whose key was
     * seen with the same feedback is a duplicate: nothing is applied again.
     *
     * @param source the source's name (the topic)
     * @param records the records read, in the order to learn them; offsets increasing per partition
     * @param ranges partition -> {from, to}: every offset the read consumed (records, and what lies
     *     between them such as transaction markers); {@code from} must be the partition's {@link
     *     #sourcePositions position} when the log has one
     * @param timeout the longest wait for room in the queue
     * @param unit its unit
     * @return events logged, duplicates, refusals
     * @throws IllegalArgumentException when the ranges leave a gap or overlap what the log holds
     * @throws QueueFullException when the queue has no room in time (nothing was logged)
     */
    public SourceResult learnFromSource(String source, List<SourceRecord> records, Map<Integer, long[]> ranges,
            long timeout, TimeUnit unit) {
        FeedbackQueue.SourcedResult done = ingest.learnSourced(source, records, ranges, timeout, unit);
        return new SourceResult(done.logged, done.duplicates, done.refusals);
    }

    /**
     * @param source the source's name (the topic)
     * @return partition -> the next offset to read, as the log says (empty: the log holds none)
     */
    public Map<Integer, Long> sourcePositions(String source) {
        return queue.positions(source);
    }

    /** @return source records refused since this learner opened (not feedback the module takes) */
    public long refusedSourceRecords() {
        return ingest.sourceRefused.get();
    }

    /** What became of one read of a source ({@link #learnFromSource}). */
    public static final class SourceResult {
        private final long events;
        private final long duplicates;
        private final List<String> refusals;

        SourceResult(long events, long duplicates, List<String> refusals) {
            this.events = events;
            this.duplicates = duplicates;
            this.refusals = Collections.unmodifiableList(refusals);
        }

        /** @return events logged and queued */
        public long getEvents() {
            return events;
        }

        /** @return events answered from earlier records with the same key (applied once) */
        public long getDuplicates() {
            return duplicates;
        }

        /** @return one line per refused record: "partition/offset: reason" */
        public List<String> getRefusals() {
            return refusals;
        }
    }

    // ---- prediction ----

    /**
     * Runs {@code forward(x)} on the current published version.
     *
     * @param x inputs, batch dimension first, matching the module's {@code x} spec
     * @return the output and the version that computed it
     * @throws InvalidInputException when x does not fit the module (shape, dtype, or a value the
     *     model refuses, e.g. an embedding id out of range)
     */
    public Prediction predict(HostTensor x) {
        return predict(features.single("predict", x));
    }

    /**
     * {@link #predict(HostTensor)} with the inputs by name (a module of several inputs, or {@code {x: tensor}}).
     *
     * @param x each input by name, batch dimension first, the same rows
     * @return the output and the version that computed it
     * @throws InvalidInputException when an input is missing, unknown or does not fit the module
     */
    public Prediction predict(Map<String, HostTensor> x) {
        ingest.checkPrediction(x);
        Prediction prediction = predictors.forward(publisher::current, x);
        predictions.incrementAndGet();
        return prediction;
    }

    // ---- publish gate and rollbacks ----

    /**
     * Returns predictions to an earlier published version, once that is in the log (so a restart
     * and the replay do the same); under {@link HoldPolicy#ROLLBACK} the learner returns to it too
     * (parameters and optimizer state). The versions published after it are dropped from the kept
     * ones. Needs a publish gate: without one the next version would replace it at once; with one,
     * later versions must pass the gate against it.
     *
     * @param version a kept published version ({@link #keptVersions}), or null for the one
     *     published before the serving one
     * @return the version predictions use now
     * @throws java.util.NoSuchElementException when {@code version} is not a kept published version
     * @throws IllegalStateException without a publish gate, with no earlier version kept, for the
     *     serving version itself, or once training has stopped
     * @throws IOException when the log cannot be written (nothing changed)
     */
    public ModelVersion rollback(Long version) throws IOException {
        return publisher.rollback(version);
    }

    /** @return the published versions kept for {@link #rollback}, oldest first (the last serves); empty without a gate */
    public List<Long> keptVersions() {
        return gate == null ? Collections.emptyList() : publisher.keptIds();
    }

    /** @return the newest version the learner made and decided on: the serving one, or a newer one the gate held back */
    public long latestVersion() {
        return publisher.latestVersion();
    }

    /** @return versions published (passed the gate, or every version without one), including those decided again on resume */
    public long publishedVersions() {
        return publisher.publishedVersions();
    }

    /** @return versions the publish gate held back, including those decided again on resume */
    public long heldVersions() {
        return publisher.heldVersions();
    }

    /** @return rollbacks ({@link #rollback}) applied, including those applied again on resume */
    public long rollbacks() {
        return publisher.rollbacks();
    }

    /** @return the gate loss of the last version the gate decided on (NaN: none yet, or no gate) */
    public double lastGateLoss() {
        return publisher.lastGateLoss();
    }

    /** @return the serving version's gate loss (NaN without a gate) */
    public double servingGateLoss() {
        return publisher.servingGateLoss();
    }

    // ---- state ----

    /** @return the version predictions use now */
    public ModelVersion currentVersion() {
        return publisher.current();
    }

    /** @return events waiting for training */
    public int queueDepth() {
        return queue.depth();
    }

    /** @return micro-batches applied (optimizer steps), including those applied again on resume */
    public long updates() {
        return updater.updates();
    }

    /** @return events this learner accepted since it opened (not counting resumed ones or duplicates) */
    public long acceptedEvents() {
        return ingest.accepted.get();
    }

    /** @return events refused because the queue was full */
    public long refusedEvents() {
        return ingest.refused.get();
    }

    /** @return events answered from an earlier request with the same idempotency key */
    public long duplicateEvents() {
        return ingest.duplicates.get();
    }

    /** @return micro-batches quarantined (not applied) since this learner opened */
    public long quarantinedBatches() {
        return quarantinedBatches.get();
    }

    /** @return predictions served */
    public long predictions() {
        return predictions.get();
    }

    /** @return why training stopped, or null while it runs (or after a clean close) */
    public Throwable getFailure() {
        return queue.failure();
    }

    /** @return the log folder */
    public Path getLogDir() {
        return logDir;
    }

    /** @return the module's metadata */
    public Metadata getMetadata() {
        return metadata;
    }

    /** @return where the time went per phase, or null unless {@link Builder#optTimePhases} was on */
    public PhaseTimes phaseTimes() {
        return phases;
    }

    /**
     * Waits until every event accepted so far has been applied (or quarantined) and the versions
     * they made are published.
     *
     * @param timeout the longest wait
     * @param unit its unit
     * @return whether the queue drained in time
     * @throws InterruptedException when interrupted
     * @throws IllegalStateException when training has failed
     */
    public boolean awaitIdle(long timeout, TimeUnit unit) throws InterruptedException {
        long deadline = System.nanoTime() + unit.toNanos(timeout);
        // Applied, and published: the last versions may still wait for the log's group commit.
        return queue.awaitIdle(timeout, unit) && log.awaitActions(deadline - System.nanoTime());
    }

    /**
     * Stops like a crash would, for tests and emergencies: training stops after the micro-batch in
     * progress, queued events stay unapplied (they are in the log), nothing is published or
     * checkpointed. Opening the log folder again resumes.
     *
     * @throws IOException when the log cannot be closed
     */
    public void halt() throws IOException {
        stop(true);
    }

    /**
     * Stops accepting feedback, applies every queued event, publishes a last version when updates
     * came after the last one, writes a final checkpoint and frees everything. Idempotent.
     *
     * @throws IOException when the final checkpoint or the log cannot be written
     * @throws IllegalStateException when training had failed (nothing more was written)
     */
    @Override
    public void close() throws IOException {
        stop(false);
    }

    private void stop(boolean halt) throws IOException {
        if (!queue.stop(halt)) {
            return;
        }
        try {
            trainer.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        Throwable failure = queue.failure();
        try {
            if (!halt && failure == null) {
                publisher.finish();
            }
        } finally {
            log.close();
            predictors.close();
            publisher.close();
            updater.close();
            if (gate != null) {
                gate.close();
            }
        }
        if (!halt && failure != null) {
            throw new IllegalStateException("online training had stopped: " + failure.getMessage(), failure);
        }
    }
}
