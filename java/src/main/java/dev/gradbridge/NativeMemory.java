package dev.gradbridge;

import com.sun.jna.Function;
import com.sun.jna.NativeLibrary;
import java.util.Locale;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Keeps glibc's allocator from handing libtorch's freed tensor memory back to the kernel after
 * every training step.
 *
 * <p>Why (issue 16): with glibc's defaults, a training step's large temporaries (activations,
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
 * adaptive threshold) and {@code mallopt(M_TRIM_THRESHOLD, 256 MiB)} (the heap is given back only
 * when more than 256 MiB at its top are free). A process keeps up to 256 MiB of freed memory for
 * reuse. Applied once, when gradbridge starts the engine; nothing happens elsewhere (other C
 * libraries, other systems), when the environment already sets glibc's malloc tunables ({@code
 * MALLOC_MMAP_THRESHOLD_}, {@code MALLOC_TRIM_THRESHOLD_}, {@code MALLOC_TOP_PAD_}, {@code
 * GLIBC_TUNABLES} with {@code malloc}), or with {@code -Dgradbridge.mallocTuning=false}.
 */
public final class NativeMemory {

    /** System property: {@code false} leaves glibc's allocator settings alone. */
    public static final String PROPERTY = "gradbridge.mallocTuning";
    /** {@code M_MMAP_THRESHOLD}'s value: glibc's ceiling for its own adaptive threshold (64-bit). */
    public static final int MMAP_THRESHOLD = 32 << 20;
    /** {@code M_TRIM_THRESHOLD}'s value. */
    public static final int TRIM_THRESHOLD = 256 << 20;

    private static final int M_TRIM_THRESHOLD = -1;
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
            NativeLibrary libc = NativeLibrary.getInstance("c");
            libc.getFunction("gnu_get_libc_version"); // glibc only: musl has no mallopt thresholds
            Function mallopt = libc.getFunction("mallopt");
            boolean mmap = mallopt.invokeInt(new Object[] {M_MMAP_THRESHOLD, MMAP_THRESHOLD}) == 1;
            boolean trim = mallopt.invokeInt(new Object[] {M_TRIM_THRESHOLD, TRIM_THRESHOLD}) == 1;
            if (!mmap || !trim) {
                return "glibc refused mallopt (mmap threshold " + mmap + ", trim threshold " + trim + ")";
            }
            return "glibc mallopt M_MMAP_THRESHOLD=" + MMAP_THRESHOLD + " M_TRIM_THRESHOLD=" + TRIM_THRESHOLD;
        } catch (RuntimeException | LinkageError e) {
            return "not applicable (" + e.getClass().getSimpleName() + ": " + e.getMessage() + ")";
        }
    }
}
