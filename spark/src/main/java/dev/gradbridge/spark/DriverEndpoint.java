package dev.gradbridge.spark;

import java.util.UUID;
import org.apache.spark.SparkEnv;
import org.apache.spark.rpc.RpcCallContext;
import org.apache.spark.rpc.RpcEndpoint;
import org.apache.spark.rpc.RpcEndpointRef;
import org.apache.spark.rpc.RpcEnv;
import scala.Function1;
import scala.PartialFunction;
import scala.runtime.AbstractPartialFunction;
import scala.runtime.BoxedUnit;

/**
 * An endpoint of a run on the driver's own Spark RPC environment (the channel every executor
 * already has to its driver), under a name of its own that the tasks look up. Requests are
 * {@code Object[]} of plain Java types, so that no class of this jar is needed to read them; each
 * subclass answers them in {@link #arrive}, through the caller's context (now or later).
 */
abstract class DriverEndpoint implements RpcEndpoint {

    private final RpcEnv env = SparkEnv.get().rpcEnv();
    private final String name;
    private RpcEndpointRef ref;

    /** @param kind the name's prefix, before a random suffix */
    DriverEndpoint(String kind) {
        name = kind + "-" + UUID.randomUUID();
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
                arrive((Object[]) message, context);
                @SuppressWarnings("unchecked")
                B1 unit = (B1) BoxedUnit.UNIT;
                return unit;
            }
        };
    }
}
