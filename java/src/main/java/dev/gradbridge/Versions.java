package dev.gradbridge;

import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The versions this jar was built with. The build writes them from the project's one version
 * file ({@code VERSION}), its pins ({@code gradle.properties}) and the supported torch range (the
 * torch line of {@code python/gradbridge/requirements.txt}) into {@value #RESOURCE}; Python's
 * {@code gradbridge doctor} reads the same resource from the jar.
 */
public final class Versions {

    /** Classpath resource holding {@code gradbridge} and {@code torch}. */
    public static final String RESOURCE = "dev/gradbridge/versions.properties";

    /** gradbridge's own version, as in the wheel and the POM. */
    public static final String GRADBRIDGE;
    /** The libtorch (and Python torch) version the jar's native library was built for. */
    public static final String TORCH;
    /** The torch releases gradbridge supports, as pip writes them: e.g. {@code torch>=2.7.1}. */
    public static final String TORCH_RANGE;

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
        TORCH_RANGE = properties.getProperty("torch_range");
    }

    private Versions() {}

    /**
     * Whether a release is inside {@link #TORCH_RANGE} (its comma-separated {@code >=}, {@code >},
     * {@code <=}, {@code <}, {@code ==}, {@code !=} clauses on dotted numbers).
     *
     * @param version e.g. {@code 2.15.0} (a local part such as {@code +cpu} is ignored)
     * @return whether it is supported
     */
    public static boolean inTorchRange(String version) {
        String clauses = TORCH_RANGE.replaceFirst("^torch", "");
        for (String clause : clauses.split(",")) {
            Matcher m = Pattern.compile("(>=|<=|==|!=|>|<)(.+)").matcher(clause.trim());
            if (!m.matches()) {
                throw new IllegalStateException("cannot read the torch range " + TORCH_RANGE + " (" + clause + ")");
            }
            int c = compareVersions(version.split("\\+")[0], m.group(2).trim());
            boolean holds;
            switch (m.group(1)) {
                case ">=": holds = c >= 0; break;
                case "<=": holds = c <= 0; break;
                case ">": holds = c > 0; break;
                case "<": holds = c < 0; break;
                case "==": holds = c == 0; break;
                default: holds = c != 0; break;
            }
            if (!holds) {
                return false;
            }
        }
        return true;
    }

    /** Dotted numeric versions compared part by part, missing parts as 0 ({@code 2.16 == 2.16.0}). */
    static int compareVersions(String a, String b) {
        String[] x = a.split("\\.");
        String[] y = b.split("\\.");
        for (int i = 0; i < Math.max(x.length, y.length); i++) {
            long p = i < x.length ? leadingNumber(x[i]) : 0;
            long q = i < y.length ? leadingNumber(y[i]) : 0;
            if (p != q) {
                return Long.compare(p, q);
            }
        }
        return 0;
    }

    private static long leadingNumber(String part) {
        Matcher m = Pattern.compile("^(\\d+)").matcher(part);
        return m.find() ? Long.parseLong(m.group(1)) : 0;
    }

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
