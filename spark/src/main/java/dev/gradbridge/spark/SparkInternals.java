package dev.gradbridge.spark;

import java.util.Iterator;
import java.util.ServiceConfigurationError;
import java.util.ServiceLoader;
import java.util.concurrent.TimeUnit;
import org.apache.spark.SparkEnv;
import org.apache.spark.rpc.RpcCallContext;
import org.apache.spark.rpc.RpcEndpoint;
import org.apache.spark.rpc.RpcEndpointRef;
import org.apache.spark.rpc.RpcEnv;
import org.apache.spark.rpc.RpcTimeout;
import org.apache.spark.scheduler.ExternalClusterManager;
import org.apache.spark.util.RpcUtils$;
import org.apache.spark.util.Utils;
import scala.Function1;
import scala.PartialFunction;
import scala.concurrent.Future;
import scala.concurrent.duration.FiniteDuration;
import scala.reflect.ClassTag$;
import scala.runtime.AbstractPartialFunction;
import scala.runtime.BoxedUnit;

/**
 * Every Spark internal that gradbridge-spark uses, in this one class, and why. Spark marks them
 * {@code private[spark]} (public in the bytecode, so Java can call them, but no API: any Spark
 * release may change them); a new Spark line is checked against this list (the spark3.5 and spark4
 * builds compile it against both).
 *
 * <ul>
 *   <li>{@code SparkEnv.rpcEnv()}, {@code RpcEnv}, {@code RpcEndpoint}, {@code RpcCallContext}: a
 *       run's endpoints on the driver ({@link DriverEndpoint}: the start, the epoch ends, the relay
 *       exchange, the Gloo rendezvous store) ride the channel every executor already has to its
 *       driver, which Spark authenticates when {@code spark.authenticate} is on: no port of the run's
 *       own to open, find or secure.
 *   <li>{@code RpcUtils.makeDriverRef}, {@code RpcEndpointRef.ask}, {@code RpcTimeout}: a task's
 *       way to those endpoints, waiting as long as a step takes.
 *   <li>{@code SparkEnv.securityManager()}: Spark's authentication secret, the run's secret when
 *       {@code spark.authenticate} is on (so the tasks need none carried with the stage).
 *   <li>{@code SparkEnv.blockManager()}: the executor's host as the driver knows it (what the Gloo
 *       exchange binds to), and {@code removeRdd} for the test fault that drops an executor's cached
 *       partitions as a lost executor would.
 *   <li>{@code ExternalClusterManager} and {@code Utils.getContextOrSparkClassLoader}: which cluster
 *       managers on the classpath accept a master URL (yarn, k8s), as {@code SparkContext} asks them,
 *       so that a wrong {@code --master} is one line before Spark starts half its services.
 * </ul>
 */
final class SparkInternals {

    /** A request to the driver waits as long as it takes (a killed task gets out through {@link RelayExchange#await}). */
    private static final RpcTimeout NO_TIMEOUT =
            new RpcTimeout(FiniteDuration.apply(365, TimeUnit.DAYS), "gradbridge exchange");

    private SparkInternals() {}

    /** The caller of one request: answered now or later, once. */
    interface Reply {
        /** @param answer the request's answer */
        void reply(Object answer);

        /** @param failure why the request fails (the caller's ask fails with it) */
        void sendFailure(Throwable failure);

        /** @return the caller's address, for a log line */
        String sender();
    }

    /** What an endpoint does with a request ({@code Object[]} of plain Java types; other messages are not its). */
    interface Handler {
        /**
         * @param request the request
         * @param reply its caller
         */
        void receive(Object[] request, Reply reply);
    }

    /** An endpoint registered on the driver's RPC environment. */
    static final class Endpoint {
        private final RpcEnv env;
        private final RpcEndpointRef ref;

        private Endpoint(RpcEnv env, RpcEndpointRef ref) {
            this.env = env;
            this.ref = ref;
        }

        /** Unregisters it. */
        void close() {
            env.stop(ref);
        }
    }

    /**
     * @param name the endpoint's name, which tasks look up ({@link #driverRef})
     * @param handler answers its requests
     * @return the registered endpoint
     */
    static Endpoint register(String name, Handler handler) {
        RpcEnv env = SparkEnv.get().rpcEnv();
        RpcEndpoint endpoint = new RpcEndpoint() {
            @Override
            public RpcEnv rpcEnv() {
                return env;
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
                        handler.receive((Object[]) message, reply(context));
                        @SuppressWarnings("unchecked")
                        B1 unit = (B1) BoxedUnit.UNIT;
                        return unit;
                    }
                };
            }
        };
        return new Endpoint(env, env.setupEndpoint(name, endpoint));
    }

    private static Reply reply(RpcCallContext context) {
        return new Reply() {
            @Override
            public void reply(Object answer) {
                context.reply(answer);
            }

            @Override
            public void sendFailure(Throwable failure) {
                context.sendFailure(failure);
            }

            @Override
            public String sender() {
                return String.valueOf(context.senderAddress());
            }
        };
    }

    /** A task's reference to one endpoint on its driver. */
    static final class DriverRef {
        private final RpcEndpointRef ref;

        private DriverRef(RpcEndpointRef ref) {
            this.ref = ref;
        }

        /**
         * @param message the request
         * @param type the answer's class
         * @param <T> the answer's type
         * @return the answer, as it comes ({@link RelayExchange#await})
         */
        <T> Future<T> ask(Object message, Class<T> type) {
            return ref.ask(message, NO_TIMEOUT, ClassTag$.MODULE$.apply(type));
        }
    }

    /**
     * @param name an endpoint's name on this task's driver
     * @return the reference to it
     */
    static DriverRef driverRef(String name) {
        SparkEnv env = SparkEnv.get();
        return new DriverRef(RpcUtils$.MODULE$.makeDriverRef(name, env.conf(), env.rpcEnv()));
    }

    /** @return Spark's authentication secret, or null or empty when it holds none */
    static String authenticationSecret() {
        return SparkEnv.get().securityManager().getSecretKey();
    }

    /** @return this executor's host as the driver knows it */
    static String executorHost() {
        return SparkEnv.get().blockManager().blockManagerId().host();
    }

    /** @param rdd the id of an RDD whose partitions this executor caches: dropped, as a lost executor would lose them */
    static void dropCachedPartitions(int rdd) {
        SparkEnv.get().blockManager().removeRdd(rdd);
    }

    /**
     * @param master a master URL that is not local or standalone
     * @return whether a cluster manager on the classpath accepts it ({@code SparkContext.getClusterManager})
     */
    static boolean clusterManagerAccepts(String master) {
        ServiceLoader<ExternalClusterManager> managers =
                ServiceLoader.load(ExternalClusterManager.class, Utils.getContextOrSparkClassLoader());
        Iterator<ExternalClusterManager> each = managers.iterator();
        while (true) {
            try {
                if (!each.hasNext()) {
                    return false;
                }
                if (each.next().canCreate(master)) {
                    return true;
                }
            } catch (ServiceConfigurationError e) {
                // a manager that cannot load accepts nothing
            }
        }
    }
}
