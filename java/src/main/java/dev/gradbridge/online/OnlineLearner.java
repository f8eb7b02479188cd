package dev.gradbridge.online;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.reflect.TypeToken;
import dev.gradbridge.DType;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Messages;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.Tensor;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
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
 * thread, a write-ahead log, published versions.
 *
 * <ul>
 *   <li>{@link #learn} (any thread) validates the feedback, appends one event per row to the
 *       {@link FeedbackLog}, forces it to disk as the {@link FsyncPolicy} says and queues it. The
 *       queue is bounded: when it is full the call throws {@link QueueFullException} and nothing
 *       is logged or queued.
 *   <li>The training thread takes events in arrival (log) order as micro-batches of up to {@code
 *       maxBatch} events, waiting at most {@code maxWaitMillis} after the first, logs the
 *       micro-batch and applies it with the module's exported optimizer ({@code train_step}).
 *   <li>Every {@code publishEvery} updates it snapshots the parameters into a new {@link
 *       ModelVersion}, logs the version with its digests and publishes it with one volatile
 *       write; every {@code checkpointEvery} versions it writes a checkpoint (the module with its
 *       optimizer state, plus {@value #CHECKPOINT_FILE} with the log position) atomically.
 *   <li>{@link #predict} (any thread) runs {@code forward} on a predictor: a separate copy of the
 *       module, one per concurrent prediction, whose parameters are set from the whole snapshot of
 *       the current version before it runs. Predictions never touch the training module, so they
 *       never see a half-applied step, and training never waits for them (a read-write lock on one
 *       module would stall every prediction for each micro-batch).
 * </ul>
 *
 * <p>Opening a log folder that holds a log resumes: the last checkpoint is loaded and the logged
 * micro-batches after it are applied again exactly as logged (each logged version's digests are
 * checked), then the events that were acknowledged but not yet applied are queued again. The
 * result is bitwise the state of a run that never stopped, and {@code gradbridge replay}
 * reproduces every logged version with eager PyTorch.
 *
 * <p>Modules with buffers (BatchNorm running statistics) are refused: predictors receive
 * parameters only. {@code forward} runs in training mode, as the module was exported.
 */
public final class OnlineLearner implements AutoCloseable {

    /** The online checkpoint's descriptor in the log folder. */
    public static final String CHECKPOINT_FILE = "checkpoint.json";

    /** Most micro-batches applied in one native call (a backlog before the next version). */
    static final int MAX_FUSED = 64;
    private static final long MAX_FUSED_BYTES = 16L << 20;

    private static final Logger logger = LoggerFactory.getLogger(OnlineLearner.class);
    private static final Gson GSON = new GsonBuilder().serializeSpecialFloatingPointValues().create();

    private final Path modelPath;
    private final Path logDir;
    private final Builder options;
    private final Metadata metadata;
    private final TrainingModule training;
    private final FeedbackLog log;
    private final BlockingQueue<Predictor> predictors;
    private final List<Predictor> allPredictors = new ArrayList<>();
    private final Metadata.TensorSpec xSpec;
    private final Metadata.TensorSpec ySpec;
    private final int xRowBytes;
    private final int yRowBytes;

    private final ReentrantLock lock = new ReentrantLock();
    private final Condition notEmpty = lock.newCondition();
    private final Condition progress = lock.newCondition();
    private final Condition notFull = lock.newCondition();
    private final ArrayDeque<QueuedEvent> queue = new ArrayDeque<>(); // guarded by lock
    private long nextSeq; // guarded by lock
    private long appliedEvents; // guarded by lock: events applied, in seq order
    private boolean closing; // guarded by lock
    private boolean halting; // guarded by lock
    private boolean busy; // guarded by lock: a micro-batch is being applied
    private Throwable failure; // guarded by lock

    // Training-thread state (also read after the thread ends).
    private volatile long updates; // written by the training thread only
    private double lastLoss = Double.NaN;
    private long lastCheckpointVersion = -1;
    private volatile ModelVersion current;
    private final Thread trainer;

    private final AtomicLong acceptedEvents = new AtomicLong();
    private final AtomicLong refusedEvents = new AtomicLong();
    private final AtomicLong predictions = new AtomicLong();
    private final PhaseTimes phases; // null unless optTimePhases(true)
    // Used by one thread at a time (see snapshot and step): opening, training, closing.
    private final ParameterDigests digester = new ParameterDigests();
    private final int maxFused; // micro-batches applied in one train_epoch call, at most
    private final ByteBuffer xBatch; // the x rows of maxFused micro-batches, reused (see step)
    private final ByteBuffer yBatch;
    private final DType xType;
    private final DType yType;

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

    private static final class Predictor {
        final TrainingModule module;
        ModelVersion loaded;

        Predictor(TrainingModule module) {
            this.module = module;
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
        private int predictors = Math.max(1, Math.min(4, Runtime.getRuntime().availableProcessors()));
        private FsyncPolicy fsync = FsyncPolicy.ALWAYS;
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
         * @param count predictor copies of the module, i.e. predictions that run at once
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
        this.modelPath = modelPath.toAbsolutePath();
        this.logDir = logDir.toAbsolutePath();
        this.options = options;
        this.phases = options.timePhases ? new PhaseTimes() : null;
        List<AutoCloseable> opened = new ArrayList<>();
        try {
            TrainingModule original = TrainingModule.load(this.modelPath);
            opened.add(original);
            this.metadata = original.getMetadata();
            if (!original.getBufferNames().isEmpty()) {
                throw new InvalidInputException(
                        this.modelPath + " has buffers " + original.getBufferNames() + "; online learning"
                                + " supports modules without buffers (predictors receive parameters only)");
            }
            this.xSpec = metadata.getInput("x");
            this.ySpec = metadata.getInput("y");
            this.xRowBytes = rowBytes(xSpec);
            this.yRowBytes = rowBytes(ySpec);
            this.xType = DType.of(xSpec.getDtype());
            this.yType = DType.of(ySpec.getDtype());
            long rowBytes = (long) xRowBytes + yRowBytes;
            this.maxFused = original.getMethodNames().contains(Protocol.TRAIN_EPOCH)
                    ? (int) Math.max(1, Math.min(Math.min(options.publishEvery, MAX_FUSED),
                            MAX_FUSED_BYTES / Math.max(1, options.maxBatch * rowBytes)))
                    : 1;
            this.xBatch = ByteBuffer.allocateDirect(Math.multiplyExact(options.maxBatch * maxFused, xRowBytes))
                    .order(ByteOrder.nativeOrder());
            this.yBatch = ByteBuffer.allocateDirect(Math.multiplyExact(options.maxBatch * maxFused, yRowBytes))
                    .order(ByteOrder.nativeOrder());
            FeedbackLog.Header header =
                    new FeedbackLog.Header(metadata.getModel(), options.publishEvery, xSpec.getDtype(),
                            sampleShape(xSpec), ySpec.getDtype(), sampleShape(ySpec));
            this.log = FeedbackLog.open(this.logDir, header, options.fsync);
            opened.add(log);
            JsonObject checkpoint = readCheckpoint();
            if (checkpoint == null) {
                this.training = original;
            } else {
                Path file = this.logDir.resolve(checkpoint.get("file").getAsString());
                this.training = TrainingModule.load(file);
                opened.add(training);
                original.close();
            }
            opened.remove(original);
            opened.add(training);
            this.predictors = new ArrayBlockingQueue<>(options.predictors);
            for (int i = 0; i < options.predictors; i++) {
                Predictor predictor = new Predictor(TrainingModule.load(this.modelPath));
                opened.add(predictor.module);
                allPredictors.add(predictor);
                predictors.add(predictor);
            }
            recover(checkpoint);
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

    private JsonObject readCheckpoint() throws IOException {
        Path file = logDir.resolve(CHECKPOINT_FILE);
        if (!Files.isRegularFile(file)) {
            return null;
        }
        try {
            JsonObject json = GSON.fromJson(new String(Files.readAllBytes(file), StandardCharsets.UTF_8), JsonObject.class);
            for (String key : new String[] {"file", "version", "updates", "next_seq", "scan_offset", "digests"}) {
                if (json == null || !json.has(key)) {
                    throw new LogCorruptException(file + " lacks '" + key + "'");
                }
            }
            return json;
        } catch (JsonParseException e) {
            throw new LogCorruptException(file + " is not valid JSON: " + e.getMessage());
        }
    }

    /** Applies the logged tail after the checkpoint (or the whole log) and re-queues pending events. */
    private void recover(JsonObject checkpoint) throws IOException {
        long scanFrom = 0;
        long appliedSeq = 0;
        ModelVersion last;
        if (checkpoint == null) {
            last = snapshot(0, 0, Double.NaN);
        } else {
            scanFrom = checkpoint.get("scan_offset").getAsLong();
            appliedSeq = checkpoint.get("next_seq").getAsLong();
            updates = checkpoint.get("updates").getAsLong();
            double loss = checkpoint.has("loss") && !checkpoint.get("loss").isJsonNull()
                    ? checkpoint.get("loss").getAsDouble() : Double.NaN;
            last = snapshot(checkpoint.get("version").getAsLong(), updates, loss);
            Map<String, String> expected =
                    GSON.fromJson(checkpoint.get("digests"), new TypeToken<Map<String, String>>() {}.getType());
            if (!expected.equals(last.getDigests())) {
                throw new LogCorruptException(
                        logDir.resolve(CHECKPOINT_FILE) + " does not match the parameters of "
                                + checkpoint.get("file").getAsString());
            }
            lastCheckpointVersion = last.getId();
        }
        FeedbackLog.Contents contents = FeedbackLog.read(logDir, scanFrom);
        Map<Long, FeedbackLog.Event> pending = new TreeMap<>();
        List<FeedbackLog.Batch> batches = new ArrayList<>();
        Map<Long, FeedbackLog.Version> loggedByUpdates = new HashMap<>();
        long maxSeq = appliedSeq - 1;
        boolean versionZeroLogged = checkpoint != null;
        for (FeedbackLog.Record record : contents.getRecords()) {
            if (record instanceof FeedbackLog.Event) {
                FeedbackLog.Event event = (FeedbackLog.Event) record;
                maxSeq = Math.max(maxSeq, event.getSeq());
                if (event.getSeq() >= appliedSeq) {
                    pending.put(event.getSeq(), event);
                }
            } else if (record instanceof FeedbackLog.Batch) {
                if (((FeedbackLog.Batch) record).getIndex() >= updates) {
                    batches.add((FeedbackLog.Batch) record);
                }
            } else {
                FeedbackLog.Version version = (FeedbackLog.Version) record;
                loggedByUpdates.put(version.getUpdates(), version);
                versionZeroLogged |= version.getId() == 0;
            }
        }
        if (!versionZeroLogged) {
            log.sync(log.appendVersion(last));
        }
        for (FeedbackLog.Batch batch : batches) {
            if (batch.getIndex() != updates || batch.getFirstSeq() != appliedSeq) {
                throw new LogCorruptException(
                        log.getFile() + ": micro-batch " + batch.getIndex() + " at offset " + batch.getOffset()
                                + " starts at event " + batch.getFirstSeq() + "; expected micro-batch " + updates
                                + " from event " + appliedSeq);
            }
            List<byte[]> xs = new ArrayList<>();
            List<byte[]> ys = new ArrayList<>();
            for (long seq = batch.getFirstSeq(); seq < batch.getFirstSeq() + batch.getCount(); seq++) {
                FeedbackLog.Event event = pending.remove(seq);
                if (event == null) {
                    throw new LogCorruptException(
                            log.getFile() + ": micro-batch " + batch.getIndex() + " names event " + seq
                                    + ", which the log does not hold");
                }
                xs.add(event.x());
                ys.add(event.y());
            }
            double loss = step(xs, ys);
            appliedSeq += batch.getCount();
            FeedbackLog.Version logged = loggedByUpdates.get(updates);
            if (logged != null || updates % options.publishEvery == 0) {
                ModelVersion version = snapshot(last.getId() + 1, updates, loss);
                if (logged == null) {
                    log.sync(log.appendVersion(version)); // the crash came before this record
                } else if (logged.getId() != version.getId() || !logged.getDigests().equals(version.getDigests())) {
                    throw new LogCorruptException(
                            log.getFile() + ": applying the logged micro-batches again does not reproduce version "
                                    + logged.getId() + " (" + logged.getUpdates() + " updates)");
                }
                last = version;
            }
        }
        current = last;
        nextSeq = maxSeq + 1;
        appliedEvents = appliedSeq;
        for (FeedbackLog.Event event : pending.values()) {
            queue.add(new QueuedEvent(event.getSeq(), event.getOffset(), event.x(), event.y()));
        }
        if (!batches.isEmpty() || !pending.isEmpty() || contents.getTornBytes() > 0 || log.getCutBytes() > 0) {
            logger.info("{}: resumed at {}: {} micro-batches applied again, {} events queued again, {} torn bytes cut",
                    logDir, last, batches.size(), pending.size(), log.getCutBytes());
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
     * @throws UncheckedIOException when the log cannot be written
     */
    public long learn(HostTensor x, HostTensor y) {
        return learn(x, y, 0, TimeUnit.NANOSECONDS);
    }

    /**
     * Like {@link #learn(HostTensor, HostTensor)}, but waits up to {@code timeout} for room in the
     * queue before refusing: back-pressure that blocks a producer inside the process instead of
     * making it spin.
     *
     * @param x inputs, batch dimension first, matching the module's {@code x} spec
     * @param y targets, as many rows as {@code x}, matching the module's {@code y} spec
     * @param timeout the longest wait for room (0: do not wait)
     * @param unit its unit
     * @return the sequence number of the first event
     * @throws QueueFullException when there was no room in time; nothing was logged
     * @throws InvalidInputException when x or y do not fit the module; nothing was logged
     */
    public long learn(HostTensor x, HostTensor y, long timeout, TimeUnit unit) {
        long t = clock();
        long rows = check("x", xSpec, x);
        if (check("y", ySpec, y) != rows) {
            throw new InvalidInputException("x has " + rows + " rows but y has " + y.rows());
        }
        if (!x.allFinite() || !y.allFinite()) {
            throw new InvalidInputException("feedback holds NaN or infinite values");
        }
        if (rows > options.queueCapacity) {
            throw new InvalidInputException(
                    rows + " events in one call exceed the queue capacity " + options.queueCapacity);
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
                throw new QueueFullException(
                        "the feedback queue is full (" + queue.size() + " of " + options.queueCapacity
                                + " events waiting); retry later");
            }
            t = lap(PhaseTimes.Phase.LEARN_LOCK, t);
            first = nextSeq;
            long[] offsets;
            try {
                offsets = log.appendEvents(first, xRows, yRows);
            } catch (IOException e) {
                failure = e;
                throw new UncheckedIOException("cannot append to " + log.getFile() + ": " + e.getMessage(), e);
            }
            for (int i = 0; i < rows; i++) {
                queue.add(new QueuedEvent(first + i, offsets[i], xRows.get(i), yRows.get(i)));
            }
            nextSeq += rows;
            end = offsets[(int) rows];
            notEmpty.signal();
        } finally {
            lock.unlock();
        }
        t = lap(PhaseTimes.Phase.LEARN_APPEND, t);
        try {
            log.sync(end); // outside the lock: concurrent callers share one fsync
            lap(PhaseTimes.Phase.LEARN_SYNC, t);
        } catch (IOException e) {
            throw new UncheckedIOException("cannot fsync " + log.getFile() + ": " + e.getMessage(), e);
        }
        acceptedEvents.addAndGet(rows);
        return first;
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
            throw new IllegalStateException("online training has stopped: " + failure, failure);
        }
        if (closing || halting) {
            throw new IllegalStateException("the online learner is closed");
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

    /** The loss on a predictor, no step: a libtorch error (e.g. class index out of range) refuses the feedback. */
    private void validateLoss(HostTensor x, HostTensor y) {
        Predictor predictor = borrow();
        try (Tensor xs = toTensor(x);
                Tensor ys = toTensor(y)) {
            predictor.module.evaluate(xs, ys);
        } catch (GradbridgeException e) {
            throw new InvalidInputException("feedback rejected by the model's loss: " + e.getMessage());
        } finally {
            predictors.add(predictor);
        }
    }

    // ---- prediction ----

    /**
     * Runs {@code forward(x)} on the current published version.
     *
     * @param x inputs, batch dimension first, matching the module's {@code x} spec
     * @return the output and the version that computed it
     * @throws InvalidInputException when x does not fit the module
     */
    public Prediction predict(HostTensor x) {
        check("x", xSpec, x);
        Predictor predictor = borrow();
        try {
            ModelVersion version = current;
            if (predictor.loaded != version) {
                // The whole snapshot, then forward: this predictor never mixes two versions.
                predictor.module.setParameters(version.parameters());
                predictor.loaded = version;
            }
            try (Tensor input = toTensor(x);
                    Tensor output = predictor.module.forward(input)) {
                String dtype = output.dtype().torchName();
                HostTensor result = HostTensor.of(dtype, output.shape(), littleEndian(output));
                predictions.incrementAndGet();
                return new Prediction(version.getId(), result);
            }
        } finally {
            predictors.add(predictor);
        }
    }

    private Predictor borrow() {
        try {
            return predictors.take();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new GradbridgeException("interrupted while waiting for a predictor", e);
        }
    }

    private static byte[] littleEndian(Tensor array) {
        byte[] bytes = array.toBytes();
        if (ByteOrder.nativeOrder() != ByteOrder.LITTLE_ENDIAN && array.dtype().size() > 1) {
            throw new GradbridgeException("big-endian native tensors are not supported");
        }
        return bytes;
    }

    private static Tensor toTensor(HostTensor tensor) {
        byte[] bytes = tensor.bytes();
        ByteBuffer buffer = ByteBuffer.allocateDirect(bytes.length).order(ByteOrder.nativeOrder());
        buffer.put(bytes).flip();
        return Tensor.fromBuffer(buffer, DType.of(tensor.getDtype()), tensor.getShape());
    }

    // ---- the training thread ----

    private void trainLoop() {
        try {
            while (true) {
                long t = clock();
                List<QueuedEvent> batch = nextBatch(t);
                if (batch == null) {
                    break;
                }
                apply(batch);
            }
        } catch (Throwable e) {
            logger.error("online training stopped", e);
            lock.lock();
            try {
                failure = e;
                busy = false;
                progress.signalAll();
            } finally {
                lock.unlock();
            }
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
            if (count == options.maxBatch) {
                // A backlog of whole micro-batches before the next version is due: take up to
                // that many at once; apply() runs them in one native call (train_epoch).
                int due = (int) (options.publishEvery - updates % options.publishEvery);
                count *= Math.max(1, Math.min(Math.min(due, maxFused), queue.size() / options.maxBatch));
            }
            List<QueuedEvent> batch = new ArrayList<>(count);
            for (int i = 0; i < count; i++) {
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

    /**
     * Applies the events taken by {@link #nextBatch}: one micro-batch, or several whole
     * micro-batches of {@code maxBatch} events that all come before the next version.
     */
    private void apply(List<QueuedEvent> batch) throws IOException {
        long t = clock();
        long first = batch.get(0).seq;
        int micro = batch.size() > options.maxBatch ? batch.size() / options.maxBatch : 1;
        // The boundaries are written before the batches are applied (one write for all), and
        // forced (under ALWAYS) by the sync before the next version is published: nothing that
        // depends on these micro-batches leaves the training thread (a version, a checkpoint)
        // before they are durable. A crash before that loses only boundaries: their events are
        // in the log, are queued again on resume and go into micro-batches that no one has seen.
        log.appendBatches(updates, first, batch.size() / micro, micro);
        t = lap(PhaseTimes.Phase.LOG_BATCH, t);
        List<byte[]> xs = new ArrayList<>(batch.size());
        List<byte[]> ys = new ArrayList<>(batch.size());
        for (QueuedEvent event : batch) {
            xs.add(event.x);
            ys.add(event.y);
        }
        double loss = micro == 1 ? step(xs, ys) : stepFused(xs, ys, micro);
        t = clock();
        if (updates % options.publishEvery == 0) {
            ModelVersion version = snapshot(current.getId() + 1, updates, loss);
            t = lap(PhaseTimes.Phase.SNAPSHOT, t);
            publish(version);
            t = clock();
        }
        lock.lock();
        try {
            appliedEvents = first + batch.size();
            busy = false;
            progress.signalAll();
        } finally {
            lock.unlock();
        }
        lap(PhaseTimes.Phase.FINISH, t);
    }

    /** One {@code train_step} on the rows, in order; counts the update. */
    private double step(List<byte[]> xs, List<byte[]> ys) {
        long t = clock();
        double loss;
        // The rows go into one reused native-order buffer per input and become one tensor each,
        // created in the module's manager and closed right after the step: no per-micro-batch
        // buffer allocation or sub-manager. The tensors may share the buffers' memory, so they
        // are closed before the buffers are filled again (one thread, one micro-batch at a time).
        // A logged micro-batch holds at most maxBatch events (resume checks the header's shapes,
        // not B, so a larger logged one gets buffers of its own).
        try (Tensor x = rowsToArray(xs, xSpec, xType, xBatch);
                Tensor y = rowsToArray(ys, ySpec, yType, yBatch)) {
            t = lap(PhaseTimes.Phase.ASSEMBLE, t);
            loss = training.trainStep(x, y);
            t = lap(PhaseTimes.Phase.TRAIN_STEP, t);
        }
        lap(PhaseTimes.Phase.ASSEMBLE, t); // freeing the inputs counts with making them
        updates++;
        lastLoss = loss;
        return loss;
    }

    /**
     * {@code micro} micro-batches of {@code maxBatch} rows each, in order, in one {@code
     * train_epoch} call (which runs {@code train_step} on each slice: the same steps, bit for bit,
     * as {@code micro} calls of {@link #step}); counts the updates.
     *
     * @return the last micro-batch's loss
     */
    private double stepFused(List<byte[]> xs, List<byte[]> ys, int micro) {
        long t = clock();
        double[] losses;
        try (Tensor x = rowsToArray(xs, xSpec, xType, xBatch);
                Tensor y = rowsToArray(ys, ySpec, yType, yBatch);
                Tensor order = Tensor.arange(xs.size())) {
            t = lap(PhaseTimes.Phase.ASSEMBLE, t);
            losses = training.trainEpoch(x, y, order, options.maxBatch);
            t = lap(PhaseTimes.Phase.TRAIN_STEP, t);
        }
        lap(PhaseTimes.Phase.ASSEMBLE, t);
        if (losses.length != micro) {
            throw new GradbridgeException("train_epoch ran " + losses.length + " micro-batches, expected " + micro);
        }
        updates += micro;
        lastLoss = losses[micro - 1];
        return lastLoss;
    }

    private Tensor rowsToArray(List<byte[]> rows, Metadata.TensorSpec spec, DType type, ByteBuffer reused) {
        int bytes = rows.get(0).length * rows.size();
        ByteBuffer buffer = bytes <= reused.capacity()
                ? reused
                : ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
        buffer.clear();
        for (byte[] row : rows) {
            buffer.put(row);
        }
        buffer.flip();
        long[] shape = spec.getShape().clone();
        shape[0] = rows.size();
        return Tensor.fromBuffer(buffer, type, shape);
    }

    /**
     * The parameters now, whole, with their digests. Runs on one thread at a time: the opening
     * thread (recovery), then the training thread, then the closing thread after it ended.
     */
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
        long end = log.appendVersion(version);
        log.sync(end);
        current = version; // one volatile write: predictors see the old or the new snapshot, whole
        t = lap(PhaseTimes.Phase.PUBLISH, t);
        if (version.getId() % options.checkpointEvery == 0) {
            checkpoint(version, end);
            lap(PhaseTimes.Phase.CHECKPOINT, t);
        }
    }

    /**
     * Writes the training module (parameters and optimizer state) and then {@value
     * #CHECKPOINT_FILE}, each atomically; a crash between the two leaves the previous checkpoint
     * in force. Called on the training thread at a version boundary.
     */
    private void checkpoint(ModelVersion version, long versionEnd) throws IOException {
        String name = String.format(Locale.ROOT, "checkpoint-v%08d.pt", version.getId());
        training.saveCheckpoint(
                logDir.resolve(name),
                Metadata.Checkpoint.progress((int) Math.min(Integer.MAX_VALUE, version.getId()), 0L));
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
        JsonObject json = new JsonObject();
        json.addProperty("file", name);
        json.addProperty("version", version.getId());
        json.addProperty("updates", version.getUpdates());
        json.addProperty("loss", version.getLoss());
        json.addProperty("next_seq", nextEvent);
        json.addProperty("scan_offset", scanOffset);
        json.add("digests", GSON.toJsonTree(version.getDigests()));
        writeAtomically(logDir.resolve(CHECKPOINT_FILE), GSON.toJson(json).getBytes(StandardCharsets.UTF_8));
        lastCheckpointVersion = version.getId();
        try (DirectoryStream<Path> old = Files.newDirectoryStream(logDir, "checkpoint-v*.pt")) {
            for (Path file : old) {
                if (!file.getFileName().toString().equals(name)) {
                    Files.deleteIfExists(file);
                }
            }
        }
    }

    private static void writeAtomically(Path target, byte[] content) throws IOException {
        Path tmp = Files.createTempFile(target.getParent(), "." + target.getFileName(), ".tmp");
        try {
            try (FileChannel channel = FileChannel.open(tmp, StandardOpenOption.WRITE)) {
                ByteBuffer buffer = ByteBuffer.wrap(content);
                while (buffer.hasRemaining()) {
                    channel.write(buffer);
                }
                channel.force(true);
            }
            Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } finally {
            Files.deleteIfExists(tmp);
        }
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
        lock.lock();
        try {
            return updates;
        } finally {
            lock.unlock();
        }
    }

    /** @return events this learner accepted since it opened (not counting resumed ones) */
    public long acceptedEvents() {
        return acceptedEvents.get();
    }

    /** @return events refused because the queue was full */
    public long refusedEvents() {
        return refusedEvents.get();
    }

    /** @return predictions served */
    public long predictions() {
        return predictions.get();
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
     * Waits until every event accepted so far has been applied.
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
                    throw new IllegalStateException("online training has stopped: " + failure, failure);
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
                    long end = log.appendVersion(version);
                    log.sync(end);
                    current = version;
                    checkpoint(version, end);
                } else if (lastCheckpointVersion != last.getId()) {
                    checkpoint(last, log.end());
                }
            }
        } finally {
            log.close();
            for (Predictor predictor : allPredictors) {
                predictor.module.close();
            }
            training.close();
        }
    }
}
