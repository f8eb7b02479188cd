package dev.gradbridge.cli;

/**
 * Console logging defaults for gradbridge's own programs (the CLIs and the in-process JVM that
 * Python starts). The library jar carries no logging configuration, so an application that
 * depends on it keeps its own; only these entry points apply defaults, and only where the user
 * has set nothing.
 */
public final class ConsoleLogging {

    private static final String PREFIX = "org.slf4j.simpleLogger.";

    private ConsoleLogging() {}

    /**
     * slf4j-simple: info and above, on stderr. Call before
     * the first logger is created; a system property the user set wins.
     */
    public static void applyDefaults() {
        setIfAbsent(PREFIX + "defaultLogLevel", "info");
        setIfAbsent(PREFIX + "logFile", "System.err");
    }

    private static void setIfAbsent(String key, String value) {
        if (System.getProperty(key) == null) {
            System.setProperty(key, value);
        }
    }
}
