package dev.gradbridge.spark;

import java.util.HashMap;
import java.util.Map;

/**
 * The driver's side of {@link RelayExchange}: an endpoint ({@link DriverEndpoint}) that, for
 * each round of a step, waits for all K tasks and then answers each task with what the others
 * addressed to it, in partition order. It only forwards bytes; it never combines. (Executors'
 * RPC environments accept no connections, so Spark's RPC between tasks goes through the driver;
 * Spark's barrier all-gather does too, and polls its answer once a second.)
 *
 * <p>A request is {@code Object[] {String round ("stageId.attempt/step/name"), Integer partition,
 * Integer partitions, byte[][] payloads}}: one payload per destination task, or one for all. The
 * answer is {@code byte[K][]}, the task's own entry empty.
 */
final class RelayEndpoint extends DriverEndpoint {

    private static final byte[] NOTHING = new byte[0];
    private final Map<String, Round> rounds = new HashMap<>();
    /** The newest stage attempt seen, as (stage id, attempt). */
    private long stageId = -1;
    private long stageAttempt = -1;

    private static final class Round {
        final SparkInternals.Reply[] callers;
        final byte[][][] payloads;
        int arrived;

        Round(int partitions) {
            callers = new SparkInternals.Reply[partitions];
            payloads = new byte[partitions][][];
        }
    }

    private RelayEndpoint(byte[] secret) {
        super("gradbridge-exchange", secret);
    }

    /** Registers a relay on the driver's RPC environment, answering requests that carry the run's {@code secret}. */
    static RelayEndpoint start(byte[] secret) {
        RelayEndpoint relay = new RelayEndpoint(secret);
        relay.register();
        return relay;
    }

    @Override
    synchronized void arrive(Object[] message, SparkInternals.Reply caller) {
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
