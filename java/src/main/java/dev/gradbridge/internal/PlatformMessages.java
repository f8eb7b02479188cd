package dev.gradbridge.internal;


/**
 * The wording of the lines about the platform: custom operator libraries, why a file is not a
 * shared library for this machine, the native layer (libtorch, gradbridge's native library, its
 * cache folder) and devices (python: {@code messages/platform.py}, the same sentences).
 */
public final class PlatformMessages {

    private PlatformMessages() {}

    // ---- custom operators ----

    /**
     * @param module the training module file
     * @param operator the custom operator ({@code NS::NAME}) that no loaded library provides
     * @return the line for a module whose operator library was not loaded
     */
    public static String missingCustomOp(String module, String operator) {
        return module + " uses the custom operator " + operator + ", which no loaded library provides: "
                + "load its library first with --op-library FILE";
    }

    /**
     * @param library the operator library as the user named it
     * @param reason why the dynamic linker refused it
     * @return the line for an operator library that cannot be loaded
     */
    public static String opLibraryUnloadable(String library, String reason) {
        return "--op-library " + library + ": cannot load it: " + reason;
    }


    // why a file is not a shared library for this machine (checked before the dynamic linker maps
    // it: a truncated library kills the JVM with SIGBUS instead of failing)

    /** A file without the ELF magic. */
    public static final String NOT_ELF = "not an ELF shared library";

    /**
     * @param bits the file's ELF class (32 or 64)
     * @return the reason for an ELF file of another class or byte order
     */
    public static String elfClass(int bits) {
        return "a " + bits + "-bit ELF file; this machine loads 64-bit little-endian libraries";
    }

    /**
     * @param type the file's e_type
     * @return the reason for an ELF file that is not a shared object (ET_DYN)
     */
    public static String elfType(int type) {
        String what;
        switch (type) {
            case 0: what = "an ELF file of no type"; break;
            case 1: what = "a relocatable object (.o)"; break;
            case 2: what = "an executable"; break;
            case 4: what = "a core dump"; break;
            default: what = "an ELF file of type " + type;
        }
        return what + ", not a shared library";
    }

    /**
     * @param found the file's e_machine
     * @param machine this machine's architecture name
     * @param expected this machine's e_machine
     * @return the reason for a library built for another CPU
     */
    public static String elfMachine(int found, String machine, int expected) {
        return "built for ELF machine " + found + "; this machine is " + machine + " (ELF machine " + expected + ")";
    }

    /**
     * @param needed the bytes the file's headers and loadable segments need
     * @param size the file's size
     * @return the reason for a truncated library
     */
    public static String elfTruncated(long needed, long size) {
        return "truncated: its headers need " + needed + " bytes, the file has " + size;
    }

    // ---- the native layer: libtorch and gradbridge's native library (NativeLibrary) ----

    /** The environment variable that moves gradbridge's cache folder (python: native.CACHE_ENV). */
    public static final String CACHE_ENV = "GRADBRIDGE_CACHE_DIR";

    /**
     * @param property the system property, e.g. {@code gradbridge.numThreads}
     * @param value its value
     * @param max the most threads accepted
     * @return the line for a thread count that is not a whole number in 1..max
     */
    public static String threadCount(String property, String value, int max) {
        return "-D" + property + "=" + value + ": expected a whole number of threads in 1.." + max;
    }

    /**
     * @param property the system property
     * @param value its value
     * @param reason libtorch's refusal
     * @return the line for a thread count libtorch refused
     */
    public static String threadCountRefused(String property, String value, String reason) {
        return "-D" + property + "=" + value + ": libtorch refused it: " + reason;
    }

    /**
     * @param library the native library as named
     * @param source where it was named ({@code -Dgradbridge.native.library} or {@code GRADBRIDGE_NATIVE_LIBRARY})
     * @return the line for a native library whose name does not end in {@code .so}
     */
    public static String nativeLibraryName(String library, String source) {
        return "gradbridge's native library " + library + " (" + source + ") is not named *.so: name the .so file"
                + " that python -m gradbridge.native build --out DIR wrote (its .properties file lies beside it)";
    }

    /**
     * @param properties the properties file beside the native library
     * @param library the native library
     * @param key the key it lacks or holds badly
     * @param value what it holds ({@code null} when the key is missing)
     * @return the line for a properties file that does not say what the library was built for
     */
    public static String nativeProperties(String properties, String library, String key, String value) {
        return properties + " (what gradbridge's native library " + library + " was built for) "
                + (value == null ? "has no " + key : "holds " + key + "=" + value) + ": rebuild the library with"
                + " python -m gradbridge.native build --out DIR, which writes both files";
    }

    /**
     * @param library the native library
     * @param source where it was named, or "cached", "this jar's"
     * @param reason why it cannot be loaded (an ELF problem, a digest mismatch)
     * @return the line for a native library that must not reach the dynamic linker
     */
    public static String nativeLibraryUnloadable(String library, String source, String reason) {
        return "cannot load gradbridge's native library " + library + " (" + source + "): " + reason;
    }

    /**
     * @param file one of libtorch's libraries
     * @param source where its folder was named, or "extracted from the pytorch-native jar"
     * @param reason why it cannot be loaded
     * @return the line for a libtorch library that must not reach the dynamic linker
     */
    public static String libtorchUnloadable(String file, String source, String reason) {
        return "cannot load libtorch's " + file + " (" + source + "): " + reason;
    }

    /**
     * @param recorded the SHA-256 recorded when the file was made
     * @param actual the file's SHA-256 now
     * @return the reason for a file whose content changed since it was made
     */
    public static String digestMismatch(String recorded, String actual) {
        return "its SHA-256 is " + actual + ", not the " + recorded + " recorded when it was built (damaged or"
                + " replaced)";
    }

    /**
     * @param what the cached thing, e.g. "libtorch" or "gradbridge's native library"
     * @param folder its cache folder
     * @param reason what is wrong with it
     * @param action what happens now, e.g. "extracting it again"
     * @return the one line printed when a cached library is made again
     */
    public static String cacheDamaged(String what, String folder, String reason, String action) {
        return "gradbridge: the cached " + what + " in " + folder + " is damaged (" + reason + "): " + action;
    }

    /**
     * @param folder the folder that cannot be written
     * @param reason the system's reason
     * @return the line for a cache folder gradbridge cannot write
     */
    public static String cacheUnwritable(String folder, String reason) {
        return "cannot write gradbridge's cache folder " + folder + " (" + CACHE_ENV + ", by default"
                + " ~/.cache/gradbridge): " + reason + "; set " + CACHE_ENV + " to a writable folder";
    }

    /**
     * @param path a path on the way to the cache folder
     * @return the reason for a cache folder under a path that is a file ({@code GRADBRIDGE_CACHE_DIR} naming one)
     */
    public static String notAFolder(String path) {
        return path + " is a file, not a folder";
    }

    // ---- devices: where a module trains (Python: messages, the same sentences) ----

    /** The environment libtorch's cuBLAS reads for reproducible results, set before CUDA starts (with its value). */
    public static final String CUBLAS_WORKSPACE_CONFIG = "CUBLAS_WORKSPACE_CONFIG";

    /** {@link #CUBLAS_WORKSPACE_CONFIG}'s value on deterministic CUDA runs. */
    public static final String CUBLAS_WORKSPACE_VALUE = ":4096:8";

    /**
     * @param device the device string given
     * @return the line for a device string that names no device
     */
    public static String unknownDevice(String device) {
        return "unknown device '" + device + "'; expected cpu, cuda or cuda:N";
    }

    /**
     * @param device the device asked for, e.g. {@code cuda:0}
     * @param reason why it is not there ({@link #cudaDevicesSeen}, {@link #cudaCpuBuild}, ...)
     * @return the line for a device this process cannot train on
     */
    public static String deviceUnavailable(String device, String reason) {
        return device + " is not available: " + reason;
    }

    /**
     * @param libtorch the libtorch build, e.g. {@code 2.7.1+cu126}
     * @param count the CUDA devices it sees
     * @param driver whether the NVIDIA driver's library loads (said when no device is seen)
     * @return why a CUDA device index is out of reach
     */
    public static String cudaDevicesSeen(String libtorch, int count, boolean driver) {
        String seen = "this libtorch (" + libtorch + ") sees " + count + " CUDA device" + (count == 1 ? "" : "s");
        if (count > 0) {
            return seen + " (cuda:0" + (count > 1 ? " to cuda:" + (count - 1) : "") + ")";
        }
        return seen + (driver ? "" : " (no NVIDIA driver: libcuda.so.1 does not load)");
    }

    /**
     * @param libtorch the libtorch build and where it is
     * @return why a libtorch without CUDA libraries trains on no CUDA device
     */
    public static String cudaCpuBuild(String libtorch) {
        return "this libtorch (" + libtorch + ") is a CPU build (no libtorch_cuda.so): use a CUDA build (pip's torch"
                + " on Linux; for a JVM of its own, GRADBRIDGE_LIBTORCH=its torch/lib)";
    }

    /**
     * @param file libtorch's CUDA library
     * @param reason the dynamic linker's
     * @return why libtorch's CUDA library did not load
     */
    public static String cudaUnloadable(String file, String reason) {
        return "cannot load " + file + ": " + reason;
    }

    /** Why a JVM whose libtorch started without its CUDA libraries trains on no CUDA device (Java only). */
    public static final String CUDA_NOT_LOADED = "libtorch started in this JVM without its CUDA libraries, which"
            + " load with libtorch: name the CUDA device before other libtorch work, or start the JVM with"
            + " -Dgradbridge.cuda=true (or GRADBRIDGE_CUDA=1)";
}
