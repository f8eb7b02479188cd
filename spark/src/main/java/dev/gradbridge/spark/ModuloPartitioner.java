package dev.gradbridge.spark;

import org.apache.spark.Partitioner;

/** Spark partitioner dealing rows round-robin by global index: row {@code i} goes to {@code i % K}. */
final class ModuloPartitioner extends Partitioner {
    private static final long serialVersionUID = 1L;
    private final int partitions;

    ModuloPartitioner(int partitions) {
        this.partitions = partitions;
    }

    @Override
    public int numPartitions() {
        return partitions;
    }

    @Override
    public int getPartition(Object key) {
        return Shard.partitionOf(((Number) key).longValue(), partitions);
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof ModuloPartitioner && ((ModuloPartitioner) other).partitions == partitions;
    }

    @Override
    public int hashCode() {
        return partitions;
    }
}
