package dev.gradbridge.internal;

import java.nio.file.Path;
import java.nio.file.Paths;

/**
 * How the native libraries' loaders (the core's, gradbridge-spark's Gloo one) read their settings: a
 * system property, else an environment variable; and the cache folder they extract into. One rule,
 * so that both put their copies in the same place and name a setting's source alike.
 */
public final class NativeSettings {

    /** The system property that moves the cache folder (before {@link Messages#CACHE_ENV}). */
    public static final String CACHE_PROPERTY = "gradbridge.cacheDir";

    private NativeSettings() {}

    /**
     * @param property a system property
     * @param env the environment variable read when the property is unset or empty
     * @return the setting's value, or null when neither is set
     */
    public static String value(String property, String env) {
        String value = System.getProperty(property);
        if (value == null || value.isEmpty()) {
            value = System.getenv(env);
        }
        return value == null || value.isEmpty() ? null : value;
    }

    /**
     * @param property a system property
     * @param env the environment variable read when the property is unset or empty
     * @return where the value came from, for messages: {@code -Dproperty}, else the variable's name
     */
    public static String source(String property, String env) {
        String value = System.getProperty(property);
        return value != null && !value.isEmpty() ? "-D" + property : env;
    }

    /** @return the cache folder: {@value #CACHE_PROPERTY}, {@code GRADBRIDGE_CACHE_DIR}, else ~/.cache/gradbridge */
    public static Path cacheFolder() {
        String configured = value(CACHE_PROPERTY, Messages.CACHE_ENV);
        return configured != null ? Paths.get(configured) : Paths.get(System.getProperty("user.home"), ".cache", "gradbridge");
    }
}
