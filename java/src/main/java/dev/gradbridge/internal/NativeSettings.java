package dev.gradbridge.internal;

import java.io.IOException;
import java.nio.file.AccessDeniedException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.LinkOption;
import java.nio.file.Path;
import java.nio.file.Paths;

/**
 * How the native libraries' loaders (the core's, gradbridge-spark's Gloo one) read their settings: a
 * system property, else an environment variable; and the cache folder they extract into. One rule,
 * so that both put their copies in the same place and name a setting's source alike.
 */
public final class NativeSettings {

    /** The system property that moves the cache folder (before {@link PlatformMessages#CACHE_ENV}). */
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

    /**
     * The one line for a cache folder that cannot be written (python: {@code native.cache_unwritable}): the
     * folder, {@code GRADBRIDGE_CACHE_DIR}, and what is wrong: a path on the way that is a file, else the
     * system's reason (Read-only file system, No space left on device, Permission denied).
     *
     * @param folder the folder (the cache folder or one under it)
     * @param e why it could not be written
     * @return the line
     */
    public static String cacheUnwritable(Path folder, IOException e) {
        for (Path path = folder.toAbsolutePath(); path != null; path = path.getParent()) {
            if (Files.exists(path, LinkOption.NOFOLLOW_LINKS)) {
                if (!Files.isDirectory(path)) {
                    return PlatformMessages.cacheUnwritable(folder.toString(),
                            PlatformMessages.notAFolder(path.toString()));
                }
                break; // the nearest one that exists is a folder: the system's reason says the rest
            }
        }
        String reason = e instanceof AccessDeniedException ? "Permission denied"
                : e instanceof FileSystemException && ((FileSystemException) e).getReason() != null
                        ? ((FileSystemException) e).getReason()
                        : String.valueOf(e.getMessage());
        return PlatformMessages.cacheUnwritable(folder.toString(), reason);
    }

    /** @return the cache folder: {@value #CACHE_PROPERTY}, {@code GRADBRIDGE_CACHE_DIR}, else ~/.cache/gradbridge */
    public static Path cacheFolder() {
        String configured = value(CACHE_PROPERTY, PlatformMessages.CACHE_ENV);
        return configured != null ? Paths.get(configured) : Paths.get(System.getProperty("user.home"), ".cache", "gradbridge");
    }
}
