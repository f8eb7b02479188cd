package dev.gradbridge.spark;

import java.util.HashMap;
import java.util.Map;
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
 * The driver's side of {@link RelayExchange}: an endpoint on Spark's own RPC environment that, for
 * each round of a step, waits for all K tasks and then answers each task with what the others
 * addressed to it, in partition order. It only forwards bytes; it never combines. (Executors'
 * RPC environments accept no connections, so Spark's RPC between tasks goes through the driver;
 * Spark's barrier all-gather does too, and polls its answer once a second.)
 *
 * <p>A request is {@code Object[] {String round ("stageId.attempt/step/name"), Integer partition, Integer partitions, byte[][]
 * payloads}}, plain Java types so that no class of this jar is needed to read it: one payload per
 * destination task, or one for all. The answer is {@code byte[K][]}, the task's own entry empty.
 */
final class ExchangeRelay implements RpcEndpoint {

    private static final byte[] NOTHING = new byte[0];
    private final RpcEnv env;
    private final String name = "gradbridge-exchange-" + UUID.randomUUID();
    private final Map<String, Round> rounds = new HashMap<>();
    /** The newest stage attempt seen, as (stage id, attempt). */
    private long stageId = -1;
    private long stageAttempt = -1;
    private RpcEndpointRef ref;

    private static final class Round {
        final RpcCallContext[] callers;
        final byte[][][] payloads;
        int arrived;

        Round(int partitions) {
            callers = new RpcCallContext[partitions];
            payloads = new byte[partitions][][];
        }
    }

    private ExchangeRelay(RpcEnv env) {
        this.env = env;
    }

    /** Registers a relay on the driver's RPC environment. */
    static ExchangeRelay start() {
        ExchangeRelay relay = new ExchangeRelay(SparkEnv.get().rpcEnv());
        relay.ref = relay.env.setupEndpoint(relay.name, relay);
        return relay;
    }

    /** @return the endpoint's name, which the tasks look up on the driver */
    String name() {
        return name;
    }

    /** Unregisters the relay. */
    void close() {
        env.stop(ref);
    }

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

    private synchronized void arrive(Object[] message, RpcCallContext caller) {
        String key = (String) message[0];
        int partition = (Integer) message[1];
        int partitions = (Integer) message[2];
        String[] stage = key.substring(0, key.indexOf('/')).split("\\.");
        long id = Long.parseLong(stage[0]);
        long attempt = Long.parseLong(stage[1]);
        if (id < stageId || (id == stageId && attempt < stageAttempt)) {
            caller.sendFailure(new IllegalStateException("a round of an earlier stage attempt: " + key));
            return;
        }
        if (id != stageId || attempt != stageAttempt) {
            rounds.clear(); // a new stage, or a retry: rounds of a failed attempt will never complete
            stageId = id;
            stageAttempt = attempt;
        }
        Round round = rounds.computeIfAbsent(key, k -> new Round(partitions));
        round.callers[partition] = caller;
        round.payloads[partition] = (byte[][]) message[3];
        if (++round.arrived < partitions) {
            return;
        }
        rounds.remove(key);
        for (int to = 0; to < partitions; to++) {
            byte[][] answer = new byte[partitions][];
            for (int from = 0; from < partitions; from++) {
                byte[][] sent = round.payloads[from];
                // a task keeps its own part: nothing of it goes back over the wire
                answer[from] = from == to ? NOTHING : sent.length == 1 ? sent[0] : sent[to];
            }
            round.callers[to].reply(answer);
        }
    }
}
