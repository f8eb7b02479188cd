package dev.gradbridge.online;

import dev.gradbridge.online.log.LogWriter;
import java.io.IOException;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The training thread's loop: takes events in log order as micro-batches (up to B events, or
 * what arrived T ms after the first), logs each micro-batch before applying it, applies it or
 * quarantines it in the log with the guard's reason, and lets the {@link Publisher} publish.
 */
final class MicroBatcher implements Runnable {

    private static final Logger logger = LoggerFactory.getLogger(MicroBatcher.class);

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
                List<FeedbackQueue.Event> batch = queue.take(maxBatch, maxWaitMillis, phases, PhaseTimes.clock(phases));
                if (batch == null) {
                    break;
                }
                apply(batch);
            }
        } catch (Throwable e) {
            logger.error("online training stopped: {}", e.toString());
            queue.fail(e);
        }
    }

    /** Logs the micro-batch, applies it (or quarantines it), publishes when a version is due. */
    private void apply(List<FeedbackQueue.Event> batch) throws IOException {
        long t = PhaseTimes.clock(phases);
        long first = batch.get(0).seq;
        int count = batch.size();
        // Written before the batch is applied and forced (under ALWAYS) by the sync before the next
        // version is published: nothing that depends on it leaves the training thread first.
        long index = updater.updates();
        log.appendBatch(index, first, count);
        PhaseTimes.lap(phases, PhaseTimes.Phase.LOG_BATCH, t);
        List<byte[]> xs = new ArrayList<>(count);
        List<byte[]> ys = new ArrayList<>(count);
        for (FeedbackQueue.Event event : batch) {
            xs.add(event.x);
            ys.add(event.y);
        }
        String refusal = updater.apply(xs, ys);
        if (refusal != null) {
            log.appendQuarantine(index, first, count, refusal);
            quarantined.incrementAndGet();
            logger.warn("{}: events {}..{} quarantined, not applied: {}", logDir, first, first + count - 1, refusal);
        } else {
            publisher.afterUpdate();
        }
        t = PhaseTimes.clock(phases);
        queue.applied(first + count);
        PhaseTimes.lap(phases, PhaseTimes.Phase.FINISH, t);
    }
}
