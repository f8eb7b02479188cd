package dev.gradbridge.serve;

import dev.gradbridge.internal.Messages;
import com.google.gson.Gson;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.online.HostTensor;
import dev.gradbridge.online.KeyConflictException;
import dev.gradbridge.online.LearnerStats;
import dev.gradbridge.online.ModelVersion;
import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.Prediction;
import dev.gradbridge.online.QueueFullException;
import io.javalin.Javalin;
import io.javalin.config.JavalinConfig;
import io.javalin.http.Context;
import io.javalin.http.Handler;
import io.javalin.http.HttpResponseException;
import io.micrometer.core.instrument.FunctionCounter;
import io.micrometer.core.instrument.Gauge;
import io.micrometer.core.instrument.Timer;
import io.micrometer.prometheusmetrics.PrometheusConfig;
import io.micrometer.prometheusmetrics.PrometheusMeterRegistry;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.concurrent.TimeUnit;
import org.eclipse.jetty.http.HttpVersion;
import org.eclipse.jetty.server.HttpConfiguration;
import org.eclipse.jetty.server.HttpConnectionFactory;
import org.eclipse.jetty.server.SecureRequestCustomizer;
import org.eclipse.jetty.server.ServerConnector;
import org.eclipse.jetty.server.SslConnectionFactory;
import org.eclipse.jetty.server.NetworkConnectionLimit;
import org.eclipse.jetty.server.handler.EagerContentHandler;
import org.eclipse.jetty.server.handler.GracefulHandler;
import org.eclipse.jetty.server.handler.MinimumDataRateHandler;
import org.eclipse.jetty.util.thread.QueuedThreadPool;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The service's routes over one {@link OnlineLearner}.
 *
 * <ul>
 *   <li>{@code POST /predict} {@code {"x": [[...], ...]}} (a module of several inputs: {@code {"x":
 *       {"input_ids": [[...]], "attention_mask": [[...]]}}}, as for {@code /feedback} and Kafka
 *       records) → {@code {"version": v, "y": [...]}}
 *       (outputs that are not finite are written as {@code null}: the answer is always JSON)
 *   <li>{@code POST /feedback} {@code {"x": [[...]], "y": [...]}} (one event per row), optional
 *       header {@code Idempotency-Key} → {@code {"accepted": n, "first_seq": s, "duplicate": b}}
 *       once logged; 429 when the queue is full; 503 when the log cannot be written (nothing of
 *       the request was logged)
 *   <li>{@code GET /healthz} (503 once training has stopped), {@code GET /metrics} (Prometheus)
 *   <li>{@code POST /admin/rollback} {@code {"version": v}} (or no body: the version before the
 *       serving one) → {@code {"version": v, "kept": [...]}}, with a publish gate only (409
 *       without); 404 for a version not kept. Beside {@code /healthz}, with the token.
 * </ul>
 *
 * {@code /predict} and {@code /feedback} need {@code Authorization: Bearer TOKEN} unless the
 * service runs with {@code --no-auth}. Every client error is a 4xx with one {@code error:} line;
 * a body over the limit is refused while it is read (chunked or not).
 */
final class HttpApi {

    private static final Logger logger = LoggerFactory.getLogger(HttpApi.class);
    private static final Gson GSON = new Gson();

    private final OnlineLearner learner;
    private final String token;
    private final long maxBodyBytes;
    private final PrometheusMeterRegistry registry = new PrometheusMeterRegistry(PrometheusConfig.DEFAULT);
    private final Timer predictLatency;
    private final Timer learnLatency;

    HttpApi(OnlineLearner learner, String token, long maxBodyBytes) {
        this.learner = learner;
        this.token = token;
        this.maxBodyBytes = maxBodyBytes;
        Gauge.builder("gradbridge_model_version", learner, l -> l.currentVersion().getId())
                .description("id of the published version predictions use").register(registry);
        Gauge.builder("gradbridge_queue_depth", learner, l -> l.stats().getQueueDepth())
                .description("feedback events waiting for training").register(registry);
        Gauge.builder("gradbridge_training_up", learner, l -> l.getFailure() == null ? 1 : 0)
                .description("1 while the training thread runs, 0 once it has stopped").register(registry);
        FunctionCounter.builder("gradbridge_updates", learner, l -> l.stats().getUpdates())
                .description("micro-batches applied (optimizer steps)").register(registry);
        FunctionCounter.builder("gradbridge_quarantined_batches", learner, l -> l.stats().getQuarantinedBatches())
                .description("micro-batches not applied (loss or gradients not finite, or over --max-grad-norm)")
                .register(registry);
        FunctionCounter.builder("gradbridge_feedback_accepted", learner, l -> l.stats().getAcceptedEvents())
                .description("feedback events logged and queued").register(registry);
        FunctionCounter.builder("gradbridge_feedback_refused", learner, l -> l.stats().getRefusedEvents())
                .description("feedback events refused because the queue was full").register(registry);
        FunctionCounter.builder("gradbridge_feedback_duplicates", learner, l -> l.stats().getDuplicateEvents())
                .description("feedback events answered from an earlier request with the same Idempotency-Key")
                .register(registry);
        FunctionCounter.builder("gradbridge_predictions", learner, l -> l.stats().getPredictions())
                .description("predictions served").register(registry);
        FunctionCounter.builder("gradbridge_published_versions", learner, l -> l.stats().getPublishedVersions())
                .description("versions published to predictors (passed the publish gate, or every version without one)")
                .register(registry);
        FunctionCounter.builder("gradbridge_held_versions", learner, l -> l.stats().getHeldVersions())
                .description("versions the publish gate held back (their gate loss rose more than --gate-max-regression)")
                .register(registry);
        FunctionCounter.builder("gradbridge_rollbacks", learner, l -> l.stats().getRollbacks())
                .description("POST /admin/rollback applied").register(registry);
        Gauge.builder("gradbridge_gate_loss", learner, l -> l.stats().getLastGateLoss())
                .description("gate-data loss of the last version the publish gate decided on (NaN: none yet)")
                .register(registry);
        Gauge.builder("gradbridge_gate_serving_loss", learner, l -> l.stats().getServingGateLoss())
                .description("gate-data loss of the serving version (NaN without a publish gate)").register(registry);
        predictLatency = Timer.builder("gradbridge_predict_latency").description("POST /predict handling time")
                .publishPercentileHistogram().register(registry);
        learnLatency = Timer.builder("gradbridge_learn_latency").description("POST /feedback handling time")
                .publishPercentileHistogram().register(registry);
    }

    /** Meters of the Kafka feedback source: lag per partition, records read and refused. */
    void meter(KafkaFeedback kafka) {
        for (org.apache.kafka.common.TopicPartition tp : kafka.partitions()) {
            Gauge.builder("gradbridge_kafka_lag", kafka, k -> k.lag(tp.partition()))
                    .description("records in the partition not yet read (consumer lag)")
                    .tag("topic", tp.topic()).tag("partition", Integer.toString(tp.partition())).register(registry);
        }
        FunctionCounter.builder("gradbridge_kafka_records", kafka, KafkaFeedback::records)
                .description("Kafka records read and logged (learned, duplicates and refused)").register(registry);
        FunctionCounter.builder("gradbridge_kafka_outages", kafka, KafkaFeedback::outages)
                .description("times the Kafka source began waiting: no broker answering, the topic gone").register(registry);
        Gauge.builder("gradbridge_kafka_waiting", kafka, KafkaFeedback::waiting)
                .description("1 while the Kafka source waits for a broker or for its topic").register(registry);
        FunctionCounter.builder("gradbridge_kafka_records_refused", kafka, KafkaFeedback::refused)
                .description("Kafka records refused: not feedback this module takes (logged as refused)").register(registry);
    }

    /**
     * The main server: /predict and /feedback, plus /healthz and /metrics when {@code withAdmin};
     * HTTPS when {@code tls} is not null.
     */
    Javalin server(String host, int port, int threads, long readTimeoutMillis, long stopTimeoutMillis, boolean withAdmin,
            Tls tls, int maxConnections, long minBodyRate) {
        return Javalin.create(config -> {
            common(config, host, port, threads, readTimeoutMillis, tls);
            config.jetty.modifyServer(server -> {
                server.setStopTimeout(stopTimeoutMillis);
                // Bodies are read without a thread (a slow client holds a connection, never a handler)
                // up to the limit (413 beyond it), at no less than minBodyRate bytes/s (408 below it).
                server.insertHandler(new EagerContentHandler(
                        new EagerContentHandler.RetainedContentLoaderFactory(maxBodyBytes, -1, true)));
                server.insertHandler(new MinimumDataRateHandler(minBodyRate, 0));
                server.insertHandler(new GracefulHandler()); // stop waits for the requests in flight
                // At most maxConnections open at once: past it Jetty stops accepting (the kernel's
                // backlog holds new ones) and closes connections idle for a second.
                NetworkConnectionLimit limit = new NetworkConnectionLimit(maxConnections, server);
                limit.setEndPointIdleTimeout(Math.min(1000, readTimeoutMillis));
                server.addBean(limit);
            });
            config.routes.post("/predict", authorized(this::predict));
            config.routes.post("/feedback", authorized(this::feedback));
            if (withAdmin) {
                adminRoutes(config);
            }
        });
    }

    /** A server of its own (own threads: busy clients on the main port cannot starve it) for /healthz and /metrics. */
    Javalin adminServer(String host, int port, long readTimeoutMillis) {
        return Javalin.create(config -> {
            common(config, host, port, 4, readTimeoutMillis, null);
            adminRoutes(config);
        });
    }

    private void common(JavalinConfig config, String host, int port, int threads, long readTimeoutMillis, Tls tls) {
        config.startup.showJavalinBanner = false;
        config.startup.showOldJavalinVersionWarning = false;
        config.http.maxRequestSize = maxBodyBytes;
        // Bounded: at most `threads` handlers run at once (Jetty queues the rest).
        config.jetty.threadPool = new QueuedThreadPool(threads, Math.min(4, threads), 60_000);
        config.jetty.modifyHttpConfiguration(http -> {
            http.setSendServerVersion(false);
            http.setIdleTimeout(readTimeoutMillis); // a request whose body stalls this long fails (408)
        });
        config.jetty.modifyServer(server -> server.setErrorHandler(new ErrorLines(maxBodyBytes)));
        // A connection that sends nothing for readTimeoutMillis (a slow or stuck client) is closed.
        config.jetty.addConnector((server, http) -> {
            ServerConnector connector;
            if (tls == null) {
                connector = new ServerConnector(server, new HttpConnectionFactory(http));
            } else {
                HttpConfiguration https = new HttpConfiguration(http);
                // Clients reach the service by IP address or any name: the certificate's names are theirs to check.
                https.addCustomizer(new SecureRequestCustomizer(false));
                connector = new ServerConnector(server, new SslConnectionFactory(tls.contextFactory(),
                        HttpVersion.HTTP_1_1.asString()), new HttpConnectionFactory(https));
            }
            connector.setHost(host);
            connector.setPort(port);
            connector.setIdleTimeout(readTimeoutMillis);
            return connector;
        });
        config.routes.exception(HttpResponseException.class, (e, ctx) -> fail(ctx, e.getStatus(), e.getMessage()));
        config.routes.exception(Exception.class, (e, ctx) -> {
            logger.error("{} {} failed", ctx.method(), ctx.path(), e);
            fail(ctx, 500, "internal error (the service's log has the details)");
        });
        config.routes.error(404, ctx -> {
            if (ctx.attribute(ANSWERED) == null) { // a route's own 404 (an unknown version) keeps its line
                fail(ctx, 404, "no route " + ctx.method() + " " + JsonTensors.abbreviate(ctx.path()));
            }
        });
        config.routes.error(405, ctx -> fail(ctx, 405, "method " + ctx.method() + " not allowed on " + ctx.path()));
    }

    private void adminRoutes(JavalinConfig config) {
        config.routes.post("/admin/rollback", authorized(this::rollback));
        config.routes.get("/healthz", this::health);
        config.routes.get("/metrics", ctx -> ctx.contentType("text/plain; version=0.0.4; charset=utf-8").result(registry.scrape()));
    }

    private Handler authorized(Handler handler) {
        if (token == null) {
            return handler;
        }
        return ctx -> {
            if (!Tokens.matches(token, ctx.header("Authorization"))) {
                ctx.header("WWW-Authenticate", "Bearer");
                fail(ctx, 401, "missing or wrong token: send 'Authorization: Bearer TOKEN' (the operator has TOKEN)");
                return;
            }
            handler.handle(ctx);
        };
    }

    private void health(Context ctx) {
        JsonObject health = new JsonObject();
        Throwable failure = learner.getFailure();
        health.addProperty("status", failure == null ? "ok" : "failed");
        if (failure != null) {
            health.addProperty("error", "training stopped: " + failure.getMessage());
        }
        LearnerStats stats = learner.stats();
        health.addProperty("version", learner.currentVersion().getId());
        health.addProperty("updates", stats.getUpdates());
        health.addProperty("queue_depth", stats.getQueueDepth());
        health.addProperty("quarantined_batches", stats.getQuarantinedBatches());
        health.addProperty("latest_version", stats.getLatestVersion());
        health.addProperty("published_versions", stats.getPublishedVersions());
        health.addProperty("held_versions", stats.getHeldVersions());
        ctx.status(failure == null ? 200 : 503).contentType("application/json").result(GSON.toJson(health));
    }

    /** The body, read with the limit applied as it arrives (Content-Length or chunked). */
    private JsonObject body(Context ctx) throws IOException {
        return body(ctx, false);
    }

    /** As {@link #body(Context)}; with {@code emptyAllowed}, no body at all reads as {@code {}}. */
    private JsonObject body(Context ctx, boolean emptyAllowed) throws IOException {
        long declared = ctx.contentLength();
        if (declared > maxBodyBytes) {
            throw new BodyTooLarge("body of " + declared + " bytes exceeds the limit of " + maxBodyBytes + " bytes");
        }
        ByteArrayOutputStream out = new ByteArrayOutputStream((int) Math.min(Math.max(declared, 1024), Math.min(maxBodyBytes, 1 << 20)));
        byte[] buffer = new byte[8192];
        try (InputStream in = ctx.req().getInputStream()) {
            for (int n; (n = in.read(buffer)) > 0; ) {
                if (out.size() + (long) n > maxBodyBytes) {
                    throw new BodyTooLarge("body exceeds the limit of " + maxBodyBytes + " bytes (--max-body-bytes)");
                }
                out.write(buffer, 0, n);
            }
        } catch (IOException | RuntimeException e) {
            if (e instanceof BodyTooLarge) {
                throw e;
            }
            throw readFailure(e);
        }
        String text = new String(out.toByteArray(), StandardCharsets.UTF_8);
        if (emptyAllowed && text.trim().isEmpty()) {
            return new JsonObject();
        }
        try {
            JsonElement json = JsonParser.parseString(text);
            if (!json.isJsonObject()) {
                throw new InvalidInputException("body must be a JSON object, got " + JsonTensors.abbreviate(text));
            }
            return json.getAsJsonObject();
        } catch (JsonParseException e) {
            throw new InvalidInputException("body is not valid JSON: " + JsonTensors.abbreviate(gsonReason(e)));
        }
    }

    /** Gson's reason without its advice to the programmer (lenient parsing, a troubleshooting URL). */
    static String gsonReason(Throwable e) {
        String message = String.valueOf(ServeCommand.rootMessage(e)).split("\n", 2)[0];
        return message.replaceAll("^(?:[a-z]+\\.)+[A-Za-z]*Exception: ", "")
                // what Gson's JsonParser says of text after the value, as advice to call setStrictness
                .replace("Use JsonReader.setStrictness(Strictness.LENIENT) to accept malformed JSON ", "text after the JSON value ")
                .replace("Use JsonReader.setLenient(true) to accept malformed JSON ", "text after the JSON value ")
                .replaceAll("\\s*See https?://\\S+", "")
                .trim();
    }

    /** A body that could not be read whole: the client's fault (malformed chunks, too slow, gone). */
    private static RuntimeException readFailure(Exception e) {
        for (Throwable cause = e; cause != null; cause = cause.getCause()) {
            if (cause instanceof java.util.concurrent.TimeoutException) {
                return new BodyUnreadable(408, "the request body arrived too slowly (--read-timeout-ms, or under the"
                        + " minimum rate); send it whole, at once");
            }
        }
        String reason = String.valueOf(ServeCommand.rootMessage(e)).split("\n", 2)[0];
        return new BodyUnreadable(400, "cannot read the request body (malformed chunked encoding, or it ended before its"
                + " length): " + JsonTensors.abbreviate(reason));
    }

    private static final class BodyUnreadable extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final int status;

        BodyUnreadable(int status, String message) {
            super(message);
            this.status = status;
        }
    }

    private static final class BodyTooLarge extends RuntimeException {
        private static final long serialVersionUID = 1L;

        BodyTooLarge(String message) {
            super(message);
        }
    }

    private void predict(Context ctx) throws IOException {
        Timer.Sample sample = Timer.start(registry);
        try {
            Map<String, HostTensor> x = JsonTensors.parseInputs(body(ctx).get("x"), learner.getMetadata());
            Prediction prediction = learner.predict(x);
            JsonObject out = new JsonObject();
            out.addProperty("version", prediction.getVersion());
            out.add("y", JsonTensors.write(prediction.getOutput()));
            ctx.contentType("application/json").result(GSON.toJson(out));
        } catch (InvalidInputException e) {
            fail(ctx, 400, e.getMessage());
        } catch (BodyTooLarge e) {
            fail(ctx, 413, e.getMessage());
        } catch (BodyUnreadable e) {
            fail(ctx, e.status, e.getMessage());
        } finally {
            sample.stop(predictLatency);
        }
    }

    private void feedback(Context ctx) throws IOException {
        Timer.Sample sample = Timer.start(registry);
        try {
            JsonObject body = body(ctx);
            Map<String, HostTensor> x = JsonTensors.parseInputs(body.get("x"), learner.getMetadata());
            HostTensor y = JsonTensors.parse("y", body.get("y"), learner.getMetadata().getInput("y").getDtype());
            String key = ctx.header("Idempotency-Key");
            OnlineLearner.Receipt receipt = learner.offer(x, y, key, 0, TimeUnit.NANOSECONDS);
            JsonObject out = new JsonObject();
            out.addProperty("accepted", receipt.getEvents());
            out.addProperty("first_seq", receipt.getFirstSeq());
            out.addProperty("duplicate", receipt.isDuplicate()); // this request's own answer from the queue
            ctx.contentType("application/json").result(GSON.toJson(out));
        } catch (InvalidInputException e) {
            fail(ctx, 400, e.getMessage());
        } catch (BodyTooLarge e) {
            fail(ctx, 413, e.getMessage());
        } catch (BodyUnreadable e) {
            fail(ctx, e.status, e.getMessage());
        } catch (KeyConflictException e) {
            fail(ctx, 422, e.getMessage());
        } catch (QueueFullException e) {
            fail(ctx, 429, e.getMessage());
        } catch (IllegalStateException | UncheckedIOException e) {
            fail(ctx, 503, e.getMessage());
        } finally {
            sample.stop(learnLatency);
        }
    }

    /**
     * {@code POST /admin/rollback} {@code {"version": v}} (or no body: the version published before
     * the serving one) → {@code {"version": v, "kept": [...]}} once the rollback is in the log.
     */
    private void rollback(Context ctx) throws IOException {
        try {
            JsonObject body = body(ctx, true);
            Long version = null;
            for (String key : body.keySet()) {
                if (!"version".equals(key)) {
                    throw new InvalidInputException("unknown field '" + JsonTensors.abbreviate(key) + "'; the body is"
                            + " {\"version\": N} (a kept published version) or empty (the one before the serving version)");
                }
            }
            JsonElement given = body.get("version");
            if (given != null) {
                version = JsonTensors.versionNumber(given);
            }
            ModelVersion serving = learner.rollback(version);
            JsonObject out = new JsonObject();
            out.addProperty("version", serving.getId());
            out.add("kept", GSON.toJsonTree(learner.keptVersions()));
            ctx.contentType("application/json").result(GSON.toJson(out));
        } catch (InvalidInputException e) {
            fail(ctx, 400, e.getMessage());
        } catch (BodyTooLarge e) {
            fail(ctx, 413, e.getMessage());
        } catch (BodyUnreadable e) {
            fail(ctx, e.status, e.getMessage());
        } catch (NoSuchElementException e) {
            ctx.attribute(ANSWERED, Boolean.TRUE);
            fail(ctx, 404, e.getMessage());
        } catch (IllegalStateException e) {
            fail(ctx, 409, e.getMessage());
        } catch (IOException | UncheckedIOException e) {
            fail(ctx, 503, "cannot log the rollback: " + e.getMessage());
        }
    }

    /** Set on a request whose route answered 404 itself (an unknown version), so the no-route line does not replace it. */
    private static final String ANSWERED = "gradbridge.answered";

    private static void fail(Context ctx, int status, String message) {
        ctx.status(status).contentType("text/plain; charset=utf-8")
                .result(Messages.ERROR_PREFIX + String.valueOf(message).replace('\n', ' ') + "\n");
    }
}
