package dev.gradbridge.online;

import dev.gradbridge.online.log.LogWriter;
import java.io.IOException;
import java.nio.file.Path;

/**
 * Versions out: logs a version with its digests, forces the log (so nothing a prediction answers
 * from is lost in a crash), publishes it with one volatile write and checkpoints every K versions.
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
    private volatile ModelVersion current;
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
        lastCheckpointVersion = checkpointedVersion;
    }

    /** @return the version predictions use now */
    ModelVersion current() {
        return current;
    }

    /** After an applied update: publishes a version every N updates. */
    void afterUpdate() throws IOException {
        if (updater.updates() % publishEvery != 0) {
            return;
        }
        long t = PhaseTimes.clock(phases);
        ModelVersion version = updater.snapshot(current.getId() + 1);
        t = PhaseTimes.lap(phases, PhaseTimes.Phase.SNAPSHOT, t);
        long end = publish(version);
        t = PhaseTimes.lap(phases, PhaseTimes.Phase.PUBLISH, t);
        if (version.getId() % checkpointEvery == 0) {
            checkpoint(version, end);
            PhaseTimes.lap(phases, PhaseTimes.Phase.CHECKPOINT, t);
        }
    }

    /** At a clean close: a last version when updates came after the last one, and a final checkpoint. */
    void finish() throws IOException {
        ModelVersion last = current;
        if (updater.updates() > last.getUpdates()) {
            ModelVersion version = updater.snapshot(last.getId() + 1);
            checkpoint(version, publish(version));
        } else if (lastCheckpointVersion != last.getId()) {
            checkpoint(last, log.end());
        }
    }

    /** Logs the version, forces the log, then makes it the one predictions use; returns its end offset. */
    private long publish(ModelVersion version) throws IOException {
        long end = log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
        log.sync(end);
        current = version; // one volatile write: predictors see the old or the new snapshot, whole
        return end;
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
