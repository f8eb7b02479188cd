package dev.gradbridge.spark;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.ShardedMessages;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.UnknownHostException;
import java.util.Arrays;
import java.util.Locale;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.SparkConf;

/**
 * The settings of a run that are checked before the Spark context starts, each refused with one
 * line: the master URL (as {@code SparkContext} parses it), the address the driver listens on, the
 * exchange's settings and the threads per task. A local master binds the driver to the loopback address unless the user
 * chose one, so that no socket of a local run listens on an external address.
 */
final class SparkSettings {

    /**
     * The Spark setting: each training task's libtorch intra-op threads. Unset, a task takes the cores Spark
     * gives each task ({@code spark.task.cpus}, 1 by default), as Spark sets a Python worker's
     * {@code OMP_NUM_THREADS}: K tasks on one executor then never run more threads than its cores.
     */
    static final String THREADS_SETTING = "spark.gradbridge.threads";

    /** The loopback address a local run's driver (and its tasks' Gloo sockets) listens on. */
    static final String LOOPBACK = "127.0.0.1";

    // SparkContext's own patterns (SparkMasterRegex)
    private static final Pattern LOCAL_N = Pattern.compile("local\\[([0-9]+|\\*)\\]");
    private static final Pattern LOCAL_N_FAILURES = Pattern.compile("local\\[([0-9]+|\\*)\\s*,\\s*([0-9]+)\\]");
    private static final Pattern LOCAL_CLUSTER =
            Pattern.compile("local-cluster\\[\\s*([0-9]+)\\s*,\\s*([0-9]+)\\s*,\\s*([0-9]+)\\s*]");

    private SparkSettings() {}

    /**
     * Checks {@code conf}'s master and exchange settings and the driver's address, and binds a
     * local run's driver to the loopback address when no address was chosen.
     *
     * @param source where the master came from, for the error line
     */
    static void check(SparkConf conf, String source) {
        checkLine();
        String master = conf.get("spark.master");
        checkMaster(source, master);
        exchange(conf);
        oneRoundBytes(conf);
        threads(conf);
        if (isLocal(master) && !conf.contains("spark.driver.host") && !conf.contains("spark.driver.bindAddress")
                && System.getenv("SPARK_LOCAL_IP") == null) {
            conf.set("spark.driver.host", LOOPBACK);
        }
        checkDriverAddress(conf);
    }

    /**
     * Refuses a Spark of another line than this artifact's ({@link SparkLine}): a jar of the other Scala
     * version would fail at its first Scala call, in a task, with a stack trace.
     */
    static void checkLine() {
        String spark = org.apache.spark.package$.MODULE$.SPARK_VERSION();
        String scalaVersion = scala.util.Properties$.MODULE$.versionNumberString();
        if (!SparkLine.runsOn(spark) || !scalaVersion.startsWith(SparkLine.SCALA + ".")) {
            throw new InvalidInputException(ShardedMessages.sparkLine(SparkLine.SCALA, SparkLine.SPARK, spark,
                    scalaVersion));
        }
    }

    /** @return whether {@code master} runs in this JVM (local, local[K], local[K,F]) */
    static boolean isLocal(String master) {
        return "local".equals(master) || LOCAL_N.matcher(master).matches() || LOCAL_N_FAILURES.matcher(master).matches();
    }

    /** Refuses a master URL that SparkContext would refuse after starting half its services. */
    static void checkMaster(String source, String master) {
        if ("local".equals(master) || master.startsWith("spark://") || LOCAL_CLUSTER.matcher(master).matches()) {
            return;
        }
        Matcher n = LOCAL_N.matcher(master);
        Matcher failures = LOCAL_N_FAILURES.matcher(master);
        if (n.matches() || failures.matches()) {
            Matcher m = n.matches() ? n : failures;
            boolean ok = positive(m.group(1)) && (m == n || m.group(2).length() <= 9); // F: any int
            if (!ok) {
                throw new InvalidInputException(ShardedMessages.sparkMaster(source, master));
            }
            return;
        }
        if (master.startsWith("local")) {
            throw new InvalidInputException(ShardedMessages.sparkMaster(source, master));
        }
        if (SparkInternals.clusterManagerAccepts(master)) {
            return;
        }
        throw new InvalidInputException(ShardedMessages.sparkMaster(source, master));
    }

    private static boolean positive(String count) {
        if ("*".equals(count)) {
            return true;
        }
        try {
            return Integer.parseInt(count) >= 1;
        } catch (NumberFormatException e) {
            return false; // more threads than an int holds
        }
    }

    /**
     * Refuses a driver address that is not this machine's (Spark would try 16 ports on it, a warning
     * each, then fail with its stack trace): the driver binds {@code spark.driver.bindAddress}, else
     * {@code spark.driver.host}.
     */
    static void checkDriverAddress(SparkConf conf) {
        String key = conf.contains("spark.driver.bindAddress") ? "spark.driver.bindAddress"
                : conf.contains("spark.driver.host") ? "spark.driver.host" : null;
        if (key == null) {
            return;
        }
        String host = conf.get(key).trim();
        InetAddress address;
        try {
            address = InetAddress.getByName(host);
        } catch (UnknownHostException e) {
            throw new InvalidInputException(ShardedMessages.sparkDriverAddress(key, host, "no such host"));
        } catch (SecurityException e) {
            throw new InvalidInputException(ShardedMessages.sparkDriverAddress(key, host, e.getMessage()));
        }
        try (ServerSocket probe = new ServerSocket(0, 1, address)) {
            // an address of this machine
        } catch (IOException e) {
            String reason = e.getMessage() == null ? e.getClass().getSimpleName() : e.getMessage();
            throw new InvalidInputException(ShardedMessages.sparkDriverAddress(key, host,
                    reason.toLowerCase(Locale.ROOT).contains("assign") ? "not an address of this machine" : reason));
        }
    }

    /** @return the exchange the Spark setting {@value GradientExchange#SETTING} names (default gloo) */
    static String exchange(SparkConf conf) {
        String exchange = conf.get(GradientExchange.SETTING, GradientExchange.GLOO);
        if (!GradientExchange.GLOO.equals(exchange) && !GradientExchange.RELAY.equals(exchange)) {
            throw new InvalidInputException(ShardedMessages.sparkExchange(GradientExchange.SETTING,
                    Arrays.asList(GradientExchange.GLOO, GradientExchange.RELAY), exchange));
        }
        return exchange;
    }

    /** @return the Spark setting {@value GradientExchange#ONE_ROUND_SETTING} (bytes, 0 to its maximum) */
    static long oneRoundBytes(SparkConf conf) {
        String value = conf.get(GradientExchange.ONE_ROUND_SETTING, Long.toString(GradientExchange.ONE_ROUND_BYTES));
        try {
            long bytes = Long.parseLong(value.trim());
            if (bytes >= 0 && bytes <= GradientExchange.ONE_ROUND_MAX_BYTES) {
                return bytes;
            }
        } catch (NumberFormatException e) {
            // the line below says what was expected
        }
        throw new InvalidInputException(ShardedMessages.sparkOneRoundBytes(GradientExchange.ONE_ROUND_SETTING,
                GradientExchange.ONE_ROUND_MAX_BYTES, value));
    }

    /**
     * @return the Spark setting {@value #THREADS_SETTING}: each training task's libtorch intra-op threads,
     *     or 0 when unset (then each task takes its task's cores, {@code TaskContext.cpus()})
     */
    static int threads(SparkConf conf) {
        if (!conf.contains(THREADS_SETTING)) {
            return 0;
        }
        String value = conf.get(THREADS_SETTING);
        try {
            int threads = Integer.parseInt(value.trim());
            if (threads >= 1 && threads <= ModuleAccess.MAX_THREADS) {
                return threads;
            }
        } catch (NumberFormatException e) {
            // the line below says what was expected
        }
        throw new InvalidInputException(ShardedMessages.sparkThreads(THREADS_SETTING, ModuleAccess.MAX_THREADS, value));
    }
}
