package dev.gradbridge;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Properties;

/**
 * The versions this jar was built with. The build writes them from the project's one version
 * file ({@code VERSION}) and its pins ({@code gradle.properties}) into {@value #RESOURCE}; Python's
 * {@code gradbridge doctor} reads the same resource from the jar.
 */
public final class Versions {

    /** Classpath resource holding {@code gradbridge} and {@code torch}. */
    public static final String RESOURCE = "dev/gradbridge/versions.properties";

    /** gradbridge's own version, as in the wheel and the POM. */
    public static final String GRADBRIDGE;
    /** The libtorch (and Python torch) version the jar's native library was built for. */
    public static final String TORCH;

    static {
        Properties properties = new Properties();
        try (InputStream in = Versions.class.getClassLoader().getResourceAsStream(RESOURCE)) {
            if (in == null) {
                throw new IllegalStateException(RESOURCE + " is missing from the gradbridge jar");
            }
            properties.load(in);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        GRADBRIDGE = properties.getProperty("gradbridge");
        TORCH = properties.getProperty("torch");
    }

    private Versions() {}

    /**
     * The libtorch this JVM runs (loads gradbridge's native library first).
     *
     * @return e.g. {@code 2.7.1}
     */
    public static String libtorch() {
        return NativeLibrary.torchVersion();
    }

    /**
     * Which native library this JVM loaded, built for which libtorch, on which libtorch folder.
     *
     * @return one line
     */
    public static String nativeLibrary() {
        return NativeLibrary.describe();
    }
}
