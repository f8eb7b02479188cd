package dev.gradbridge;

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
 * another version is refused with one line saying what mismatched.
 */
final class NativeLibrary {

    static final String LIBTORCH_PROPERTY = "gradbridge.libtorch.path";
    static final String LIBTORCH_ENV = "GRADBRIDGE_LIBTORCH";
    static final String LIBRARY_PROPERTY = "gradbridge.native.library";
    static final String LIBRARY_ENV = "GRADBRIDGE_NATIVE_LIBRARY";
    static final String CACHE_PROPERTY = "gradbridge.cacheDir";
    static final String CACHE_ENV = "GRADBRIDGE_CACHE_DIR";
    static final String THREADS_PROPERTY = "gradbridge.numThreads";
    static final String INTEROP_THREADS_PROPERTY = "gradbridge.numInteropThreads";
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

    private NativeLibrary() {}

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
            description = loadOnce();
        } catch (GradbridgeException e) {
            failure = e;
            throw e;
        } finally {
            loading = false;
        }
        NativeMemory.tune(); // once: freed tensor memory stays in the process (see NativeMemory)
        String threads = System.getProperty(THREADS_PROPERTY);
        if (threads != null) {
            Native.setNumThreads(Integer.parseInt(threads.trim()));
        }
        String interop = System.getProperty(INTEROP_THREADS_PROPERTY);
        if (interop != null) {
            Native.setNumInteropThreads(Integer.parseInt(interop.trim()));
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
        String configured = setting(LIBRARY_PROPERTY, LIBRARY_ENV);
        if (configured != null) {
            library = Paths.get(configured).toAbsolutePath();
            if (!Files.isRegularFile(library)) {
                throw new GradbridgeException("gradbridge's native library " + library + " ("
                        + source(LIBRARY_PROPERTY, LIBRARY_ENV) + ") does not exist");
            }
            built = readProperties(propertiesBeside(library));
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
        int folderAbi = cxx11Abi(libtorch);
        if (!String.valueOf(folderAbi).equals(abi)) {
            throw new GradbridgeException(named(libtorch) + " holds libtorch " + libtorchVersion + " built with the "
                    + (folderAbi == 0 ? "pre-C++11 ABI" : "C++11 ABI") + " (C++11 ABI " + folderAbi
                    + "), but gradbridge's native library " + library.getFileName() + " was built for C++11 ABI "
                    + abi + ": name a libtorch of C++11 ABI " + abi + " (pip's torch is one), or build the native"
                    + " library against this one (python -m gradbridge.native build)");
        }
        for (Path file : libtorchFiles(libtorch)) {
            try {
                System.load(file.toString());
            } catch (UnsatisfiedLinkError e) {
                throw new GradbridgeException("cannot load libtorch's " + file + ": " + e.getMessage());
            }
        }
        try {
            System.load(library.toString());
        } catch (UnsatisfiedLinkError e) {
            throw new GradbridgeException("cannot load gradbridge's native library " + library
                    + " (built for libtorch " + builtFor + ", C++11 ABI " + abi + ") on " + libtorch + ": "
                    + e.getMessage());
        }
        if (!builtFor.equals(Native.torchVersion()) || !String.valueOf(Native.cxx11Abi()).equals(abi)) {
            throw new GradbridgeException("gradbridge's native library " + library + " reports libtorch "
                    + Native.torchVersion() + " (C++11 ABI " + Native.cxx11Abi() + ") but its properties file says "
                    + builtFor + " (" + abi + "): rebuild it");
        }
        return library + " (libtorch " + builtFor + ", C++11 ABI " + abi + ") on libtorch " + libtorchVersion
                + " from " + libtorch;
    }

    private static String setting(String property, String env) {
        String value = System.getProperty(property);
        if (value == null || value.isEmpty()) {
            value = System.getenv(env);
        }
        return value == null || value.isEmpty() ? null : value;
    }

    /** Where a setting came from, for messages: {@code -Dproperty} or the environment variable. */
    private static String source(String property, String env) {
        String value = System.getProperty(property);
        return value != null && !value.isEmpty() ? "-D" + property : env;
    }

    /** The cache folder: {@value #CACHE_PROPERTY}, {@value #CACHE_ENV}, else ~/.cache/gradbridge. */
    static Path cacheFolder() {
        String configured = setting(CACHE_PROPERTY, CACHE_ENV);
        return configured != null
                ? Paths.get(configured)
                : Paths.get(System.getProperty("user.home"), ".cache", "gradbridge");
    }

    private static Path libtorchFolder() {
        String configured = setting(LIBTORCH_PROPERTY, LIBTORCH_ENV);
        if (configured != null) {
            Path folder = Paths.get(configured).toAbsolutePath();
            if (!Files.isRegularFile(folder.resolve("libtorch_cpu.so")) || !Files.isRegularFile(folder.resolve("libc10.so"))) {
                throw new GradbridgeException(
                        folder + " (" + source(LIBTORCH_PROPERTY, LIBTORCH_ENV) + ") is not a libtorch folder: it"
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
        String configured = setting(LIBTORCH_PROPERTY, LIBTORCH_ENV);
        return configured != null && folder.equals(Paths.get(configured).toAbsolutePath())
                ? folder + " (" + source(LIBTORCH_PROPERTY, LIBTORCH_ENV) + ")"
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
            throw new UncheckedIOException(e);
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
            throw new UncheckedIOException(e);
        }
        files.add(folder.resolve("libc10.so"));
        files.add(folder.resolve("libtorch_cpu.so"));
        return files;
    }

    /** DJL's libtorch extracted once into the cache (temp folder, then a rename); sizes checked on every start. */
    private static Path extractDjlLibtorch(Properties djl) {
        String version = djl.getProperty("version", "unknown");
        String[] names = djl.getProperty("libraries", "").split(",");
        Path target = cacheFolder().resolve("libtorch").resolve(version + "-cpu-linux-x86_64");
        if (!complete(target, names, DJL_FOLDER)) {
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
        return built;
    }

    private static Path extractJarLibrary(Properties built) {
        String name = built.getProperty("library");
        Path target = cacheFolder().resolve("native").resolve("jar-torch" + built.getProperty("torch_version")
                + "-cxx11abi" + built.getProperty("cxx11_abi") + "-" + built.getProperty("source_sha256"));
        if (!complete(target, new String[] {name}, JAR_FOLDER)) {
            extract(target, new String[] {name}, JAR_FOLDER, JAR_PROPERTIES, "native.properties");
        }
        return target.resolve(name);
    }

    /** Whether every file is there with the size of its jar entry. */
    private static boolean complete(Path folder, String[] names, String resourceFolder) {
        for (String name : names) {
            Path file = folder.resolve(name.trim());
            try {
                long expected = NativeLibrary.class.getClassLoader().getResource(resourceFolder + name.trim())
                        .openConnection().getContentLengthLong();
                if (!Files.isRegularFile(file) || Files.size(file) != expected) {
                    return false;
                }
            } catch (IOException | NullPointerException e) {
                return false;
            }
        }
        return true;
    }

    private static void extract(Path target, String[] names, String resourceFolder, String properties, String as) {
        try {
            Files.createDirectories(target.getParent());
            Path tmp = Files.createTempDirectory(target.getParent(), target.getFileName() + ".tmp");
            try {
                for (String name : names) {
                    copyResource(resourceFolder + name.trim(), tmp.resolve(name.trim()));
                }
                copyResource(properties, tmp.resolve(as));
                if (Files.exists(target)) {
                    deleteTree(target); // incomplete or stale: another JVM may have died while extracting
                }
                try {
                    Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE);
                } catch (FileAlreadyExistsException | AtomicMoveNotSupportedException e) {
                    // another JVM won the race: its copy is complete
                }
            } finally {
                if (Files.exists(tmp)) {
                    deleteTree(tmp);
                }
            }
        } catch (IOException e) {
            throw new GradbridgeException("cannot extract libtorch into " + target + ": " + e.getMessage(), e);
        }
    }

    private static void copyResource(String resource, Path file) throws IOException {
        try (InputStream in = NativeLibrary.class.getClassLoader().getResourceAsStream(resource)) {
            if (in == null) {
                throw new IOException("the classpath lacks " + resource);
            }
            Files.copy(in, file);
        }
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
        } catch (IOException e) {
            throw new GradbridgeException("cannot read " + file + " (what the native library was built for): "
                    + e.getMessage(), e);
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
