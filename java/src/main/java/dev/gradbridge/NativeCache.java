package dev.gradbridge;

import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.NativeSettings;
import dev.gradbridge.internal.PlatformMessages;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.AtomicMoveNotSupportedException;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Comparator;
import java.util.Properties;
import java.util.stream.Stream;

/**
 * The copies the native loader extracts into the cache folder ({@code NativeSettings.cacheFolder()}): DJL's
 * libtorch and this jar's native library, each file's SHA-256 recorded as it is written and checked at every
 * start, a damaged copy extracted again. Apart from {@link NativeLibrary}, which decides what to load; this
 * class only makes sure that what it loads from the cache is what the jar carried.
 */
final class NativeCache {

    private NativeCache() {}

    /**
     * DJL's libtorch extracted once into the cache (temp folder, then a rename), each file's SHA-256
     * recorded as it is written. Every start checks each file against its record: in full when the
     * file's size, times or inode changed since it was last checked (libtorch_cpu.so is ~450 MB; any
     * write to a file changes its ctime), else by that stat alone. A damaged copy is extracted again.
     */
    static Path extractDjlLibtorch(Properties djl) {
        String version = djl.getProperty("version", "unknown");
        String[] names = djl.getProperty("libraries", "").split(",");
        Path target = NativeSettings.cacheFolder().resolve("libtorch").resolve(version + "-cpu-linux-x86_64");
        String problem = cacheProblem(target, names, false);
        if (problem != null) {
            if (!problem.isEmpty()) {
                System.err.println(PlatformMessages.cacheDamaged("libtorch", target.toString(), problem,
                        "extracting it again"));
            }
            extract(target, names, NativeLibrary.DJL_FOLDER, NativeLibrary.DJL_PROPERTIES, "pytorch.properties");
        }
        return target;
    }

    static Properties jarProperties() {
        Properties built = NativeLibrary.resourceProperties(NativeLibrary.JAR_PROPERTIES);
        if (built == null) {
            throw new GradbridgeException("this gradbridge jar carries no native library (" + NativeLibrary.JAR_PROPERTIES
                    + "): set -D" + NativeLibrary.LIBRARY_PROPERTY + " to one built with python -m gradbridge.native build");
        }
        NativeLibrary.checkBuiltFor(built, Paths.get(NativeLibrary.JAR_PROPERTIES), Paths.get(built.getProperty("library", "?")));
        return built;
    }

    /**
     * This jar's native library, extracted once into the cache; checked in full (it is small) at every
     * start. The folder is named by the library's own SHA-256 (older jars: by their sources'): two builds
     * of the same sources differ in their bytes, and each keeps its own copy.
     */
    static Path extractJarLibrary(Properties built) {
        String name = built.getProperty("library");
        String identity = built.getProperty(NativeLibrary.LIBRARY_DIGEST_KEY, built.getProperty("source_sha256", "unversioned"));
        Path target = NativeSettings.cacheFolder().resolve("native").resolve("jar-torch" + built.getProperty("torch_version")
                + "-cxx11abi" + built.getProperty("cxx11_abi") + "-"
                + identity.substring(0, Math.min(32, identity.length())));
        String problem = cacheProblem(target, new String[] {name}, true);
        if (problem != null) {
            if (!problem.isEmpty()) {
                System.err.println(PlatformMessages.cacheDamaged("gradbridge's native library", target.toString(),
                        problem,
                        "extracting it again"));
            }
            extract(target, new String[] {name}, NativeLibrary.JAR_FOLDER, NativeLibrary.JAR_PROPERTIES, "native.properties");
        }
        Path library = target.resolve(name);
        String recorded = built.getProperty(NativeLibrary.LIBRARY_DIGEST_KEY);
        String elf = NativeLibrary.libraryProblem(library, recorded); // the jar's own record, when it carries one
        if (elf != null) {
            throw new GradbridgeException(PlatformMessages.nativeLibraryUnloadable(library.toString(), "this jar's",
                    elf));
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
                    return name + ": " + PlatformMessages.digestMismatch(recorded, actual);
                }
            } catch (IOException e) {
                return name + ": cannot read it: " + NativeLibrary.ioReason(e);
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
}
