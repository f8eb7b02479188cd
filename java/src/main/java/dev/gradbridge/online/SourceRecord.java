package dev.gradbridge.online;

/**
 * One record of an external feedback source (a Kafka topic's record) for {@link
 * OnlineLearner#learnFromSource}: where it sits in the source, its idempotency key, and its
 * feedback, or why it holds none that the module takes (a record that does not decode).
 */
public final class SourceRecord {
    final int partition;
    final long offset;
    final String key;
    final HostTensor x;
    final HostTensor y;
    final String refusal;

    private SourceRecord(int partition, long offset, String key, HostTensor x, HostTensor y, String refusal) {
        if (partition < 0 || offset < 0) {
            throw new IllegalArgumentException("a source record's partition and offset are >= 0, got " + partition + "/" + offset);
        }
        this.partition = partition;
        this.offset = offset;
        this.key = key;
        this.x = x;
        this.y = y;
        this.refusal = refusal;
    }

    /**
     * @param partition the record's partition
     * @param offset its offset in the partition
     * @param key its idempotency key, or null
     * @param x inputs, batch dimension first (one event per row)
     * @param y targets
     * @return a record of feedback (checked by the learner like {@link OnlineLearner#learn})
     */
    public static SourceRecord feedback(int partition, long offset, String key, HostTensor x, HostTensor y) {
        return new SourceRecord(partition, offset, key, x, y, null);
    }

    /**
     * @param partition the record's partition
     * @param offset its offset in the partition
     * @param reason why it holds no feedback (e.g. its value is not JSON)
     * @return a record that is logged as refused: its offset is consumed, nothing is learned
     */
    public static SourceRecord refused(int partition, long offset, String reason) {
        return new SourceRecord(partition, offset, null, null, null, reason);
    }

    /** @return the record's partition */
    public int getPartition() {
        return partition;
    }

    /** @return its offset */
    public long getOffset() {
        return offset;
    }
}
