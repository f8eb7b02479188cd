package dev.gradbridge;

import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.NativeSettings;
import dev.gradbridge.internal.PlatformMessages;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.Properties;
import java.util.regex.Pattern;

/**
 * Finds and loads libtorch and gradbridge's native library built for it, once per JVM.
 *
 * <p>libtorch comes from the folder named by {@value #LIBTORCH_PROPERTY} (or {@value
 * #LIBTORCH_ENV}): in-process, the folder of the torch that Python imported; any libtorch
 * folder, e.g. a pip torch's {@code torch/lib}. Without one, from DJL's {@code
 * pytorch-native-cpu} jar on the classpath, used only as a distribution of libtorch's shared
 * libraries: extracted once into the cache folder and checked. The native library comes from
 * {@value #LIBRARY_PROPERTY} (or {@value #LIBRARY_ENV}), else the one this jar carries. Its
 * properties file says which libtorch version and C++ ABI it was compiled for; a libtorch of
 * another version is refused with one line saying what mismatched. No library reaches {@code
 * System.load} unchecked: each must be a whole ELF shared object for this machine ({@link
 * #libraryProblem}), and the cached copies must match the SHA-256 recorded when they were made
 * (else they are extracted again, with one line).
 *
 * <p>CUDA: libtorch's CUDA libraries ({@code libc10_cuda.so}, {@code libtorch_cuda.so}) load with libtorch,
 * before anything asks libtorch about CUDA (asked first, libtorch answers "no CUDA" for good, without an
 * error): when the first request is for a CUDA device ({@link #requireDevice}), when {@value
 * #CUDA_PROPERTY} (or {@value #CUDA_ENV}) is {@code true}, or when this process has them mapped already
 * (in-process, Python's torch loaded them). A CPU run on a CUDA build loads none of them.
 */
final class NativeLibrary {

    static final String LIBTORCH_PROPERTY = "gradbridge.libtorch.path";
    static final String LIBTORCH_ENV = "GRADBRIDGE_LIBTORCH";
    static final String LIBRARY_PROPERTY = "gradbridge.native.library";
    static final String LIBRARY_ENV = "GRADBRIDGE_NATIVE_LIBRARY";
    static final String THREADS_PROPERTY = "gradbridge.numThreads";
    static final String INTEROP_THREADS_PROPERTY = "gradbridge.numInteropThreads";
    static final String CUDA_PROPERTY = "gradbridge.cuda";
    static final String CUDA_ENV = "GRADBRIDGE_CUDA";
    /** Inside this jar: the native library built at build time, and its properties. */
    static final String JAR_FOLDER = "dev/gradbridge/native/linux-x86_64/";
    static final String JAR_PROPERTIES = JAR_FOLDER + "native.properties";
    /** DJL's pytorch-native-cpu jar: libtorch's shared libraries and their version. */
    static final String DJL_FOLDER = "pytorch/cpu/linux-x86_64/";
    static final String DJL_PROPERTIES = "native/lib/pytorch.properties";

    private static String description;
    private static GradbridgeException failure;
    private static boolean loading;
    private static boolean cudaWanted; // the first load is for a CUDA device
    private static String libtorchBuild = "?"; // the loaded libtorch's version with its local suffix (2.7.1+cu126)
    private static String cudaProblem = PlatformMessages.CUDA_NOT_LOADED; // why no CUDA device is reachable, or null

    private NativeLibrary() {}

    /**
     * Checks that this process can train on {@code device} (canonical, {@link Devices}), loading libtorch first:
     * for a CUDA device with its CUDA libraries, then that libtorch sees the device.
     *
     * @throws InvalidInputException naming the device and why it is not available
     */
    static void requireDevice(String device) {
        if (!Devices.isCuda(device)) {
            load();
            return;
        }
        String problem;
        synchronized (NativeLibrary.class) {
            if (description == null && failure == null && !loading) {
                cudaWanted = true;
            }
            load();
            problem = cudaProblem;
        }
        if (problem == null) {
            int count = Native.cudaDeviceCount();
            if (Devices.index(device) < count) {
                return;
            }
            problem = PlatformMessages.cudaDevicesSeen(libtorchBuild, count, count > 0 || Native.cudaDriverLoads());
        }
        throw new InvalidInputException(PlatformMessages.deviceUnavailable(device, problem));
    }

    /** Loads libtorch and the native library (once); every later call returns at once or rethrows the first failure. */
    static synchronized void load() {
        if (description != null) {
            return;
        }
        if (failure != null) {
            throw failure;
        }
        if (loading) {
            return; // a class initialized from JNI_OnLoad must not load the library again
        }
        loading = true;
        try {
            // checked before anything loads: a bad setting is one line, not a half-started engine
            Integer threads = threadCount(THREADS_PROPERTY);
            Integer interop = threadCount(INTEROP_THREADS_PROPERTY);
            String loaded = loadOnce();
            NativeMemory.tune(); // once: freed tensor memory stays in the process (see NativeMemory)
            if (threads != null) {
                applyThreads(THREADS_PROPERTY, () -> Native.setNumThreads(threads));
            }
            if (interop != null) {
                applyThreads(INTEROP_THREADS_PROPERTY, () -> Native.setNumInteropThreads(interop));
            }
            description = loaded;
        } catch (GradbridgeException e) {
            failure = e;
            throw e;
        } finally {
            loading = false;
        }
    }

    /** The most threads {@value #THREADS_PROPERTY} and {@value #INTEROP_THREADS_PROPERTY} take (OpenMP aborts the process when it cannot create them). */
    static final int MAX_THREADS = ModuleAccess.MAX_THREADS;

    /** A thread-count property: {@code null} when unset, else a whole number in 1..{@value #MAX_THREADS}. */
    private static Integer threadCount(String property) {
        String value = System.getProperty(property);
        if (value == null) {
            return null;
        }
        try {
            int threads = Integer.parseInt(value.trim());
            if (threads >= 1 && threads <= MAX_THREADS) {
                return threads;
            }
        } catch (NumberFormatException e) {
            // the line below
        }
        throw new GradbridgeException(PlatformMessages.threadCount(property, value, MAX_THREADS));
    }

    private static void applyThreads(String property, Runnable set) {
        try {
            set.run();
        } catch (NativeException e) { // libtorch: inter-op threads can be set once, before any inter-op work
            throw new GradbridgeException(
                    PlatformMessages.threadCountRefused(property, System.getProperty(property), e.getMessage()), e);
        }
    }

    /** @return which native library and libtorch this JVM runs, in words (loads them first) */
    static synchronized String describe() {
        load();
        return description;
    }

    /** @return the libtorch version the loaded native library was compiled against */
    static String torchVersion() {
        load();
        return Native.torchVersion();
    }

    private static String loadOnce() {
        Path libtorch = LibtorchFolder.libtorchFolder();
        String libtorchVersion = LibtorchFolder.libtorchVersion(libtorch);
        if (!Versions.inTorchRange(libtorchVersion)) {
            throw new GradbridgeException(LibtorchFolder.named(libtorch) + " holds libtorch " + libtorchVersion
                    + ", outside gradbridge's supported range " + Versions.TORCH_RANGE
                    + ": name the torch/lib folder of a torch in that range");
        }
        Path library;
        Properties built;
        String configured = NativeSettings.value(LIBRARY_PROPERTY, LIBRARY_ENV);
        if (configured != null) {
            library = Paths.get(configured).toAbsolutePath();
            built = configuredLibrary(library);
        } else {
            built = NativeCache.jarProperties();
            library = NativeCache.extractJarLibrary(built);
        }
        String builtFor = built.getProperty("torch_version");
        String abi = built.getProperty("cxx11_abi");
        List<Path> files = checkPair(libtorch, libtorchVersion, library, builtFor, abi);
        for (Path file : files) {
            try {
                System.load(file.toString());
            } catch (UnsatisfiedLinkError e) {
                throw new GradbridgeException("cannot load libtorch's " + file + ": " + e.getMessage());
            }
        }
        libtorchBuild = LibtorchFolder.libtorchBuild(libtorch, libtorchVersion);
        cudaProblem = loadCuda(libtorch);
        loadNative(library, libtorch, builtFor, abi);
        if (cudaProblem == null) {
            if (Native.cudaBuilt()) { // cuBLAS reads its workspace setting once, when CUDA starts: before that
                Native.setEnvDefault(PlatformMessages.CUBLAS_WORKSPACE_CONFIG, PlatformMessages.CUBLAS_WORKSPACE_VALUE);
            } else {
                cudaProblem = PlatformMessages.CUDA_NOT_LOADED;
            }
        }
        return library + " (libtorch " + builtFor + ", C++11 ABI " + abi + ") on libtorch " + libtorchVersion
                + " from " + libtorch;
    }

    /**
     * A native library a setting names: a {@code .so} file, its properties beside it saying what it was built
     * for, its bytes those the properties record.
     *
     * @return its properties
     */
    private static Properties configuredLibrary(Path library) {
        String source = NativeSettings.source(LIBRARY_PROPERTY, LIBRARY_ENV);
        if (!Files.isRegularFile(library)) {
            throw new GradbridgeException("gradbridge's native library " + library + " (" + source
                    + (Files.isDirectory(library) ? ") is a folder: name the .so file in it" : ") does not exist"));
        }
        if (!library.getFileName().toString().endsWith(".so") || library.getFileName().toString().equals(".so")) {
            throw new GradbridgeException(PlatformMessages.nativeLibraryName(library.toString(), source));
        }
        Properties built = readProperties(propertiesBeside(library));
        checkBuiltFor(built, propertiesBeside(library), library);
        String problem = libraryProblem(library, built.getProperty(LIBRARY_DIGEST_KEY));
        if (problem != null) {
            throw new GradbridgeException(PlatformMessages.nativeLibraryUnloadable(library.toString(), source,
                    problem));
        }
        return built;
    }

    /**
     * The native library and the libtorch folder belong together (the same libtorch version, the same C++ ABI)
     * and the folder's libraries are whole, before any of them loads.
     *
     * @return libtorch's files to load, in dependency order
     */
    private static List<Path> checkPair(Path libtorch, String libtorchVersion, Path library, String builtFor, String abi) {
        if (!libtorchVersion.equals(builtFor)) {
            throw new GradbridgeException(
                    "gradbridge's native library " + library.getFileName() + " was built for libtorch " + builtFor
                            + " (C++11 ABI " + abi + "), but " + libtorch + " holds libtorch " + libtorchVersion
                            + ": use a native library built for " + libtorchVersion
                            + " (python -m gradbridge.native build --out DIR with that torch installed,"
                            + " then -D" + LIBRARY_PROPERTY + "=DIR/<file>.so)");
        }
        List<Path> files = LibtorchFolder.libtorchFiles(libtorch);
        LibtorchFolder.checkLibtorchFiles(libtorch);
        int folderAbi = LibtorchFolder.cxx11Abi(libtorch);
        if (!String.valueOf(folderAbi).equals(abi)) {
            throw new GradbridgeException(LibtorchFolder.named(libtorch) + " holds libtorch " + libtorchVersion + " built with the "
                    + (folderAbi == 0 ? "pre-C++11 ABI" : "C++11 ABI") + " (C++11 ABI " + folderAbi
                    + "), but gradbridge's native library " + library.getFileName() + " was built for C++11 ABI "
                    + abi + ": name a libtorch of C++11 ABI " + abi + " (pip's torch is one), or build the native"
                    + " library against this one (python -m gradbridge.native build)");
        }
        return files;
    }

    /** Loads the native library (libtorch's files are loaded) and checks that it is what its properties say. */
    private static void loadNative(Path library, Path libtorch, String builtFor, String abi) {
        try {
            System.load(library.toString());
        } catch (UnsatisfiedLinkError e) {
            throw new GradbridgeException("cannot load gradbridge's native library " + library
                    + " (built for libtorch " + builtFor + ", C++11 ABI " + abi + ") on " + libtorch + ": "
                    + e.getMessage());
        }
        String reported;
        try {
            reported = Native.torchVersion();
        } catch (UnsatisfiedLinkError e) { // a shared library, but not gradbridge's: no JNI entry points
            throw new GradbridgeException("cannot load gradbridge's native library " + library + ": it is not"
                    + " gradbridge's JNI library (" + e.getMessage() + " is missing from it): name the .so that"
                    + " python -m gradbridge.native build --out DIR wrote");
        }
        if (!builtFor.equals(reported) || !String.valueOf(Native.cxx11Abi()).equals(abi)) {
            throw new GradbridgeException("gradbridge's native library " + library + " reports libtorch "
                    + Native.torchVersion() + " (C++11 ABI " + Native.cxx11Abi() + ") but its properties file says "
                    + builtFor + " (" + abi + "): rebuild it");
        }
    }

    /**
     * libtorch's CUDA libraries loaded from its folder when this run wants them (see the class comment): null,
     * else why no CUDA device is reachable. A libtorch folder without them is a CPU build.
     */
    private static String loadCuda(Path folder) {
        Path torchCuda = folder.resolve("libtorch_cuda.so");
        if (!Files.isRegularFile(torchCuda)) {
            return PlatformMessages.cudaCpuBuild(libtorchBuild + " at " + folder);
        }
        String setting = NativeSettings.value(CUDA_PROPERTY, CUDA_ENV);
        boolean asked = cudaWanted || "true".equalsIgnoreCase(String.valueOf(setting).trim())
                || "1".equals(String.valueOf(setting).trim());
        if (!asked && !LibtorchFolder.mappedHere(torchCuda)) {
            return PlatformMessages.CUDA_NOT_LOADED;
        }
        for (Path file : new Path[] {folder.resolve("libc10_cuda.so"), torchCuda}) {
            if (!Files.isRegularFile(file)) {
                continue; // a libtorch of another layout: libtorch_cuda's own dependencies bring it
            }
            try {
                System.load(file.toString());
            } catch (UnsatisfiedLinkError e) {
                return PlatformMessages.cudaUnloadable(file.toString(), String.valueOf(e.getMessage()));
            }
        }
        return null;
    }

    /** The key of a native library's properties that holds the library's SHA-256 (python: native.Build). */
    static final String LIBRARY_DIGEST_KEY = "library_sha256";
    private static final Pattern VERSION = Pattern.compile("\\d+(\\.\\w+)+");

    /** The properties must say which libtorch and C++ ABI the library was built for: else one line, never "null". */
    static void checkBuiltFor(Properties built, Path properties, Path library) {
        String version = built.getProperty("torch_version");
        if (version == null || !VERSION.matcher(version.trim()).matches()) {
            throw new GradbridgeException(PlatformMessages.nativeProperties(properties.toString(),
                    library.getFileName().toString(), "torch_version", version));
        }
        String abi = built.getProperty("cxx11_abi");
        if (!"0".equals(abi) && !"1".equals(abi)) {
            throw new GradbridgeException(PlatformMessages.nativeProperties(properties.toString(),
                    library.getFileName().toString(), "cxx11_abi", abi));
        }
    }

    /**
     * Why {@code file} must not reach the dynamic linker, or {@code null}: not an ELF shared object this
     * machine can map (a truncated one is SIGBUS; OperatorLibraries' check), or, with a recorded SHA-256,
     * content that differs from it (a damaged one can be SIGILL).
     */
    static String libraryProblem(Path file, String recordedSha256) {
        String problem = OperatorLibraries.libraryProblem(file);
        if (problem != null || recordedSha256 == null || recordedSha256.isEmpty()) {
            return problem;
        }
        try {
            String actual = Digests.sha256Hex(file);
            return actual.equals(recordedSha256.trim()) ? null
                    : PlatformMessages.digestMismatch(recordedSha256.trim(), actual);
        } catch (IOException e) {
            return "cannot read it: " + ioReason(e);
        }
    }

    /** The system's reason for an I/O failure, in words (AccessDeniedException's message is only the path). */
    static String ioReason(IOException e) {
        if (e instanceof java.nio.file.AccessDeniedException) {
            return "Permission denied";
        }
        if (e instanceof FileAlreadyExistsException) {
            return "a file is in the way: " + e.getMessage();
        }
        if (e instanceof java.nio.file.NoSuchFileException) {
            return "No such file or directory: " + e.getMessage();
        }
        if (e instanceof java.nio.file.FileSystemException && ((java.nio.file.FileSystemException) e).getReason() != null) {
            return ((java.nio.file.FileSystemException) e).getReason();
        }
        return String.valueOf(e.getMessage());
    }

    private static Path propertiesBeside(Path library) {
        String name = library.getFileName().toString();
        return library.resolveSibling(name.substring(0, name.length() - ".so".length()) + ".properties");
    }

    static Properties readProperties(Path file) {
        Properties properties = new Properties();
        try (InputStream in = Files.newInputStream(file)) {
            properties.load(in);
        } catch (IOException | IllegalArgumentException e) { // IllegalArgumentException: a malformed unicode escape
            throw new GradbridgeException("cannot read " + file + " (what the native library was built for): "
                    + (e instanceof IOException ? ioReason((IOException) e) : e.getMessage())
                    + "; python -m gradbridge.native build --out DIR writes the library and this file", e);
        }
        return properties;
    }

    static Properties resourceProperties(String resource) {
        try (InputStream in = NativeLibrary.class.getClassLoader().getResourceAsStream(resource)) {
            if (in == null) {
                return null;
            }
            Properties properties = new Properties();
            properties.load(in);
            return properties;
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
