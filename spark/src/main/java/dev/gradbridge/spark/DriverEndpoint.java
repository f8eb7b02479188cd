package dev.gradbridge.spark;

import java.nio.charset.StandardCharsets;
import java.security.GeneralSecurityException;
import java.security.MessageDigest;
import java.security.SecureRandom;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicBoolean;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;
import org.apache.spark.SparkConf;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.concurrent.Future;

/**
 * An endpoint of a run on the driver's own Spark RPC environment (the channel every executor
 * already has to its driver: {@link SparkInternals}), under a name of its own that the tasks look up. Requests are
 * {@code Object[]} of plain Java types, so that no class of this jar is needed to read them; each
 * subclass answers them in {@link #arrive}, through the caller's context (now or later).
 *
 * <p>Every request carries the run's token ({@link Caller}): an HMAC-SHA256 of the endpoint's name
 * under the run's secret, which is Spark's own authentication secret when {@code spark.authenticate}
 * is on (Spark's RPC then also refuses unauthenticated peers itself), else 32 bytes drawn per run
 * ({@link #runSecret}) that the tasks receive with the stage. A request without it is refused
 * (the caller's ask fails) and changes nothing.
 */
abstract class DriverEndpoint {

    private static final Logger logger = LoggerFactory.getLogger(DriverEndpoint.class);
    private static final int SECRET_BYTES = 32;

    private final String name;
    private final byte[] token;
    private final AtomicBoolean warned = new AtomicBoolean();
    private SparkInternals.Endpoint endpoint;

    /**
     * @param kind the name's prefix, before a random suffix
     * @param secret the run's secret ({@link #secretOf})
     */
    DriverEndpoint(String kind, byte[] secret) {
        name = kind + "-" + UUID.randomUUID();
        token = token(secret, name);
    }

    /**
     * @return the secret a run's tasks receive with the stage: null when {@code spark.authenticate}
     *     is on (each side then reads Spark's own, {@link #secretOf}), else 32 random bytes
     */
    static byte[] runSecret(SparkConf conf) {
        if (conf.getBoolean("spark.authenticate", false)) {
            return null;
        }
        byte[] secret = new byte[SECRET_BYTES];
        new SecureRandom().nextBytes(secret);
        return secret;
    }

    /** @return the run's secret: {@code carried} (from {@link #runSecret}), else Spark's authentication secret */
    static byte[] secretOf(byte[] carried) {
        if (carried != null) {
            return carried;
        }
        String spark = SparkInternals.authenticationSecret();
        if (spark == null || spark.isEmpty()) {
            throw new IllegalStateException("spark.authenticate is on but Spark holds no authentication secret");
        }
        return spark.getBytes(StandardCharsets.UTF_8);
    }

    private static byte[] token(byte[] secret, String name) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            mac.init(new SecretKeySpec(secret, "HmacSHA256"));
            return mac.doFinal(name.getBytes(StandardCharsets.UTF_8));
        } catch (GeneralSecurityException e) {
            throw new IllegalStateException("HmacSHA256 is unavailable in this Java", e);
        }
    }

    /** Registers the endpoint; a subclass's factory calls it once its fields are set. */
    final void register() {
        endpoint = SparkInternals.register(name, this::request);
    }

    /** @return the endpoint's name, which the tasks look up on the driver */
    final String name() {
        return name;
    }

    /** Unregisters the endpoint. */
    final void close() {
        endpoint.close();
    }

    /** One request; answered by {@code caller.reply} (or {@code sendFailure}), now or later. */
    abstract void arrive(Object[] message, SparkInternals.Reply caller);

    /** A request {@code {byte[] token, Object[] message}}: the message goes on only with the run's token. */
    private void request(Object[] parts, SparkInternals.Reply caller) {
        if (parts.length != 2 || !(parts[0] instanceof byte[]) || !(parts[1] instanceof Object[])
                || !MessageDigest.isEqual(token, (byte[]) parts[0])) {
            if (!warned.getAndSet(true)) {
                logger.warn("gradbridge: refused a request to {} without the run's secret (from {})", name,
                        caller.sender());
            }
            caller.sendFailure(new SecurityException("refused: the request does not carry the run's secret"));
            return;
        }
        arrive((Object[]) parts[1], caller);
    }

    /** A task's way to one endpoint of its run: each request carries the run's token. */
    static final class Caller {
        private final SparkInternals.DriverRef ref;
        private final byte[] token;

        /**
         * @param name the endpoint's name
         * @param carried the secret the stage carried ({@link #runSecret}: null when Spark's own is the secret)
         */
        Caller(String name, byte[] carried) {
            ref = SparkInternals.driverRef(name);
            token = token(secretOf(carried), name);
        }

        /** @return the endpoint's answer to {@code message}, as it comes ({@link RelayExchange#await}) */
        <T> Future<T> ask(Object[] message, Class<T> type) {
            return ref.ask(new Object[] {token, message}, type);
        }
    }
}
