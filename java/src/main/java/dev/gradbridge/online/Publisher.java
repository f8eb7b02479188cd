package dev.gradbridge.online;

import dev.gradbridge.internal.Digests;
import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.ReentrantLock;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Versions out: logs a version with its digests and publishes it with one volatile write once its
 * record is durable (so nothing a prediction answers from is lost in a crash: under fsync always
 * after the log's group commit, without the training thread waiting), checkpoints every K versions.
 *
 * <p>With a publish {@link Gate}, a version is published only when it passes the gate; the decision
 * is logged right after the version (a {@code G} record), and the published versions are kept (the
 * last {@code keepVersions}; the newest is the serving one) so that {@link #rollback} can return
 * predictions to one of them. Everything that changes which version serves or what the learner
 * holds happens under {@link #lock}, in log order, so a restart and the replay take the same path.
 */
final class Publisher {

    private static final Logger logger = LoggerFactory.getLogger(Publisher.class);

    /** A published version kept for rollbacks: its gate loss and, under {@link HoldPolicy#ROLLBACK}, the learner then. */
    static final class Kept {
        final ModelVersion version;
        final double loss;
        final TrainingModule state; // null unless the hold policy is ROLLBACK

        Kept(ModelVersion version, double loss, TrainingModule state) {
            this.version = version;
            this.loss = loss;
            this.state = state;
        }
    }

    /** Held by the training thread while it applies a run of micro-batches, and by a rollback. */
    final ReentrantLock lock = new ReentrantLock(true);

    private final Path logDir;
    private final LogWriter log;
    private final FeedbackQueue queue;
    private final Updater updater;
    private final String modelSha256;
    private final int publishEvery;
    private final int checkpointEvery;
    private final PhaseTimes phases;
    private final Gate gate; // null: every version is published
    private volatile ModelVersion current; // the published version
    private ModelVersion logged; // the last version logged (training thread, then closing)
    private boolean atLogged = true; // the learner holds `logged`'s state (no rollback since)
    private long lastCheckpointVersion = -1; // training thread, then closing
    private final ArrayDeque<Kept> kept = new ArrayDeque<>(); // under lock: published versions, oldest first
    private long generation; // guarded by this: a rollback keeps versions logged before it from being published
    private long writtenServing = -1; // the serving version whose file the last checkpoint wrote
    private String writtenServingSha256;
    // Read by LearnerStats, from any thread:
    volatile long latest; // the newest version logged and decided (published, or held back); set after its publication is queued
    final AtomicLong published = new AtomicLong(); // versions published (every version without a gate)
    final AtomicLong held = new AtomicLong(); // versions the gate held back
    final AtomicLong rollbacks = new AtomicLong();
    volatile double lastGateLoss = Double.NaN; // of the last version the gate decided on
    volatile double servingGateLoss = Double.NaN;

    Publisher(Path logDir, LogWriter log, FeedbackQueue queue, Updater updater, String modelSha256, int publishEvery,
            int checkpointEvery, PhaseTimes phases, Gate gate) {
        this.logDir = logDir;
        this.log = log;
        this.queue = queue;
        this.updater = updater;
        this.modelSha256 = modelSha256;
        this.publishEvery = publishEvery;
        this.checkpointEvery = checkpointEvery;
        this.phases = phases;
        this.gate = gate;
    }

    /** Sets the version recovery arrived at, and the last checkpointed version (-1: none). */
    void resume(ModelVersion version, long checkpointedVersion) {
        logged = version;
        latest = version.getId();
        lastCheckpointVersion = checkpointedVersion;
        current = gate == null ? version : kept.getLast().version;
    }

    /** Recovery re-derived {@code version}: the learner holds its state. */
    void reached(ModelVersion version) {
        logged = version;
        atLogged = true;
    }

    /** @return the version predictions use now */
    ModelVersion current() {
        return current;
    }

    /** @return updates to apply before the next version is due (1..N) */
    int updatesToVersion() {
        return (int) (publishEvery - updater.updates() % publishEvery);
    }

    /**
     * After an applied update: a version every N updates, logged now and published once its
     * record is durable (group commit: the training thread does not wait for the fsync), except
     * every K versions, where it waits and checkpoints. With a gate: the checkpoint comes before
     * the decision, which is applied again after it on a restart.
     */
    void afterUpdate() throws IOException {
        if (updater.updates() % publishEvery != 0) {
            return;
        }
        phases.start();
        ModelVersion version = updater.snapshot(logged.getId() + 1);
        phases.lap(PhaseTimes.Phase.SNAPSHOT);
        long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
        logged = version;
        atLogged = true;
        boolean checkpointDue = version.getId() % checkpointEvery == 0;
        if (gate != null) {
            if (checkpointDue) {
                log.sync(end);
                checkpoint(version, end);
            }
            decide(version);
            phases.lap(PhaseTimes.Phase.PUBLISH);
            return;
        }
        published.incrementAndGet();
        if (!checkpointDue) {
            log.afterSync(end, () -> publishIfNewer(version));
            latest = version.getId();
            phases.lap(PhaseTimes.Phase.PUBLISH);
            return;
        }
        log.sync(end);
        publishIfNewer(version);
        latest = version.getId();
        phases.lap(PhaseTimes.Phase.PUBLISH);
        checkpoint(version, end);
        phases.lap(PhaseTimes.Phase.CHECKPOINT);
    }

    /** At a clean close: a last version when updates came after the last one, and a final checkpoint. */
    void finish() throws IOException {
        lock.lock();
        try {
            log.sync(log.end()); // versions still waiting for group commit: durable, so published now
            ModelVersion last = logged;
            if (updater.updates() > last.getUpdates()) {
                ModelVersion version = updater.snapshot(last.getId() + 1);
                long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
                logged = version;
                atLogged = true;
                log.sync(end);
                if (gate == null) {
                    published.incrementAndGet();
                    latest = version.getId();
                    publishIfNewer(version);
                    checkpoint(version, end);
                } else {
                    checkpoint(version, end);
                    decide(version);
                    log.sync(log.end());
                    publishServing();
                }
            } else {
                if (gate == null) {
                    publishIfNewer(last);
                } else {
                    publishServing();
                }
                // After a rollback the learner holds no logged version's state: the last checkpoint stays.
                if (lastCheckpointVersion != last.getId() && atLogged) {
                    checkpoint(last, log.end());
                }
            }
        } finally {
            lock.unlock();
        }
    }

    /** Makes {@code version} the one predictions use unless a newer one already is (group commit may reorder). */
    private synchronized void publishIfNewer(ModelVersion version) {
        if (current == null || version.getId() > current.getId()) {
            current = version; // one volatile write: predictors see the old or the new snapshot, whole
        }
    }

    /** As {@link #publishIfNewer}, unless a rollback came after the version was logged. */
    private synchronized void publishIf(ModelVersion version, long loggedGeneration) {
        if (loggedGeneration == generation) {
            publishIfNewer(version);
        }
    }

    /** The serving version, at once (closing: its record is durable). */
    private synchronized void publishServing() {
        current = kept.getLast().version;
    }

    // ---- the publish gate ----

    /** @return whether versions go through a publish gate */
    boolean gated() {
        return gate != null;
    }

    /** The version the log starts serving from (recovery): version 0, or the checkpoint's serving version. */
    void startServing(ModelVersion version, TrainingModule module) {
        double loss = gate.loss(module);
        kept.addLast(new Kept(version, loss, gate.onHold() == HoldPolicy.ROLLBACK ? updater.copyOf(module).orElseThrow(
                () -> new IllegalStateException("--gate-on-hold rollback cannot copy the learner")) : null));
        servingGateLoss = loss;
    }

    /** @return the serving version (the newest kept) */
    ModelVersion serving() {
        return kept.getLast().version;
    }

    /** @return the serving version's gate loss */
    double servingLoss() {
        return kept.getLast().loss;
    }

    /** @return the decision a gate takes on a version of gate loss {@code loss} now */
    int decision(double loss) {
        if (gate.passes(loss, kept.getLast().loss)) {
            return LogRecord.Gate.PUBLISHED;
        }
        return gate.onHold() == HoldPolicy.ROLLBACK ? LogRecord.Gate.ROLLED_BACK : LogRecord.Gate.HELD;
    }

    /** @return the learner's loss on the gate data now */
    double gateLoss() {
        return gate.loss(updater.module());
    }

    /** The gate's decision on the version just logged: logged, applied, published once durable. */
    void decide(ModelVersion version) throws IOException {
        Kept serving = kept.getLast();
        double loss = gateLoss();
        int decision = decision(loss);
        long end = log.appendGate(version.getId(), serving.version.getId(), loss, serving.loss, decision);
        applyDecision(version, loss, decision);
        if (decision == LogRecord.Gate.PUBLISHED) {
            long loggedGeneration;
            synchronized (this) {
                loggedGeneration = generation;
            }
            log.afterSync(end, () -> publishIf(version, loggedGeneration));
            latest = version.getId();
        } else {
            latest = version.getId();
            logger.warn("{}: version {} held back: its gate loss {} exceeds serving version {}'s {} by more than {}{}",
                    logDir, version.getId(), loss, serving.version.getId(), serving.loss, gate.maxRegression(),
                    decision == LogRecord.Gate.ROLLED_BACK ? "; the learner returns to version " + serving.version.getId() : "");
        }
    }

    /** A logged (or just taken) decision's effect: the version kept and served, or held (and the learner rolled back). */
    void applyDecision(ModelVersion version, double loss, int decision) {
        lastGateLoss = loss;
        if (decision == LogRecord.Gate.PUBLISHED) {
            keep(new Kept(version, loss, gate.onHold() == HoldPolicy.ROLLBACK ? updater.copyState() : null));
            servingGateLoss = loss;
            published.incrementAndGet();
            return;
        }
        held.incrementAndGet();
        if (decision == LogRecord.Gate.ROLLED_BACK) {
            updater.restore(kept.getLast().state);
            atLogged = false;
        }
    }

    private void keep(Kept version) {
        kept.addLast(version);
        while (kept.size() > gate.keepVersions()) {
            close(kept.removeFirst());
        }
    }

    private static void close(Kept version) {
        if (version.state != null) {
            version.state.close();
        }
    }

    /**
     * Returns predictions to an earlier kept version (under {@link HoldPolicy#ROLLBACK} the learner
     * too), once the rollback is in the log. Any thread.
     *
     * @param target the version, or null for the one published before the serving one
     * @return the version predictions use now
     * @throws IllegalStateException without a gate, with no earlier version kept, for the serving
     *     version itself, or once training has stopped
     * @throws NoSuchElementException when {@code target} is not a kept published version
     * @throws IOException when the log cannot be written
     */
    ModelVersion rollback(Long target) throws IOException {
        if (gate == null) {
            throw new IllegalStateException("a rollback needs a publish gate (--gate-data): without one the next version"
                    + " would replace the rolled-back one within --publish-every updates");
        }
        lock.lock();
        try {
            if (queue.failure() != null) {
                throw new IllegalStateException("training has stopped: " + queue.failure().getMessage());
            }
            Kept serving = kept.getLast();
            long id;
            if (target == null) {
                if (kept.size() < 2) {
                    throw new IllegalStateException("no version published before the serving version "
                            + serving.version.getId() + " is kept; kept: " + keptIds());
                }
                Iterator<Kept> newestFirst = kept.descendingIterator();
                newestFirst.next();
                id = newestFirst.next().version.getId();
            } else {
                id = target;
                if (id == serving.version.getId()) {
                    throw new IllegalStateException("version " + id + " is the serving version already");
                }
                if (kept.stream().noneMatch(k -> k.version.getId() == id)) {
                    throw new NoSuchElementException("version " + id + " is not a kept published version; kept: "
                            + keptIds() + " (--keep-versions " + gate.keepVersions() + ")");
                }
            }
            long end = log.appendRollback(id, serving.version.getId());
            log.sync(end); // durable before predictions change
            applyRollback(id);
            logger.warn("{}: rolled back from version {} to version {}", logDir, serving.version.getId(), id);
            return current;
        } finally {
            lock.unlock();
        }
    }

    /** A rollback's effect (live or applied again): the versions after {@code id} dropped, {@code id} served. */
    void applyRollback(long id) {
        while (kept.getLast().version.getId() != id) {
            close(kept.removeLast());
        }
        Kept to = kept.getLast();
        servingGateLoss = to.loss;
        rollbacks.incrementAndGet();
        synchronized (this) {
            generation++;
            current = to.version;
        }
        if (gate.onHold() == HoldPolicy.ROLLBACK) {
            updater.restore(to.state);
            atLogged = false;
        }
    }

    /** @return whether a kept version has id {@code id} */
    boolean isKept(long id) {
        return kept.stream().anyMatch(k -> k.version.getId() == id);
    }

    /** @return the kept published versions' ids, oldest first (any thread: a copy) */
    List<Long> keptIds() {
        lock.lock();
        try {
            List<Long> ids = new ArrayList<>();
            for (Kept k : kept) {
                ids.add(k.version.getId());
            }
            return ids;
        } finally {
            lock.unlock();
        }
    }

    /** Frees the kept learner copies (closing). */
    void close() {
        for (Kept k : kept) {
            close(k);
        }
        kept.clear();
    }

    /** Writes a checkpoint at a version boundary (with a gate: the serving version too, unless it is this one). */
    private void checkpoint(ModelVersion version, long versionEnd) throws IOException {
        // Events still queued and micro-batches after this version both lie after the scan offset.
        long[] resume = queue.resumePoint(versionEnd);
        boolean leavesOut = !updater.frozen().isEmpty();
        Checkpoints.Descriptor descriptor = new Checkpoints.Descriptor(Checkpoints.fileName(version.getId(), leavesOut),
                modelSha256, version.getId(), version.getUpdates(), version.getLoss(), resume[0], resume[1],
                version.getDigests());
        byte[] servingArchive = null;
        if (gate != null) {
            Kept serving = kept.getLast();
            long id = serving.version.getId();
            descriptor.servingVersion = id;
            descriptor.stateOffset = log.end(); // decisions and rollbacks from here on come after this checkpoint
            if (id != version.getId()) {
                descriptor.servingFile = Checkpoints.servingFileName(id, leavesOut);
                if (writtenServing != id) {
                    servingArchive = servingArchive(serving);
                    writtenServingSha256 = Digests.sha256Hex(servingArchive);
                    writtenServing = id;
                }
                descriptor.servingSha256 = writtenServingSha256;
            }
        }
        byte[] archive = updater.archive(updater.module(),
                Metadata.Checkpoint.progress((int) Math.min(Integer.MAX_VALUE, version.getId()), 0L));
        Checkpoints.write(logDir, archive, descriptor, servingArchive);
        lastCheckpointVersion = version.getId();
    }

    /**
     * The serving version as a module file: its kept learner, or the learner with its parameters and trained
     * buffers; the frozen tensors left out, as in a checkpoint.
     */
    private byte[] servingArchive(Kept serving) {
        Metadata.Checkpoint progress = Metadata.Checkpoint.progress(
                (int) Math.min(Integer.MAX_VALUE, serving.version.getId()), 0L);
        if (serving.state != null) {
            return updater.archive(serving.state, progress);
        }
        try (TrainingModule copy = updater.copyState()) {
            serving.version.applyTo(copy);
            return updater.archive(copy, progress);
        }
    }
}
