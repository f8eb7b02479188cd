package dev.gradbridge.online;

import com.google.gson.Gson;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.Collections;
import java.util.Map;

/**
 * One record after the header. Payloads, little-endian, after the type byte:
 *
 * <ul>
 *   <li>{@code W}: {@code i64 bytes}: the frames after it that complete its write (one request's
 *       events and key, which follow it in the same write); read by {@link LogReader} for the
 *       framing, never returned as a record;
 *   <li>{@code E} {@link Event}: {@code i64 seq, u32 n, x bytes, u32 m, y bytes} (one sample);
 *   <li>{@code K} {@link Key}: {@code i64 first seq, u32 count, 32 bytes SHA-256 of the request's
 *       x and y bytes, UTF-8 key} (after the request's events, in the same write);
 *   <li>{@code B} {@link Batch}: {@code i64 index, i64 first seq, u32 count} (before it is applied);
 *   <li>{@code Q} {@link Quarantine}: {@code i64 index, i64 first seq, u32 count, UTF-8 reason}
 *       (after its {@code B}: the micro-batch was not applied and does not count as an update);
 *   <li>{@code V} {@link Version}: {@code i64 id, i64 updates, f64 loss}, UTF-8 JSON of the
 *       parameter digests;
 *   <li>{@code P} {@link Position}: {@code u16 n, UTF-8 source name (a Kafka topic), u32 ranges,
 *       each (i32 partition, i64 from, i64 to), u32 items, each (i32 partition, i64 offset, i64
 *       first seq, u32 count, u8 status)}: the source offsets {@code [from, to)} of each partition
 *       that the write it ends consumed, and what became of each source record (status {@link
 *       Position#LOGGED}, {@link Position#DUPLICATE} or {@link Position#REFUSED}); after that
 *       write's events and keys, in the same write (logs of earlier versions);
 *   <li>{@code S} {@link Position} too: the fields of {@code P}, then {@code i64 bytes}: the frames
 *       after it that complete its write (the events and keys), which follow it in the same write.
 *   <li>{@code G} {@link Gate}: {@code i64 version, i64 serving version, f64 version's gate loss, f64
 *       serving version's gate loss, u8 decision} ({@link Gate#PUBLISHED}, {@link Gate#HELD} or
 *       {@link Gate#ROLLED_BACK}); right after the version's {@code V};
 *   <li>{@code R} {@link Rollback}: {@code i64 version, i64 serving version before}: predictions
 *       returned to {@code version} (an operator's rollback).
 * </ul>
 */
abstract class LogRecord {

    private static final Gson GSON = new Gson();

    private final long offset;

    LogRecord(long offset) {
        this.offset = offset;
    }

    /** @return the record's frame offset in the file */
    long getOffset() {
        return offset;
    }

    static ByteBuffer payload(int size) {
        return ByteBuffer.allocate(size).order(ByteOrder.LITTLE_ENDIAN);
    }

    static byte[] event(long seq, byte[] x, byte[] y) {
        return payload(1 + 8 + 4 + x.length + 4 + y.length)
                .put(LogFormat.EVENT).putLong(seq).putInt(x.length).put(x).putInt(y.length).put(y).array();
    }

    static byte[] request(long following) {
        return payload(1 + 8).put(LogFormat.REQUEST).putLong(following).array();
    }

    static byte[] key(long firstSeq, int count, byte[] sha256, String key) {
        byte[] text = key.getBytes(StandardCharsets.UTF_8);
        return payload(1 + 8 + 4 + 32 + text.length)
                .put(LogFormat.KEY).putLong(firstSeq).putInt(count).put(sha256).put(text).array();
    }

    static byte[] batch(long index, long firstSeq, int count) {
        return payload(1 + 8 + 8 + 4).put(LogFormat.BATCH).putLong(index).putLong(firstSeq).putInt(count).array();
    }

    static byte[] quarantine(long index, long firstSeq, int count, String reason) {
        byte[] text = reason.getBytes(StandardCharsets.UTF_8);
        return payload(1 + 8 + 8 + 4 + text.length)
                .put(LogFormat.QUARANTINE).putLong(index).putLong(firstSeq).putInt(count).put(text).array();
    }

    static byte[] version(long id, long updates, double loss, Map<String, String> digests) {
        byte[] json = GSON.toJson(digests).getBytes(StandardCharsets.UTF_8);
        return payload(1 + 8 + 8 + 8 + json.length)
                .put(LogFormat.VERSION).putLong(id).putLong(updates).putDouble(loss).put(json).array();
    }

    static byte[] sourced(String source, long[][] ranges, long[][] items, long following) {
        byte[] name = source.getBytes(StandardCharsets.UTF_8);
        ByteBuffer p = payload(1 + 2 + name.length + 4 + ranges.length * 20 + 4 + items.length * 25 + 8)
                .put(LogFormat.SOURCED).putShort((short) name.length).put(name).putInt(ranges.length);
        for (long[] r : ranges) {
            p.putInt((int) r[0]).putLong(r[1]).putLong(r[2]);
        }
        p.putInt(items.length);
        for (long[] item : items) {
            p.putInt((int) item[0]).putLong(item[1]).putLong(item[2]).putInt((int) item[3]).put((byte) item[4]);
        }
        return p.putLong(following).array();
    }

    static byte[] gate(long version, long serving, double loss, double servingLoss, int decision) {
        return payload(1 + 8 + 8 + 8 + 8 + 1).put(LogFormat.GATE).putLong(version).putLong(serving).putDouble(loss)
                .putDouble(servingLoss).put((byte) decision).array();
    }

    static byte[] rollback(long version, long from) {
        return payload(1 + 8 + 8).put(LogFormat.ROLLBACK).putLong(version).putLong(from).array();
    }

    /** One feedback event: one sample's x and y bytes. */
    static final class Event extends LogRecord {
        private final long seq;
        private final byte[] x;
        private final byte[] y;

        Event(long offset, long seq, byte[] x, byte[] y) {
            super(offset);
            this.seq = seq;
            this.x = x;
            this.y = y;
        }

        /** @return the event's sequence number (arrival order) */
        long getSeq() {
            return seq;
        }

        /** @return x's little-endian bytes (shared: do not modify) */
        byte[] x() {
            return x;
        }

        /** @return y's little-endian bytes (shared: do not modify) */
        byte[] y() {
            return y;
        }
    }

    /** A request's idempotency key and the events it was answered with. */
    static final class Key extends LogRecord {
        private final long firstSeq;
        private final int count;
        private final byte[] sha256;
        private final String key;

        Key(long offset, long firstSeq, int count, byte[] sha256, String key) {
            super(offset);
            this.firstSeq = firstSeq;
            this.count = count;
            this.sha256 = sha256;
            this.key = key;
        }

        /** @return the request's first event */
        long getFirstSeq() {
            return firstSeq;
        }

        /** @return its number of events */
        int getCount() {
            return count;
        }

        /** @return SHA-256 of its x and y bytes (shared: do not modify) */
        byte[] sha256() {
            return sha256;
        }

        /** @return the key */
        String getKey() {
            return key;
        }
    }

    /** A micro-batch as applied: {@code count} events from {@code firstSeq}, one optimizer step. */
    static final class Batch extends LogRecord {
        private final long index;
        private final long firstSeq;
        private final int count;

        Batch(long offset, long index, long firstSeq, int count) {
            super(offset);
            this.index = index;
            this.firstSeq = firstSeq;
            this.count = count;
        }

        /** @return updates applied before it */
        long getIndex() {
            return index;
        }

        /** @return its first event */
        long getFirstSeq() {
            return firstSeq;
        }

        /** @return its number of events */
        int getCount() {
            return count;
        }
    }

    /** A micro-batch that was not applied: its loss or gradients were not finite, or the guard refused it. */
    static final class Quarantine extends LogRecord {
        private final long index;
        private final long firstSeq;
        private final int count;
        private final String reason;

        Quarantine(long offset, long index, long firstSeq, int count, String reason) {
            super(offset);
            this.index = index;
            this.firstSeq = firstSeq;
            this.count = count;
            this.reason = reason;
        }

        /** @return updates applied before it */
        long getIndex() {
            return index;
        }

        /** @return its first event */
        long getFirstSeq() {
            return firstSeq;
        }

        /** @return its number of events */
        int getCount() {
            return count;
        }

        /** @return why it was not applied */
        String getReason() {
            return reason;
        }
    }

    /** A published version: its id, the updates it includes and its parameters' digests. */
    static final class Version extends LogRecord {
        private final long id;
        private final long updates;
        private final double loss;
        private final Map<String, String> digests;

        Version(long offset, long id, long updates, double loss, Map<String, String> digests) {
            super(offset);
            this.id = id;
            this.updates = updates;
            this.loss = loss;
            this.digests = Collections.unmodifiableMap(digests);
        }

        /** @return the version id */
        long getId() {
            return id;
        }

        /** @return micro-batches applied in it */
        long getUpdates() {
            return updates;
        }

        /** @return the loss of its last micro-batch */
        double getLoss() {
            return loss;
        }

        /** @return parameter digests by name */
        Map<String, String> getDigests() {
            return digests;
        }
    }

    /**
     * Where the events of one write came from in an external source (a Kafka topic): for each
     * partition read, the offsets {@code [from, to)} consumed (every record in that range, control
     * records included, is accounted for), and per source record its events or why it gave none.
     */
    static final class Position extends LogRecord {
        /** The record's events were logged: {@code count} events from {@code firstSeq}. */
        static final int LOGGED = 0;
        /** The record's idempotency key was seen with the same content: its events are {@code count} from {@code firstSeq}. */
        static final int DUPLICATE = 1;
        /** The record was refused (not feedback this module takes): no events. */
        static final int REFUSED = 2;

        private final String source;
        private final long[][] ranges;
        private final long[][] items;
        private final long following;

        Position(long offset, String source, long[][] ranges, long[][] items, long following) {
            super(offset);
            this.source = source;
            this.ranges = ranges;
            this.items = items;
            this.following = following;
        }

        /**
         * @return bytes of the frames after this record that complete its write ({@code S}), or -1
         *     for a {@code P} record, which follows its events
         */
        long getFollowing() {
            return following;
        }

        /** @return the source's name (the topic) */
        String getSource() {
            return source;
        }

        /** @return each partition's range: {partition, from, to} (shared: do not modify) */
        long[][] ranges() {
            return ranges;
        }

        /** @return each source record: {partition, offset, first seq, count, status} (shared: do not modify) */
        long[][] items() {
            return items;
        }
    }

    /** A publish gate's decision on a version: published to predictors, or held back (and the learner rolled back). */
    static final class Gate extends LogRecord {
        /** The version was published. */
        static final int PUBLISHED = 0;
        /** The version was held back; training continued from it. */
        static final int HELD = 1;
        /** The version was held back and the learner returned to the serving version. */
        static final int ROLLED_BACK = 2;

        private final long version;
        private final long serving;
        private final double loss;
        private final double servingLoss;
        private final int decision;

        Gate(long offset, long version, long serving, double loss, double servingLoss, int decision) {
            super(offset);
            this.version = version;
            this.serving = serving;
            this.loss = loss;
            this.servingLoss = servingLoss;
            this.decision = decision;
        }

        /** @return the version decided on */
        long getVersion() {
            return version;
        }

        /** @return the version predictions used when it was decided */
        long getServing() {
            return serving;
        }

        /** @return the version's loss on the gate data */
        double getLoss() {
            return loss;
        }

        /** @return the serving version's loss on the gate data */
        double getServingLoss() {
            return servingLoss;
        }

        /** @return {@link #PUBLISHED}, {@link #HELD} or {@link #ROLLED_BACK} */
        int getDecision() {
            return decision;
        }
    }

    /** An operator's rollback: predictions returned to an earlier published version. */
    static final class Rollback extends LogRecord {
        private final long version;
        private final long from;

        Rollback(long offset, long version, long from) {
            super(offset);
            this.version = version;
            this.from = from;
        }

        /** @return the version predictions returned to */
        long getVersion() {
            return version;
        }

        /** @return the version they used before */
        long getFrom() {
            return from;
        }
    }
}
