package dev.gradbridge.online;

import dev.gradbridge.online.log.LogWriter;
import java.io.IOException;
import java.nio.file.Path;

/**
 * Versions out: logs a version with its digests and publishes it with one volatile write once its
 * record is durable (so nothing a prediction answers from is lost in a crash: under fsync always
 * after the log's group commit, without the training thread waiting), checkpoints every K versions.
 */
final class Publisher {

    private final Path logDir;
    private final LogWriter log;
    private final FeedbackQueue queue;
    private final Updater updater;
    private final String modelSha256;
    private final int publishEvery;
    private final int checkpointEvery;
    private final PhaseTimes phases;
    private volatile ModelVersion current; // the published version
    private ModelVersion logged; // the last version logged (training thread, then closing)
    private long lastCheckpointVersion = -1; // training thread, then closing

    Publisher(Path logDir, LogWriter log, FeedbackQueue queue, Updater updater, String modelSha256, int publishEvery,
            int checkpointEvery, PhaseTimes phases) {
        this.logDir = logDir;
        this.log = log;
        this.queue = queue;
        this.updater = updater;
        this.modelSha256 = modelSha256;
        this.publishEvery = publishEvery;
        this.checkpointEvery = checkpointEvery;
        this.phases = phases;
    }

    /** Sets the version recovery arrived at, and the last checkpointed version (-1: none). */
    void resume(ModelVersion version, long checkpointedVersion) {
        current = version;
        logged = version;
        lastCheckpointVersion = checkpointedVersion;
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
     * every K versions, where it waits and checkpoints.
     */
    void afterUpdate() throws IOException {
        if (updater.updates() % publishEvery != 0) {
            return;
        }
        long t = PhaseTimes.clock(phases);
        ModelVersion version = updater.snapshot(logged.getId() + 1);
        t = PhaseTimes.lap(phases, PhaseTimes.Phase.SNAPSHOT, t);
        long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
        logged = version;
        if (version.getId() % checkpointEvery != 0) {
            log.afterSync(end, () -> publishIfNewer(version));
            PhaseTimes.lap(phases, PhaseTimes.Phase.PUBLISH, t);
            return;
        }
        log.sync(end);
        publishIfNewer(version);
        t = PhaseTimes.lap(phases, PhaseTimes.Phase.PUBLISH, t);
        checkpoint(version, end);
        PhaseTimes.lap(phases, PhaseTimes.Phase.CHECKPOINT, t);
    }

    /** At a clean close: a last version when updates came after the last one, and a final checkpoint. */
    void finish() throws IOException {
        log.sync(log.end()); // versions still waiting for group commit: durable, so published now
        ModelVersion last = logged;
        if (updater.updates() > last.getUpdates()) {
            ModelVersion version = updater.snapshot(last.getId() + 1);
            long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
            logged = version;
            log.sync(end);
            publishIfNewer(version);
            checkpoint(version, end);
        } else {
            publishIfNewer(last);
            if (lastCheckpointVersion != last.getId()) {
                checkpoint(last, log.end());
            }
        }
    }

    /** Makes {@code version} the one predictions use unless a newer one already is (group commit may reorder). */
    private synchronized void publishIfNewer(ModelVersion version) {
        if (current == null || version.getId() > current.getId()) {
            current = version; // one volatile write: predictors see the old or the new snapshot, whole
        }
    }

    /** Writes a checkpoint at a version boundary. */
    private void checkpoint(ModelVersion version, long versionEnd) throws IOException {
        // Events still queued and micro-batches after this version both lie after the scan offset.
        long[] resume = queue.resumePoint(versionEnd);
        Checkpoints.write(logDir, updater.module(), new Checkpoints.Descriptor(Checkpoints.fileName(version.getId()),
                modelSha256, version.getId(), version.getUpdates(), version.getLoss(), resume[0], resume[1],
                version.getDigests()));
        lastCheckpointVersion = version.getId();
    }
}
