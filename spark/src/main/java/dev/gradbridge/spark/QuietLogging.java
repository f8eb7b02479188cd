package dev.gradbridge.spark;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.internal.ShardedMessages;
import java.net.URISyntaxException;
import java.net.URL;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.function.Supplier;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.Configuration;
import org.apache.logging.log4j.core.config.DefaultConfiguration;
import org.apache.logging.log4j.core.config.LoggerConfig;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;

/**
 * Warnings and errors only, unless the user configured logging (a {@code log4j2.properties} in
 * Spark's conf folder, {@code -Dlog4j2.configurationFile}, or {@code spark.log.level}). Spark falls
 * back to its own INFO defaults ({@code org/apache/spark/log4j2-defaults.properties}) when it finds
 * no configuration. Then the driver sets the root level to WARN at once (the library's lines as the
 * module loads) and {@code spark.log.level=WARN} (Spark resets the level as its context starts and applies
 * that setting right after its first three lines); the first training task of each executor JVM
 * replaces the defaults with {@value #RESOURCE} (a resource of this jar), which also drops the line
 * every executor logs when its worker ends it at a normal application end.
 */
final class QuietLogging {

    static final String RESOURCE = "gradbridge-spark-log4j2.properties";
    /** The loggers through which Spark reports a context that fails to start. */
    private static final List<String> START_REPORTS = Arrays.asList("org.apache.spark.SparkContext",
            "org.apache.spark.util.Utils", "org.apache.spark.SparkEnv");
    private static volatile boolean applied;

    private QuietLogging() {}

    /**
     * On the driver, before its Spark context starts (and before Spark's settings are first read:
     * Spark then logs its address warnings). Where nothing configured logging yet, {@value #RESOURCE}.
     */
    static void driver(SparkConf conf) {
        LoggerContext context = sparkContext();
        URL ours = QuietLogging.class.getClassLoader().getResource(RESOURCE);
        if (context != null && ours != null && context.getConfiguration() instanceof DefaultConfiguration) {
            try {
                context.setConfigLocation(ours.toURI());
            } catch (URISyntaxException e) {
                // Spark's defaults, at WARN below
            }
        }
        if (context != null && byDefault(context) && !conf.contains("spark.log.level")) {
            context.getConfiguration().getRootLogger().setLevel(Level.WARN);
            context.updateLoggers();
            conf.set("spark.log.level", "WARN");
        }
    }

    /**
     * Starts Spark on the driver. A failure is one line ({@link ShardedMessages#sparkStart}: Spark's reason),
     * and, unless the user configured logging, Spark's own report of it (an ERROR line and its stack
     * trace, the start-up retries' warnings) is not printed.
     */
    static <T> T start(Supplier<T> start) {
        LoggerContext context = sparkContext();
        Configuration configuration = context == null || !byDefault(context) ? null : context.getConfiguration();
        List<String> silenced = new ArrayList<>();
        if (configuration != null) {
            for (String name : START_REPORTS) {
                if (!configuration.getLoggers().containsKey(name)) {
                    configuration.addLogger(name, new LoggerConfig(name, Level.OFF, false));
                    silenced.add(name);
                }
            }
            context.updateLoggers();
        }
        try {
            return start.get();
        } catch (RuntimeException e) {
            throw new InvalidInputException(ShardedMessages.sparkStart(reason(e)));
        } finally {
            if (!silenced.isEmpty() && context.getConfiguration() == configuration) {
                silenced.forEach(configuration::removeLogger);
                context.updateLoggers();
            }
        }
    }

    /** The first line of the innermost message of {@code e}'s causes. */
    private static String reason(Throwable e) {
        String reason = e.toString();
        for (Throwable t = e; t != null && t.getCause() != t; t = t.getCause()) {
            if (t.getMessage() != null && !t.getMessage().isBlank()) {
                reason = t.getMessage();
            }
        }
        return reason.strip().split("\\R", 2)[0];
    }

    /** On an executor: {@value #RESOURCE} in place of the defaults, once per JVM. */
    static void executor() {
        if (applied) {
            return;
        }
        synchronized (QuietLogging.class) {
            if (applied) {
                return;
            }
            applied = true;
            LoggerContext context = sparkContext();
            URL ours = QuietLogging.class.getClassLoader().getResource(RESOURCE);
            if (context != null && byDefault(context) && ours != null) {
                try {
                    context.setConfigLocation(ours.toURI());
                } catch (URISyntaxException e) {
                    // keep Spark's configuration
                }
            }
        }
    }

    private static boolean byDefault(LoggerContext context) {
        Configuration configuration = context.getConfiguration();
        String location = configuration.getConfigurationSource() == null
                ? null : configuration.getConfigurationSource().getLocation();
        return configuration instanceof DefaultConfiguration || location == null
                || location.endsWith("org/apache/spark/log4j2-defaults.properties") || location.endsWith(RESOURCE);
    }

    /** The log4j2 context Spark's own classes log through (this class may sit in a child class loader). */
    private static LoggerContext sparkContext() {
        Object context = LogManager.getContext(SparkContext.class.getClassLoader(), false);
        return context instanceof LoggerContext ? (LoggerContext) context : null;
    }
}
