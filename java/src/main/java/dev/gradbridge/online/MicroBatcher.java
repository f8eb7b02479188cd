package dev.gradbridge.online;

import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The training thread's loop: takes events in log order as micro-batches (up to B events, or
 * what arrived T ms after the first; with the full ones waiting behind, up to the next version),
 * applies them (or quarantines one, in the log with the guard's reason), logs each micro-batch,
 * and lets the {@link Publisher} publish.
 */
final class MicroBatcher implements Runnable {

    private static final Logger logger = LoggerFactory.getLogger(MicroBatcher.class);
    /** Micro-batches taken (and applied in one native call) at most at once: bounds how long a halt waits. */
    private static final int MAX_BATCHES_PER_CALL = 32;

    private final Path logDir;
    private final LogWriter log;
    private final FeedbackQueue queue;
    private final Updater updater;
    private final Publisher publisher;
    private final int maxBatch;
    private final long maxWaitMillis;
    private final AtomicLong quarantined;
    private final PhaseTimes phases;

    MicroBatcher(Path logDir, LogWriter log, FeedbackQueue queue, Updater updater, Publisher publisher, int maxBatch,
            long maxWaitMillis, AtomicLong quarantined, PhaseTimes phases) {
        this.logDir = logDir;
        this.log = log;
        this.queue = queue;
        this.updater = updater;
        this.publisher = publisher;
        this.maxBatch = maxBatch;
        this.maxWaitMillis = maxWaitMillis;
        this.quarantined = quarantined;
        this.phases = phases;
    }

    @Override
    public void run() {
        try {
            while (true) {
                // Never past a version: Java snapshots and publishes between two micro-batches.
                int most = Math.min(MAX_BATCHES_PER_CALL, publisher.updatesToVersion());
                List<List<FeedbackQueue.Event>> run = queue.take(maxBatch, most, maxWaitMillis);
                if (run == null) {
                    break;
                }
                publisher.lock.lock(); // a rollback comes between two runs, never inside one
                try {
                    apply(run);
                } finally {
                    publisher.lock.unlock();
                }
            }
        } catch (Throwable e) {
            logger.error("online training stopped: {}", e.toString());
            queue.fail(e);
        }
    }

    /**
     * Applies the micro-batches (several per native call until one is refused), then logs each as
     * the per-micro-batch path would have: its micro-batch record, a quarantine after a refused
     * one; publishes when a version is due.
     */
    private void apply(List<List<FeedbackQueue.Event>> run) throws IOException {
        int done = 0;
        while (done < run.size()) {
            List<List<FeedbackQueue.Event>> part = run.subList(done, Math.min(run.size(), done + publisher.updatesToVersion()));
            List<List<byte[]>> xs = new ArrayList<>(part.size());
            List<List<byte[]>> ys = new ArrayList<>(part.size());
            for (List<FeedbackQueue.Event> batch : part) {
                List<byte[]> x = new ArrayList<>(batch.size());
                List<byte[]> y = new ArrayList<>(batch.size());
                for (FeedbackQueue.Event event : batch) {
                    x.add(event.x);
                    y.add(event.y);
                }
                xs.add(x);
                ys.add(y);
            }
            long[] firstSeqs = new long[part.size()];
            for (int i = 0; i < firstSeqs.length; i++) {
                firstSeqs[i] = part.get(i).get(0).seq;
            }
            long index = updater.updates();
            Updater.Run applied = updater.applyUntilRefused(firstSeqs, xs, ys);
            // Each micro-batch's record is written after its update, before anything that depends on
            // it leaves the training thread (a version, a checkpoint, the applied mark), and in the
            // order one call per micro-batch wrote them (a quarantine right after its B): the same log.
            phases.start();
            for (int i = 0; i < applied.applied; i++) {
                log.appendBatch(index + i, part.get(i).get(0).seq, part.get(i).size());
            }
            boolean stopped = applied.refusal != null || applied.failure != null;
            if (stopped) {
                log.appendBatch(index + applied.applied, part.get(applied.applied).get(0).seq,
                        part.get(applied.applied).size());
            }
            phases.lap(PhaseTimes.Phase.LOG_BATCH);
            if (applied.failure != null) {
                throw applied.failure;
            }
            if (applied.refusal != null) {
                List<FeedbackQueue.Event> refused = part.get(applied.applied);
                long first = refused.get(0).seq;
                int count = refused.size();
                log.appendQuarantine(index + applied.applied, first, count, applied.refusal);
                quarantined.incrementAndGet();
                logger.warn("{}: events {}..{} quarantined, not applied: {}", logDir, first, first + count - 1,
                        applied.refusal);
            }
            if (applied.applied > 0) {
                publisher.afterUpdate(); // a version only after the last: the part ends at one
            }
            done += applied.applied + (stopped ? 1 : 0);
        }
        phases.start();
        List<FeedbackQueue.Event> last = run.get(run.size() - 1);
        queue.applied(last.get(last.size() - 1).seq + 1);
        phases.lap(PhaseTimes.Phase.FINISH);
    }
}
