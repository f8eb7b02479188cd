package dev.gradbridge.spark;

import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import org.apache.spark.BarrierTaskContext;

/**
 * The exchange over Spark's own barrier RPC: every task's encoded shard result, as Base64 text
 * ({@code allGather} carries strings), goes to the driver's barrier coordinator, which answers every
 * task with all K messages in partition order; each task decodes them and combines them itself.
 *
 * <p>Cost per step: a task sends 4/3 of its gradient bytes and receives K times that, and the
 * driver relays K^2 of them, so the bytes per task grow with K (benchmarks/README.md measures
 * them). It needs nothing beyond Spark; one all-gather per step is also the step's barrier. The
 * RPC limit ({@code spark.rpc.message.maxSize}, 128 MiB by default) bounds K times the encoded
 * gradient.
 */
final class AllGatherExchange implements GradientExchange {

    private final BarrierTaskContext context;
    private long sent;
    private long received;

    AllGatherExchange(BarrierTaskContext context) {
        this.context = context;
    }

    @Override
    public GradientCombiner.Combined combine(ShardResult mine, List<String> dtypes, long[] sizes) {
        String message = Base64.getEncoder().encodeToString(mine.encode());
        String[] messages = context.allGather(message);
        sent += message.length();
        List<ShardResult> results = new ArrayList<>(messages.length);
        for (String m : messages) {
            received += m.length();
            results.add(ShardResult.decode(Base64.getDecoder().decode(m)));
        }
        results.sort((a, b) -> Integer.compare(a.partition, b.partition));
        for (int p = 0; p < results.size(); p++) {
            if (results.get(p).partition != p) {
                throw new IllegalStateException("the all-gather returned partitions out of order: " + p + " is "
                        + results.get(p).partition);
            }
        }
        return GradientCombiner.combine(results, dtypes, sizes);
    }

    @Override
    public long bytesSent() {
        return sent;
    }

    @Override
    public long bytesReceived() {
        return received;
    }
}
