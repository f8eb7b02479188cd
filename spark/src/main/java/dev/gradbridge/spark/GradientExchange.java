package dev.gradbridge.spark;

import java.nio.ByteBuffer;

/**
 * How the training tasks of one barrier stage combine their gradients each step, among
 * themselves (no driver-side combine, no Spark job per step). Every task calls {@link #combine}
 * once per step with its own shard result and gets the same combined gradient: the
 * sample-weighted sum in partition order ({@link GradientCombiner}), bit for bit on every task.
 *
 * <p>Both exchanges are a reduce-scatter by chunk ({@link Chunks}, each chunk combined in partition
 * order by its owner) then an all-gather, so they give the same bits: {@link GlooExchange} (the
 * default) task to task over libtorch's c10d Gloo, {@link RelayExchange} over Spark's RPC through
 * the driver, for clusters whose executors cannot reach each other's ports. {@link SoloExchange}
 * for one partition. The Spark setting {@value #SETTING} picks one; over Gloo, a gradient of which
 * each task would receive at most {@value #ONE_ROUND_SETTING} bytes ((K-1) P) goes in one all-gather
 * of whole records instead (the same bits).
 *
 * <p>An exchange is made for one run's parameters (dtypes and sizes): it sizes its direct buffers
 * once, each step's gradient is copied straight from libtorch's tensors into them ({@link #put}),
 * and the combined gradient it returns lies in its own buffers, which the optimizer reads in place.
 */
interface GradientExchange extends AutoCloseable {

    /** The Spark setting that picks the exchange of a run with more than one partition. */
    String SETTING = "spark.gradbridge.exchange";
    /** The Spark setting: the most gradient bytes a task receives when Gloo exchanges them in one round. */
    String ONE_ROUND_SETTING = "spark.gradbridge.exchange.oneRoundBytes";
    /**
     * Its default, 128 KiB: at 1 Gb/s those bytes take about the millisecond the second collective
     * would (a step that small is bound by latency, not bytes).
     */
    long ONE_ROUND_BYTES = 128 * 1024;
    /** Its largest value, 512 MiB: the K records one round gathers stay within one direct buffer (2 GiB). */
    long ONE_ROUND_MAX_BYTES = 512L * 1024 * 1024;
    /** Task to task over c10d Gloo (the default). */
    String GLOO = "gloo";
    /** Through an endpoint on the driver, over Spark's RPC. */
    String RELAY = "relay";

    /** What {@link #phaseNanos} times, in its order. */
    String[] PHASES = {"copy_in", "alltoall", "combine", "allgather", "copy_out"};

    /**
     * Copies this step's gradient of one parameter to where the exchange sends it from (every
     * parameter once per step, before {@link #combine}; a task without rows puts nothing).
     *
     * @param parameter its index in protocol order
     * @param values its bytes from index 0, little-endian (libtorch's tensor memory: read now, not kept)
     */
    void put(int parameter, ByteBuffer values);

    /**
     * @param mine this task's rows, loss and flags for the step (its gradient {@link #put} before)
     * @return the step's combined gradient and loss, the same on every task, in this exchange's
     *     buffers: valid until the next step's {@link #put}
     */
    GradientCombiner.Combined combine(ShardResult mine);

    /**
     * Gives every task partition {@code source}'s bytes (a step's trained buffers, {@link
     * Replica#shareBuffers}): on the source {@code values} holds them, on every other task they are
     * written into it; every task calls this at the same point of the step, with the same limit.
     *
     * @param source the partition whose bytes every task takes
     * @param values a direct little-endian buffer, position 0, its limit the bytes
     */
    void broadcast(int source, ByteBuffer values);

    /** @return per {@link #PHASES} entry, this task's time in it so far, ns (zeros where an exchange has none) */
    default long[] phaseNanos() {
        return new long[PHASES.length];
    }

    /** @return bytes this task sent so far */
    long bytesSent();

    /** @return bytes this task received so far */
    long bytesReceived();

    /** Leaves the exchange (a peer waiting on this task fails rather than waits). */
    @Override
    default void close() {}
}
