package dev.gradbridge;

import java.util.Locale;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps glibc's allocator from handing libtorch's freed tensor memory back to the kernel after
 * every training step.
 *
 * <p>Why: with glibc's defaults, a training step's large temporaries (activations,
 * gradients, optimizer scratch: several MiB each on the compute-bound benchmark model) are freed
 * at the end of the step, the top of the heap (or the thread arena's heap: in a JVM the training
 * thread is never the process's first thread) is trimmed back to the kernel, and the next step
 * faults every page in again and has the kernel zero it. Measured with {@code gradbridge bench}
 * on the MLP 512-1024-512-10, batch 1024: about 4,000 minor page faults per step and 15% more
 * time per step than eager PyTorch in a Python process (whose heap happens to stay put), and 0.1
 * faults and no measurable difference with the thresholds below.
 *
 * <p>What: on Linux with glibc, {@code mallopt(M_MMAP_THRESHOLD, 32 MiB)} (blocks up to 32 MiB
 * come from the heap, not from a fresh mmap each time; 32 MiB is glibc's own ceiling for its
 * adaptive threshold), {@code mallopt(M_TRIM_THRESHOLD, 256 MiB)} (a heap is given back only when
 * more than 256 MiB at its top are free) and {@code mallopt(M_TOP_PAD, 64 MiB)} (a thread arena
 * keeps an emptied extra heap instead of unmapping it: without it, a step whose temporaries
 * overflow the arena's first 64 MiB heap maps a new heap and unmaps it again every step, which
 * the trim threshold does not prevent). A process keeps up to a few hundred MiB of freed memory
 * for reuse; the address space it reserves grows in 64 MiB steps (untouched pages cost nothing). Applied once, when gradbridge starts the engine; nothing happens elsewhere (other C
 * libraries, other systems), when the environment already sets glibc's malloc tunables ({@code
 * MALLOC_MMAP_THRESHOLD_}, {@code MALLOC_TRIM_THRESHOLD_}, {@code MALLOC_TOP_PAD_}, {@code
 * GLIBC_TUNABLES} with {@code malloc}), or with {@code -Dgradbridge.mallocTuning=false}.
 */
final class NativeMemory {

    /** System property: {@code false} leaves glibc's allocator settings alone. */
    public static final String PROPERTY = "gradbridge.mallocTuning";
    /** {@code M_MMAP_THRESHOLD}'s value: glibc's ceiling for its own adaptive threshold (64-bit). */
    public static final int MMAP_THRESHOLD = 32 << 20;
    /** {@code M_TRIM_THRESHOLD}'s value. */
    public static final int TRIM_THRESHOLD = 256 << 20;

    /** {@code M_TOP_PAD}'s value: a thread arena's largest heap (64-bit glibc). */
    public static final int TOP_PAD = 64 << 20;
    /** What {@link #tune} reports when it applied the settings. */
    public static final String SETTINGS = "glibc mallopt M_MMAP_THRESHOLD=" + MMAP_THRESHOLD
            + " M_TRIM_THRESHOLD=" + TRIM_THRESHOLD + " M_TOP_PAD=" + TOP_PAD;

    private static final int M_TRIM_THRESHOLD = -1;
    private static final int M_TOP_PAD = -2;
    private static final int M_MMAP_THRESHOLD = -3;
    private static final Logger logger = LoggerFactory.getLogger(NativeMemory.class);
    private static String state;

    private NativeMemory() {}

    /**
     * Applies the settings once (later calls return the first call's outcome).
     *
     * @return what was done, in words (for logs and benchmark records)
     */
    public static synchronized String tune() {
        if (state == null) {
            state = apply();
            logger.debug("native memory: {}", state);
        }
        return state;
    }

    /** @return what {@link #tune} did, or "not applied yet" */
    public static synchronized String describe() {
        return state == null ? "not applied yet" : state;
    }

    private static String apply() {
        if ("false".equalsIgnoreCase(System.getProperty(PROPERTY))) {
            return "glibc defaults (-D" + PROPERTY + "=false)";
        }
        for (String variable : new String[] {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
            if (System.getenv(variable) != null) {
                return "left to the environment (" + variable + " is set)";
            }
        }
        String tunables = System.getenv("GLIBC_TUNABLES");
        if (tunables != null && tunables.contains("malloc")) {
            return "left to the environment (GLIBC_TUNABLES sets malloc)";
        }
        if (!System.getProperty("os.name", "").toLowerCase(Locale.ROOT).contains("linux")) {
            return "not applicable (not Linux)";
        }
        try {
            int mmapResult = Native.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
            if (mmapResult < 0) {
                return "not applicable (not glibc)"; // musl has no mallopt thresholds
            }
            boolean mmap = mmapResult == 1;
            boolean trim = Native.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1;
            boolean pad = Native.mallopt(M_TOP_PAD, TOP_PAD) == 1;
            if (!mmap || !trim || !pad) {
                return "glibc refused mallopt (mmap threshold " + mmap + ", trim threshold " + trim + ", top pad "
                        + pad + ")";
            }
            return SETTINGS;
        } catch (RuntimeException | LinkageError e) {
            return "not applicable (" + e.getClass().getSimpleName() + ": " + e.getMessage() + ")";
        }
    }
}
