package dev.gradbridge;

import dev.gradbridge.internal.NativeSettings;
import dev.gradbridge.internal.PlatformMessages;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * A libtorch folder, read before anything of it loads: where it is (the setting that names it, else DJL's jar
 * extracted), which version and C++ ABI it holds, which files load first and whether each is a whole
 * library. Apart from {@link NativeLibrary}, which checks the native library against what this reads.
 */
final class LibtorchFolder {

    private LibtorchFolder() {}

    private static final Pattern PY_VERSION = Pattern.compile("__version__\\s*=\\s*['\"]([^'\"]+)['\"]");
    static Path libtorchFolder() {
        String configured = NativeSettings.value(NativeLibrary.LIBTORCH_PROPERTY, NativeLibrary.LIBTORCH_ENV);
        if (configured != null) {
            Path folder = Paths.get(configured).toAbsolutePath();
            if (!Files.isRegularFile(folder.resolve("libtorch_cpu.so")) || !Files.isRegularFile(folder.resolve("libc10.so"))) {
                throw new GradbridgeException(
                        folder + " (" + NativeSettings.source(NativeLibrary.LIBTORCH_PROPERTY, NativeLibrary.LIBTORCH_ENV) + ") is not a libtorch folder: it"
                                + " lacks libc10.so or libtorch_cpu.so; name a folder that holds them, e.g. a pip"
                                + " torch's torch/lib");
            }
            return folder;
        }
        Properties djl = NativeLibrary.resourceProperties(NativeLibrary.DJL_PROPERTIES);
        if (djl == null || NativeLibrary.class.getClassLoader().getResource(NativeLibrary.DJL_FOLDER + "libtorch_cpu.so") == null) {
            throw new GradbridgeException(
                    "no libtorch for gradbridge: put ai.djl.pytorch:pytorch-native-cpu (classifier linux-x86_64) on"
                            + " the classpath, or set -D" + NativeLibrary.LIBTORCH_PROPERTY + " (or " + NativeLibrary.LIBTORCH_ENV
                            + ") to a libtorch folder, e.g. a pip torch's torch/lib");
        }
        return NativeCache.extractDjlLibtorch(djl);
    }

    /** A libtorch folder for messages: with the setting that named it, if one did. */
    static String named(Path folder) {
        String configured = NativeSettings.value(NativeLibrary.LIBTORCH_PROPERTY, NativeLibrary.LIBTORCH_ENV);
        return configured != null && folder.equals(Paths.get(configured).toAbsolutePath())
                ? folder + " (" + NativeSettings.source(NativeLibrary.LIBTORCH_PROPERTY, NativeLibrary.LIBTORCH_ENV) + ")"
                : folder.toString();
    }

    /** Where a libtorch folder came from, for messages. */
    private static String libtorchSource(Path folder) {
        String configured = NativeSettings.value(NativeLibrary.LIBTORCH_PROPERTY, NativeLibrary.LIBTORCH_ENV);
        return configured != null && folder.equals(Paths.get(configured).toAbsolutePath())
                ? NativeSettings.source(NativeLibrary.LIBTORCH_PROPERTY, NativeLibrary.LIBTORCH_ENV)
                : "extracted from the pytorch-native jar";
    }

    /**
     * Every library of a libtorch folder is an ELF shared object inside its file before any is loaded:
     * those Java loads and those the dynamic linker pulls in beside them (libtorch_cpu.so needs libgomp).
     */
    static void checkLibtorchFiles(Path folder) {
        Pattern library = Pattern.compile("lib.*\\.so(\\.\\d+)*");
        List<Path> files = new ArrayList<>();
        try (Stream<Path> entries = Files.list(folder)) {
            entries.filter(f -> library.matcher(f.getFileName().toString()).matches() && Files.isRegularFile(f))
                    .sorted()
                    .forEach(files::add);
        } catch (IOException e) {
            throw new GradbridgeException("cannot read the libtorch folder " + named(folder) + ": " + NativeLibrary.ioReason(e), e);
        }
        for (Path file : files) {
            String problem = OperatorLibraries.libraryProblem(file);
            if (problem != null) {
                throw new GradbridgeException(PlatformMessages.libtorchUnloadable(file.toString(),
                        libtorchSource(folder),
                        problem));
            }
        }
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
                return NativeLibrary.readProperties(djl).getProperty("version", "").split("-")[0];
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
                    + NativeLibrary.ioReason(e), e);
        }
        throw new GradbridgeException("cannot tell which libtorch version " + folder + " holds (it has no"
                + " pytorch.properties, ../version.py or ../build-version)");
    }

    /** What to load before the native library, in dependency order. */
    static List<Path> libtorchFiles(Path folder) {
        List<Path> files = new ArrayList<>();
        try (DirectoryStream<Path> gomp = Files.newDirectoryStream(folder, "libgomp*.so*")) {
            for (Path file : gomp) {
                files.add(file);
            }
        } catch (IOException e) {
            throw new GradbridgeException("cannot read the libtorch folder " + named(folder) + ": " + NativeLibrary.ioReason(e), e);
        }
        files.add(folder.resolve("libc10.so"));
        files.add(folder.resolve("libtorch_cpu.so"));
        return files;
    }

    /** The libtorch's version with its local suffix ({@code 2.7.1+cu126}), for messages; else {@code version}. */
    static String libtorchBuild(Path folder, String version) {
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

    /** Whether this process has {@code file} mapped already (Python's torch loaded it: in-process). */
    static boolean mappedHere(Path file) {
        try (Stream<String> maps = Files.lines(Paths.get("/proc/self/maps"), StandardCharsets.ISO_8859_1)) {
            String name = file.toRealPath().toString();
            return maps.anyMatch(line -> line.endsWith(name));
        } catch (IOException | UncheckedIOException e) {
            return false;
        }
    }
}
