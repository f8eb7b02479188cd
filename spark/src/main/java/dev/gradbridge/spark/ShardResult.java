package dev.gradbridge.spark;

import java.io.Serializable;

/**
 * What one partition sends back for one step: how many rows of the global mini-batch it held,
 * the mean loss over them, and the gradients of that mean loss (raw little-endian bytes, one array
 * per parameter in {@code parameter_names()} order) with the flags saying which parameters got one.
 */
final class ShardResult implements Serializable {
    private static final long serialVersionUID = 1L;

    final int partition;
    final int rows;
    final double loss;
    final byte[][] gradients;
    final boolean[] flags;
    /** Whether this task had to load its module (from the broadcast bytes) rather than reuse one. */
    final boolean loadedModule;
    final long computeNanos;

    ShardResult(int partition, int rows, double loss, byte[][] gradients, boolean[] flags, boolean loadedModule,
            long computeNanos) {
        this.partition = partition;
        this.rows = rows;
        this.loss = loss;
        this.gradients = gradients;
        this.flags = flags;
        this.loadedModule = loadedModule;
        this.computeNanos = computeNanos;
    }

    static ShardResult empty(int partition) {
        return new ShardResult(partition, 0, 0.0, null, null, false, 0L);
    }

    long bytes() {
        long total = 0;
        if (gradients != null) {
            for (byte[] g : gradients) {
                total += g.length;
            }
        }
        return total;
    }
}
