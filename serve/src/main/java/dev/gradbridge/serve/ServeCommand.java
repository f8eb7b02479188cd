package dev.gradbridge.serve;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.cli.OneLineErrors;
import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.OnlineLearnerBuilder;
import io.javalin.Javalin;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.UnknownHostException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Mixin;
import picocli.CommandLine.Option;
import sun.misc.Signal;

/**
 * {@code gradbridge-serve}: an {@link OnlineLearner} behind HTTP (Javalin 7 on Jetty 12); the
 * routes are in {@link HttpApi}.
 *
 * <p>Every option is checked before anything is created (a bad value, a port in use: one {@code
 * error:} line, exit 1, no log folder left behind). SIGTERM (or SIGINT) stops accepting
 * connections, answers the requests in flight, drains the queue, writes a final checkpoint and
 * exits 0. When training stops for good (a full disk at a checkpoint, say), {@code /healthz}
 * answers 503 and the service exits 1 with one line.
 */
@Command(name = "gradbridge-serve", mixinStandardHelpOptions = true,
        description = "Serve predictions from an exported training module while it learns from feedback.")
public final class ServeCommand implements Callable<Integer> {

    @Option(names = "--model", required = true, description = "exported training module (.pt)")
    Path model;

    @Option(names = "--log", required = true, description = "log folder (write-ahead log, checkpoints); resumed when it exists")
    Path log;

    @Option(names = "--port", defaultValue = "8080", description = "TCP port; 0 picks a free one (default ${DEFAULT-VALUE})")
    int port;

    @Option(names = "--host", defaultValue = "127.0.0.1", description = "address to bind (default ${DEFAULT-VALUE})")
    String host;

    @Option(names = "--admin-port", defaultValue = "-1",
            description = "serve /healthz and /metrics on this port of --admin-host instead of --port (0: a free one)")
    int adminPort;

    @Option(names = "--admin-host", defaultValue = "127.0.0.1", description = "address of --admin-port (default ${DEFAULT-VALUE})")
    String adminHost;

    @Option(names = "--token-file", description = "file holding the bearer token for /predict and /feedback")
    Path tokenFile;

    @Option(names = "--token-env", description = "environment variable holding the bearer token")
    String tokenEnv;

    @Option(names = "--no-auth", description = "accept /predict and /feedback from anyone who reaches the port")
    boolean noAuth;

    @Option(names = "--tls-keystore", description = "serve HTTPS on --port with the key and certificate of this"
            + " keystore (PKCS12 or JKS)")
    Path tlsKeystore;

    @Option(names = "--tls-password-file", description = "file holding the keystore's password")
    Path tlsPasswordFile;

    @Option(names = "--tls-password-env", description = "environment variable holding the keystore's password")
    String tlsPasswordEnv;

    @Option(names = "--max-body-bytes", defaultValue = "1048576", description = "larger bodies get 413 (default ${DEFAULT-VALUE})")
    long maxBodyBytes;

    @Option(names = "--threads", defaultValue = "32", description = "HTTP worker threads (default ${DEFAULT-VALUE})")
    int threads;

    @Option(names = "--read-timeout-ms", defaultValue = "10000",
            description = "a connection idle this long is closed (default ${DEFAULT-VALUE})")
    long readTimeoutMillis;

    @Option(names = "--stop-timeout-ms", defaultValue = "30000",
            description = "on SIGTERM, longest wait for requests in flight (default ${DEFAULT-VALUE})")
    long stopTimeoutMillis;

    @Option(names = "--max-connections", defaultValue = "1000",
            description = "connections open at once on --port; more wait to be accepted (default ${DEFAULT-VALUE})")
    int maxConnections;

    @Option(names = "--min-body-rate", defaultValue = "1024",
            description = "a request body arriving slower than this many bytes/s is refused with 408 (default ${DEFAULT-VALUE})")
    long minBodyRate;

    @Option(names = "--kafka-bootstrap", paramLabel = "HOST:PORT[,...]",
            description = "also learn from a Kafka topic at these brokers (record value: the JSON of /feedback; key: the"
                    + " idempotency key), exactly once: positions live in the log")
    String kafkaBootstrap;

    @Option(names = "--kafka-topic", description = "the topic to learn from (every partition, in a defined order)")
    String kafkaTopic;

    @Option(names = "--kafka-group", description = "consumer group to commit offsets to, for monitoring only (default: none)")
    String kafkaGroup;

    @Option(names = "--kafka-properties", paramLabel = "FILE",
            description = "Kafka client properties (security: security.protocol, sasl.*, ssl.*); secrets go here, never on the command line")
    Path kafkaProperties;

    @Mixin
    LearnerOptions learnerOptions = new LearnerOptions(); // --max-batch ... --op-library: the learner's

    /**
     * Runs the service until SIGTERM or SIGINT; exit code 0 after a clean drain, 1 with one
     * {@code error:} line otherwise.
     *
     * @param args the options above
     */
    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
                System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"));
        // Kafka's client logs a line per retry (a deleted topic: thousands a second); the service says
        // each condition once (TopicWatch) and its errors in its own line.
        System.setProperty("org.slf4j.simpleLogger.log.org.apache.kafka",
                System.getProperty("org.slf4j.simpleLogger.log.org.apache.kafka", "off"));
        System.exit(OneLineErrors.install(new CommandLine(new ServeCommand())).execute(args));
    }

    /** Every option against its range, and what must exist, before anything is created. */
    private void checkOptions() {
        checkPort("--port", port, false);
        checkPort("--admin-port", adminPort, true);
        if (adminPort > 0 && adminPort == port) {
            throw new GradbridgeException("--admin-port " + adminPort + " is --port's: /healthz and /metrics need a port of"
                    + " their own (or leave --admin-port out to serve them on --port)");
        }
        learnerOptions.checkRanges();
        range("--max-body-bytes", maxBodyBytes, 1, MAX_BODY_BYTES);
        range("--threads", threads, 4, MAX_THREADS);
        range("--read-timeout-ms", readTimeoutMillis, 1, HOUR_MS);
        range("--stop-timeout-ms", stopTimeoutMillis, 1, HOUR_MS);
        range("--max-connections", maxConnections, 1, MAX_CONNECTIONS);
        range("--min-body-rate", minBodyRate, 0, Integer.MAX_VALUE);
        learnerOptions.checkGate();
        if (noAuth && (tokenFile != null || tokenEnv != null)) {
            throw new GradbridgeException("--no-auth and a token option contradict each other; give one");
        }
        address("--host", host);
        address("--admin-host", adminHost);
        if (Files.exists(log) && !Files.isDirectory(log)) {
            throw new GradbridgeException("--log " + log.toAbsolutePath() + " is a file, not a folder; name a folder"
                    + " (created when missing)");
        }
        learnerOptions.checkLibraries();
        if (kafkaBootstrap != null || kafkaTopic != null || kafkaGroup != null || kafkaProperties != null) {
            if (kafkaBootstrap == null || kafkaBootstrap.trim().isEmpty() || kafkaTopic == null || kafkaTopic.trim().isEmpty()) {
                throw new GradbridgeException("Kafka feedback needs both --kafka-bootstrap and --kafka-topic");
            }
            kafkaClient = KafkaFeedback.properties(kafkaProperties);
        }
    }

    private java.util.Properties kafkaClient; // read by checkOptions when Kafka is on

    static final int MAX_THREADS = 10_000;
    static final int MAX_CONNECTIONS = 1_000_000;
    /** Largest --max-body-bytes: a body is read into one array. */
    static final long MAX_BODY_BYTES = 1L << 30;
    static final long HOUR_MS = 3_600_000;

    private static void checkPort(String name, int value, boolean optional) {
        if (value > 65535 || value < (optional ? -1 : 0)) {
            throw new GradbridgeException(name + " must be in " + (optional ? "-1" : "0") + "..65535, got " + value);
        }
    }

    static void range(String name, long value, long min, long max) {
        if (value < min || value > max) {
            throw new GradbridgeException(name + " must be in " + min + ".." + max + ", got " + value);
        }
    }

    /** An address this machine can listen on: a literal IP or a name that resolves. */
    private static void address(String name, String value) {
        try {
            InetAddress.getByName(value);
        } catch (UnknownHostException | SecurityException e) {
            throw new GradbridgeException(name + " " + value + " is neither an IP address nor a host name this machine"
                    + " resolves (e.g. 127.0.0.1, 0.0.0.0 or ::1)");
        }
    }

    /** Fails when {@code host:port} cannot be bound now (a port in use), before anything is created. */
    private static void probe(String host, int port) {
        if (port <= 0) {
            return;
        }
        try (ServerSocket socket = new ServerSocket()) {
            socket.bind(new InetSocketAddress(InetAddress.getByName(host), port));
        } catch (IOException e) {
            throw new GradbridgeException("cannot listen on " + host + ":" + port + ": " + Tokens.reason(e));
        }
    }

    @Override
    public Integer call() throws Exception {
        checkOptions();
        OnlineLearnerBuilder builder = learnerOptions.builder();
        if (!Files.isRegularFile(model)) {
            throw new GradbridgeException("no training module at " + model.toAbsolutePath() + " (--model: the .pt that"
                    + " gradbridge export wrote)");
        }
        String token = noAuth ? null : Tokens.named(tokenFile, tokenEnv);
        if (!noAuth && token == null && Files.isDirectory(log)) {
            token = Tokens.existingKey(log); // an empty or bad serve.key is refused now, before anything is opened
        }
        Tls tls = Tls.open(tlsKeystore, tlsPasswordFile, tlsPasswordEnv);
        probe(host, port);
        probe(adminHost, adminPort);
        boolean logExisted = Files.exists(log);

        OnlineLearner learner = openLearner(builder, logExisted);
        Started started = start(learner, token, tls, logExisted);
        CountDownLatch stop = new CountDownLatch(1); // before the first line: whoever reads it may signal
        for (String name : new String[] {"TERM", "INT"}) {
            Signal.handle(new Signal(name), signal -> stop.countDown());
        }
        announce(learner, started, tls);
        return serve(learner, started, stop);
    }

    /** What {@link #start} started: the servers, the Kafka source, where the token comes from (null: none). */
    private static final class Started {
        Javalin app;
        Javalin admin;
        KafkaFeedback kafka;
        String tokenSource;
    }

    /** Opens the learner on the log folder; a refused start leaves no log folder it created. */
    private OnlineLearner openLearner(OnlineLearnerBuilder builder, boolean logExisted) throws IOException {
        OnlineLearner learner;
        try {
            learner = builder.open(model, log);
        } catch (IOException | RuntimeException e) {
            if (!logExisted) {
                deleteTree(log.toAbsolutePath()); // a refused start leaves no log folder behind
            }
            if (e instanceof IOException) {
                throw new GradbridgeException("cannot open the log folder " + log.toAbsolutePath() + ": "
                        + ioLine((IOException) e), e);
            }
            throw e;
        }
        return learner;
    }

    /** Starts the Kafka source and the servers; on failure stops what started and halts the learner (one line). */
    private Started start(OnlineLearner learner, String token, Tls tls, boolean logExisted) throws IOException {
        Started started = new Started();
        KafkaFeedback kafka = null;
        try {
            if (!noAuth && token == null) {
                token = Tokens.generated(learner.getLogDir());
                started.tokenSource = learner.getLogDir().resolve(Tokens.KEY_FILE).toString();
            } else if (!noAuth && tokenFile == null && tokenEnv == null) {
                started.tokenSource = learner.getLogDir().resolve(Tokens.KEY_FILE).toString();
            } else {
                started.tokenSource = noAuth ? null : (tokenFile != null ? tokenFile.toAbsolutePath().toString() : "$" + tokenEnv);
            }
            if (kafkaClient != null) {
                kafka = KafkaFeedback.start(learner, kafkaBootstrap, kafkaTopic, kafkaGroup, kafkaClient,
                        KafkaConsumers.apiTimeout(kafkaClient, java.time.Duration.ofSeconds(30)));
            }
            HttpApi api = new HttpApi(learner, token, maxBodyBytes);
            if (kafka != null) {
                api.meter(kafka);
            }
            started.app = api.server(host, port, threads, readTimeoutMillis, stopTimeoutMillis, adminPort < 0, tls, maxConnections,
                    minBodyRate).start();
            if (adminPort >= 0) {
                started.admin = api.adminServer(adminHost, adminPort, readTimeoutMillis).start();
            }
        } catch (RuntimeException | IOException e) {
            if (kafka != null) {
                kafka.close();
            }
            learner.halt(); // nothing was served: leave the log as it was
            if (e instanceof GradbridgeException && kafka == null && kafkaClient != null) {
                if (!logExisted) {
                    deleteTree(learner.getLogDir());
                }
                throw e; // the Kafka source's own line
            }
            if (!logExisted) {
                deleteTree(learner.getLogDir());
            }
            throw new GradbridgeException("cannot start the service on " + host + ":" + port + ": "
                    + (e instanceof IOException ? ioLine((IOException) e) : rootMessage(e)), e);
        }
        started.kafka = kafka;
        return started;
    }

    /** The lines that say where the service listens and what it needs. */
    private void announce(OnlineLearner learner, Started started, Tls tls) {
        if (noAuth) {
            System.err.println("gradbridge-serve: warning: --no-auth: anyone who reaches " + host + ":" + started.app.port()
                    + " can send feedback that changes the model");
        }
        System.out.println("gradbridge-serve: listening on " + (tls == null ? "http" : "https") + "://" + host + ":" + started.app.port() + " (version "
                + learner.currentVersion().getId() + ", log " + learner.getLogDir() + ")");
        if (started.admin != null) {
            System.out.println("gradbridge-serve: /healthz and /metrics on http://" + adminHost + ":" + started.admin.port());
        }
        if (started.tokenSource != null) {
            System.out.println("gradbridge-serve: /predict and /feedback need 'Authorization: Bearer TOKEN', TOKEN from "
                    + started.tokenSource);
        }
        System.out.flush();

        if (started.kafka != null) {
            System.out.println("gradbridge-serve: learning from Kafka topic '" + kafkaTopic + "' (" + started.kafka.partitions().size()
                    + " partitions) at " + kafkaBootstrap + ", positions from the log");
        }
        System.out.flush();
    }

    /** Serves until a signal or a failure, then stops in order; the exit code. */
    private int serve(OnlineLearner learner, Started started, CountDownLatch stop) throws Exception {
        Javalin app = started.app;
        Javalin admin = started.admin;
        KafkaFeedback kafka = started.kafka;
        while (!stop.await(200, TimeUnit.MILLISECONDS) && learner.getFailure() == null
                && (kafka == null || kafka.getFailure() == null)) {
            // serve
        }
        if (kafka != null) {
            kafka.close(); // the read in progress is logged whole or not at all
            if (kafka.getFailure() != null && learner.getFailure() == null) {
                app.stop();
                learner.close();
                if (admin != null) {
                    admin.stop();
                }
                System.err.println(Messages.ERROR_PREFIX + "Kafka feedback from '" + kafkaTopic + "' stopped: " + rootMessage(kafka.getFailure())
                        + " (everything read is in " + learner.getLogDir() + "; a restart reads on from there)");
                return 1;
            }
        }
        boolean failed = learner.getFailure() != null;
        if (failed) {
            stop.await(2, TimeUnit.SECONDS); // /healthz says 503 meanwhile, for whoever watches it
        }
        app.stop(); // stops accepting; requests in flight are answered (Jetty's graceful stop)
        try {
            learner.close(); // drains the queue, writes the final version and checkpoint
        } catch (IllegalStateException e) {
            failed = true;
        } catch (IOException e) {
            System.err.println(Messages.ERROR_PREFIX + "training stopped, the service cannot continue: " + e.getMessage()
                    + " (every acknowledged event is in " + learner.getLogDir() + "; a restart resumes from it)");
            return 1;
        } finally {
            if (admin != null) {
                admin.stop();
            }
        }
        if (failed) {
            System.err.println(Messages.ERROR_PREFIX + "training stopped, the service cannot continue: " + learner.getFailure().getMessage()
                    + " (every acknowledged event is in " + learner.getLogDir() + "; a restart resumes from it)");
            return 1;
        }
        System.out.println("gradbridge-serve: stopped at version " + learner.currentVersion().getId() + " after "
                + learner.stats().getUpdates() + " updates");
        System.out.flush();
        return 0;
    }

    private static void deleteTree(Path dir) {
        try (Stream<Path> files = Files.walk(dir)) {
            files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
        } catch (IOException ignored) {
            // best effort: the folder was ours and empty of anything acknowledged
        }
    }

    /** An I/O error as one line that names the file (Java's FileSystemException keeps it apart from the reason). */
    static String ioLine(IOException e) {
        if (e instanceof FileSystemException && ((FileSystemException) e).getFile() != null
                && !String.valueOf(e.getMessage()).startsWith("cannot")) {
            FileSystemException fs = (FileSystemException) e;
            return fs.getFile() + (fs.getOtherFile() != null ? " -> " + fs.getOtherFile() : "") + ": "
                    + (fs.getReason() != null ? fs.getReason() : e.getClass().getSimpleName());
        }
        return String.valueOf(e.getMessage());
    }

    static String rootMessage(Throwable e) {
        while (e.getCause() != null) {
            e = e.getCause();
        }
        return e.getMessage();
    }
}
