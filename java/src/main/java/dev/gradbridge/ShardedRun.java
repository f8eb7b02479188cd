package dev.gradbridge;

/**
 * What a replay of a data-parallel run needs besides its thread count (the history's {@code "sharded"} key,
 * the same in every record of the run): {@code reference.train_sharded} and {@code gradbridge parity
 * --spark-history} take their settings from it.
 */
public final class ShardedRun {
    private final int partitions;
    private final int batchSize;
    private final long seed;
    private final boolean shuffle;
    private final String rule;
    private final String shardsSha256;

    /**
     * @param partitions the run's partitions (K)
     * @param batchSize its global mini-batch
     * @param seed its seed (shuffling and each step's draws)
     * @param shuffle whether each epoch shuffles the rows
     * @param rule how a step combines the partitions ({@link Protocol#SHARDED_RULE})
     * @param shardsSha256 the partitions' digest of the data (a checkpoint's {@code shards_sha256})
     */
    public ShardedRun(int partitions, int batchSize, long seed, boolean shuffle, String rule, String shardsSha256) {
        this.partitions = partitions;
        this.batchSize = batchSize;
        this.seed = seed;
        this.shuffle = shuffle;
        this.rule = rule;
        this.shardsSha256 = shardsSha256;
    }

    /** @return the run's partitions */
    public int getPartitions() {
        return partitions;
    }

    /** @return the run's global mini-batch */
    public int getBatchSize() {
        return batchSize;
    }

    /** @return the run's seed */
    public long getSeed() {
        return seed;
    }

    /** @return whether each epoch shuffled the rows */
    public boolean isShuffle() {
        return shuffle;
    }

    /** @return how a step combined the partitions */
    public String getRule() {
        return rule;
    }

    /** @return the partitions' digest of the data */
    public String getShardsSha256() {
        return shardsSha256;
    }
}
