package dev.gradbridge.online;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

/**
 * Where an {@link OnlineLearner}'s time goes, for benchmarks and debugging ({@link
 * OnlineLearnerBuilder#optTimePhases}): cumulative {@code System.nanoTime} per phase, the
 * thread's CPU time in it (which, unlike wall time, does not count time the thread was
 * descheduled or waiting on a lock) and how often each ran. Training-thread phases are one micro-batch's path; {@code learn_*} phases run on
 * the callers' threads and overlap training.
 *
 * <p>Each part of the learner holds the learner's one instance: a thread {@link #start starts} a
 * phase and each {@link #lap} ends the phase in progress on that thread and starts the next. When
 * timing is off the parts hold {@link #OFF}, whose calls return at once: no clock is read.
 */
public final class PhaseTimes {

    /** The phases, in the order a micro-batch meets them. */
    public enum Phase {
        /** learn(): shape, finiteness and (optionally) loss checks. */
        LEARN_VALIDATE,
        /** learn(): waiting for the lock and for room in the queue. */
        LEARN_LOCK,
        /** learn(): framing and writing the event records (one write per call). */
        LEARN_APPEND,
        /** learn(): the fsync the policy asks for (shared by concurrent callers). */
        LEARN_SYNC,
        /** training thread: waiting for events (an empty queue, or T ms for a micro-batch to fill). */
        WAIT,
        /** training thread: taking micro-batches off the queue. */
        DEQUEUE,
        /** training thread: writing the micro-batch records (no fsync: the next version's covers them). */
        LOG_BATCH,
        /** training thread: the micro-batch's rows into native tensors. */
        ASSEMBLE,
        /** training thread: a guarded step call: one micro-batch, or several in one native call. */
        TRAIN_STEP,
        /** training thread: reading the parameters and their digests for a version. */
        SNAPSHOT,
        /** training thread: the version record (write, and fsync under ALWAYS) and the publish. */
        PUBLISH,
        /** training thread: checkpoints (every K versions). */
        CHECKPOINT,
        /** training thread: marking the micro-batch applied and waking waiters. */
        FINISH
    }

    /** Timing off: every call returns at once. */
    static final PhaseTimes OFF = new PhaseTimes(false);

    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
    private final boolean on;
    private final boolean cpu;
    private final ThreadLocal<long[]> last; // per thread: {nanoTime, CPU time} where the phase in progress began
    private final LongAdder[] nanos;
    private final LongAdder[] cpuNanos;
    private final LongAdder[] counts;

    private PhaseTimes(boolean on) {
        this.on = on;
        this.cpu = on && THREADS.isCurrentThreadCpuTimeSupported();
        this.last = on ? ThreadLocal.withInitial(() -> new long[2]) : null;
        int phases = on ? Phase.values().length : 0;
        nanos = new LongAdder[phases];
        cpuNanos = new LongAdder[phases];
        counts = new LongAdder[phases];
        for (int i = 0; i < phases; i++) {
            nanos[i] = new LongAdder();
            cpuNanos[i] = new LongAdder();
            counts[i] = new LongAdder();
        }
    }

    /** @return a new recorder when {@code time}, else {@link #OFF} */
    static PhaseTimes of(boolean time) {
        return time ? new PhaseTimes(true) : OFF;
    }

    /** @return whether this records (not {@link #OFF}) */
    boolean isOn() {
        return on;
    }

    /** Starts a phase on this thread: notes the time and the thread's CPU time. */
    void start() {
        if (!on) {
            return;
        }
        long[] begun = last.get();
        begun[0] = System.nanoTime();
        if (cpu) {
            begun[1] = THREADS.getCurrentThreadCpuTime();
        }
    }

    /** Ends the phase in progress on this thread (begun at {@link #start} or the last lap) as {@code phase}; the next begins. */
    void lap(Phase phase) {
        if (!on) {
            return;
        }
        long[] begun = last.get();
        long now = System.nanoTime();
        nanos[phase.ordinal()].add(now - begun[0]);
        counts[phase.ordinal()].increment();
        begun[0] = now;
        if (cpu) {
            long cpuNow = THREADS.getCurrentThreadCpuTime();
            cpuNanos[phase.ordinal()].add(cpuNow - begun[1]);
            begun[1] = cpuNow;
        }
    }

    /** @return the threads' CPU time per phase (lower-case names), in phase order; zeros when unsupported */
    public Map<String, Long> cpuNanos() {
        return byPhase(cpuNanos);
    }

    /** @return total nanoseconds per phase (lower-case names), in phase order */
    public Map<String, Long> nanos() {
        return byPhase(nanos);
    }

    /** @return how many times each phase ran (lower-case names), in phase order */
    public Map<String, Long> counts() {
        return byPhase(counts);
    }

    private Map<String, Long> byPhase(LongAdder[] values) {
        Map<String, Long> out = new LinkedHashMap<>();
        for (Phase phase : Phase.values()) {
            out.put(phase.name().toLowerCase(java.util.Locale.ROOT), on ? values[phase.ordinal()].sum() : 0L);
        }
        return out;
    }
}
