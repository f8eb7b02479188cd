package dev.gradbridge.online;

import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Function;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Opening a log folder: reads the locked log and the checkpoint strictly and checks them against
 * the module and each other ({@link #read}, nothing written), then brings the training module to
 * where the log says it was ({@link #replay}): the logged micro-batches after the checkpoint are
 * applied again exactly as logged, each logged version's digests checked, and the events
 * acknowledged but not yet applied are queued again.
 */
final class Recovery {

    private static final Logger logger = LoggerFactory.getLogger(Recovery.class);

    private final Path logDir;
    private final LogWriter log;
    private final LogHeader wanted;
    private final Checkpoints.Descriptor checkpoint; // null: none
    private final LogReader.Contents contents;

    private Recovery(Path logDir, LogWriter log, LogHeader wanted, Checkpoints.Descriptor checkpoint,
            LogReader.Contents contents) {
        this.logDir = logDir;
        this.log = log;
        this.wanted = wanted;
        this.checkpoint = checkpoint;
        this.contents = contents;
    }

    /** @return the seed of the run's draws: the log's, else (a new log) the one it gets; null for an older log without one */
    Long runSeed() {
        return contents.getHeader() != null ? contents.getHeader().getSeed() : wanted.getSeed();
    }

    /**
     * Before the folder is created or locked: a checkpoint without its log is refused.
     *
     * @return whether the folder holds a log
     */
    static boolean checkUnlocked(Path logDir) {
        boolean hasLog = LogReader.exists(logDir);
        if (!hasLog && Checkpoints.exists(logDir)) {
            throw new LogCorruptException(logDir.resolve(Checkpoints.FILE) + " checkpoints a log, but "
                    + LogReader.file(logDir) + " is missing");
        }
        return hasLog;
    }

    /**
     * Reads the locked log and checkpoint; refuses a log or checkpoint of another model or one that
     * contradicts the other. Writes nothing.
     */
    static Recovery read(Path logDir, LogWriter log, LogHeader wanted, String modelSha256) throws IOException {
        Checkpoints.Descriptor checkpoint = Checkpoints.read(logDir);
        LogReader.Contents contents = log.read(checkpoint == null ? 0 : checkpoint.scanOffset);
        if (contents.getHeader() != null) {
            String mismatch = contents.getHeader().mismatch(wanted);
            if (mismatch != null) {
                throw new LogCorruptException(log.getFile() + ": offset 0: " + mismatch);
            }
        } else if (checkpoint != null) {
            throw new LogCorruptException(log.getFile() + " holds no record, but " + logDir.resolve(Checkpoints.FILE)
                    + " checkpoints one: the log was cut or replaced");
        }
        if (checkpoint != null) {
            Checkpoints.check(logDir, checkpoint, modelSha256, contents);
            Checkpoints.verifyModule(logDir, checkpoint);
            if (checkpoint.servingVersion != null && rollsBackPast(contents, checkpoint)) {
                // A rollback after the checkpoint to a version it does not keep: the whole log is applied again.
                logger.info("{}: a rollback after {} returns to a version published before it: resuming from the whole log",
                        logDir, checkpoint.file);
                return new Recovery(logDir, log, wanted, null, log.read(0));
            }
            Checkpoints.verifyServing(logDir, checkpoint);
        }
        return new Recovery(logDir, log, wanted, checkpoint, contents);
    }

    /** Whether a rollback after the gated checkpoint returns to a version older than its serving one. */
    private static boolean rollsBackPast(LogReader.Contents contents, Checkpoints.Descriptor checkpoint) {
        for (LogRecord record : contents.getRecords()) {
            if (record instanceof LogRecord.Rollback && record.getOffset() >= checkpoint.stateOffset
                    && ((LogRecord.Rollback) record).getVersion() < checkpoint.servingVersion) {
                return true;
            }
        }
        return false;
    }

    /** @return the checkpointed training module to load instead of the exported one, or null */
    Path checkpointModule() {
        return checkpoint == null ? null : logDir.resolve(checkpoint.file);
    }

    /**
     * Applies the logged micro-batches after the checkpoint (or the whole log) again on {@code
     * updater}, checking every logged version and quarantine; then the first write: the torn tail
     * is cut, a new log gets its header, and the records the crash kept from being written (a
     * version, a quarantine: only ever at the end) are appended. Sets the queue and publisher.
     */
    void replay(Updater updater, int publishEvery, FeedbackQueue queue, Publisher publisher, AtomicLong quarantined,
            Function<Path, TrainingModule> load) throws IOException {
        Pass pass = new Pass(updater, publishEvery, publisher);
        if (publisher.gated()) {
            startServing(updater, publisher, pass.last, load);
        }
        pass.undecided = undecidedAtCheckpoint(publisher, pass.last);
        pass.index();
        for (LogRecord record : contents.getRecords()) {
            pass.apply(record);
        }
        pass.finish(quarantined);
        pass.requeue(queue);
    }

    /**
     * With a gate, a checkpoint taken after its last version was logged but before the gate decided
     * on it: that version, unless its decision is in the checkpoint (before the state offset).
     */
    private ModelVersion undecidedAtCheckpoint(Publisher publisher, ModelVersion last) {
        if (!publisher.gated() || checkpoint == null || checkpoint.servingVersion == null
                || checkpoint.servingVersion == checkpoint.version) {
            return null;
        }
        for (LogRecord record : contents.getRecords()) {
            if (record instanceof LogRecord.Gate && ((LogRecord.Gate) record).getVersion() == checkpoint.version
                    && record.getOffset() < checkpoint.stateOffset) {
                return null;
            }
        }
        return last;
    }

    /** One pass of {@link #replay} over the log: what it has applied and found so far. */
    private final class Pass {
        private final Updater updater;
        private final int publishEvery;
        private final Publisher publisher;
        private final Path file = log.getFile();
        private long appliedSeq; // the next event a micro-batch must start at
        private ModelVersion last; // the last version reached
        private long checkpointedVersion = -1;
        private final long checkpointSeq;
        private final long stateOffset; // gate decisions and rollbacks after the checkpoint
        private ModelVersion undecided; // with a gate: the last version, while its decision is not applied
        private long maxSeq;
        private final Map<Long, LogRecord.Event> pending = new TreeMap<>();
        private final Map<Long, LogRecord.Version> loggedByUpdates = new HashMap<>();
        private final Map<String, FeedbackQueue.Key> keys = new HashMap<>();
        private final Map<String, Map<Integer, Long>> positions = new HashMap<>(); // source -> partition -> next offset
        private final List<ModelVersion> missing = new ArrayList<>(); // versions to append, in order
        private LogRecord.Batch refused; // a re-applied micro-batch that the guard refused: its Q must follow
        private String refusal;
        private int reapplied;

        /** Starts at the checkpoint (its parameters checked against its digests), else at version 0. */
        Pass(Updater updater, int publishEvery, Publisher publisher) {
            this.updater = updater;
            this.publishEvery = publishEvery;
            this.publisher = publisher;
            if (checkpoint == null) {
                appliedSeq = contents.getHeader() == null ? 0 : contents.getHeader().getFirstSeq();
                last = updater.snapshot(0, 0, Double.NaN);
            } else {
                appliedSeq = checkpoint.nextSeq;
                updater.resumeAt(checkpoint.updates);
                last = updater.snapshot(checkpoint.version, checkpoint.updates, checkpoint.loss);
                if (!checkpoint.digests.equals(last.getDigests())) {
                    throw new LogCorruptException(logDir.resolve(Checkpoints.FILE) + " does not match the parameters of "
                            + logDir.resolve(checkpoint.file));
                }
                checkpointedVersion = last.getId();
            }
            checkpointSeq = appliedSeq;
            stateOffset = checkpoint == null ? 0 : checkpoint.stateOffset;
            maxSeq = appliedSeq - 1;
        }

        /** Before applying: the logged versions by updates, the keys, the source positions; version 0 when unlogged. */
        void index() {
            boolean versionZeroLogged = checkpoint != null;
            for (LogRecord record : contents.getRecords()) {
                if (record instanceof LogRecord.Version) {
                    LogRecord.Version version = (LogRecord.Version) record;
                    loggedByUpdates.put(version.getUpdates(), version);
                    versionZeroLogged |= version.getId() == 0;
                } else if (record instanceof LogRecord.Key) {
                    LogRecord.Key key = (LogRecord.Key) record;
                    keys.put(key.getKey(), new FeedbackQueue.Key(key.getFirstSeq(), key.getCount(), key.sha256(), 0));
                    maxSeq = Math.max(maxSeq, key.getFirstSeq() + key.getCount() - 1);
                } else if (record instanceof LogRecord.Position) {
                    advance((LogRecord.Position) record);
                }
            }
            if (!versionZeroLogged) {
                missing.add(last);
            }
        }

        /** A source read's offsets, each continuing where the log had reached. */
        private void advance(LogRecord.Position position) {
            Map<Integer, Long> partitions = positions.computeIfAbsent(position.getSource(), s -> new HashMap<>());
            for (long[] range : position.ranges()) {
                Long at = partitions.get((int) range[0]);
                if (at != null && at != range[1]) {
                    throw new LogCorruptException(file + ": offset " + position.getOffset() + ": " + position.getSource()
                            + " partition " + range[0] + " continues at offset " + range[1] + " but the log had reached "
                            + at + " (a gap or an overlap)");
                }
                partitions.put((int) range[0], range[2]);
            }
        }

        /** One record, in log order. */
        void apply(LogRecord record) {
            if (record instanceof LogRecord.Event) {
                LogRecord.Event event = (LogRecord.Event) record;
                maxSeq = Math.max(maxSeq, event.getSeq());
                if (event.getSeq() >= appliedSeq) {
                    pending.put(event.getSeq(), event);
                }
            } else if (record instanceof LogRecord.Gate) {
                if (record.getOffset() >= stateOffset) { // else decided before the checkpoint
                    gate((LogRecord.Gate) record);
                }
            } else if (record instanceof LogRecord.Rollback) {
                if (record.getOffset() >= stateOffset) {
                    rollback((LogRecord.Rollback) record);
                }
            } else if (record instanceof LogRecord.Quarantine) {
                quarantine((LogRecord.Quarantine) record);
            } else if (record instanceof LogRecord.Batch) {
                batch((LogRecord.Batch) record);
            }
        }

        /** A gate decision: on the version just reached, and reproduced bit for bit. */
        private void gate(LogRecord.Gate gate) {
            if (!publisher.gated() || undecided == null || gate.getVersion() != undecided.getId()) {
                throw new LogCorruptException(file + ": offset " + gate.getOffset() + ": a gate decision on version "
                        + gate.getVersion() + ", which " + (publisher.gated() ? "is not the version just logged"
                        : "a learner without a publish gate never writes"));
            }
            checkGate(file, gate, publisher);
            publisher.applyDecision(undecided, gate.getLoss(), gate.getDecision());
            undecided = null;
        }

        /** A rollback: from the serving version to a kept one, after the last decision. */
        private void rollback(LogRecord.Rollback rollback) {
            if (!publisher.gated() || undecided != null || !publisher.isKept(rollback.getVersion())
                    || rollback.getFrom() != publisher.serving().getId()) {
                throw new LogCorruptException(file + ": offset " + rollback.getOffset() + ": a rollback from version "
                        + rollback.getFrom() + " to version " + rollback.getVersion() + ", which applying the log again"
                        + " cannot reproduce (serving: " + (publisher.gated() ? publisher.serving().getId() + ", kept: "
                        + publisher.keptIds() : "no publish gate") + ")");
            }
            publisher.applyRollback(rollback.getVersion());
        }

        /** A quarantine: of the micro-batch just refused again (or before the checkpoint). */
        private void quarantine(LogRecord.Quarantine q) {
            if (q.getFirstSeq() < checkpointSeq) {
                return; // before the checkpoint
            }
            if (refused == null || refused.getFirstSeq() != q.getFirstSeq()) {
                throw new LogCorruptException(file + ": offset " + q.getOffset() + ": quarantines the micro-batch from event "
                        + q.getFirstSeq() + ", which applies cleanly when replayed");
            }
            refused = null;
        }

        /** A micro-batch after the checkpoint: applied again from its events; a version when one is due or logged. */
        private void batch(LogRecord.Batch batch) {
            if (batch.getFirstSeq() < appliedSeq) {
                return; // applied before the checkpoint
            }
            checkBatch(batch);
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
            String why = updater.apply(batch.getFirstSeq(), xs, ys);
            appliedSeq += batch.getCount();
            if (why != null) {
                refused = batch;
                refusal = why;
                return;
            }
            LogRecord.Version logged = loggedByUpdates.get(updater.updates());
            if (logged != null || updater.updates() % publishEvery == 0) {
                reach(logged);
            }
        }

        /** A micro-batch comes after the last one's quarantine and decision, and is the next one, from the next event. */
        private void checkBatch(LogRecord.Batch batch) {
            if (refused != null) {
                throw new LogCorruptException(file + ": offset " + refused.getOffset() + ": the micro-batch from event "
                        + refused.getFirstSeq() + " is refused when replayed (" + refusal + ") but the log has no quarantine for it");
            }
            if (undecided != null) {
                throw new LogCorruptException(file + ": offset " + batch.getOffset() + ": a micro-batch before the gate"
                        + " decision on version " + undecided.getId());
            }
            long floor = contents.getHeader().getSeqFloor();
            if (appliedSeq < floor && batch.getFirstSeq() == floor && pending.keySet().stream().allMatch(k -> k >= floor)) {
                appliedSeq = floor; // a recovered log: the numbers below the floor are gone for good
            }
            if (batch.getIndex() != updater.updates() || batch.getFirstSeq() != appliedSeq) {
                throw new LogCorruptException(file + ": offset " + batch.getOffset() + ": micro-batch " + batch.getIndex()
                        + " starts at event " + batch.getFirstSeq() + "; expected micro-batch " + updater.updates()
                        + " from event " + appliedSeq);
            }
        }

        /** The next version, checked against the one logged (null: the crash came before its record). */
        private void reach(LogRecord.Version logged) {
            ModelVersion version = updater.snapshot(last.getId() + 1);
            if (logged == null) {
                missing.add(version); // the crash came before this record
            } else if (logged.getId() != version.getId() || !logged.getDigests().equals(version.getDigests())) {
                throw new LogCorruptException(file + ": offset " + logged.getOffset() + ": applying the logged"
                        + " micro-batches again does not reproduce version " + logged.getId() + " (" + logged.getUpdates()
                        + " updates)");
            }
            last = version;
            publisher.reached(version);
            if (publisher.gated()) {
                undecided = version;
            }
        }

        /**
         * The first write: the torn tail goes, a new log gets its header, then what the crash kept from
         * being written (versions, the last gate decision, the last quarantine); the publisher resumes.
         */
        void finish(AtomicLong quarantined) throws IOException {
            log.begin(contents, wanted);
            for (ModelVersion version : missing) {
                log.appendVersion(version.getId(), version.getUpdates(), version.getLoss(), version.getDigests());
            }
            if (undecided != null) { // the crash came before the gate's decision on the last version
                publisher.decide(undecided);
            }
            if (refused != null) { // the last micro-batch, refused again: the crash came before its quarantine
                log.appendQuarantine(refused.getIndex(), refused.getFirstSeq(), refused.getCount(), refusal);
                quarantined.incrementAndGet();
            }
            log.sync(log.end());
            publisher.resume(last, checkpointedVersion);
        }

        /** Queues the events acknowledged but not applied, with the keys and source positions the log holds. */
        void requeue(FeedbackQueue queue) {
            long floor = contents.getHeader() == null ? 0 : contents.getHeader().getSeqFloor();
            long nextSeq = Math.max(Math.max(maxSeq + 1, appliedSeq), floor);
            List<FeedbackQueue.Event> queued = new ArrayList<>(pending.size());
            for (LogRecord.Event event : pending.values()) {
                queued.add(new FeedbackQueue.Event(event.getSeq(), event.getOffset(), event.x(), event.y()));
            }
            queue.restore(nextSeq, pending.isEmpty() ? nextSeq : appliedSeq, queued, keys, positions);
            if (reapplied > 0 || !pending.isEmpty() || contents.getTornBytes() > 0) {
                logger.info("{}: resumed at {}: {} micro-batches applied again, {} events queued again, {} torn bytes cut",
                        logDir, last, reapplied, pending.size(), contents.getTornBytes());
            }
        }
    }

    /**
     * The serving version when the log starts applying: version 0, or the gated checkpoint's
     * serving version (the checkpoint itself, or its serving file, checked against the log).
     */
    private void startServing(Updater updater, Publisher publisher, ModelVersion last, Function<Path, TrainingModule> load) {
        if (checkpoint == null || checkpoint.servingFile == null) {
            publisher.startServing(last, updater.module());
            return;
        }
        LogRecord.Version logged = null;
        for (LogRecord record : contents.getRecords()) {
            if (record instanceof LogRecord.Version && ((LogRecord.Version) record).getId() == checkpoint.servingVersion) {
                logged = (LogRecord.Version) record;
            }
        }
        Path path = logDir.resolve(checkpoint.servingFile);
        if (logged == null) {
            throw new LogCorruptException(log.getFile() + " does not hold version " + checkpoint.servingVersion
                    + ", which " + logDir.resolve(Checkpoints.FILE) + " serves: the log was cut or replaced");
        }
        try (TrainingModule module = load.apply(path)) {
            ModelVersion serving = updater.versionOf(module, logged.getId(), logged.getUpdates(), logged.getLoss());
            if (!serving.getDigests().equals(logged.getDigests())) {
                throw new LogCorruptException(path + " does not hold the parameters of version " + logged.getId()
                        + " that the log records; move the log folder's checkpoint.json aside to resume from the whole log instead");
            }
            publisher.startServing(serving, module);
        }
    }

    /** Applying the log again must reproduce a logged gate decision: both losses, bit for bit, and the decision. */
    private static void checkGate(Path file, LogRecord.Gate gate, Publisher publisher) {
        double loss = publisher.gateLoss();
        double servingLoss = publisher.servingLoss();
        int decision = publisher.decision(loss);
        if (gate.getServing() != publisher.serving().getId()
                || Double.doubleToLongBits(gate.getLoss()) != Double.doubleToLongBits(loss)
                || Double.doubleToLongBits(gate.getServingLoss()) != Double.doubleToLongBits(servingLoss)
                || gate.getDecision() != decision) {
            throw new LogCorruptException(file + ": offset " + gate.getOffset() + ": applying the log again does not"
                    + " reproduce the gate decision on version " + gate.getVersion() + ": logged " + gate.getLoss() + " vs serving"
                    + " version " + gate.getServing() + "'s " + gate.getServingLoss() + " (decision " + gate.getDecision()
                    + "), again " + loss + " vs version " + publisher.serving().getId() + "'s " + servingLoss + " (decision "
                    + decision + ")");
        }
    }
}
