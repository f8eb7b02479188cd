package dev.gradbridge;

import java.util.concurrent.atomic.AtomicReference;

/**
 * One thread at a time: libtorch's module state (gradients, optimizer state) is not safe to
 * share, so a call that overlaps another thread's call fails before it touches anything. A
 * thread that already holds the guard passes through (typed calls nest, and {@link Trainer}
 * holds it for a whole run).
 */
final class ThreadGuard {

    /** Held until closed. */
    interface Use extends AutoCloseable {
        @Override
        void close();
    }

    private static final Use NESTED = () -> {};

    private final String owner;
    private final AtomicReference<Thread> user = new AtomicReference<>();
    private volatile boolean closed;

    /** @param owner what is guarded, for messages (the module's path) */
    ThreadGuard(String owner) {
        this.owner = owner;
    }

    /**
     * Marks the calling thread as the user until the returned {@link Use} is closed.
     *
     * @throws ConcurrentUseException when another thread holds it
     * @throws IllegalStateException after {@link #markClosed}
     */
    Use enter() {
        Thread me = Thread.currentThread();
        if (user.get() == me) {
            return NESTED;
        }
        if (!user.compareAndSet(null, me)) {
            Thread other = user.get();
            throw new ConcurrentUseException(
                    owner + " is in use by thread '" + (other == null ? "?" : other.getName())
                            + "'; a TrainingModule serves one thread at a time: load one module per thread");
        }
        if (closed) {
            user.set(null);
            throw new IllegalStateException("training module " + owner + " is closed");
        }
        return () -> user.set(null);
    }

    boolean isClosed() {
        return closed;
    }

    /** Every later {@link #enter} fails; call while holding the guard. */
    void markClosed() {
        closed = true;
    }
}
