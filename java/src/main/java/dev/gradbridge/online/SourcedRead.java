package dev.gradbridge.online;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * One read of an external source on its way into the log, as {@link FeedbackQueue#offerSourced}
 * writes it under the queue's lock: the offset ranges it consumed, checked to continue the log's
 * positions, and its records sorted into events to log, duplicates of a known key and refusals.
 */
final class SourcedRead {

    /** One record of an external source, checked: its rows, or why it gives none. */
    static final class Item {
        final int partition;
        final long offset;
        final String key; // null: none
        final byte[] sha256; // with a key
        final List<byte[]> xRows; // null: refused
        final List<byte[]> yRows;
        final String refusal; // null unless refused

        Item(int partition, long offset, String key, byte[] sha256, List<byte[]> xRows, List<byte[]> yRows,
                String refusal) {
            this.partition = partition;
            this.offset = offset;
            this.key = key;
            this.sha256 = sha256;
            this.xRows = xRows;
            this.yRows = yRows;
            this.refusal = refusal;
        }

        int rows() {
            return xRows == null ? 0 : xRows.size();
        }
    }

    /** What {@link FeedbackQueue#offerSourced} did. */
    static final class Result {
        long end;
        long logged; // events
        long duplicates; // events answered from earlier keys
        final List<String> refusals = new ArrayList<>(); // "partition/offset: reason"
    }

    private final String source;
    private final List<Item> items;
    private final Map<Integer, long[]> ranges; // partition -> {from, to}
    /** The events to log, in order, each record's rows after the last's. */
    final List<byte[]> xRows = new ArrayList<>();
    final List<byte[]> yRows = new ArrayList<>();
    /** The keys of the records logged, and the same by key (their log end not known yet). */
    final List<LogWriter.KeyEntry> keyEntries = new ArrayList<>();
    final Map<String, FeedbackQueue.Key> fresh = new HashMap<>();
    /** Per record: {partition, offset, first seq or -1, count, LogRecord.Position status}. */
    long[][] logged;

    SourcedRead(String source, List<Item> items, Map<Integer, long[]> ranges) {
        this.source = source;
        this.items = items;
        this.ranges = ranges;
    }

    /**
     * @param known partition -> the next offset the log holds for this source
     * @return the rows of the records that carry any
     * @throws IllegalArgumentException when a range does not continue the logged position or an
     *     item lies outside its partition's range or out of order
     */
    int check(Map<Integer, Long> known) {
        Map<Integer, Long> next = new HashMap<>();
        for (Map.Entry<Integer, long[]> range : ranges.entrySet()) {
            Long at = known.get(range.getKey());
            long[] r = range.getValue();
            if ((at != null && at != r[0]) || r[1] < r[0]) {
                throw new IllegalArgumentException(source + " partition " + range.getKey() + ": offsets " + r[0] + ".." + r[1]
                        + " do not continue the logged position " + at + " (a gap or an overlap); nothing was logged");
            }
            next.put(range.getKey(), r[0]);
        }
        int rows = 0;
        for (Item item : items) {
            long[] r = ranges.get(item.partition);
            Long expected = next.get(item.partition);
            if (r == null || item.offset < expected || item.offset >= r[1]) {
                throw new IllegalArgumentException(source + " partition " + item.partition + " offset " + item.offset
                        + " is outside the range read or out of order; nothing was logged");
            }
            next.put(item.partition, item.offset + 1);
            rows += item.rows();
        }
        return rows;
    }

    /**
     * Sorts the records: refused (their own refusal, or a key that came with other feedback), a
     * duplicate of a key seen before (in the log or earlier in this read), or events numbered from
     * {@code first}; fills {@link #logged}, the rows and keys to write, and the result's duplicates
     * and refusals.
     *
     * @param keys the keys the log holds
     * @return the sequence number after the last event
     */
    long sort(long first, Map<String, FeedbackQueue.Key> keys, Result result) {
        long seq = first;
        logged = new long[items.size()][];
        for (int i = 0; i < items.size(); i++) {
            Item item = items.get(i);
            String refusal = item.refusal;
            FeedbackQueue.Key seen = item.key == null || refusal != null ? null
                    : fresh.containsKey(item.key) ? fresh.get(item.key) : keys.get(item.key);
            if (seen != null && (!Arrays.equals(seen.sha256, item.sha256) || seen.count != item.rows())) {
                refusal = "idempotency key '" + item.key + "' was used for another request (events " + seen.firstSeq + ".."
                        + (seen.firstSeq + seen.count - 1) + ")";
            }
            if (refusal != null) {
                logged[i] = new long[] {item.partition, item.offset, -1, 0, LogRecord.Position.REFUSED};
                result.refusals.add(item.partition + "/" + item.offset + ": " + refusal);
            } else if (seen != null) {
                logged[i] = new long[] {item.partition, item.offset, seen.firstSeq, seen.count, LogRecord.Position.DUPLICATE};
                result.duplicates += seen.count;
            } else {
                logged[i] = new long[] {item.partition, item.offset, seq, item.rows(), LogRecord.Position.LOGGED};
                if (item.key != null) {
                    fresh.put(item.key, new FeedbackQueue.Key(seq, item.rows(), item.sha256, 0));
                    keyEntries.add(new LogWriter.KeyEntry(seq, item.rows(), item.sha256, item.key));
                }
                xRows.addAll(item.xRows);
                yRows.addAll(item.yRows);
                seq += item.rows();
            }
        }
        return seq;
    }

    /** @return the ranges as {partition, from, to}, by partition */
    long[][] rangeList() {
        long[][] list = new long[ranges.size()][];
        int r = 0;
        for (Map.Entry<Integer, long[]> range : new TreeMap<>(ranges).entrySet()) {
            list[r++] = new long[] {range.getKey(), range.getValue()[0], range.getValue()[1]};
        }
        return list;
    }
}
