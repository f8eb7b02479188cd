package dev.gradbridge.spark;

import java.util.List;

/**
 * How the training tasks of one barrier stage combine their gradients each step, among
 * themselves (no driver-side combine, no Spark job per step). Every task calls {@link #combine}
 * once per step with its own shard result and gets the same combined gradient: the
 * sample-weighted sum in partition order ({@link GradientCombiner}), bit for bit on every task.
 *
 * <p>{@link RelayExchange} is the one in use: a reduce-scatter by chunk then an all-gather, over
 * Spark's RPC through the driver. A collective among the tasks that keeps the partition order, e.g.
 * c10d Gloo's all-to-all by chunk (each chunk summed in partition order by its owner, with {@link
 * Chunks} and {@link GradientCombiner}) then all-gather, fits behind the same method without the
 * driver in the path.
 */
interface GradientExchange {

    /**
     * @param mine this task's contribution to the step
     * @param dtypes each parameter's dtype
     * @param sizes each parameter's number of elements
     * @return the step's combined gradient and loss, the same on every task
     */
    GradientCombiner.Combined combine(ShardResult mine, List<String> dtypes, long[] sizes);

    /** @return bytes this task sent so far */
    long bytesSent();

    /** @return bytes this task received so far */
    long bytesReceived();
}
