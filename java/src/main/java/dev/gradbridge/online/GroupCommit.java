package dev.gradbridge.online;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A {@link LogWriter}'s group commit: actions that wait for their records to be durable ({@link #afterSync})
 * run after one shared {@code fsync}, which a daemon thread forces at most {@code delayMillis} after the first
 * of them, so a burst of requests costs one {@code fsync} and no request thread waits for it. Apart from the
 * writer, whose appends and {@link LogWriter#sync} it only calls.
 */
final class GroupCommit {

    private final LogWriter writer;
    private final FsyncPolicy policy;
    private final Path file;
    private final ArrayDeque<Pending> pending = new ArrayDeque<>(); // guarded by itself
    private int running;           // guarded by pending: actions taken off it, still running
    private boolean commitFailed;  // guarded by pending: a failed fsync dropped the actions
    private volatile Thread committer; // null until start, under ALWAYS only

    GroupCommit(LogWriter writer, FsyncPolicy policy, Path file) {
        this.writer = writer;
        this.policy = policy;
        this.file = file;
    }

    /** An action waiting for the records before {@code offset} to be durable. */
    private static final class Pending {
        final long offset;
        final long since;
        final Runnable action;

        Pending(long offset, Runnable action) {
            this.offset = offset;
            this.since = System.nanoTime();
            this.action = action;
        }
    }

    /**
     * Starts group commit for {@link #afterSync} under {@link FsyncPolicy#ALWAYS} (a no-op under
     * NEVER, where actions run at once): a daemon thread forces the file at most {@code delayMillis}
     * after the first waiting request, so one {@code fsync} covers every request that came meanwhile.
     *
     * @param delayMillis the longest wait before the shared fsync (0: at once)
     * @param onFailure told when a forced write fails (what is durable is unknown then)
     */
    void start(long delayMillis, Consumer<Throwable> onFailure) {
        if (policy == FsyncPolicy.NEVER || committer != null) {
            return;
        }
        long delay = TimeUnit.MILLISECONDS.toNanos(delayMillis);
        committer = new Thread(() -> commitLoop(delay, onFailure), "gradbridge-log-commit");
        committer.setDaemon(true);
        committer.start();
    }

    /**
     * Runs {@code action} once every record before {@code offset} is durable as the policy says:
     * at once when it already is (or under NEVER), else on the group-commit thread after its next
     * fsync. Actions may run out of order; a failed fsync drops them.
     *
     * @param offset an end offset returned by an append
     * @param action what to do then (quick: it runs on the writer's thread)
     */
    void afterSync(long offset, Runnable action) {
        if (policy == FsyncPolicy.NEVER || writer.synced() >= offset || committer == null) {
            if (policy == FsyncPolicy.ALWAYS && writer.synced() < offset) {
                try {
                    writer.sync(offset); // no group-commit thread: force here
                } catch (IOException e) {
                    throw new UncheckedIOException("cannot fsync " + file + ": " + e.getMessage(), e);
                }
            }
            action.run();
            return;
        }
        synchronized (pending) {
            pending.add(new Pending(offset, action));
            pending.notifyAll();
        }
    }

    /**
     * Waits until every {@link #afterSync} action has run.
     *
     * @param timeoutNanos the longest wait
     * @return false on timeout
     * @throws InterruptedException when interrupted
     */
    boolean awaitActions(long timeoutNanos) throws InterruptedException {
        long deadline = System.nanoTime() + timeoutNanos;
        synchronized (pending) {
            // running: actions taken off the queue but not finished; failed: dropped by a failed fsync
            while (!pending.isEmpty() || running > 0) {
                long left = deadline - System.nanoTime();
                if (left <= 0 || committer == null || commitFailed) {
                    return false;
                }
                TimeUnit.NANOSECONDS.timedWait(pending, left);
            }
            return !commitFailed;
        }
    }

    private void commitLoop(long delayNanos, Consumer<Throwable> onFailure) {
        try {
            while (true) {
                long due;
                synchronized (pending) {
                    while (pending.isEmpty() && committer != null) {
                        pending.wait();
                    }
                    if (committer == null) {
                        return;
                    }
                    due = pending.peek().since + delayNanos;
                    for (long left; (left = due - System.nanoTime()) > 0 && committer != null; ) {
                        TimeUnit.NANOSECONDS.timedWait(pending, left);
                    }
                    if (committer == null) {
                        return;
                    }
                }
                writer.sync(writer.end()); // shared with callers of sync: whoever forces first covers the others
                List<Runnable> ready = new ArrayList<>();
                synchronized (pending) {
                    while (!pending.isEmpty() && pending.peek().offset <= writer.synced()) {
                        ready.add(pending.poll().action);
                    }
                    running = ready.size();
                }
                try {
                    for (Runnable action : ready) {
                        action.run();
                    }
                } finally {
                    synchronized (pending) {
                        running = 0;
                        pending.notifyAll();
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } catch (IOException | RuntimeException e) {
            synchronized (pending) {
                pending.clear();
                commitFailed = true;
                pending.notifyAll();
            }
            onFailure.accept(e);
        }
    }

    /** Stops the thread; actions still waiting are dropped, as in a crash. */
    void stop() {
        Thread thread = committer;
        if (thread == null) {
            return;
        }
        synchronized (pending) {
            committer = null;
            pending.notifyAll();
        }
        try {
            thread.join();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
