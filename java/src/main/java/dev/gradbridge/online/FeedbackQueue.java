package dev.gradbridge.online;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
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
    private final PhaseTimes phases;
    private final ReentrantLock lock = new ReentrantLock();
    private final Condition notEmpty = lock.newCondition();
    private final Condition progress = lock.newCondition();
    private final Condition notFull = lock.newCondition();
    private final ArrayDeque<Event> queue = new ArrayDeque<>(); // guarded by lock
    private final Map<String, Key> keys = new HashMap<>(); // guarded by lock
    private final Map<String, Map<Integer, Long>> positions = new HashMap<>(); // guarded by lock: source -> partition -> next offset
    private long nextSeq; // guarded by lock
    private long appliedEvents; // guarded by lock: events applied or quarantined, in seq order
    private boolean closing; // guarded by lock
    private boolean halting; // guarded by lock
    private boolean busy; // guarded by lock: a micro-batch is being applied
    private volatile Throwable failure; // written under lock

    FeedbackQueue(int capacity, PhaseTimes phases) {
        this.capacity = capacity;
        this.phases = phases;
    }

    /** Sets the state recovery found (before the training thread starts). */
    void restore(long nextSeq, long appliedEvents, List<Event> pending, Map<String, Key> seenKeys,
            Map<String, Map<Integer, Long>> sourcePositions) {
        lock.lock();
        try {
            sourcePositions.forEach((source, map) -> positions.put(source, new HashMap<>(map)));
            this.nextSeq = nextSeq;
            this.appliedEvents = appliedEvents;
            queue.addAll(pending);
            keys.putAll(seenKeys);
        } finally {
            lock.unlock();
        }
    }

    /**
     * Numbers the rows, appends them to the log and queues them, or answers a known key. Times
     * {@code LEARN_LOCK} and {@code LEARN_APPEND} after the caller's phase in progress.
     *
     * @throws KeyConflictException when the key came with another request before
     * @throws QueueFullException when there is no room after {@code timeout}
     * @throws UncheckedIOException when the log cannot be written (nothing of it was logged)
     */
    Accepted offer(LogWriter log, List<byte[]> xRows, List<byte[]> yRows, String key, byte[] sha256, long timeout,
            TimeUnit unit) {
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
                phases.lap(PhaseTimes.Phase.LEARN_LOCK);
                accepted = append(log, xRows, yRows, key, sha256);
            }
        } finally {
            lock.unlock();
        }
        phases.lap(PhaseTimes.Phase.LEARN_APPEND);
        return accepted;
    }

    /** @return the next unread offset of each partition of {@code source} the log holds (a copy) */
    Map<Integer, Long> positions(String source) {
        lock.lock();
        try {
            return new HashMap<>(positions.getOrDefault(source, Collections.emptyMap()));
        } finally {
            lock.unlock();
        }
    }

    /**
     * Logs what one read of {@code source} gave, in one write with the offsets it consumed, and
     * queues its events: each record's rows (or a known key's answer, or its refusal). The ranges
     * must continue exactly where the log's last ones for the source ended (no gap, no overlap).
     *
     * @param ranges partition -> {from, to}: the offsets this read consumed
     * @throws IllegalArgumentException when a range does not continue the logged position or an
     *     item lies outside its partition's range (nothing was logged)
     * @throws QueueFullException when there is no room after {@code timeout} (nothing was logged)
     * @throws UncheckedIOException when the log cannot be written (nothing was logged)
     */
    SourcedRead.Result offerSourced(LogWriter log, String source, List<SourcedRead.Item> items, Map<Integer, long[]> ranges,
            long timeout, TimeUnit unit) {
        SourcedRead read = new SourcedRead(source, items, ranges);
        SourcedRead.Result result = new SourcedRead.Result();
        lock.lock();
        try {
            checkOpen();
            int rows = read.check(positions.getOrDefault(source, Collections.emptyMap()));
            waitForRoom(rows, timeout, unit);
            long first = nextSeq;
            long seq = read.sort(first, keys, result);
            long[] offsets;
            try {
                offsets = log.appendSourced(first, read.xRows, read.yRows, read.keyEntries, source, read.rangeList(),
                        read.logged);
            } catch (IOException e) {
                throw new UncheckedIOException("cannot append to " + log.getFile() + " (" + e.getMessage()
                        + "); nothing of this read of " + source + " was logged", e);
            }
            for (int i = 0; i < read.xRows.size(); i++) {
                queue.add(new Event(first + i, offsets[i], read.xRows.get(i), read.yRows.get(i)));
            }
            nextSeq = seq;
            long end = offsets[read.xRows.size()];
            for (Map.Entry<String, Key> k : read.fresh.entrySet()) {
                Key key = k.getValue();
                keys.put(k.getKey(), new Key(key.firstSeq, key.count, key.sha256, end));
            }
            Map<Integer, Long> moved = positions.computeIfAbsent(source, s -> new HashMap<>());
            ranges.forEach((partition, range) -> moved.put(partition, range[1]));
            result.logged = seq - first;
            result.end = end;
            if (!read.xRows.isEmpty()) {
                notEmpty.signal();
            }
            passOnRoom();
        } finally {
            lock.unlock();
        }
        return result;
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
     * The next micro-batches for the training thread: the first up to {@code maxBatch} consecutive
     * events, or what arrived {@code maxWaitMillis} after its first; then, up to {@code
     * maxBatches} in all, those the following calls would take without waiting (full ones, or
     * what is left when closing). Null to stop (halting, or closing with nothing left). Marks the
     * learner busy until {@link #applied}. Times {@code WAIT} and {@code DEQUEUE}.
     */
    List<List<Event>> take(int maxBatch, int maxBatches, long maxWaitMillis) throws InterruptedException {
        phases.start();
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
            phases.lap(PhaseTimes.Phase.WAIT);
            List<List<Event>> batches = new ArrayList<>();
            do {
                batches.add(poll(maxBatch));
            } while (batches.size() < maxBatches && !queue.isEmpty() && (queue.size() >= maxBatch || closing));
            busy = true;
            passOnRoom();
            return batches;
        } finally {
            lock.unlock();
            phases.lap(PhaseTimes.Phase.DEQUEUE);
        }
    }

    /** Up to {@code maxBatch} events off the queue (lock held, not empty). */
    private List<Event> poll(int maxBatch) {
        int count = Math.min(maxBatch, queue.size());
        List<Event> batch = new ArrayList<>(count);
        // Consecutive numbers only: a micro-batch is logged as (first, count). Numbers jump once,
        // at a recovered log's floor.
        while (batch.size() < count && (batch.isEmpty() || queue.peek().seq == batch.get(batch.size() - 1).seq + 1)) {
            batch.add(queue.poll());
        }
        return batch;
    }

    /** The micro-batches ending before event {@code end} are applied (or quarantined). */
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
