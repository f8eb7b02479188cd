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

    /** Classpath resource holding {@code gradbridge}, {@code djl} and {@code torch}. */
    public static final String RESOURCE = "dev/gradbridge/versions.properties";

    /** gradbridge's own version, as in the wheel and the POM. */
    public static final String GRADBRIDGE;
    /** The DJL release the library is built against. */
    public static final String DJL;
    /** The libtorch (and Python torch) version that DJL release runs. */
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
        DJL = properties.getProperty("djl");
        TORCH = properties.getProperty("torch");
    }

    private Versions() {}
}
