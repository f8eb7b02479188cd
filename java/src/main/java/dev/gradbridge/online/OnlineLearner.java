package dev.gradbridge.online;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
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
 * <p>The parts, one job each: {@link OnlineLearnerBuilder} (options; the package-private {@code
 * Assembly} wires the rest), {@link Recovery} (opening a log folder),
 * {@link Ingest} and {@link FeedbackQueue} (feedback in), {@link MicroBatcher} and {@link Updater}
 * (the training thread), {@link Publisher} (versions and checkpoints), {@link PredictorPool}
 * (predictions).
 *
 * <p>Buffers that training changes (BatchNorm's running statistics) are part of every version, with
 * the parameters; constant buffers stay as the module file has them. A module that draws random
 * numbers (dropout) draws each micro-batch's from libtorch's generator seeded from the log's seed
 * and the micro-batch's first event ({@link OnlineLearnerBuilder#optSeed}); predictors stay in eval mode and draw
 * nothing. Modules with gradient accumulation are refused.
 */
public final class OnlineLearner implements AutoCloseable {

    /** The online checkpoint's descriptor in the log folder. */
    public static final String CHECKPOINT_FILE = Checkpoints.FILE;
    /** Longest idempotency key. */
    public static final int MAX_KEY_LENGTH = Ingest.MAX_KEY_LENGTH;

    private final Assembly parts;
    private final AtomicLong predictions = new AtomicLong();
    private final Thread trainer;

    /** @return options with their defaults; {@link OnlineLearnerBuilder#open} starts a learner */
    public static OnlineLearnerBuilder builder() {
        return new OnlineLearnerBuilder();
    }

    /** Takes the assembled parts and starts the training thread. */
    OnlineLearner(Assembly parts) {
        this.parts = parts;
        this.trainer = new Thread(parts.batcher, "gradbridge-online-trainer");
        trainer.setDaemon(true);
        trainer.start();
    }

    // ---- learning ----

    /**
     * Accepts feedback: one event per row of {@code x} and {@code y}, logged before this returns.
     * Refuses at once when the queue has no room ({@link #offer} can wait, and takes an
     * idempotency key).
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
        return offer(x, y, null, 0, TimeUnit.NANOSECONDS).getFirstSeq();
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
     * Like {@link #learn(HostTensor, HostTensor)}, with an idempotency key and a wait for room:
     * when a request with the same key was accepted before (by this learner or one before it on
     * the same log), nothing is logged or applied again and the answer is the first request's
     * events. Waiting up to {@code timeout} for room in the queue before refusing is back-pressure
     * that blocks a producer inside the process. The answer is the queue's own for this request,
     * whatever other callers do meanwhile.
     *
     * @param x inputs
     * @param y targets
     * @param key 1 to {@value #MAX_KEY_LENGTH} visible ASCII characters, or null for none
     * @param timeout the longest wait for room (0: do not wait)
     * @param unit its unit
     * @return the request's events and whether it was a duplicate
     * @throws KeyConflictException when the key came with other x or y before; nothing was logged
     */
    public Receipt offer(HostTensor x, HostTensor y, String key, long timeout, TimeUnit unit) {
        return parts.ingest.learn(parts.features.single("learn", x), y, key, timeout, unit);
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
        return parts.ingest.learn(x, y, key, timeout, unit);
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
        SourcedRead.Result done = parts.ingest.learnSourced(source, records, ranges, timeout, unit);
        return new SourceResult(done.logged, done.duplicates, done.refusals);
    }

    /**
     * @param source the source's name (the topic)
     * @return partition -> the next offset to read, as the log says (empty: the log holds none)
     */
    public Map<Integer, Long> sourcePositions(String source) {
        return parts.queue.positions(source);
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
        return predict(parts.features.single("predict", x));
    }

    /**
     * {@link #predict(HostTensor)} with the inputs by name (a module of several inputs, or {@code {x: tensor}}).
     *
     * @param x each input by name, batch dimension first, the same rows
     * @return the output and the version that computed it
     * @throws InvalidInputException when an input is missing, unknown or does not fit the module
     */
    public Prediction predict(Map<String, HostTensor> x) {
        Prediction prediction = parts.predictors.forward(parts.publisher::current, parts.ingest.checkPrediction(x));
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
        return parts.publisher.rollback(version);
    }

    /** @return the published versions kept for {@link #rollback}, oldest first (the last serves); empty without a gate */
    public List<Long> keptVersions() {
        return parts.gate == null ? Collections.emptyList() : parts.publisher.keptIds();
    }

    // ---- state ----

    /** @return the version predictions use now */
    public ModelVersion currentVersion() {
        return parts.publisher.current();
    }

    /** @return the learner's counters now: updates, events accepted and refused, versions, predictions */
    public LearnerStats stats() {
        return new LearnerStats(parts, predictions.get());
    }

    /** @return why training stopped, or null while it runs (or after a clean close) */
    public Throwable getFailure() {
        return parts.queue.failure();
    }

    /** @return the log folder */
    public Path getLogDir() {
        return parts.logDir;
    }

    /** @return the module's metadata */
    public Metadata getMetadata() {
        return parts.metadata;
    }

    /** @return where the time went per phase, or null unless {@link OnlineLearnerBuilder#optTimePhases} was on */
    public PhaseTimes phaseTimes() {
        return parts.phases.isOn() ? parts.phases : null;
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
        return parts.queue.awaitIdle(timeout, unit) && parts.log.awaitActions(deadline - System.nanoTime());
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
        if (!parts.queue.stop(halt)) {
            return;
        }
        try {
            trainer.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        Throwable failure = parts.queue.failure();
        try {
            if (!halt && failure == null) {
                parts.publisher.finish();
            }
        } finally {
            parts.close();
        }
        if (!halt && failure != null) {
            throw new IllegalStateException("online training had stopped: " + failure.getMessage(), failure);
        }
    }
}
