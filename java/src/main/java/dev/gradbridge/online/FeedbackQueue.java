package dev.gradbridge.online;

import dev.gradbridge.online.log.LogWriter;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;
import java.util.concurrent.locks.ReentrantLock;

/**
 * The events between the callers of {@code learn} and the training thread, under one lock: the
 * bounded queue, sequence numbering (appended to the log under the same lock, so log order is
 * sequence order), the idempotency keys seen, how far training got, and the learner's lifecycle
 * (open, closing, halting, failed).
 */
final class FeedbackQueue {

    /** One logged event waiting for training. */
    static final class Event {
        final long seq;
        final long offset; // where its record starts in the log
        final byte[] x;
        final byte[] y;

        Event(long seq, long offset, byte[] x, byte[] y) {
            this.seq = seq;
            this.offset = offset;
            this.x = x;
            this.y = y;
        }
    }

    /** A request seen with an idempotency key. */
    static final class Key {
        final long firstSeq;
        final int count;
        final byte[] sha256;
        final long end; // the log offset after its records (0 when read back from the log: already durable)

        Key(long firstSeq, int count, byte[] sha256, long end) {
            this.firstSeq = firstSeq;
            this.count = count;
            this.sha256 = sha256;
            this.end = end;
        }
    }

    /** What {@link #offer} did: the first sequence number and the log offset to make durable. */
    static final class Accepted {
        final long firstSeq;
        final long end;
        final boolean duplicate;

        Accepted(long firstSeq, long end, boolean duplicate) {
            this.firstSeq = firstSeq;
            this.end = end;
            this.duplicate = duplicate;
        }
    }

    private final int capacity;
    private final ReentrantLock lock = new ReentrantLock();
    private final Condition notEmpty = lock.newCondition();
    private final Condition progress = lock.newCondition();
    private final Condition notFull = lock.newCondition();
    private final ArrayDeque<Event> queue = new ArrayDeque<>(); // guarded by lock
    private final Map<String, Key> keys = new HashMap<>(); // guarded by lock
    private long nextSeq; // guarded by lock
    private long appliedEvents; // guarded by lock: events applied or quarantined, in seq order
    private boolean closing; // guarded by lock
    private boolean halting; // guarded by lock
    private boolean busy; // guarded by lock: a micro-batch is being applied
    private volatile Throwable failure; // written under lock

    FeedbackQueue(int capacity) {
        this.capacity = capacity;
    }

    /** Sets the state recovery found (before the training thread starts). */
    void restore(long nextSeq, long appliedEvents, List<Event> pending, Map<String, Key> seenKeys) {
        lock.lock();
        try {
            this.nextSeq = nextSeq;
            this.appliedEvents = appliedEvents;
            queue.addAll(pending);
            keys.putAll(seenKeys);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Numbers the rows, appends them to the log and queues them, or answers a known key.
     *
     * @throws KeyConflictException when the key came with another request before
     * @throws QueueFullException when there is no room after {@code timeout}
     * @throws UncheckedIOException when the log cannot be written (nothing of it was logged)
     */
    Accepted offer(LogWriter log, List<byte[]> xRows, List<byte[]> yRows, String key, byte[] sha256, long timeout,
            TimeUnit unit, PhaseTimes phases, long t) {
        int rows = xRows.size();
        Accepted accepted;
        lock.lock();
        try {
            checkOpen();
            Key seen = key == null ? null : keys.get(key);
            if (seen != null) {
                if (!Arrays.equals(seen.sha256, sha256) || seen.count != rows) {
                    throw new KeyConflictException("idempotency key '" + key + "' was used for another request (events "
                            + seen.firstSeq + ".." + (seen.firstSeq + seen.count - 1) + "); nothing was logged");
                }
                accepted = new Accepted(seen.firstSeq, seen.end, true);
            } else {
                waitForRoom(rows, timeout, unit);
                t = PhaseTimes.lap(phases, PhaseTimes.Phase.LEARN_LOCK, t);
                accepted = append(log, xRows, yRows, key, sha256);
            }
        } finally {
            lock.unlock();
        }
        PhaseTimes.lap(phases, PhaseTimes.Phase.LEARN_APPEND, t);
        return accepted;
    }

    /** Waits (lock held) up to {@code timeout} for room for {@code rows} events. */
    private void waitForRoom(int rows, long timeout, TimeUnit unit) {
        long deadline = System.nanoTime() + unit.toNanos(timeout);
        while (queue.size() + rows > capacity && deadline - System.nanoTime() > 0) {
            try {
                notFull.awaitNanos(deadline - System.nanoTime());
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                break;
            }
            checkOpen();
        }
        if (queue.size() + rows > capacity) {
            passOnRoom(); // a signal this caller took may fit another waiter
            throw new QueueFullException("the feedback queue is full (" + queue.size() + " of " + capacity
                    + " events waiting); retry later");
        }
    }

    /** Logs and queues the rows (lock held): one write, so the request is logged whole or not at all. */
    private Accepted append(LogWriter log, List<byte[]> xRows, List<byte[]> yRows, String key, byte[] sha256) {
        int rows = xRows.size();
        long first = nextSeq;
        long[] offsets;
        try {
            offsets = log.appendEvents(first, xRows, yRows, key, sha256);
        } catch (IOException e) {
            // The writer truncated the file back: nothing of this request is in the log.
            throw new UncheckedIOException("cannot append to " + log.getFile() + " (" + e.getMessage()
                    + "); nothing of this request was logged", e);
        }
        for (int i = 0; i < rows; i++) {
            queue.add(new Event(first + i, offsets[i], xRows.get(i), yRows.get(i)));
        }
        nextSeq += rows;
        long end = offsets[rows];
        if (key != null) {
            keys.put(key, new Key(first, rows, sha256, end));
        }
        notEmpty.signal();
        passOnRoom();
        return new Accepted(first, end, false);
    }

    /**
     * Wakes one caller waiting for room when some is left (lock held). Room is handed on one
     * waiter at a time, each passing on what it leaves: waking every waiter whenever a
     * micro-batch leaves would wake them all to find room for one, and on a small machine their
     * wake-ups preempt the training thread.
     */
    private void passOnRoom() {
        if (queue.size() < capacity) {
            notFull.signal();
        }
    }

    /**
     * The next micro-batch for the training thread: up to {@code maxBatch} consecutive events, or
     * what arrived {@code maxWaitMillis} after the first; null to stop (halting, or closing with
     * nothing left). Marks the learner busy until {@link #applied}.
     */
    List<Event> take(int maxBatch, long maxWaitMillis, PhaseTimes phases, long t) throws InterruptedException {
        lock.lock();
        try {
            while (queue.isEmpty() && !closing && !halting) {
                notEmpty.await();
            }
            if (halting || queue.isEmpty()) {
                return null;
            }
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(maxWaitMillis);
            while (queue.size() < maxBatch && !closing && !halting) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    break;
                }
                notEmpty.awaitNanos(left);
            }
            if (halting) {
                return null;
            }
            t = PhaseTimes.lap(phases, PhaseTimes.Phase.WAIT, t);
            int count = Math.min(maxBatch, queue.size());
            List<Event> batch = new ArrayList<>(count);
            // Consecutive numbers only: a micro-batch is logged as (first, count). Numbers jump once,
            // at a recovered log's floor.
            while (batch.size() < count && (batch.isEmpty() || queue.peek().seq == batch.get(batch.size() - 1).seq + 1)) {
                batch.add(queue.poll());
            }
            busy = true;
            passOnRoom();
            return batch;
        } finally {
            lock.unlock();
            PhaseTimes.lap(phases, PhaseTimes.Phase.DEQUEUE, t);
        }
    }

    /** The micro-batch ending before event {@code end} is applied (or quarantined). */
    void applied(long end) {
        lock.lock();
        try {
            appliedEvents = Math.max(appliedEvents, end);
            busy = false;
            progress.signalAll();
        } finally {
            lock.unlock();
        }
    }

    /**
     * Where a checkpoint taken now must resume: the first event not yet taken, and the log offset
     * from which a restart must scan (that event's record, or the version's end).
     */
    long[] resumePoint(long versionEnd) {
        lock.lock();
        try {
            Event head = queue.peek();
            return new long[] {head == null ? nextSeq : head.seq, head == null ? versionEnd : Math.min(head.offset, versionEnd)};
        } finally {
            lock.unlock();
        }
    }

    /** @return events waiting */
    int depth() {
        lock.lock();
        try {
            return queue.size();
        } finally {
            lock.unlock();
        }
    }

    /** Waits until every accepted event is applied; false on timeout. */
    boolean awaitIdle(long timeout, TimeUnit unit) throws InterruptedException {
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
     * Starts stopping: no more feedback; the training thread drains ({@code halt} false) or stops
     * after the micro-batch in progress.
     *
     * @return false when already stopping
     */
    boolean stop(boolean halt) {
        lock.lock();
        try {
            if (closing || halting) {
                return false;
            }
            if (halt) {
                halting = true;
            } else {
                closing = true;
            }
            notEmpty.signalAll();
            notFull.signalAll();
            return true;
        } finally {
            lock.unlock();
        }
    }

    /** Training cannot continue: every waiter wakes and fails. */
    void fail(Throwable e) {
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

    /** @return why training stopped, or null */
    Throwable failure() {
        return failure;
    }

    private void checkOpen() {
        if (failure != null) {
            throw new IllegalStateException("online training has stopped: " + failure.getMessage(), failure);
        }
        if (closing || halting) {
            throw new IllegalStateException("the online learner is closed");
        }
    }
}
