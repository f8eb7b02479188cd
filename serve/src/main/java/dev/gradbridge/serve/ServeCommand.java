package dev.gradbridge.serve;

import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.online.FsyncPolicy;
import dev.gradbridge.online.HostTensor;
import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.Prediction;
import dev.gradbridge.online.QueueFullException;
import io.javalin.Javalin;
import io.javalin.http.Context;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.Timer;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.concurrent.Callable;
import java.util.concurrent.CountDownLatch;
import picocli.CommandLine;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import sun.misc.Signal;

/**
 * {@code gradbridge-serve}: an {@link OnlineLearner} behind HTTP (Javalin on Jetty).
 *
 * <ul>
 *   <li>{@code POST /predict} {@code {"x": [[...], ...]}} → {@code {"version": v, "y": [...]}}
 *   <li>{@code POST /feedback} {@code {"x": [[...]], "y": [...]}} (one event per row) → {@code
 *       {"accepted": n, "first_seq": s}} once logged; 429 when the queue is full
 *   <li>{@code GET /healthz}, {@code GET /metrics} (Prometheus text, Micrometer)
 * </ul>
 *
 * Bad JSON, shapes or dtypes answer 400 and an oversized body 413, each with one {@code error:}
 * line; nothing is applied. SIGTERM (or SIGINT) stops the listener, drains the queue, writes a
 * final checkpoint and exits 0.
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

    @Option(names = "--max-batch", defaultValue = "32", description = "largest micro-batch B (default ${DEFAULT-VALUE})")
    int maxBatch;

    @Option(names = "--max-wait-ms", defaultValue = "10", description = "micro-batch wait T in ms (default ${DEFAULT-VALUE})")
    long maxWaitMillis;

    @Option(names = "--publish-every", defaultValue = "1", description = "a version every N updates (default ${DEFAULT-VALUE})")
    int publishEvery;

    @Option(names = "--checkpoint-every", defaultValue = "100", description = "a checkpoint every K versions (default ${DEFAULT-VALUE})")
    int checkpointEvery;

    @Option(names = "--queue-capacity", defaultValue = "10000", description = "events waiting before 429 (default ${DEFAULT-VALUE})")
    int queueCapacity;

    @Option(names = "--predictors", defaultValue = "4", description = "concurrent predictions (default ${DEFAULT-VALUE})")
    int predictors;

    @Option(names = "--fsync", defaultValue = "always", description = "always or never (default ${DEFAULT-VALUE})")
    String fsync;

    @Option(names = "--max-body-bytes", defaultValue = "1048576", description = "larger bodies get 413 (default ${DEFAULT-VALUE})")
    long maxBodyBytes;

    private static final Gson GSON = new Gson();

    /**
     * Runs the service until SIGTERM or SIGINT; exit code 0 after a clean drain, 1 with one
     * {@code gradbridge-serve: error:} line otherwise.
     *
     * @param args the options above
     */
    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
                System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"));
        CommandLine cli = new CommandLine(new ServeCommand());
        cli.setExecutionExceptionHandler((e, line, parsed) -> {
            // One line for any failure (the JDK banner and stack traces stay out of the user's way).
            System.err.println("gradbridge-serve: error: " + String.valueOf(e.getMessage()).replace('\n', ' '));
            return 1;
        });
        System.exit(cli.execute(args));
    }

    @Override
    public Integer call() throws Exception {
        if (!Files.isRegularFile(model)) {
            throw new GradbridgeException("no training module at " + model.toAbsolutePath());
        }
        OnlineLearner learner = OnlineLearner.builder().optMaxBatch(maxBatch).optMaxWaitMillis(maxWaitMillis)
                .optPublishEvery(publishEvery).optCheckpointEvery(checkpointEvery).optQueueCapacity(queueCapacity)
                .optPredictors(predictors).optFsync(FsyncPolicy.parse(fsync)).open(model, log);
        PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
        Metrics metrics = new Metrics(registry, learner);
        Javalin app = Javalin.create(config -> {
            config.showJavalinBanner = false;
            config.http.maxRequestSize = maxBodyBytes;
        });
        app.before(ctx -> {
            long length = ctx.contentLength();
            if (length > maxBodyBytes) {
                fail(ctx, 413, "body of " + length + " bytes exceeds the limit of " + maxBodyBytes + " bytes");
                ctx.skipRemainingHandlers();
            }
        });
        app.post("/predict", ctx -> predict(ctx, learner, metrics));
        app.post("/feedback", ctx -> feedback(ctx, learner, metrics));
        app.get("/healthz", ctx -> {
            JsonObject health = new JsonObject();
            health.addProperty("status", "ok");
            health.addProperty("version", learner.currentVersion().getId());
            health.addProperty("updates", learner.updates());
            health.addProperty("queue_depth", learner.queueDepth());
            ctx.contentType("application/json").result(GSON.toJson(health));
        });
        app.get("/metrics", ctx -> ctx.contentType("text/plain; version=0.0.4; charset=utf-8").result(registry.scrape()));
        app.exception(io.javalin.http.HttpResponseException.class, (e, ctx) -> fail(ctx, e.getStatus(), e.getMessage()));
        app.exception(Exception.class, (e, ctx) -> fail(ctx, 500, e.toString()));

        CountDownLatch stop = new CountDownLatch(1);
        Signal.handle(new Signal("TERM"), signal -> stop.countDown());
        Signal.handle(new Signal("INT"), signal -> stop.countDown());
        try {
            app.start(host, port);
        } catch (RuntimeException e) {
            learner.close();
            throw new GradbridgeException("cannot listen on " + host + ":" + port + ": " + rootMessage(e), e);
        }
        System.out.println("gradbridge-serve: listening on http://" + host + ":" + app.port() + " (version "
                + learner.currentVersion().getId() + ", log " + learner.getLogDir() + ")");
        System.out.flush();
        stop.await();
        app.stop(); // no new requests; those in flight finish first
        learner.close(); // drains the queue, writes the final version and checkpoint
        System.out.println("gradbridge-serve: stopped at version " + learner.currentVersion().getId() + " after "
                + learner.updates() + " updates");
        System.out.flush();
        return 0;
    }

    private static String rootMessage(Throwable e) {
        while (e.getCause() != null) {
            e = e.getCause();
        }
        return e.getMessage();
    }

    private static JsonObject body(Context ctx) {
        String text = new String(ctx.bodyAsBytes(), StandardCharsets.UTF_8);
        try {
            JsonElement json = JsonParser.parseString(text);
            if (!json.isJsonObject()) {
                throw new InvalidInputException("body must be a JSON object, got " + abbreviate(text));
            }
            return json.getAsJsonObject();
        } catch (JsonParseException e) {
            throw new InvalidInputException("body is not valid JSON: " + rootMessage(e));
        }
    }

    private static String abbreviate(String text) {
        String line = text.replace('\n', ' ');
        return line.length() > 60 ? line.substring(0, 60) + "..." : line;
    }

    private static void predict(Context ctx, OnlineLearner learner, Metrics metrics) {
        Timer.Sample sample = Timer.start(metrics.registry);
        try {
            HostTensor x = JsonTensors.parse("x", body(ctx).get("x"), learner.getMetadata().getInput("x").getDtype());
            Prediction prediction = learner.predict(x);
            JsonObject out = new JsonObject();
            out.addProperty("version", prediction.getVersion());
            out.add("y", JsonTensors.write(prediction.getOutput()));
            ctx.contentType("application/json").result(GSON.toJson(out));
        } catch (InvalidInputException e) {
            fail(ctx, 400, e.getMessage());
        } finally {
            sample.stop(metrics.predictLatency);
        }
    }

    private static void feedback(Context ctx, OnlineLearner learner, Metrics metrics) {
        Timer.Sample sample = Timer.start(metrics.registry);
        try {
            JsonObject body = body(ctx);
            HostTensor x = JsonTensors.parse("x", body.get("x"), learner.getMetadata().getInput("x").getDtype());
            HostTensor y = JsonTensors.parse("y", body.get("y"), learner.getMetadata().getInput("y").getDtype());
            long first = learner.learn(x, y);
            JsonObject out = new JsonObject();
            out.addProperty("accepted", x.rows());
            out.addProperty("first_seq", first);
            ctx.contentType("application/json").result(GSON.toJson(out));
        } catch (InvalidInputException e) {
            fail(ctx, 400, e.getMessage());
        } catch (QueueFullException e) {
            fail(ctx, 429, e.getMessage());
        } catch (IllegalStateException e) {
            fail(ctx, 503, e.getMessage());
        } finally {
            sample.stop(metrics.learnLatency);
        }
    }

    private static void fail(Context ctx, int status, String message) {
        ctx.status(status).contentType("text/plain; charset=utf-8")
                .result("error: " + String.valueOf(message).replace('\n', ' ') + "\n");
    }

    /** The service's meters (Prometheus names: gradbridge_*). */
    private static final class Metrics {
        final PrometheusMeterRegistry registry;
        final Timer predictLatency;
        final Timer learnLatency;
        private long lastUpdates;
        private long lastNanos = System.nanoTime();

        Metrics(PrometheusMeterRegistry registry, OnlineLearner learner) {
            this.registry = registry;
            Gauge.builder("gradbridge_model_version", learner, l -> l.currentVersion().getId())
                    .description("id of the published version predictions use").register(registry);
            Gauge.builder("gradbridge_queue_depth", learner, OnlineLearner::queueDepth)
                    .description("feedback events waiting for training").register(registry);
            FunctionCounter.builder("gradbridge_updates", learner, OnlineLearner::updates)
                    .description("micro-batches applied (optimizer steps)").register(registry);
            Gauge.builder("gradbridge_updates_per_second", learner, this::updatesPerSecond)
                    .description("micro-batches applied per second since the previous scrape").register(registry);
            FunctionCounter.builder("gradbridge_feedback_accepted", learner, OnlineLearner::acceptedEvents)
                    .description("feedback events logged and queued").register(registry);
            FunctionCounter.builder("gradbridge_feedback_refused", learner, OnlineLearner::refusedEvents)
                    .description("feedback events refused because the queue was full").register(registry);
            FunctionCounter.builder("gradbridge_predictions", learner, OnlineLearner::predictions)
                    .description("predictions served").register(registry);
            predictLatency = Timer.builder("gradbridge_predict_latency").description("POST /predict handling time")
                    .publishPercentileHistogram().register(registry);
            learnLatency = Timer.builder("gradbridge_learn_latency").description("POST /feedback handling time")
                    .publishPercentileHistogram().register(registry);
        }

        private synchronized double updatesPerSecond(OnlineLearner learner) {
            long now = System.nanoTime();
            long updates = learner.updates();
            double rate = (updates - lastUpdates) / Math.max(1e-9, (now - lastNanos) / 1e9);
            lastUpdates = updates;
            lastNanos = now;
            return rate;
        }
    }
}
