package dev.gradbridge.online;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.internal.InputMessages;
import dev.gradbridge.internal.Messages;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;

/**
 * Feedback in (any thread): checks a request against the module (shapes, finite values, the
 * loss on a predictor), splits it into one event per row, hands it to the {@link FeedbackQueue}
 * (which logs it) and forces the log as the policy says before the caller is answered.
 */
final class Ingest {

    /** Longest idempotency key. */
    static final int MAX_KEY_LENGTH = 200;

    private final Features features;
    private final Metadata.TensorSpec ySpec;
    private final int yRowBytes;
    private final int queueCapacity;
    private final PredictorPool lossCheck; // null: no loss check
    private final FeedbackQueue queue;
    private final LogWriter log;
    private final Consumer<Throwable> fail;
    private final PhaseTimes phases;
    private final double maxInputAbs; // 0: no limit

    final AtomicLong accepted = new AtomicLong();
    final AtomicLong refused = new AtomicLong();
    final AtomicLong duplicates = new AtomicLong();
    final AtomicLong sourceRefused = new AtomicLong(); // source records refused (not feedback the module takes)

    Ingest(Features features, Metadata.TensorSpec ySpec, int queueCapacity, PredictorPool lossCheck,
            FeedbackQueue queue, LogWriter log, Consumer<Throwable> fail, PhaseTimes phases, double maxInputAbs) {
        this.features = features;
        this.ySpec = ySpec;
        this.yRowBytes = rowBytes(ySpec);
        this.queueCapacity = queueCapacity;
        this.lossCheck = lossCheck;
        this.queue = queue;
        this.log = log;
        this.fail = fail;
        this.phases = phases;
        this.maxInputAbs = maxInputAbs;
    }

    /**
     * Refuses an input holding a floating-point value beyond the magnitude limit, naming the field
     * and the element.
     *
     * @throws InvalidInputException when a value exceeds it
     */
    void checkMagnitude(Map<String, HostTensor> x) {
        if (maxInputAbs <= 0) {
            return;
        }
        for (String name : features.names()) {
            HostTensor tensor = x.get(name);
            long index = tensor.firstAbove(maxInputAbs);
            if (index >= 0) {
                throw new InvalidInputException(InputMessages.inputTooLarge(features.field(name), tensor.indexOf(index),
                        tensor.valueAt(index), maxInputAbs));
            }
        }
    }

    /**
     * Checks a prediction's inputs (fit, finite, within the magnitude limit).
     *
     * @return the inputs in the module's dtypes ({@link Features#carried})
     */
    Map<String, HostTensor> checkPrediction(Map<String, HostTensor> given) {
        Map<String, HostTensor> x = features.carried(given);
        features.rows("predict", x);
        if (!features.allFinite(x)) {
            throw new InvalidInputException("x holds NaN or infinite values");
        }
        checkMagnitude(x);
        return x;
    }

    /** See {@link OnlineLearner#offer(Map, HostTensor, String, long, TimeUnit)}. */
    OnlineLearner.Receipt learn(Map<String, HostTensor> given, HostTensor target, String key, long timeout,
            TimeUnit unit) {
        phases.start();
        Map<String, HostTensor> x = features.carried(given);
        HostTensor y = target.carriedAs(ySpec.getDtype(), "y");
        long rows = checkFeedback(x, y, queueCapacity, "call");
        byte[] sha = null;
        if (key != null) {
            checkKey(key);
            sha = features.sha256(x, y);
        }
        if (lossCheck != null) {
            lossCheck.checkLoss(x, y);
        }
        List<byte[]> xRows = features.split(x, rows);
        List<byte[]> yRows = split(y.bytes(), yRowBytes);
        phases.lap(PhaseTimes.Phase.LEARN_VALIDATE);
        FeedbackQueue.Accepted done;
        try {
            done = queue.offer(log, xRows, yRows, key, sha, timeout, unit);
        } catch (QueueFullException e) {
            refused.addAndGet(rows);
            throw e;
        }
        (done.duplicate ? duplicates : accepted).addAndGet(rows);
        phases.start();
        try {
            log.sync(done.end); // outside the queue's lock: concurrent callers share one fsync
            phases.lap(PhaseTimes.Phase.LEARN_SYNC);
        } catch (IOException e) {
            fail.accept(e); // what is durable is unknown now: stop rather than acknowledge anything more
            throw new UncheckedIOException("cannot fsync " + log.getFile() + ": " + e.getMessage(), e);
        }
        return new OnlineLearner.Receipt(done.firstSeq, rows, done.duplicate);
    }

    /**
     * See {@link OnlineLearner#learnFromSource}: each record checked as {@link #learn} checks a
     * request (a record that fails is refused, not thrown), then one write with the offsets read.
     */
    SourcedRead.Result learnSourced(String source, List<SourceRecord> records, Map<Integer, long[]> ranges,
            long timeout, TimeUnit unit) {
        List<SourcedRead.Item> items = new ArrayList<>(records.size());
        for (SourceRecord record : records) {
            items.add(check(record));
        }
        SourcedRead.Result done;
        try {
            done = queue.offerSourced(log, source, items, ranges, timeout, unit);
        } catch (QueueFullException e) {
            long rows = items.stream().mapToLong(SourcedRead.Item::rows).sum();
            refused.addAndGet(rows);
            throw e;
        }
        accepted.addAndGet(done.logged);
        duplicates.addAndGet(done.duplicates);
        sourceRefused.addAndGet(done.refusals.size());
        try {
            log.sync(done.end);
        } catch (IOException e) {
            fail.accept(e);
            throw new UncheckedIOException("cannot fsync " + log.getFile() + ": " + e.getMessage(), e);
        }
        return done;
    }

    private SourcedRead.Item check(SourceRecord record) {
        if (record.refusal != null) {
            return new SourcedRead.Item(record.partition, record.offset, null, null, null, null, record.refusal);
        }
        try {
            Map<String, HostTensor> x = features.carried(record.x);
            HostTensor y = record.y.carriedAs(ySpec.getDtype(), "y");
            long rows = checkFeedback(x, y, queueCapacity / 2, "record");
            byte[] sha = null;
            if (record.key != null) {
                checkKey(record.key);
                sha = features.sha256(x, y);
            }
            if (lossCheck != null) {
                lossCheck.checkLoss(x, y);
            }
            return new SourcedRead.Item(record.partition, record.offset, record.key, sha,
                    features.split(x, rows), split(y.bytes(), yRowBytes), null);
        } catch (InvalidInputException e) {
            return new SourcedRead.Item(record.partition, record.offset, null, null, null, null, e.getMessage());
        }
    }

    /** Inputs and targets of one request or record: fit, finite, within the limits; returns the rows. */
    private long checkFeedback(Map<String, HostTensor> x, HostTensor y, long most, String what) {
        long rows = features.rows("learn", x);
        if (rows("y", ySpec, y) != rows) {
            throw new InvalidInputException(features.field(features.names().get(0)) + " has " + rows + " rows but y has "
                    + y.rows());
        }
        if (!features.allFinite(x) || !y.allFinite()) {
            throw new InvalidInputException("feedback holds NaN or infinite values");
        }
        checkMagnitude(x);
        if (rows > most) {
            throw new InvalidInputException(rows + " events in one " + what + " exceed " + ("call".equals(what)
                    ? "the queue capacity " : "half the queue capacity ") + queueCapacity);
        }
        return rows;
    }

    /**
     * @return the rows of {@code tensor}
     * @throws InvalidInputException when it does not fit {@code spec} or has no rows
     */
    static long rows(String name, Metadata.TensorSpec spec, HostTensor tensor) {
        long[] shape = tensor.getShape();
        if (shape.length > 0 && shape[0] == 0) { // also [] in JSON, whose inner shape cannot show
            throw new InvalidInputException("input " + name + " has no rows: send at least one");
        }
        if (!spec.accepts(tensor.getDtype(), shape) || shape.length == 0) {
            throw new InvalidInputException(
                    Messages.tensorSpec("", "input " + name, spec.getDtype(), spec.getShape(), tensor.getDtype(), shape));
        }
        return shape[0];
    }

    /** @return the dimensions of one sample (without the batch dimension) */
    static long[] sampleShape(Metadata.TensorSpec spec) {
        long[] shape = spec.getShape();
        return Arrays.copyOfRange(shape, 1, shape.length);
    }

    /** @return bytes of one sample; a variable dimension is refused */
    static int rowBytes(Metadata.TensorSpec spec) {
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

    private static List<byte[]> split(byte[] bytes, int rowBytes) {
        List<byte[]> rows = new ArrayList<>(bytes.length / Math.max(1, rowBytes));
        for (int offset = 0; offset < bytes.length; offset += rowBytes) {
            rows.add(Arrays.copyOfRange(bytes, offset, offset + rowBytes));
        }
        return rows;
    }

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

}
