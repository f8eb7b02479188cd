package dev.gradbridge.spark;

import java.io.Serializable;
import dev.gradbridge.internal.Digests;
import java.security.MessageDigest;

/**
 * One partition's rows of the training data, as raw little-endian bytes in the dtypes of the
 * module's metadata: one array per column, the model's inputs in the metadata's order ({@code x},
 * or several by name) then {@code y}. Rows are dealt round-robin: partition {@code p} of {@code K}
 * holds the rows whose global index {@code i} has {@code i % K == p}, in index order, so its local
 * row {@code j} is global row {@code p + j * K}. Python's reference (shards=K) uses the same rule.
 */
final class Shard implements Serializable {
    private static final long serialVersionUID = 2L;

    final int partition;
    final int partitions;
    final long total;
    final int rows;
    /** Per column (the inputs, then y): the bytes of one row. */
    final int[] rowBytes;
    /** Per column (the inputs, then y): its rows' bytes. */
    final byte[][] columns;

    Shard(int partition, int partitions, long total, int rows, int[] rowBytes, byte[][] columns) {
        this.partition = partition;
        this.partitions = partitions;
        this.total = total;
        this.rows = rows;
        this.rowBytes = rowBytes;
        this.columns = columns;
    }

    /** @return the partition that holds global row {@code index} of {@code partitions} */
    static int partitionOf(long index, int partitions) {
        return (int) (index % partitions);
    }

    /** @return how many of {@code total} rows partition {@code p} of {@code partitions} holds */
    static int rowsOf(long total, int p, int partitions) {
        return (int) ((total - p + partitions - 1) / partitions);
    }

    /** @return SHA-256 of this shard's columns' bytes in order: x (or each input) then y */
    byte[] digest() {
        MessageDigest sha = Digests.sha256();
        for (byte[] column : columns) {
            sha.update(column);
        }
        return sha.digest();
    }
}
