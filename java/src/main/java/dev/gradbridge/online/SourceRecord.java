package dev.gradbridge.online;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * One record of an external feedback source (a Kafka topic's record) for {@link
 * OnlineLearner#learnFromSource}: where it sits in the source, its idempotency key, and its
 * feedback, or why it holds none that the module takes (a record that does not decode).
 */
public final class SourceRecord {
    final int partition;
    final long offset;
    final String key;
    final Map<String, HostTensor> x; // by input name ({x: tensor} for a module of one input)
    final HostTensor y;
    final String refusal;

    private SourceRecord(int partition, long offset, String key, Map<String, HostTensor> x, HostTensor y, String refusal) {
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
        return new SourceRecord(partition, offset, key, Collections.singletonMap("x", x), y, null);
    }

    /**
     * @param partition the record's partition
     * @param offset its offset in the partition
     * @param key its idempotency key, or null
     * @param x each of the module's inputs by name, batch dimension first (one event per row)
     * @param y targets
     * @return a record of feedback for a module of several inputs (checked like {@link OnlineLearner#learn})
     */
    public static SourceRecord feedback(int partition, long offset, String key, Map<String, HostTensor> x, HostTensor y) {
        return new SourceRecord(partition, offset, key, new LinkedHashMap<>(x), y, null);
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
