package dev.gradbridge.online;

import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.concurrent.atomic.LongAdder;

/**
 * Where an {@link OnlineLearner}'s time goes, for benchmarks and debugging ({@link
 * OnlineLearner.Builder#optTimePhases}): cumulative {@code System.nanoTime} per phase, the
 * thread's CPU time in it (which, unlike wall time, does not count time the thread was
 * descheduled or waiting on a lock) and how often each ran. Training-thread phases are one micro-batch's path; {@code learn_*} phases run on
 * the callers' threads and overlap training.
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

    private static final ThreadMXBean THREADS = ManagementFactory.getThreadMXBean();
    private final boolean cpu = THREADS.isCurrentThreadCpuTimeSupported();
    private final ThreadLocal<long[]> lastCpu = ThreadLocal.withInitial(() -> new long[1]);
    private final LongAdder[] nanos = new LongAdder[Phase.values().length];
    private final LongAdder[] cpuNanos = new LongAdder[Phase.values().length];
    private final LongAdder[] counts = new LongAdder[Phase.values().length];

    PhaseTimes() {
        for (int i = 0; i < nanos.length; i++) {
            nanos[i] = new LongAdder();
            cpuNanos[i] = new LongAdder();
            counts[i] = new LongAdder();
        }
    }

    /** @return now, for {@link #lap}, starting a phase on this thread; 0 when {@code phases} is null (not timing) */
    static long clock(PhaseTimes phases) {
        if (phases == null) {
            return 0;
        }
        phases.start();
        return System.nanoTime();
    }

    /** Adds the time since {@code since} to {@code phase}; returns now (0 when {@code phases} is null). */
    static long lap(PhaseTimes phases, Phase phase, long since) {
        if (phases == null) {
            return 0;
        }
        long now = System.nanoTime();
        phases.add(phase, now - since);
        return now;
    }

    /** Starts a phase on this thread: notes its CPU time. */
    void start() {
        if (cpu) {
            lastCpu.get()[0] = THREADS.getCurrentThreadCpuTime();
        }
    }

    /** Ends a phase on this thread, which started at {@link #start} or at the previous add. */
    void add(Phase phase, long elapsedNanos) {
        nanos[phase.ordinal()].add(elapsedNanos);
        counts[phase.ordinal()].increment();
        if (cpu) {
            long[] last = lastCpu.get();
            long now = THREADS.getCurrentThreadCpuTime();
            cpuNanos[phase.ordinal()].add(now - last[0]);
            last[0] = now;
        }
    }

    /** @return the calling thread's CPU time per phase (lower-case names), in phase order; zeros when unsupported */
    public Map<String, Long> cpuNanos() {
        Map<String, Long> out = new LinkedHashMap<>();
        for (Phase phase : Phase.values()) {
            out.put(phase.name().toLowerCase(java.util.Locale.ROOT), cpuNanos[phase.ordinal()].sum());
        }
        return out;
    }

    /** @return total nanoseconds per phase (lower-case names), in phase order */
    public Map<String, Long> nanos() {
        Map<String, Long> out = new LinkedHashMap<>();
        for (Phase phase : Phase.values()) {
            out.put(phase.name().toLowerCase(java.util.Locale.ROOT), nanos[phase.ordinal()].sum());
        }
        return out;
    }

    /** @return how many times each phase ran (lower-case names), in phase order */
    public Map<String, Long> counts() {
        Map<String, Long> out = new LinkedHashMap<>();
        for (Phase phase : Phase.values()) {
            out.put(phase.name().toLowerCase(java.util.Locale.ROOT), counts[phase.ordinal()].sum());
        }
        return out;
    }
}
