package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Messages;
import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.online.log.FsyncPolicy;
import dev.gradbridge.online.log.LogCorruptException;
import dev.gradbridge.online.log.LogHeader;
import dev.gradbridge.online.log.LogReader;
import dev.gradbridge.online.log.LogRecord;
import dev.gradbridge.online.log.LogWriter;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Serves predictions while it learns from feedback: one exported training module, one training
 * thread, a write-ahead log ({@link dev.gradbridge.online.log}), published versions.
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
 * <p>Modules with buffers (BatchNorm running statistics) or gradient accumulation are refused.
 */
public final class OnlineLearner implements AutoCloseable {

    /** The online checkpoint's descriptor in the log folder. */
    public static final String CHECKPOINT_FILE = Checkpoints.FILE;
    /** Predictor copies when not set: concurrent predictions (capped by the cores). */
    public static final int DEFAULT_PREDICTORS = 2;

    private static final Logger logger = LoggerFactory.getLogger(OnlineLearner.class);

    private final Path logDir;
    private final Builder options;
    private final String modelSha256;
    private final Metadata metadata;
    private final TrainingModule training;
    private final ModuleCalls calls;
    private final UpdateGuard guard;
    private final LogWriter log;
    private final BlockingQueue<TrainingModule> predictors;
    private final List<TrainingModule> allPredictors = new ArrayList<>();
    private final Map<TrainingModule, ModelVersion> loaded = new java.util.concurrent.ConcurrentHashMap<>();
    private final Metadata.TensorSpec xSpec;
    private final Metadata.TensorSpec ySpec;
    private final int xRowBytes;
    private final int yRowBytes;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition notEmpty = lock.newCondition();
    private final Condition progress = lock.newCondition();
    private final Condition notFull = lock.newCondition();
    private final ArrayDeque<QueuedEvent> queue = new ArrayDeque<>(); // guarded by lock
    private final Map<String, KeyEntry> keys = new HashMap<>(); // guarded by lock
    private long nextSeq; // guarded by lock
    private long appliedEvents; // guarded by lock: events applied or quarantined, in seq order
    private boolean closing; // guarded by lock
    private boolean halting; // guarded by lock
    private boolean busy; // guarded by lock: a micro-batch is being applied
    private volatile Throwable failure; // written under lock

    // Training-thread state (also read after the thread ends).
    private volatile long updates;
    private double lastLoss = Double.NaN;
    private long lastCheckpointVersion = -1;
    private volatile ModelVersion current;
    private final Thread trainer;

    private final AtomicLong acceptedEvents = new AtomicLong();
    private final AtomicLong refusedEvents = new AtomicLong();
    private final AtomicLong duplicateEvents = new AtomicLong();
    private final AtomicLong quarantinedBatches = new AtomicLong();
    private final AtomicLong predictions = new AtomicLong();
    private final PhaseTimes phases; // null unless optTimePhases(true)
    private final ParameterDigests digester = new ParameterDigests(); // one thread at a time

    private static final class QueuedEvent {
        final long seq;
        final long offset;
        final byte[] x;
        final byte[] y;

        QueuedEvent(long seq, long offset, byte[] x, byte[] y) {
            this.seq = seq;
            this.offset = offset;
            this.x = x;
            this.y = y;
        }
    }

    private static final class KeyEntry {
        final long firstSeq;
        final int count;
        final byte[] sha256;
        final long end;

        KeyEntry(long firstSeq, int count, byte[] sha256, long end) {
            this.firstSeq = firstSeq;
            this.count = count;
            this.sha256 = sha256;
            this.end = end;
        }
    }

    /** @return options with their defaults; {@link Builder#open} starts a learner */
    public static Builder builder() {
        return new Builder();
    }

    /** Options of an {@link OnlineLearner}. */
    public static final class Builder {
        private int maxBatch = 32;
        private long maxWaitMillis = 10;
        private int publishEvery = 1;
        private int checkpointEvery = 100;
        private int queueCapacity = 10_000;
        private int predictors = Math.max(1, Math.min(DEFAULT_PREDICTORS, Runtime.getRuntime().availableProcessors()));
        private FsyncPolicy fsync = FsyncPolicy.ALWAYS;
        private double maxGradNorm;
        private boolean validateTargets = true;
        private boolean timePhases;

        private Builder() {}

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
         * @param events largest micro-batch (B), default 32
         * @return this
         */
        public Builder optMaxBatch(int events) {
            this.maxBatch = positive("max batch", events);
            return this;
        }

        /**
         * @param millis longest wait for a micro-batch to fill after its first event (T), default
         *     10; 0 takes what is queued
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
         * @param updates publish a version every this many micro-batches (N), default 1
         * @return this
         */
        public Builder optPublishEvery(int updates) {
            this.publishEvery = positive("publish every", updates);
            return this;
        }

        /**
         * @param versions write a checkpoint every this many versions (K), default 100
         * @return this
         */
        public Builder optCheckpointEvery(int versions) {
            this.checkpointEvery = positive("checkpoint every", versions);
            return this;
        }

        /**
         * @param events most events waiting for training; more feedback is refused, default 10000
         * @return this
         */
        public Builder optQueueCapacity(int events) {
            this.queueCapacity = positive("queue capacity", events);
            return this;
        }

        /**
         * @param count predictor copies of the module, i.e. predictions that run at once (default
         *     {@value OnlineLearner#DEFAULT_PREDICTORS}, at most the cores)
         * @return this
         */
        public Builder optPredictors(int count) {
            this.predictors = positive("predictors", count);
            return this;
        }

        /**
         * @param policy when the log is forced to disk, default {@link FsyncPolicy#ALWAYS}
         * @return this
         */
        public Builder optFsync(FsyncPolicy policy) {
            this.fsync = policy;
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
        this.options = options;
        this.phases = options.timePhases ? new PhaseTimes() : null;
        List<AutoCloseable> opened = new ArrayList<>();
        try {
            TrainingModule original = TrainingModule.load(modelPath);
            opened.add(original);
            this.metadata = original.getMetadata();
            if (!original.getBufferNames().isEmpty()) {
                throw new InvalidInputException(
                        modelPath + " has buffers " + original.getBufferNames() + "; online learning"
                                + " supports modules without buffers (predictors receive parameters only)");
            }
            Object accumulate = metadata.getFineTuning().get("accumulate");
            if (accumulate instanceof Number && ((Number) accumulate).intValue() > 1) {
                throw new InvalidInputException(modelPath + " accumulates gradients over " + accumulate
                        + " micro-batches; online learning applies one step per micro-batch (export without accumulate)");
            }
            this.modelSha256 = sha256(modelPath);
            this.xSpec = metadata.getInput("x");
            this.ySpec = metadata.getInput("y");
            this.xRowBytes = rowBytes(xSpec);
            this.yRowBytes = rowBytes(ySpec);
            this.calls = new ModuleCalls(xSpec, ySpec, options.maxBatch, xRowBytes, yRowBytes);
            this.guard = new UpdateGuard(options.maxGradNorm);
            LogHeader wanted = new LogHeader(metadata.getModel(), modelSha256, options.publishEvery, options.maxGradNorm,
                    0, 0, xSpec.getDtype(), sampleShape(xSpec), ySpec.getDtype(), sampleShape(ySpec));

            // Everything is read and checked before the first write: a refused start changes nothing.
            boolean hasLog = LogReader.exists(this.logDir);
            if (!hasLog && Checkpoints.exists(this.logDir)) {
                throw new LogCorruptException(this.logDir.resolve(CHECKPOINT_FILE) + " checkpoints a log, but "
                        + LogReader.file(this.logDir) + " is missing");
            }
            Files.createDirectories(this.logDir);
            this.log = LogWriter.lock(this.logDir, options.fsync, !hasLog);
            opened.add(log);
            Checkpoints.Descriptor checkpoint = Checkpoints.read(this.logDir);
            LogReader.Contents contents = log.read(checkpoint == null ? 0 : checkpoint.scanOffset);
            if (contents.getHeader() != null) {
                String mismatch = contents.getHeader().mismatch(wanted);
                if (mismatch != null) {
                    throw new LogCorruptException(log.getFile() + ": offset 0: " + mismatch);
                }
            } else if (checkpoint != null) {
                throw new LogCorruptException(log.getFile() + " holds no record, but " + this.logDir.resolve(CHECKPOINT_FILE)
                        + " checkpoints one: the log was cut or replaced");
            }
            if (checkpoint != null) {
                Checkpoints.check(this.logDir, checkpoint, modelSha256, contents);
                this.training = TrainingModule.load(this.logDir.resolve(checkpoint.file));
                opened.add(training);
            } else {
                this.training = original;
                opened.remove(original);
                opened.add(training);
            }
            this.predictors = new ArrayBlockingQueue<>(options.predictors);
            for (int i = 0; i < options.predictors; i++) {
                TrainingModule predictor = TrainingModule.load(modelPath);
                opened.add(predictor);
                allPredictors.add(predictor);
                predictors.add(predictor);
            }
            if (training != original) {
                original.close();
                opened.remove(original);
            }
            recover(checkpoint, contents, wanted);
        } catch (IOException | RuntimeException e) {
            for (int i = opened.size() - 1; i >= 0; i--) {
                try {
                    opened.get(i).close();
                } catch (Exception suppressed) {
                    e.addSuppressed(suppressed);
                }
            }
            throw e;
        }
        this.trainer = new Thread(this::trainLoop, "gradbridge-online-trainer");
        trainer.setDaemon(true);
        trainer.start();
    }

    static String sha256(Path file) throws IOException {
        try (InputStream in = Files.newInputStream(file)) {
            MessageDigest digest = MessageDigest.getInstance("SHA-256");
            byte[] buffer = new byte[1 << 16];
            for (int n; (n = in.read(buffer)) > 0; ) {
                digest.update(buffer, 0, n);
            }
            return hex(digest.digest());
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private static String hex(byte[] bytes) {
        StringBuilder text = new StringBuilder();
        for (byte b : bytes) {
            text.append(String.format("%02x", b));
        }
        return text.toString();
    }

    private static long[] sampleShape(Metadata.TensorSpec spec) {
        long[] shape = spec.getShape();
        return Arrays.copyOfRange(shape, 1, shape.length);
    }

    private static int rowBytes(Metadata.TensorSpec spec) {
        long count = 1;
        for (long dim : sampleShape(spec)) {
            if (dim < 0) {
                throw new InvalidInputException(
                        "input " + spec.getName() + " has a variable dimension " + Arrays.toString(spec.getShape())
                                + "; online learning needs fixed sample shapes");
            }
            count *= dim;
        }
        return Math.toIntExact(count * HostTensor.elementSize(spec.getDtype()));
    }


    // ---- recovery ----

    /**
     * Applies the logged micro-batches after the checkpoint (or the whole log) again, checking every
     * logged version and quarantine, then queues the pending events again. Records the crash kept
     * from being written (a version, a quarantine: only ever at the end) are appended last.
     */
    private void recover(Checkpoints.Descriptor checkpoint, LogReader.Contents contents, LogHeader wanted)
            throws IOException {
        Path file = log.getFile();
        long appliedSeq;
        ModelVersion last;
        if (checkpoint == null) {
            appliedSeq = contents.getHeader() == null ? 0 : contents.getHeader().getFirstSeq();
            last = snapshot(0, 0, Double.NaN);
        } else {
            appliedSeq = checkpoint.nextSeq;
            updates = checkpoint.updates;
            last = snapshot(checkpoint.version, updates, checkpoint.loss);
            if (!checkpoint.digests.equals(last.getDigests())) {
                throw new LogCorruptException(logDir.resolve(CHECKPOINT_FILE) + " does not match the parameters of "
                        + logDir.resolve(checkpoint.file));
            }
            lastCheckpointVersion = last.getId();
        }
        long checkpointSeq = appliedSeq;
        long maxSeq = appliedSeq - 1;
        Map<Long, LogRecord.Event> pending = new TreeMap<>();
        Map<Long, LogRecord.Version> loggedByUpdates = new HashMap<>();
        boolean versionZeroLogged = checkpoint != null;
        for (LogRecord record : contents.getRecords()) {
            if (record instanceof LogRecord.Version) {
                LogRecord.Version version = (LogRecord.Version) record;
                loggedByUpdates.put(version.getUpdates(), version);
                versionZeroLogged |= version.getId() == 0;
            } else if (record instanceof LogRecord.Key) {
                LogRecord.Key key = (LogRecord.Key) record;
                keys.put(key.getKey(), new KeyEntry(key.getFirstSeq(), key.getCount(), key.sha256(), 0));
                maxSeq = Math.max(maxSeq, key.getFirstSeq() + key.getCount() - 1);
            }
        }
        List<ModelVersion> missing = new ArrayList<>(); // versions to append, in order
        if (!versionZeroLogged) {
            missing.add(last);
        }
        LogRecord.Batch refused = null; // a re-applied micro-batch that the guard refused: its Q must follow
        String refusal = null;
        int reapplied = 0;
        for (LogRecord record : contents.getRecords()) {
            if (record instanceof LogRecord.Event) {
                LogRecord.Event event = (LogRecord.Event) record;
                maxSeq = Math.max(maxSeq, event.getSeq());
                if (event.getSeq() >= appliedSeq) {
                    pending.put(event.getSeq(), event);
                }
            } else if (record instanceof LogRecord.Quarantine) {
                LogRecord.Quarantine q = (LogRecord.Quarantine) record;
                if (q.getFirstSeq() < checkpointSeq) {
                    continue; // before the checkpoint
                }
                if (refused == null || refused.getFirstSeq() != q.getFirstSeq()) {
                    throw new LogCorruptException(file + ": offset " + q.getOffset() + ": quarantines the micro-batch from event "
                            + q.getFirstSeq() + ", which applies cleanly when replayed");
                }
                refused = null;
            } else if (record instanceof LogRecord.Batch) {
                LogRecord.Batch batch = (LogRecord.Batch) record;
                if (batch.getFirstSeq() < appliedSeq) {
                    continue; // applied before the checkpoint
                }
                if (refused != null) {
                    throw new LogCorruptException(file + ": offset " + refused.getOffset() + ": the micro-batch from event "
                            + refused.getFirstSeq() + " is refused when replayed (" + refusal + ") but the log has no quarantine for it");
                }
                long floor = contents.getHeader().getSeqFloor();
                if (appliedSeq < floor && batch.getFirstSeq() == floor && pending.keySet().stream().allMatch(k -> k >= floor)) {
                    appliedSeq = floor; // a recovered log: the numbers below the floor are gone for good
                }
                if (batch.getIndex() != updates || batch.getFirstSeq() != appliedSeq) {
                    throw new LogCorruptException(file + ": offset " + batch.getOffset() + ": micro-batch " + batch.getIndex()
                            + " starts at event " + batch.getFirstSeq() + "; expected micro-batch " + updates + " from event "
                            + appliedSeq);
                }
                List<byte[]> xs = new ArrayList<>();
                List<byte[]> ys = new ArrayList<>();
                for (long seq = batch.getFirstSeq(); seq < batch.getFirstSeq() + batch.getCount(); seq++) {
                    LogRecord.Event event = pending.remove(seq);
                    if (event == null) {
                        throw new LogCorruptException(file + ": offset " + batch.getOffset() + ": micro-batch " + batch.getIndex()
                                + " names event " + seq + ", which the log does not hold before it");
                    }
                    xs.add(event.x());
                    ys.add(event.y());
                }
                reapplied++;
                String why = applyGuarded(xs, ys);
                appliedSeq += batch.getCount();
                if (why != null) {
                    refused = batch;
                    refusal = why;
                    continue;
                }
                LogRecord.Version logged = loggedByUpdates.get(updates);
                if (logged != null || updates % options.publishEvery == 0) {
                    ModelVersion version = snapshot(last.getId() + 1, updates, lastLoss);
                    if (logged == null) {
                        missing.add(version); // the crash came before this record
                    } else if (logged.getId() != version.getId() || !logged.getDigests().equals(version.getDigests())) {
                        throw new LogCorruptException(file + ": offset " + logged.getOffset() + ": applying the logged"
                                + " micro-batches again does not reproduce version " + logged.getId() + " (" + logged.getUpdates()
                                + " updates)");
                    }
                    last = version;
                }
            }
        }
        // Only now the first write: the torn tail goes, a new log gets its header.
        log.begin(contents, wanted);
        for (ModelVersion version : missing) {
            log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
        }
        if (refused != null) { // the last micro-batch, refused again: the crash came before its quarantine
            log.appendQuarantine(refused.getIndex(), refused.getFirstSeq(), refused.getCount(), refusal);
            quarantinedBatches.incrementAndGet();
        }
        log.sync(log.end());
        current = last;
        long floor = contents.getHeader() == null ? 0 : contents.getHeader().getSeqFloor();
        nextSeq = Math.max(Math.max(maxSeq + 1, appliedSeq), floor);
        appliedEvents = pending.isEmpty() ? nextSeq : appliedSeq;
        for (LogRecord.Event event : pending.values()) {
            queue.add(new QueuedEvent(event.getSeq(), event.getOffset(), event.x(), event.y()));
        }
        if (reapplied > 0 || !pending.isEmpty() || contents.getTornBytes() > 0) {
            logger.info("{}: resumed at {}: {} micro-batches applied again, {} events queued again, {} torn bytes cut",
                    logDir, last, reapplied, pending.size(), contents.getTornBytes());
        }
    }

    /**
     * The micro-batch's loss and gradients, then the optimizer step unless the guard refuses: the
     * same calls as {@code train_step} when it goes through, no step (gradients zeroed) when not.
     *
     * @return null when applied (and counted), else why not
     */
    private String applyGuarded(List<byte[]> xs, List<byte[]> ys) {
        long t = clock();
        double loss = calls.lossAndBackward(training, xs, ys);
        String refusal = guard.refuse(loss, training.getParameterNames(), training.getGradients());
        if (refusal == null) {
            training.optimizerStep();
            updates++;
            lastLoss = loss;
        } else {
            training.zeroGrad();
        }
        lap(PhaseTimes.Phase.TRAIN_STEP, t);
        return refusal;
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
        long t = clock();
        long rows = check("x", xSpec, x);
        if (check("y", ySpec, y) != rows) {
            throw new InvalidInputException("x has " + rows + " rows but y has " + y.rows());
        }
        if (!x.allFinite() || !y.allFinite()) {
            throw new InvalidInputException("feedback holds NaN or infinite values");
        }
        if (rows > options.queueCapacity) {
            throw new InvalidInputException(rows + " events in one call exceed the queue capacity " + options.queueCapacity);
        }
        byte[] sha = null;
        if (key != null) {
            checkKey(key);
            sha = requestSha256(x, y);
        }
        if (options.validateTargets) {
            validateLoss(x, y);
        }
        List<byte[]> xRows = split(x.bytes(), xRowBytes);
        List<byte[]> yRows = split(y.bytes(), yRowBytes);
        t = lap(PhaseTimes.Phase.LEARN_VALIDATE, t);
        long first;
        long end;
        lock.lock();
        try {
            checkOpen();
            KeyEntry seen = key == null ? null : keys.get(key);
            if (seen != null) {
                if (!Arrays.equals(seen.sha256, sha) || seen.count != rows) {
                    throw new KeyConflictException("idempotency key '" + key + "' was used for another request (events "
                            + seen.firstSeq + ".." + (seen.firstSeq + seen.count - 1) + "); nothing was logged");
                }
                duplicateEvents.addAndGet(rows);
                first = seen.firstSeq;
                end = seen.end;
            } else {
                long deadline = System.nanoTime() + unit.toNanos(timeout);
                while (queue.size() + rows > options.queueCapacity && deadline - System.nanoTime() > 0) {
                    try {
                        notFull.awaitNanos(deadline - System.nanoTime());
                    } catch (InterruptedException e) {
                        Thread.currentThread().interrupt();
                        break;
                    }
                    checkOpen();
                }
                if (queue.size() + rows > options.queueCapacity) {
                    refusedEvents.addAndGet(rows);
                    throw new QueueFullException("the feedback queue is full (" + queue.size() + " of "
                            + options.queueCapacity + " events waiting); retry later");
                }
                t = lap(PhaseTimes.Phase.LEARN_LOCK, t);
                first = nextSeq;
                long[] offsets;
                try {
                    offsets = log.appendEvents(first, xRows, yRows, key, sha);
                } catch (IOException e) {
                    // The writer truncated the file back: nothing of this request is in the log.
                    throw new UncheckedIOException("cannot append to " + log.getFile() + " (" + e.getMessage()
                            + "); nothing of this request was logged", e);
                }
                for (int i = 0; i < rows; i++) {
                    queue.add(new QueuedEvent(first + i, offsets[i], xRows.get(i), yRows.get(i)));
                }
                nextSeq += rows;
                end = offsets[(int) rows];
                if (key != null) {
                    keys.put(key, new KeyEntry(first, (int) rows, sha, end));
                }
                acceptedEvents.addAndGet(rows);
                notEmpty.signal();
            }
        } finally {
            lock.unlock();
        }
        t = lap(PhaseTimes.Phase.LEARN_APPEND, t);
        try {
            log.sync(end); // outside the lock: concurrent callers share one fsync
            lap(PhaseTimes.Phase.LEARN_SYNC, t);
        } catch (IOException e) {
            fail(e); // what is durable is unknown now: stop rather than acknowledge anything more
            throw new UncheckedIOException("cannot fsync " + log.getFile() + ": " + e.getMessage(), e);
        }
        return first;
    }

    /** Longest idempotency key. */
    public static final int MAX_KEY_LENGTH = 200;

    private static void checkKey(String key) {
        if (key.isEmpty() || key.length() > MAX_KEY_LENGTH) {
            throw new InvalidInputException("an idempotency key has 1 to " + MAX_KEY_LENGTH + " characters, got " + key.length());
        }
        for (int i = 0; i < key.length(); i++) {
            char c = key.charAt(i);
            if (c < 0x21 || c > 0x7e) {
                throw new InvalidInputException("an idempotency key holds visible ASCII characters only");
            }
        }
    }

    private static byte[] requestSha256(HostTensor x, HostTensor y) {
        try {
            MessageDigest digest = MessageDigest.getInstance("SHA-256");
            digest.update(x.bytes());
            digest.update(y.bytes());
            return digest.digest();
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    private long clock() {
        if (phases == null) {
            return 0;
        }
        phases.start();
        return System.nanoTime();
    }

    /** Adds the time since {@code since} to {@code phase}; returns now (0 when not timing). */
    private long lap(PhaseTimes.Phase phase, long since) {
        if (phases == null) {
            return 0;
        }
        long now = System.nanoTime();
        phases.add(phase, now - since);
        return now;
    }

    /** @return where the time went per phase, or null unless {@link Builder#optTimePhases} was on */
    public PhaseTimes phaseTimes() {
        return phases;
    }

    private void checkOpen() {
        if (failure != null) {
            throw new IllegalStateException("online training has stopped: " + failure.getMessage(), failure);
        }
        if (closing || halting) {
            throw new IllegalStateException("the online learner is closed");
        }
    }

    private void fail(Throwable e) {
        lock.lock();
        try {
            if (failure == null) {
                failure = e;
            }
            busy = false;
            notEmpty.signalAll();
            notFull.signalAll();
            progress.signalAll();
        } finally {
            lock.unlock();
        }
    }

    private long check(String name, Metadata.TensorSpec spec, HostTensor tensor) {
        long[] shape = tensor.getShape();
        if (!spec.accepts(tensor.getDtype(), shape) || shape.length == 0 || shape[0] == 0) {
            throw new InvalidInputException(
                    Messages.tensorSpec("", "input " + name, spec.getDtype(), spec.getShape(), tensor.getDtype(), shape));
        }
        return shape[0];
    }

    private static List<byte[]> split(byte[] bytes, int rowBytes) {
        List<byte[]> rows = new ArrayList<>(bytes.length / Math.max(1, rowBytes));
        for (int offset = 0; offset < bytes.length; offset += rowBytes) {
            rows.add(Arrays.copyOfRange(bytes, offset, offset + rowBytes));
        }
        return rows;
    }

    /** The loss on a predictor, no step: a libtorch error (e.g. a class index out of range) refuses the feedback. */
    private void validateLoss(HostTensor x, HostTensor y) {
        TrainingModule predictor = borrow();
        try {
            ModuleCalls.evaluate(predictor, x, y);
        } catch (GradbridgeException e) {
            throw new InvalidInputException("feedback rejected by the model's loss: " + libtorchReason(e));
        } finally {
            predictors.add(predictor);
        }
    }

    /** libtorch's own reason, first line only, without Java or C++ frames (e.g. "index 9 is out of bounds"). */
    static String libtorchReason(Throwable e) {
        String text = String.valueOf(e.getMessage());
        for (Throwable cause = e.getCause(); cause != null; cause = cause.getCause()) {
            if (cause.getMessage() != null) {
                text = cause.getMessage();
            }
        }
        String line = text.split("\n", 2)[0].trim();
        int colon = line.lastIndexOf(": ");
        if (line.matches(".*\\b(ai\\.djl|java\\.|dev\\.gradbridge)\\..*") && colon >= 0) {
            line = line.substring(colon + 2);
        }
        return line.length() > 200 ? line.substring(0, 200) + "..." : line;
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
        check("x", xSpec, x);
        if (!x.allFinite()) {
            throw new InvalidInputException("x holds NaN or infinite values");
        }
        TrainingModule predictor = borrow();
        try {
            ModelVersion version = current;
            if (loaded.get(predictor) != version) {
                // The whole snapshot, then forward: this predictor never mixes two versions.
                predictor.setParameters(version.parameters());
                loaded.put(predictor, version);
            }
            HostTensor output;
            try {
                output = ModuleCalls.forward(predictor, x);
            } catch (GradbridgeException e) {
                throw new InvalidInputException("x rejected by the model: " + libtorchReason(e));
            }
            predictions.incrementAndGet();
            return new Prediction(version.getId(), output);
        } finally {
            predictors.add(predictor);
        }
    }

    private TrainingModule borrow() {
        try {
            return predictors.take();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new GradbridgeException("interrupted while waiting for a predictor", e);
        }
    }

    // ---- the training thread ----

    private void trainLoop() {
        try {
            while (true) {
                List<QueuedEvent> batch = nextBatch(clock());
                if (batch == null) {
                    break;
                }
                apply(batch);
            }
        } catch (Throwable e) {
            logger.error("online training stopped: {}", e.toString());
            fail(e);
        }
    }

    /** The next micro-batch (up to B events, or what arrived T ms after the first), or null to stop. */
    private List<QueuedEvent> nextBatch(long t) throws InterruptedException {
        lock.lock();
        try {
            while (queue.isEmpty() && !closing && !halting) {
                notEmpty.await();
            }
            if (halting || queue.isEmpty()) {
                return null; // halted, or closing with nothing left to drain
            }
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(options.maxWaitMillis);
            while (queue.size() < options.maxBatch && !closing && !halting) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    break;
                }
                notEmpty.awaitNanos(left);
            }
            if (halting) {
                return null;
            }
            t = lap(PhaseTimes.Phase.WAIT, t);
            int count = Math.min(options.maxBatch, queue.size());
            List<QueuedEvent> batch = new ArrayList<>(count);
            // Consecutive numbers only: a micro-batch is logged as (first, count). Numbers jump once,
            // at a recovered log's floor.
            while (batch.size() < count && (batch.isEmpty() || queue.peek().seq == batch.get(batch.size() - 1).seq + 1)) {
                batch.add(queue.poll());
            }
            busy = true;
            notFull.signalAll();
            return batch;
        } finally {
            lock.unlock();
            lap(PhaseTimes.Phase.DEQUEUE, t);
        }
    }

    /** Logs the micro-batch, applies it (or quarantines it), publishes when a version is due. */
    private void apply(List<QueuedEvent> batch) throws IOException {
        long t = clock();
        long first = batch.get(0).seq;
        int count = batch.size();
        // Written before the batch is applied and forced (under ALWAYS) by the sync before the next
        // version is published: nothing that depends on it leaves the training thread first.
        long index = updates;
        log.appendBatch(index, first, count);
        t = lap(PhaseTimes.Phase.LOG_BATCH, t);
        List<byte[]> xs = new ArrayList<>(count);
        List<byte[]> ys = new ArrayList<>(count);
        for (QueuedEvent event : batch) {
            xs.add(event.x);
            ys.add(event.y);
        }
        String refusal = applyGuarded(xs, ys);
        t = clock();
        if (refusal != null) {
            log.appendQuarantine(index, first, count, refusal);
            quarantinedBatches.incrementAndGet();
            logger.warn("{}: events {}..{} quarantined, not applied: {}", logDir, first, first + count - 1, refusal);
        } else if (updates % options.publishEvery == 0) {
            ModelVersion version = snapshot(current.getId() + 1, updates, lastLoss);
            t = lap(PhaseTimes.Phase.SNAPSHOT, t);
            publish(version);
            t = clock();
        }
        lock.lock();
        try {
            appliedEvents = Math.max(appliedEvents, first + count);
            busy = false;
            progress.signalAll();
        } finally {
            lock.unlock();
        }
        lap(PhaseTimes.Phase.FINISH, t);
    }

    /** The parameters now, whole, with their digests (one thread at a time: opening, training, closing). */
    private ModelVersion snapshot(long id, long atUpdates, double loss) {
        Map<String, double[]> parameters = training.getParameters();
        Map<String, String> digests = new LinkedHashMap<>();
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            digests.put(spec.getName(), digester.digest(parameters.get(spec.getName()), spec.getDtype()));
        }
        return new ModelVersion(id, atUpdates, loss, parameters, digests);
    }

    /** Logs the version, then makes it the one predictions use; checkpoints every K versions. */
    private void publish(ModelVersion version) throws IOException {
        long t = clock();
        long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
        log.sync(end);
        current = version; // one volatile write: predictors see the old or the new snapshot, whole
        t = lap(PhaseTimes.Phase.PUBLISH, t);
        if (version.getId() % options.checkpointEvery == 0) {
            checkpoint(version, end);
            lap(PhaseTimes.Phase.CHECKPOINT, t);
        }
    }

    /** Writes a checkpoint at a version boundary (training thread, or closing after it ended). */
    private void checkpoint(ModelVersion version, long versionEnd) throws IOException {
        long nextEvent;
        long scanOffset;
        lock.lock();
        try {
            QueuedEvent head = queue.peek();
            nextEvent = head == null ? nextSeq : head.seq;
            // Events still queued and micro-batches after this version both lie after scanOffset.
            scanOffset = head == null ? versionEnd : Math.min(head.offset, versionEnd);
        } finally {
            lock.unlock();
        }
        Checkpoints.write(logDir, training, new Checkpoints.Descriptor(Checkpoints.fileName(version.getId()), modelSha256,
                version.getId(), version.getUpdates(), version.getLoss(), nextEvent, scanOffset, version.getDigests()));
        lastCheckpointVersion = version.getId();
    }

    // ---- state ----

    /** @return the version predictions use now */
    public ModelVersion currentVersion() {
        return current;
    }

    /** @return events waiting for training */
    public int queueDepth() {
        lock.lock();
        try {
            return queue.size();
        } finally {
            lock.unlock();
        }
    }

    /** @return micro-batches applied (optimizer steps), including those applied again on resume */
    public long updates() {
        return updates;
    }

    /** @return events this learner accepted since it opened (not counting resumed ones or duplicates) */
    public long acceptedEvents() {
        return acceptedEvents.get();
    }

    /** @return events refused because the queue was full */
    public long refusedEvents() {
        return refusedEvents.get();
    }

    /** @return events answered from an earlier request with the same idempotency key */
    public long duplicateEvents() {
        return duplicateEvents.get();
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
        return failure;
    }

    /** @return the log folder */
    public Path getLogDir() {
        return logDir;
    }

    /** @return the module's metadata */
    public Metadata getMetadata() {
        return metadata;
    }

    /**
     * Waits until every event accepted so far has been applied (or quarantined).
     *
     * @param timeout the longest wait
     * @param unit its unit
     * @return whether the queue drained in time
     * @throws InterruptedException when interrupted
     * @throws IllegalStateException when training has failed
     */
    public boolean awaitIdle(long timeout, TimeUnit unit) throws InterruptedException {
        long deadline = System.nanoTime() + unit.toNanos(timeout);
        lock.lock();
        try {
            while (appliedEvents < nextSeq || busy) {
                if (failure != null) {
                    throw new IllegalStateException("online training has stopped: " + failure.getMessage(), failure);
                }
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                progress.awaitNanos(left);
            }
            return true;
        } finally {
            lock.unlock();
        }
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
        lock.lock();
        try {
            if (closing || halting) {
                return;
            }
            if (halt) {
                halting = true;
            } else {
                closing = true;
            }
            notEmpty.signalAll();
            notFull.signalAll();
        } finally {
            lock.unlock();
        }
        try {
            trainer.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        try {
            if (!halt && failure == null) {
                ModelVersion last = current;
                if (updates > last.getUpdates()) {
                    ModelVersion version = snapshot(last.getId() + 1, updates, lastLoss);
                    long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
                    log.sync(end);
                    current = version;
                    checkpoint(version, end);
                } else if (lastCheckpointVersion != last.getId()) {
                    checkpoint(last, log.end());
                }
            }
        } finally {
            log.close();
            for (TrainingModule predictor : allPredictors) {
                predictor.close();
            }
            training.close();
        }
        if (!halt && failure != null) {
            throw new IllegalStateException("online training had stopped: " + failure.getMessage(), failure);
        }
    }
}
