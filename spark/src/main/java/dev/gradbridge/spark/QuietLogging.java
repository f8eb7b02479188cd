package dev.gradbridge.spark;

import java.net.URISyntaxException;
import java.net.URL;
import org.apache.logging.log4j.Level;
import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.core.LoggerContext;
import org.apache.logging.log4j.core.config.Configuration;
import org.apache.logging.log4j.core.config.DefaultConfiguration;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkContext;

/**
 * Warnings and errors only, unless the user configured logging (a {@code log4j2.properties} in
 * Spark's conf folder, {@code -Dlog4j2.configurationFile}, or {@code spark.log.level}). Spark falls
 * back to its own INFO defaults ({@code org/apache/spark/log4j2-defaults.properties}) when it finds
 * no configuration. Then the driver sets the root level to WARN at once (DJL's lines as the module
 * loads) and {@code spark.log.level=WARN} (Spark resets the level as its context starts and applies
 * that setting right after its first three lines); the first training task of each executor JVM
 * replaces the defaults with {@value #RESOURCE} (a resource of this jar), which also drops the line
 * every executor logs when its worker ends it at a normal application end.
 */
final class QuietLogging {

    static final String RESOURCE = "gradbridge-spark-log4j2.properties";
    private static volatile boolean applied;

    private QuietLogging() {}

    /** On the driver, before its Spark context starts. */
    static void driver(SparkConf conf) {
        LoggerContext context = sparkContext();
        if (context != null && byDefault(context) && !conf.contains("spark.log.level")) {
            context.getConfiguration().getRootLogger().setLevel(Level.WARN);
            context.updateLoggers();
            conf.set("spark.log.level", "WARN");
        }
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
                || location.endsWith("org/apache/spark/log4j2-defaults.properties");
    }

    /** The log4j2 context Spark's own classes log through (this class may sit in a child class loader). */
    private static LoggerContext sparkContext() {
        Object context = LogManager.getContext(SparkContext.class.getClassLoader(), false);
        return context instanceof LoggerContext ? (LoggerContext) context : null;
    }
}
