package dev.gradbridge.spark;

import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedDeque;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.broadcast.Broadcast;

/**
 * The training modules of this JVM (an executor, or the driver in local mode), keyed by the
 * SHA-256 of the module file's bytes. A task borrows an idle module or, when there is none,
 * loads one from the broadcast bytes; it gives it back when its step succeeded. So a JVM loads
 * one module per task slot (executor core) that ran at the same time, once, not one per task or
 * step. A module whose task failed is closed, never reused: its state is unknown. Every step
 * begins with {@code set_parameters}, so which idle module a task gets does not matter.
 */
final class ExecutorModules {

    private static final Map<String, ConcurrentLinkedDeque<Idle>> IDLE = new ConcurrentHashMap<>();
    /** Raised by {@link #dropAll()}: modules of an older generation are never handed out again. */
    private static final AtomicLong GENERATION = new AtomicLong();
    private static final AtomicInteger LOADS = new AtomicInteger();
    private static final AtomicInteger DISCARDED = new AtomicInteger();

    private ExecutorModules() {}

    private static final class Idle {
        final TrainingModule module;
        final long generation;

        Idle(TrainingModule module, long generation) {
            this.module = module;
            this.generation = generation;
        }
    }

    /** A borrowed module: given back on {@link #close()} after {@link #succeeded()}, else closed. */
    static final class Lease implements AutoCloseable {
        final TrainingModule module;
        final boolean loaded;
        private final String key;
        private final long generation;
        private boolean ok;

        Lease(String key, TrainingModule module, boolean loaded, long generation) {
            this.key = key;
            this.module = module;
            this.loaded = loaded;
            this.generation = generation;
        }

        void succeeded() {
            ok = true;
        }

        @Override
        public void close() {
            if (ok && generation == GENERATION.get()) {
                IDLE.computeIfAbsent(key, k -> new ConcurrentLinkedDeque<>()).push(new Idle(module, generation));
            } else {
                DISCARDED.incrementAndGet();
                module.close();
            }
        }
    }

    static Lease borrow(String key, Broadcast<byte[]> moduleBytes) {
        long generation = GENERATION.get();
        ConcurrentLinkedDeque<Idle> idle = IDLE.computeIfAbsent(key, k -> new ConcurrentLinkedDeque<>());
        for (Idle entry = idle.poll(); entry != null; entry = idle.poll()) {
            if (entry.generation == generation) {
                return new Lease(key, entry.module, false, generation);
            }
            DISCARDED.incrementAndGet();
            entry.module.close();
        }
        return new Lease(key, load(moduleBytes.value()), true, generation);
    }

    private static TrainingModule load(byte[] bytes) {
        Path file = null;
        try {
            file = Files.createTempFile("gradbridge-spark-", ".pt");
            Files.write(file, bytes);
            TrainingModule module = TrainingModule.load(file);
            LOADS.incrementAndGet();
            return module;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot write the broadcast training module to a temporary file", e);
        } finally {
            if (file != null) {
                try {
                    Files.deleteIfExists(file);
                } catch (IOException ignored) {
                    // a leftover temp file only; the module is in memory
                }
            }
        }
    }

    /**
     * Forgets every module of this JVM, as if the executor had been lost and replaced: idle ones
     * are closed now, borrowed ones when given back. (The tests' executor-loss fault.)
     */
    static void dropAll() {
        GENERATION.incrementAndGet();
        for (ConcurrentLinkedDeque<Idle> idle : IDLE.values()) {
            for (Idle entry = idle.poll(); entry != null; entry = idle.poll()) {
                DISCARDED.incrementAndGet();
                entry.module.close();
            }
        }
    }

    /** @return modules this JVM loaded from broadcast bytes so far */
    static int loads() {
        return LOADS.get();
    }

    /** @return modules this JVM closed because their task failed or their executor was "lost" */
    static int discarded() {
        return DISCARDED.get();
    }
}
