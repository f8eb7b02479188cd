package dev.gradbridge;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.NativeSettings;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.DirectoryStream;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

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

    private static final Pattern PY_VERSION = Pattern.compile("__version__\\s*=\\s*['\"]([^'\"]+)['\"]");

    private static String description;
    private static GradbridgeException failure;
    private static boolean loading;
    private static boolean cudaWanted; // the first load is for a CUDA device
    private static String libtorchBuild = "?"; // the loaded libtorch's version with its local suffix (2.7.1+cu126)
    private static String cudaProblem = Messages.CUDA_NOT_LOADED; // why no CUDA device is reachable, or null

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
            problem = Messages.cudaDevicesSeen(libtorchBuild, count, count > 0 || Native.cudaDriverLoads());
        }
        throw new InvalidInputException(Messages.deviceUnavailable(device, problem));
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
        throw new GradbridgeException(Messages.threadCount(property, value, MAX_THREADS));
    }

    private static void applyThreads(String property, Runnable set) {
        try {
            set.run();
        } catch (NativeException e) { // libtorch: inter-op threads can be set once, before any inter-op work
            throw new GradbridgeException(
                    Messages.threadCountRefused(property, System.getProperty(property), e.getMessage()), e);
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
        Path libtorch = libtorchFolder();
        String libtorchVersion = libtorchVersion(libtorch);
        if (!Versions.inTorchRange(libtorchVersion)) {
            throw new GradbridgeException(named(libtorch) + " holds libtorch " + libtorchVersion
                    + ", outside gradbridge's supported range " + Versions.TORCH_RANGE
                    + ": name the torch/lib folder of a torch in that range");
        }
        Path library;
        Properties built;
        String configured = NativeSettings.value(LIBRARY_PROPERTY, LIBRARY_ENV);
        if (configured != null) {
            library = Paths.get(configured).toAbsolutePath();
            String source = NativeSettings.source(LIBRARY_PROPERTY, LIBRARY_ENV);
            if (!Files.isRegularFile(library)) {
                throw new GradbridgeException("gradbridge's native library " + library + " (" + source
                        + (Files.isDirectory(library) ? ") is a folder: name the .so file in it" : ") does not exist"));
            }
            if (!library.getFileName().toString().endsWith(".so") || library.getFileName().toString().equals(".so")) {
                throw new GradbridgeException(Messages.nativeLibraryName(library.toString(), source));
            }
            built = readProperties(propertiesBeside(library));
            checkBuiltFor(built, propertiesBeside(library), library);
            String problem = libraryProblem(library, built.getProperty(LIBRARY_DIGEST_KEY));
            if (problem != null) {
                throw new GradbridgeException(Messages.nativeLibraryUnloadable(library.toString(), source, problem));
            }
        } else {
            built = jarProperties();
            library = extractJarLibrary(built);
        }
        String builtFor = built.getProperty("torch_version");
        String abi = built.getProperty("cxx11_abi");
        if (!libtorchVersion.equals(builtFor)) {
            throw new GradbridgeException(
                    "gradbridge's native library " + library.getFileName() + " was built for libtorch " + builtFor
                            + " (C++11 ABI " + abi + "), but " + libtorch + " holds libtorch " + libtorchVersion
                            + ": use a native library built for " + libtorchVersion
                            + " (python -m gradbridge.native build --out DIR with that torch installed,"
                            + " then -D" + LIBRARY_PROPERTY + "=DIR/<file>.so)");
        }
        List<Path> files = libtorchFiles(libtorch);
        checkLibtorchFiles(libtorch);
        int folderAbi = cxx11Abi(libtorch);
        if (!String.valueOf(folderAbi).equals(abi)) {
            throw new GradbridgeException(named(libtorch) + " holds libtorch " + libtorchVersion + " built with the "
                    + (folderAbi == 0 ? "pre-C++11 ABI" : "C++11 ABI") + " (C++11 ABI " + folderAbi
                    + "), but gradbridge's native library " + library.getFileName() + " was built for C++11 ABI "
                    + abi + ": name a libtorch of C++11 ABI " + abi + " (pip's torch is one), or build the native"
                    + " library against this one (python -m gradbridge.native build)");
        }
        for (Path file : files) {
            try {
                System.load(file.toString());
            } catch (UnsatisfiedLinkError e) {
                throw new GradbridgeException("cannot load libtorch's " + file + ": " + e.getMessage());
            }
        }
        libtorchBuild = libtorchBuild(libtorch, libtorchVersion);
        cudaProblem = loadCuda(libtorch);
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
        if (cudaProblem == null) {
            if (Native.cudaBuilt()) { // cuBLAS reads its workspace setting once, when CUDA starts: before that
                Native.setEnvDefault(Messages.CUBLAS_WORKSPACE_CONFIG, Messages.CUBLAS_WORKSPACE_VALUE);
            } else {
                cudaProblem = Messages.CUDA_NOT_LOADED;
            }
        }
        return library + " (libtorch " + builtFor + ", C++11 ABI " + abi + ") on libtorch " + libtorchVersion
                + " from " + libtorch;
    }

    /**
     * libtorch's CUDA libraries loaded from its folder when this run wants them (see the class comment): null,
     * else why no CUDA device is reachable. A libtorch folder without them is a CPU build.
     */
    private static String loadCuda(Path folder) {
        Path torchCuda = folder.resolve("libtorch_cuda.so");
        if (!Files.isRegularFile(torchCuda)) {
            return Messages.cudaCpuBuild(libtorchBuild + " at " + folder);
        }
        String setting = NativeSettings.value(CUDA_PROPERTY, CUDA_ENV);
        boolean asked = cudaWanted || "true".equalsIgnoreCase(String.valueOf(setting).trim())
                || "1".equals(String.valueOf(setting).trim());
        if (!asked && !mappedHere(torchCuda)) {
            return Messages.CUDA_NOT_LOADED;
        }
        for (Path file : new Path[] {folder.resolve("libc10_cuda.so"), torchCuda}) {
            if (!Files.isRegularFile(file)) {
                continue; // a libtorch of another layout: libtorch_cuda's own dependencies bring it
            }
            try {
                System.load(file.toString());
            } catch (UnsatisfiedLinkError e) {
                return Messages.cudaUnloadable(file.toString(), String.valueOf(e.getMessage()));
            }
        }
        return null;
    }

    /** Whether this process has {@code file} mapped already (Python's torch loaded it: in-process). */
    private static boolean mappedHere(Path file) {
        try (Stream<String> maps = Files.lines(Paths.get("/proc/self/maps"), StandardCharsets.ISO_8859_1)) {
            String name = file.toRealPath().toString();
            return maps.anyMatch(line -> line.endsWith(name));
        } catch (IOException | UncheckedIOException e) {
            return false;
        }
    }

    /** The libtorch's version with its local suffix ({@code 2.7.1+cu126}), for messages; else {@code version}. */
    private static String libtorchBuild(Path folder, String version) {
        try {
            Path pip = folder.resolveSibling("version.py");
            if (Files.isRegularFile(pip)) {
                Matcher m = PY_VERSION.matcher(new String(Files.readAllBytes(pip), StandardCharsets.UTF_8));
                if (m.find()) {
                    return m.group(1);
                }
            }
            Path zip = folder.resolveSibling("build-version");
            if (Files.isRegularFile(zip)) {
                return new String(Files.readAllBytes(zip), StandardCharsets.UTF_8).trim();
            }
        } catch (IOException e) {
            // the version alone below
        }
        return version;
    }

    /** The key of a native library's properties that holds the library's SHA-256 (python: native.Build). */
    static final String LIBRARY_DIGEST_KEY = "library_sha256";
    private static final Pattern VERSION = Pattern.compile("\\d+(\\.\\w+)+");

    /** The properties must say which libtorch and C++ ABI the library was built for: else one line, never "null". */
    private static void checkBuiltFor(Properties built, Path properties, Path library) {
        String version = built.getProperty("torch_version");
        if (version == null || !VERSION.matcher(version.trim()).matches()) {
            throw new GradbridgeException(Messages.nativeProperties(properties.toString(),
                    library.getFileName().toString(), "torch_version", version));
        }
        String abi = built.getProperty("cxx11_abi");
        if (!"0".equals(abi) && !"1".equals(abi)) {
            throw new GradbridgeException(Messages.nativeProperties(properties.toString(),
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
            return actual.equals(recordedSha256.trim()) ? null : Messages.digestMismatch(recordedSha256.trim(), actual);
        } catch (IOException e) {
            return "cannot read it: " + ioReason(e);
        }
    }

    /**
     * Every library of a libtorch folder is an ELF shared object inside its file before any is loaded:
     * those Java loads and those the dynamic linker pulls in beside them (libtorch_cpu.so needs libgomp).
     */
    private static void checkLibtorchFiles(Path folder) {
        Pattern library = Pattern.compile("lib.*\\.so(\\.\\d+)*");
        List<Path> files = new ArrayList<>();
        try (Stream<Path> entries = Files.list(folder)) {
            entries.filter(f -> library.matcher(f.getFileName().toString()).matches() && Files.isRegularFile(f))
                    .sorted()
                    .forEach(files::add);
        } catch (IOException e) {
            throw new GradbridgeException("cannot read the libtorch folder " + named(folder) + ": " + ioReason(e), e);
        }
        for (Path file : files) {
            String problem = OperatorLibraries.libraryProblem(file);
            if (problem != null) {
                throw new GradbridgeException(Messages.libtorchUnloadable(file.toString(), libtorchSource(folder),
                        problem));
            }
        }
    }

    /** Where a libtorch folder came from, for messages. */
    private static String libtorchSource(Path folder) {
        String configured = NativeSettings.value(LIBTORCH_PROPERTY, LIBTORCH_ENV);
        return configured != null && folder.equals(Paths.get(configured).toAbsolutePath())
                ? NativeSettings.source(LIBTORCH_PROPERTY, LIBTORCH_ENV)
                : "extracted from the pytorch-native jar";
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

    private static Path libtorchFolder() {
        String configured = NativeSettings.value(LIBTORCH_PROPERTY, LIBTORCH_ENV);
        if (configured != null) {
            Path folder = Paths.get(configured).toAbsolutePath();
            if (!Files.isRegularFile(folder.resolve("libtorch_cpu.so")) || !Files.isRegularFile(folder.resolve("libc10.so"))) {
                throw new GradbridgeException(
                        folder + " (" + NativeSettings.source(LIBTORCH_PROPERTY, LIBTORCH_ENV) + ") is not a libtorch folder: it"
                                + " lacks libc10.so or libtorch_cpu.so; name a folder that holds them, e.g. a pip"
                                + " torch's torch/lib");
            }
            return folder;
        }
        Properties djl = resourceProperties(DJL_PROPERTIES);
        if (djl == null || NativeLibrary.class.getClassLoader().getResource(DJL_FOLDER + "libtorch_cpu.so") == null) {
            throw new GradbridgeException(
                    "no libtorch for gradbridge: put ai.djl.pytorch:pytorch-native-cpu (classifier linux-x86_64) on"
                            + " the classpath, or set -D" + LIBTORCH_PROPERTY + " (or " + LIBTORCH_ENV
                            + ") to a libtorch folder, e.g. a pip torch's torch/lib");
        }
        return extractDjlLibtorch(djl);
    }

    /** A libtorch folder for messages: with the setting that named it, if one did. */
    private static String named(Path folder) {
        String configured = NativeSettings.value(LIBTORCH_PROPERTY, LIBTORCH_ENV);
        return configured != null && folder.equals(Paths.get(configured).toAbsolutePath())
                ? folder + " (" + NativeSettings.source(LIBTORCH_PROPERTY, LIBTORCH_ENV) + ")"
                : folder.toString();
    }

    /**
     * The C++ ABI a libtorch folder was built with, read before anything loads: 1 when libc10.so's
     * symbols name {@code std::__cxx11} types (every C++11-ABI build's do), else 0. A native library
     * of the other ABI would fail to load with an undefined symbol, or worse, load.
     */
    static int cxx11Abi(Path folder) {
        byte[] marker = "__cxx11".getBytes(StandardCharsets.US_ASCII);
        byte[] bytes;
        try {
            bytes = Files.readAllBytes(folder.resolve("libc10.so"));
        } catch (IOException e) {
            throw new GradbridgeException("cannot read " + folder.resolve("libc10.so") + ": " + e.getMessage(), e);
        }
        outer:
        for (int i = 0; i + marker.length <= bytes.length; i++) {
            for (int j = 0; j < marker.length; j++) {
                if (bytes[i + j] != marker[j]) {
                    continue outer;
                }
            }
            return 1;
        }
        return 0;
    }

    /** The version of libtorch in a folder: DJL's properties, a pip torch's version.py, or libtorch's build-version. */
    static String libtorchVersion(Path folder) {
        try {
            Path djl = folder.resolve("pytorch.properties");
            if (Files.isRegularFile(djl)) {
                return readProperties(djl).getProperty("version", "").split("-")[0];
            }
            Path pip = folder.resolveSibling("version.py");
            if (Files.isRegularFile(pip)) {
                Matcher m = PY_VERSION.matcher(new String(Files.readAllBytes(pip), StandardCharsets.UTF_8));
                if (m.find()) {
                    return m.group(1).split("\\+")[0];
                }
            }
            Path zip = folder.resolveSibling("build-version");
            if (Files.isRegularFile(zip)) {
                return new String(Files.readAllBytes(zip), StandardCharsets.UTF_8).trim().split("\\+")[0];
            }
        } catch (IOException e) {
            throw new GradbridgeException("cannot tell which libtorch version " + folder + " holds: "
                    + ioReason(e), e);
        }
        throw new GradbridgeException("cannot tell which libtorch version " + folder + " holds (it has no"
                + " pytorch.properties, ../version.py or ../build-version)");
    }

    /** What to load before the native library, in dependency order. */
    private static List<Path> libtorchFiles(Path folder) {
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> gomp = Files.newDirectoryStream(folder, "libgomp*.so*")) {
            for (Path file : gomp) {
                files.add(file);
            }
        } catch (IOException e) {
            throw new GradbridgeException("cannot read the libtorch folder " + named(folder) + ": " + ioReason(e), e);
        }
        files.add(folder.resolve("libc10.so"));
        files.add(folder.resolve("libtorch_cpu.so"));
        return files;
    }

    /**
     * DJL's libtorch extracted once into the cache (temp folder, then a rename), each file's SHA-256
     * recorded as it is written. Every start checks each file against its record: in full when the
     * file's size, times or inode changed since it was last checked (libtorch_cpu.so is ~450 MB; any
     * write to a file changes its ctime), else by that stat alone. A damaged copy is extracted again.
     */
    private static Path extractDjlLibtorch(Properties djl) {
        String version = djl.getProperty("version", "unknown");
        String[] names = djl.getProperty("libraries", "").split(",");
        Path target = NativeSettings.cacheFolder().resolve("libtorch").resolve(version + "-cpu-linux-x86_64");
        String problem = cacheProblem(target, names, false);
        if (problem != null) {
            if (!problem.isEmpty()) {
                System.err.println(Messages.cacheDamaged("libtorch", target.toString(), problem, "extracting it again"));
            }
            extract(target, names, DJL_FOLDER, DJL_PROPERTIES, "pytorch.properties");
        }
        return target;
    }

    private static Properties jarProperties() {
        Properties built = resourceProperties(JAR_PROPERTIES);
        if (built == null) {
            throw new GradbridgeException("this gradbridge jar carries no native library (" + JAR_PROPERTIES
                    + "): set -D" + LIBRARY_PROPERTY + " to one built with python -m gradbridge.native build");
        }
        checkBuiltFor(built, Paths.get(JAR_PROPERTIES), Paths.get(built.getProperty("library", "?")));
        return built;
    }

    /**
     * This jar's native library, extracted once into the cache; checked in full (it is small) at every
     * start. The folder is named by the library's own SHA-256 (older jars: by their sources'): two builds
     * of the same sources differ in their bytes, and each keeps its own copy.
     */
    private static Path extractJarLibrary(Properties built) {
        String name = built.getProperty("library");
        String identity = built.getProperty(LIBRARY_DIGEST_KEY, built.getProperty("source_sha256", "unversioned"));
        Path target = NativeSettings.cacheFolder().resolve("native").resolve("jar-torch" + built.getProperty("torch_version")
                + "-cxx11abi" + built.getProperty("cxx11_abi") + "-"
                + identity.substring(0, Math.min(32, identity.length())));
        String problem = cacheProblem(target, new String[] {name}, true);
        if (problem != null) {
            if (!problem.isEmpty()) {
                System.err.println(Messages.cacheDamaged("gradbridge's native library", target.toString(), problem,
                        "extracting it again"));
            }
            extract(target, new String[] {name}, JAR_FOLDER, JAR_PROPERTIES, "native.properties");
        }
        Path library = target.resolve(name);
        String recorded = built.getProperty(LIBRARY_DIGEST_KEY);
        String elf = libraryProblem(library, recorded); // the jar's own record, when it carries one
        if (elf != null) {
            throw new GradbridgeException(Messages.nativeLibraryUnloadable(library.toString(), "this jar's", elf));
        }
        return library;
    }

    /** In an extracted folder: each file's SHA-256 as extracted, and the stat it had when last checked. */
    static final String DIGESTS = "gradbridge-sha256.properties";
    private static final String STAT_PREFIX = "stat.";

    /**
     * Whether an extracted folder is complete and undamaged: {@code null} when it is, "" when it is not
     * there yet, else what is wrong (for the one line). {@code always}: hash every file at every start.
     */
    private static String cacheProblem(Path folder, String[] names, boolean always) {
        if (!Files.isDirectory(folder)) {
            return "";
        }
        Path digestsFile = folder.resolve(DIGESTS);
        if (!Files.isRegularFile(digestsFile)) {
            return "it has no " + DIGESTS + " (extracted by an older gradbridge, or cut short)";
        }
        Properties digests = new Properties();
        try (InputStream in = Files.newInputStream(digestsFile)) {
            digests.load(in);
        } catch (IOException | IllegalArgumentException e) {
            return "cannot read " + DIGESTS + ": " + e.getMessage();
        }
        boolean restat = false;
        for (String raw : names) {
            String name = raw.trim();
            Path file = folder.resolve(name);
            String recorded = digests.getProperty(name);
            if (recorded == null) {
                return name + ": no SHA-256 recorded";
            }
            if (!Files.isRegularFile(file)) {
                return name + " is missing";
            }
            String stat = stat(file);
            if (!always && stat != null && stat.equals(digests.getProperty(STAT_PREFIX + name))) {
                continue; // unchanged since it was last hashed
            }
            try {
                String actual = Digests.sha256Hex(file);
                if (!actual.equals(recorded)) {
                    return name + ": " + Messages.digestMismatch(recorded, actual);
                }
            } catch (IOException e) {
                return name + ": cannot read it: " + ioReason(e);
            }
            if (!always && stat != null) {
                digests.setProperty(STAT_PREFIX + name, stat);
                restat = true;
            }
        }
        if (restat) { // hashed again and found intact (e.g. copied or touched): remember its new stat
            try {
                writeDigests(folder, digests);
            } catch (IOException e) {
                // a read-only cache: it is hashed again at the next start
            }
        }
        return null;
    }

    /** A file's size, modification and change times and inode: any write to it changes its ctime. */
    private static String stat(Path file) {
        try {
            java.util.Map<String, Object> unix = Files.readAttributes(file, "unix:size,lastModifiedTime,ctime,ino");
            return unix.get("size") + ":" + ((java.nio.file.attribute.FileTime) unix.get("lastModifiedTime"))
                    .to(java.util.concurrent.TimeUnit.NANOSECONDS) + ":" + ((java.nio.file.attribute.FileTime)
                    unix.get("ctime")).to(java.util.concurrent.TimeUnit.NANOSECONDS) + ":" + unix.get("ino");
        } catch (IOException | UnsupportedOperationException | IllegalArgumentException e) {
            return null; // no unix view: hashed in full every time
        }
    }

    private static void writeDigests(Path folder, Properties digests) throws IOException {
        Path tmp = Files.createTempFile(folder, DIGESTS, ".tmp");
        try {
            try (java.io.OutputStream out = Files.newOutputStream(tmp)) {
                digests.store(out, "SHA-256 of each file as extracted; stat.<name>: its stat when last checked");
            }
            Files.move(tmp, folder.resolve(DIGESTS), StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
        } finally {
            Files.deleteIfExists(tmp);
        }
    }

    /**
     * Extracts into a temp folder beside {@code target} (each file's SHA-256 computed as it is written,
     * recorded in {@value #DIGESTS}), then renames it to {@code target}; a damaged {@code target} is
     * renamed aside first and removed after, so another JVM never sees a half-written folder.
     */
    private static void extract(Path target, String[] names, String resourceFolder, String properties, String as) {
        Path tmp;
        try {
            Files.createDirectories(target.getParent());
            tmp = Files.createTempDirectory(target.getParent(), target.getFileName() + ".tmp");
        } catch (IOException e) {
            throw new GradbridgeException(NativeSettings.cacheUnwritable(target.getParent(), e), e);
        }
        try {
            Properties digests = new Properties();
            for (String name : names) {
                Path file = tmp.resolve(name.trim());
                digests.setProperty(name.trim(), copyResource(resourceFolder + name.trim(), file));
                String stat = stat(file);
                if (stat != null) {
                    digests.setProperty(STAT_PREFIX + name.trim(), stat);
                }
            }
            copyResource(properties, tmp.resolve(as));
            writeDigests(tmp, digests);
            if (Files.exists(target)) { // damaged or stale: aside, then gone
                Path aside = Files.createTempDirectory(target.getParent(), target.getFileName() + ".old");
                Files.delete(aside);
                try {
                    Files.move(target, aside, StandardCopyOption.ATOMIC_MOVE);
                    deleteTree(aside);
                } catch (java.nio.file.NoSuchFileException e) {
                    // another JVM moved it first
                }
            }
            try {
                Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE);
            } catch (FileAlreadyExistsException | java.nio.file.DirectoryNotEmptyException
                    | AtomicMoveNotSupportedException e) {
                // another JVM won the race: its copy is complete
            }
        } catch (IOException e) {
            throw new GradbridgeException(NativeSettings.cacheUnwritable(target.getParent(), e), e);
        } finally {
            try {
                if (Files.exists(tmp)) {
                    deleteTree(tmp);
                }
            } catch (IOException e) {
                // left for the next extraction
            }
        }
    }

    /** Copies a resource to {@code file}; returns the SHA-256 of the bytes written. */
    private static String copyResource(String resource, Path file) throws IOException {
        java.security.MessageDigest digest = Digests.sha256();
        try (InputStream in = NativeLibrary.class.getClassLoader().getResourceAsStream(resource)) {
            if (in == null) {
                throw new GradbridgeException("cannot extract " + resource + ": the classpath lacks it");
            }
            Files.copy(new java.security.DigestInputStream(in, digest), file);
        }
        return Digests.hex(digest.digest());
    }

    private static void deleteTree(Path folder) throws IOException {
        try (Stream<Path> files = Files.walk(folder)) {
            for (Path file : (Iterable<Path>) files.sorted(Comparator.reverseOrder())::iterator) {
                Files.deleteIfExists(file);
            }
        }
    }

    private static Path propertiesBeside(Path library) {
        String name = library.getFileName().toString();
        return library.resolveSibling(name.substring(0, name.length() - ".so".length()) + ".properties");
    }

    private static Properties readProperties(Path file) {
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

    private static Properties resourceProperties(String resource) {
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
