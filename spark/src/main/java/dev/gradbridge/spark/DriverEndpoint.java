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
import org.apache.spark.SparkEnv;
import org.apache.spark.rpc.RpcCallContext;
import org.apache.spark.rpc.RpcEndpoint;
import org.apache.spark.rpc.RpcEndpointRef;
import org.apache.spark.rpc.RpcEnv;
import org.apache.spark.util.RpcUtils$;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import scala.Function1;
import scala.PartialFunction;
import scala.concurrent.Future;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractPartialFunction;
import scala.runtime.BoxedUnit;

/**
 * An endpoint of a run on the driver's own Spark RPC environment (the channel every executor
 * already has to its driver), under a name of its own that the tasks look up. Requests are
 * {@code Object[]} of plain Java types, so that no class of this jar is needed to read them; each
 * subclass answers them in {@link #arrive}, through the caller's context (now or later).
 *
 * <p>Every request carries the run's token ({@link Caller}): an HMAC-SHA256 of the endpoint's name
 * under the run's secret, which is Spark's own authentication secret when {@code spark.authenticate}
 * is on (Spark's RPC then also refuses unauthenticated peers itself), else 32 bytes drawn per run
 * ({@link #runSecret}) that the tasks receive with the stage. A request without it is refused
 * (the caller's ask fails) and changes nothing.
 */
abstract class DriverEndpoint implements RpcEndpoint {

    private static final Logger logger = LoggerFactory.getLogger(DriverEndpoint.class);
    private static final int SECRET_BYTES = 32;

    private final RpcEnv env = SparkEnv.get().rpcEnv();
    private final String name;
    private final byte[] token;
    private final AtomicBoolean warned = new AtomicBoolean();
    private RpcEndpointRef ref;

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
        String spark = SparkEnv.get().securityManager().getSecretKey();
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
        ref = env.setupEndpoint(name, this);
    }

    /** @return the endpoint's name, which the tasks look up on the driver */
    final String name() {
        return name;
    }

    /** Unregisters the endpoint. */
    final void close() {
        env.stop(ref);
    }

    /** One request; answered by {@code caller.reply} (or {@code sendFailure}), now or later. */
    abstract void arrive(Object[] message, RpcCallContext caller);

    @Override
    public RpcEnv rpcEnv() {
        return env;
    }

    /** A request {@code {byte[] token, Object[] message}}: the message goes on only with the run's token. */
    private void request(Object request, RpcCallContext caller) {
        Object[] parts = (Object[]) request;
        if (parts.length != 2 || !(parts[0] instanceof byte[]) || !(parts[1] instanceof Object[])
                || !MessageDigest.isEqual(token, (byte[]) parts[0])) {
            if (!warned.getAndSet(true)) {
                logger.warn("gradbridge: refused a request to {} without the run's secret (from {})", name,
                        caller.senderAddress());
            }
            caller.sendFailure(new SecurityException("refused: the request does not carry the run's secret"));
            return;
        }
        arrive((Object[]) parts[1], caller);
    }

    @Override
    public PartialFunction<Object, BoxedUnit> receiveAndReply(RpcCallContext context) {
        return new AbstractPartialFunction<Object, BoxedUnit>() {
            @Override
            public boolean isDefinedAt(Object message) {
                return message instanceof Object[];
            }

            @Override
            public <A1, B1> B1 applyOrElse(A1 message, Function1<A1, B1> otherwise) {
                if (!isDefinedAt(message)) {
                    return otherwise.apply(message);
                }
                request(message, context);
                @SuppressWarnings("unchecked")
                B1 unit = (B1) BoxedUnit.UNIT;
                return unit;
            }
        };
    }

    /** A task's way to one endpoint of its run: each request carries the run's token. */
    static final class Caller {
        private final RpcEndpointRef ref;
        private final byte[] token;

        /**
         * @param name the endpoint's name
         * @param carried the secret the stage carried ({@link #runSecret}: null when Spark's own is the secret)
         */
        Caller(String name, byte[] carried) {
            SparkEnv env = SparkEnv.get();
            ref = RpcUtils$.MODULE$.makeDriverRef(name, env.conf(), env.rpcEnv());
            token = token(secretOf(carried), name);
        }

        /** @return the endpoint's answer to {@code message}, as it comes ({@link RelayExchange#await}) */
        <T> Future<T> ask(Object[] message, Class<T> type) {
            return ref.ask(new Object[] {token, message}, RelayExchange.NO_TIMEOUT, ClassTag$.MODULE$.apply(type));
        }
    }
}
