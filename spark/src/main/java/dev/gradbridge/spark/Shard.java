package dev.gradbridge.spark;

import java.io.Serializable;
import dev.gradbridge.Digests;
import java.security.MessageDigest;

/**
 * One partition's rows of the training data, as raw little-endian bytes in the dtypes of the
 * module's metadata. Rows are dealt round-robin: partition {@code p} of {@code K} holds the rows
 * whose global index {@code i} has {@code i % K == p}, in index order, so its local row {@code j}
 * is global row {@code p + j * K}. Python's reference (shards=K) uses the same rule.
 */
public final class Shard implements Serializable {
    private static final long serialVersionUID = 1L;

    final int partition;
    final int partitions;
    final long total;
    final int rows;
    final int xRowBytes;
    final int yRowBytes;
    final byte[] x;
    final byte[] y;

    Shard(int partition, int partitions, long total, int rows, int xRowBytes, int yRowBytes, byte[] x, byte[] y) {
        this.partition = partition;
        this.partitions = partitions;
        this.total = total;
        this.rows = rows;
        this.xRowBytes = xRowBytes;
        this.yRowBytes = yRowBytes;
        this.x = x;
        this.y = y;
    }

    /** @return the partition that holds global row {@code index} of {@code partitions} */
    static int partitionOf(long index, int partitions) {
        return (int) (index % partitions);
    }

    /** @return how many of {@code total} rows partition {@code p} of {@code partitions} holds */
    static int rowsOf(long total, int p, int partitions) {
        return (int) ((total - p + partitions - 1) / partitions);
    }

    /** @return SHA-256 of this shard's x bytes then y bytes */
    byte[] digest() {
        MessageDigest sha = Digests.sha256();
        sha.update(x);
        sha.update(y);
        return sha.digest();
    }
}
