package dev.gradbridge.spark;

import dev.gradbridge.GradbridgeException;
import dev.gradbridge.Versions;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.NativeSettings;
import dev.gradbridge.internal.PlatformMessages;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Properties;

/**
 * Finds and loads gradbridge-spark's own native library, {@code libgradbridge_gloo} (the entry points
 * of {@link GlooNative}), once per JVM. {@link #load} loads gradbridge's core library first (and with it libtorch, which this library
 * links against), then this one: from {@value #LIBRARY_PROPERTY} (or {@value #LIBRARY_ENV}), which
 * {@code gradbridge spark} sets to the one built for its torch, else the one this jar carries (built
 * for the build's torch), extracted once into the cache folder. Either must say, in the properties
 * file beside it, that it was built for the libtorch this JVM runs, and match the SHA-256 recorded
 * there; else one line, before anything reaches the dynamic linker.
 */
final class GlooLibrary {

    static final String LIBRARY_PROPERTY = "gradbridge.gloo.library";
    static final String LIBRARY_ENV = "GRADBRIDGE_GLOO_LIBRARY";
    /** Inside this jar: the library built at build time and native.properties naming it (python: native.GLOO_JAR_FOLDER). */
    static final String JAR_FOLDER = "dev/gradbridge/spark/native/linux-x86_64/";
    private static final String DIGEST_KEY = "library_sha256";

    private static String loaded;
    private static GradbridgeException failure;

    private GlooLibrary() {}

    /** Loads the core library, then this one (once); later calls return at once or rethrow the first failure. */
    static synchronized void load() {
        if (loaded != null) {
            return;
        }
        if (failure != null) {
            throw failure;
        }
        try {
            String libtorch = Versions.libtorch();
            String configured = NativeSettings.value(LIBRARY_PROPERTY, LIBRARY_ENV);
            Path library = configured != null ? Paths.get(configured).toAbsolutePath() : extracted();
            String source = configured != null ? NativeSettings.source(LIBRARY_PROPERTY, LIBRARY_ENV) : "this jar's";
            Path propertiesFile = library.resolveSibling(library.getFileName().toString().replaceAll("\\.so$", ".properties"));
            if (!Files.isRegularFile(library)) {
                throw new GradbridgeException("gradbridge-spark's Gloo library " + library + " (" + source
                        + ") does not exist: name the .so that python -m gradbridge.native build --gloo --out DIR wrote");
            }
            Properties built = properties(propertiesFile);
            String builtFor = built.getProperty("torch_version");
            if (!libtorch.equals(builtFor)) {
                throw new GradbridgeException("gradbridge-spark's Gloo library " + library + " (" + source
                        + ") was built for libtorch " + builtFor + ", but this JVM runs libtorch " + libtorch
                        + ": build it for " + libtorch + " (python -m gradbridge.native build --gloo --out DIR)");
            }
            String recorded = built.getProperty(DIGEST_KEY, "");
            String actual = sha256(library);
            if (!actual.equals(recorded.trim())) {
                throw new GradbridgeException("gradbridge-spark's Gloo library " + library + " (" + source + "): "
                        + PlatformMessages.digestMismatch(recorded.trim(), actual));
            }
            try {
                System.load(library.toString());
            } catch (UnsatisfiedLinkError e) {
                throw new GradbridgeException("cannot load gradbridge-spark's Gloo library " + library + " (" + source
                        + ", built for libtorch " + builtFor + "): " + e.getMessage());
            }
            loaded = library.toString();
        } catch (GradbridgeException e) {
            failure = e;
            throw e;
        }
    }

    /** This jar's library and its properties, copied once into the cache folder under the library's digest. */
    private static Path extracted() {
        Properties jar;
        try (InputStream in = resource("native.properties")) {
            jar = new Properties();
            jar.load(in);
        } catch (IOException e) {
            throw new GradbridgeException("cannot read " + JAR_FOLDER + "native.properties in gradbridge-spark's jar: "
                    + e.getMessage(), e);
        }
        String name = jar.getProperty("library");
        String digest = jar.getProperty(DIGEST_KEY, "");
        if (name == null || digest.length() < 32) {
            throw new GradbridgeException(JAR_FOLDER + "native.properties in gradbridge-spark's jar names no library"
                    + " and digest: rebuild gradbridge-spark");
        }
        Path folder = NativeSettings.cacheFolder().resolve("native").resolve("spark-jar-" + digest.substring(0, 32));
        Path library = folder.resolve(name);
        Path properties = folder.resolve(name.replaceAll("\\.so$", ".properties"));
        try {
            if (Files.isRegularFile(library) && Files.isRegularFile(properties) && sha256(library).equals(digest)) {
                return library;
            }
            Files.createDirectories(folder);
            // the library first, then the properties naming its digest: each through a temporary file and a rename
            for (String[] file : new String[][] {{name, name}, {"native.properties", properties.getFileName().toString()}}) {
                Path scratch = Files.createTempFile(folder, file[1], ".part");
                try (InputStream in = resource(file[0])) {
                    Files.copy(in, scratch, StandardCopyOption.REPLACE_EXISTING);
                    Files.move(scratch, folder.resolve(file[1]), StandardCopyOption.ATOMIC_MOVE,
                            StandardCopyOption.REPLACE_EXISTING);
                } finally {
                    Files.deleteIfExists(scratch);
                }
            }
        } catch (IOException e) {
            throw new GradbridgeException(NativeSettings.cacheUnwritable(folder, e), e);
        }
        return library;
    }

    private static InputStream resource(String name) throws IOException {
        InputStream in = GlooLibrary.class.getClassLoader().getResourceAsStream(JAR_FOLDER + name);
        if (in == null) {
            throw new GradbridgeException("gradbridge-spark's jar carries no Gloo library (" + JAR_FOLDER + name
                    + "): set -D" + LIBRARY_PROPERTY + " to one (python -m gradbridge.native build --gloo --out DIR)");
        }
        return in;
    }

    private static Properties properties(Path file) {
        Properties values = new Properties();
        try (InputStream in = Files.newInputStream(file)) {
            values.load(in);
        } catch (IOException e) {
            throw new GradbridgeException("cannot read " + file + " (the properties beside gradbridge-spark's Gloo"
                    + " library, written when it was built): " + e.getMessage(), e);
        }
        return values;
    }

    private static String sha256(Path file) {
        try {
            return Digests.sha256Hex(file);
        } catch (IOException e) {
            throw new GradbridgeException("cannot read " + file + ": " + e.getMessage(), e);
        }
    }
}
