package dev.gradbridge.online;

import com.google.gson.Gson;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.zip.CRC32;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The write-ahead log of an {@link OnlineLearner}: one append-only file, {@value #FILE_NAME}, in
 * the log folder.
 *
 * <p>Every record is framed as {@code u32 length, u32 crc32(payload), payload}, little-endian. The
 * payload's first byte is its type:
 *
 * <ul>
 *   <li>{@code 'H'} header (first record): UTF-8 JSON with the format, the version cadence
 *       ({@code publish_every}) and the per-sample dtype and shape of x and y;
 *   <li>{@code 'E'} event: {@code i64 seq, u32 n, x bytes, u32 m, y bytes} (one sample);
 *   <li>{@code 'B'} micro-batch, written before it is applied: {@code i64 index, i64 first seq,
 *       u32 count};
 *   <li>{@code 'V'} version: {@code i64 id, i64 updates, f64 loss of the last micro-batch}, then
 *       UTF-8 JSON of the parameter digests ({@code dev.gradbridge.History#digest}).
 * </ul>
 *
 * <p>On open, a record that is cut short or fails its checksum ends the log: the file is
 * truncated there (a torn tail from a crash during an append), and {@link #getCutBytes()} says how
 * many bytes went. Python's {@code gradbridge.replay} reads the same format.
 */
public final class FeedbackLog implements AutoCloseable {

    /** The log's file name inside the log folder. */
    public static final String FILE_NAME = "feedback.log";
    /** The header's {@code format} value. */
    public static final String FORMAT = "gradbridge-feedback-log";
    /** The header's {@code version} value. */
    public static final int FORMAT_VERSION = 1;
    /** Payloads above this are treated as garbage (a torn or overwritten length). */
    static final int MAX_PAYLOAD = 64 << 20;

    static final byte HEADER = 'H';
    static final byte EVENT = 'E';
    static final byte BATCH = 'B';
    static final byte VERSION = 'V';

    private static final Logger logger = LoggerFactory.getLogger(FeedbackLog.class);
    private static final Gson GSON = new Gson();

    private final Path file;
    private final FileChannel channel;
    private final FsyncPolicy policy;
    private final Header header;
    private final long cutBytes;
    private final Object syncLock = new Object();
    private long end; // guarded by this
    private volatile long synced;

    private FeedbackLog(Path file, FileChannel channel, FsyncPolicy policy, Header header, long end, long cutBytes) {
        this.file = file;
        this.channel = channel;
        this.policy = policy;
        this.header = header;
        this.end = end;
        this.synced = end;
        this.cutBytes = cutBytes;
    }

    /**
     * Opens the log in {@code dir}, creating it with {@code header} when absent; an existing log
     * must have the same header, and a torn tail is cut.
     *
     * @param dir the log folder (created when missing)
     * @param header what the log holds
     * @param policy when appends are forced to disk
     * @return the open log, positioned at its end
     * @throws IOException when the folder cannot be written
     * @throws LogCorruptException when the file is not a feedback log or holds another header
     */
    public static FeedbackLog open(Path dir, Header header, FsyncPolicy policy) throws IOException {
        Files.createDirectories(dir);
        Path file = dir.resolve(FILE_NAME).toAbsolutePath();
        FileChannel channel =
                FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE);
        try {
            long size = channel.size();
            long valid = validLength(channel);
            long cut = size - valid;
            if (cut > 0) {
                logger.warn("{}: cut a torn tail of {} bytes at offset {}", file, cut, valid);
                channel.truncate(valid);
                channel.force(true);
            }
            if (valid == 0) {
                FeedbackLog log = new FeedbackLog(file, channel, policy, header, 0, cut);
                log.sync(log.append(frame(header.payload())));
                return log;
            }
            Header existing = readHeader(file, channel);
            if (!existing.equals(header)) {
                throw new LogCorruptException(
                        file + " was written for " + existing + ", not " + header
                                + "; use another log folder for another model or cadence");
            }
            channel.position(valid);
            return new FeedbackLog(file, channel, policy, header, valid, cut);
        } catch (IOException | RuntimeException e) {
            channel.close();
            throw e;
        }
    }

    /** @return the log file */
    public Path getFile() {
        return file;
    }

    /** @return the header */
    public Header getHeader() {
        return header;
    }

    /** @return bytes of a torn tail cut when the log was opened (0: none) */
    public long getCutBytes() {
        return cutBytes;
    }

    /** @return the offset just after the last appended record */
    public synchronized long end() {
        return end;
    }

    /**
     * Appends events (one sample each) as consecutive records; not yet forced.
     *
     * @param firstSeq the first event's sequence number
     * @param xRows x bytes of each event
     * @param yRows y bytes of each event, as many as {@code xRows}
     * @return each event's offset, then the end offset (one more element than events)
     * @throws IOException when the write fails
     */
    synchronized long[] appendEvents(long firstSeq, List<byte[]> xRows, List<byte[]> yRows) throws IOException {
        long[] offsets = new long[xRows.size() + 1];
        int total = 0;
        for (int i = 0; i < xRows.size(); i++) {
            total += 8 + 1 + 8 + 4 + xRows.get(i).length + 4 + yRows.get(i).length;
        }
        ByteBuffer frames = ByteBuffer.allocate(total).order(ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < xRows.size(); i++) {
            offsets[i] = end + frames.position();
            byte[] x = xRows.get(i);
            byte[] y = yRows.get(i);
            ByteBuffer payload = ByteBuffer.allocate(1 + 8 + 4 + x.length + 4 + y.length).order(ByteOrder.LITTLE_ENDIAN);
            payload.put(EVENT).putLong(firstSeq + i).putInt(x.length).put(x).putInt(y.length).put(y);
            putFrame(frames, payload.array());
        }
        frames.flip();
        offsets[xRows.size()] = append(frames);
        return offsets;
    }

    /**
     * Appends a micro-batch boundary (before the batch is applied).
     *
     * @param index the micro-batch's number, from 0
     * @param firstSeq its first event
     * @param count its number of events
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendBatch(long index, long firstSeq, int count) throws IOException {
        return appendBatches(index, firstSeq, count, 1);
    }

    /**
     * Appends consecutive micro-batch boundaries of {@code count} events each, in one write.
     *
     * @param firstIndex the first micro-batch's number
     * @param firstSeq its first event
     * @param count events per micro-batch
     * @param batches how many micro-batches
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendBatches(long firstIndex, long firstSeq, int count, int batches) throws IOException {
        int payloadSize = 1 + 8 + 8 + 4;
        ByteBuffer frames = ByteBuffer.allocate(batches * (8 + payloadSize)).order(ByteOrder.LITTLE_ENDIAN);
        ByteBuffer payload = ByteBuffer.allocate(payloadSize).order(ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < batches; i++) {
            payload.clear();
            payload.put(BATCH).putLong(firstIndex + i).putLong(firstSeq + (long) i * count).putInt(count);
            putFrame(frames, payload.array());
        }
        frames.flip();
        return append(frames);
    }

    /**
     * Appends a published version.
     *
     * @param version the version
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendVersion(ModelVersion version) throws IOException {
        byte[] json = GSON.toJson(version.getDigests()).getBytes(StandardCharsets.UTF_8);
        ByteBuffer payload = ByteBuffer.allocate(1 + 8 + 8 + 8 + json.length).order(ByteOrder.LITTLE_ENDIAN);
        payload.put(VERSION).putLong(version.getId()).putLong(version.getUpdates()).putDouble(version.getLoss()).put(json);
        return append(frame(payload.array()));
    }

    /**
     * Makes every record up to {@code offset} durable as the policy says: with {@link
     * FsyncPolicy#ALWAYS} one {@code fsync} covers every caller waiting for it.
     *
     * @param offset an end offset returned by an append
     * @throws IOException when the fsync fails
     */
    void sync(long offset) throws IOException {
        if (policy == FsyncPolicy.NEVER || synced >= offset) {
            return;
        }
        synchronized (syncLock) {
            if (synced >= offset) {
                return; // another caller's fsync covered this record
            }
            long target = end();
            channel.force(false);
            synced = target;
        }
    }

    private long append(ByteBuffer frames) throws IOException {
        while (frames.hasRemaining()) {
            end += channel.write(frames, end);
        }
        return end;
    }

    private static ByteBuffer frame(byte[] payload) {
        ByteBuffer frame = ByteBuffer.allocate(8 + payload.length).order(ByteOrder.LITTLE_ENDIAN);
        putFrame(frame, payload);
        frame.flip();
        return frame;
    }

    private static void putFrame(ByteBuffer out, byte[] payload) {
        CRC32 crc = new CRC32();
        crc.update(payload);
        out.putInt(payload.length).putInt((int) crc.getValue()).put(payload);
    }

    @Override
    public void close() throws IOException {
        synchronized (this) {
            if (!channel.isOpen()) {
                return;
            }
            if (policy == FsyncPolicy.ALWAYS) {
                channel.force(false);
            }
            channel.close();
        }
    }

    // ---- reading ----

    /** The length of the valid prefix: whole frames with good checksums. */
    private static long validLength(FileChannel channel) throws IOException {
        long offset = 0;
        for (Frame frame; (frame = readFrame(channel, offset)) != null; ) {
            offset = frame.next;
        }
        return offset;
    }

    private static final class Frame {
        final long offset;
        final long next;
        final ByteBuffer payload;

        Frame(long offset, long next, ByteBuffer payload) {
            this.offset = offset;
            this.next = next;
            this.payload = payload;
        }
    }

    /** The frame at {@code offset}, or null at the end or at a torn or corrupt frame. */
    private static Frame readFrame(FileChannel channel, long offset) throws IOException {
        ByteBuffer head = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
        if (!readFully(channel, head, offset)) {
            return null;
        }
        int length = head.getInt(0);
        int crc = head.getInt(4);
        if (length < 1 || length > MAX_PAYLOAD || offset + 8 + length > channel.size()) {
            return null;
        }
        ByteBuffer payload = ByteBuffer.allocate(length).order(ByteOrder.LITTLE_ENDIAN);
        if (!readFully(channel, payload, offset + 8)) {
            return null;
        }
        CRC32 check = new CRC32();
        check.update(payload.array());
        if ((int) check.getValue() != crc) {
            return null;
        }
        payload.rewind();
        return new Frame(offset, offset + 8 + length, payload);
    }

    private static boolean readFully(FileChannel channel, ByteBuffer buffer, long offset) throws IOException {
        while (buffer.hasRemaining()) {
            int read = channel.read(buffer, offset + buffer.position());
            if (read < 0) {
                return false;
            }
        }
        return true;
    }

    private static Header readHeader(Path file, FileChannel channel) throws IOException {
        Frame first = readFrame(channel, 0);
        if (first == null || first.payload.get(0) != HEADER) {
            throw new LogCorruptException(file + " is not a gradbridge feedback log (no header record)");
        }
        return Header.parse(file, first.payload);
    }

    /**
     * Reads every whole record from {@code offset} to the end of the valid prefix (a torn tail is
     * ignored, not cut: the file may be open for writing elsewhere).
     *
     * @param dir the log folder
     * @param offset where to start: 0 or a record boundary (e.g. a checkpoint's log offset)
     * @return the header and the records after {@code offset}, in file order
     * @throws IOException when the file cannot be read
     * @throws LogCorruptException when it is not a feedback log or a record is malformed
     */
    public static Contents read(Path dir, long offset) throws IOException {
        Path file = dir.resolve(FILE_NAME).toAbsolutePath();
        if (!Files.isRegularFile(file)) {
            throw new LogCorruptException("no feedback log at " + file);
        }
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
            Header header = readHeader(file, channel);
            List<Record> records = new ArrayList<>();
            long position = offset == 0 ? readFrame(channel, 0).next : offset;
            for (Frame frame; (frame = readFrame(channel, position)) != null; ) {
                records.add(Record.parse(file, frame));
                position = frame.next;
            }
            return new Contents(header, records, position, channel.size() - position);
        }
    }

    /** The records of a log read with {@link #read}. */
    public static final class Contents {
        private final Header header;
        private final List<Record> records;
        private final long end;
        private final long tornBytes;

        Contents(Header header, List<Record> records, long end, long tornBytes) {
            this.header = header;
            this.records = Collections.unmodifiableList(records);
            this.end = end;
            this.tornBytes = tornBytes;
        }

        /** @return the header */
        public Header getHeader() {
            return header;
        }

        /** @return the records in file order */
        public List<Record> getRecords() {
            return records;
        }

        /** @return the offset after the last whole record */
        public long getEnd() {
            return end;
        }

        /** @return bytes after the last whole record (a torn tail) */
        public long getTornBytes() {
            return tornBytes;
        }
    }

    /** One record: {@link Event}, {@link Batch} or {@link Version}. */
    public abstract static class Record {
        private final long offset;
        private final long next;

        Record(long offset, long next) {
            this.offset = offset;
            this.next = next;
        }

        /** @return the record's offset in the file */
        public long getOffset() {
            return offset;
        }

        /** @return the offset just after it */
        public long getNext() {
            return next;
        }

        static Record parse(Path file, Frame frame) {
            ByteBuffer p = frame.payload;
            try {
                byte type = p.get();
                switch (type) {
                    case EVENT: {
                        long seq = p.getLong();
                        byte[] x = new byte[p.getInt()];
                        p.get(x);
                        byte[] y = new byte[p.getInt()];
                        p.get(y);
                        return new Event(frame.offset, frame.next, seq, x, y);
                    }
                    case BATCH:
                        return new Batch(frame.offset, frame.next, p.getLong(), p.getLong(), p.getInt());
                    case VERSION: {
                        long id = p.getLong();
                        long updates = p.getLong();
                        double loss = p.getDouble();
                        byte[] json = new byte[p.remaining()];
                        p.get(json);
                        Map<String, String> digests = new LinkedHashMap<>();
                        JsonObject object = GSON.fromJson(new String(json, StandardCharsets.UTF_8), JsonObject.class);
                        object.entrySet().forEach(e -> digests.put(e.getKey(), e.getValue().getAsString()));
                        return new Version(frame.offset, frame.next, id, updates, loss, digests);
                    }
                    default:
                        throw new LogCorruptException(
                                file + ": record at offset " + frame.offset + " has unknown type " + type);
                }
            } catch (RuntimeException e) {
                if (e instanceof LogCorruptException) {
                    throw e;
                }
                throw new LogCorruptException(
                        file + ": record at offset " + frame.offset + " is malformed (" + e + ")");
            }
        }
    }

    /** One feedback event: one sample's x and y bytes. */
    public static final class Event extends Record {
        private final long seq;
        private final byte[] x;
        private final byte[] y;

        Event(long offset, long next, long seq, byte[] x, byte[] y) {
            super(offset, next);
            this.seq = seq;
            this.x = x;
            this.y = y;
        }

        /** @return the event's sequence number (arrival order, from 0) */
        public long getSeq() {
            return seq;
        }

        /** @return x's little-endian bytes (a copy) */
        public byte[] getX() {
            return x.clone();
        }

        /** @return y's little-endian bytes (a copy) */
        public byte[] getY() {
            return y.clone();
        }

        byte[] x() {
            return x;
        }

        byte[] y() {
            return y;
        }
    }

    /** A micro-batch as applied: {@code count} events from {@code firstSeq}, one optimizer step. */
    public static final class Batch extends Record {
        private final long index;
        private final long firstSeq;
        private final int count;

        Batch(long offset, long next, long index, long firstSeq, int count) {
            super(offset, next);
            this.index = index;
            this.firstSeq = firstSeq;
            this.count = count;
        }

        /** @return the micro-batch's number (= updates before it) */
        public long getIndex() {
            return index;
        }

        /** @return its first event */
        public long getFirstSeq() {
            return firstSeq;
        }

        /** @return its number of events */
        public int getCount() {
            return count;
        }
    }

    /** A published version: its id, the updates it includes and its parameters' digests. */
    public static final class Version extends Record {
        private final long id;
        private final long updates;
        private final double loss;
        private final Map<String, String> digests;

        Version(long offset, long next, long id, long updates, double loss, Map<String, String> digests) {
            super(offset, next);
            this.id = id;
            this.updates = updates;
            this.loss = loss;
            this.digests = Collections.unmodifiableMap(digests);
        }

        /** @return the version id */
        public long getId() {
            return id;
        }

        /** @return micro-batches applied in it */
        public long getUpdates() {
            return updates;
        }

        /** @return the loss of its last micro-batch */
        public double getLoss() {
            return loss;
        }

        /** @return parameter digests by name */
        public Map<String, String> getDigests() {
            return digests;
        }
    }

    /** The log's header: what it holds and the version cadence. */
    public static final class Header {
        private final String model;
        private final int publishEvery;
        private final String xDtype;
        private final long[] xShape;
        private final String yDtype;
        private final long[] yShape;

        /**
         * Creates a header.
         *
         * @param model the model's name (metadata {@code model})
         * @param publishEvery a version every this many updates
         * @param xDtype x's dtype
         * @param xShape one sample's x shape (without the batch dimension)
         * @param yDtype y's dtype
         * @param yShape one sample's y shape (without the batch dimension)
         */
        public Header(String model, int publishEvery, String xDtype, long[] xShape, String yDtype, long[] yShape) {
            this.model = model;
            this.publishEvery = publishEvery;
            this.xDtype = xDtype;
            this.xShape = xShape.clone();
            this.yDtype = yDtype;
            this.yShape = yShape.clone();
        }

        /** @return the model's name */
        public String getModel() {
            return model;
        }

        /** @return a version every this many updates */
        public int getPublishEvery() {
            return publishEvery;
        }

        /** @return x's dtype */
        public String getXDtype() {
            return xDtype;
        }

        /** @return one sample's x shape */
        public long[] getXShape() {
            return xShape.clone();
        }

        /** @return y's dtype */
        public String getYDtype() {
            return yDtype;
        }

        /** @return one sample's y shape */
        public long[] getYShape() {
            return yShape.clone();
        }

        String toJson() {
            JsonObject json = new JsonObject();
            json.addProperty("format", FORMAT);
            json.addProperty("version", FORMAT_VERSION);
            json.addProperty("model", model);
            json.addProperty("publish_every", publishEvery);
            json.add("x", spec(xDtype, xShape));
            json.add("y", spec(yDtype, yShape));
            return GSON.toJson(json);
        }

        private static JsonObject spec(String dtype, long[] shape) {
            JsonObject spec = new JsonObject();
            spec.addProperty("dtype", dtype);
            spec.add("shape", GSON.toJsonTree(shape));
            return spec;
        }

        byte[] payload() {
            byte[] json = toJson().getBytes(StandardCharsets.UTF_8);
            byte[] payload = new byte[json.length + 1];
            payload[0] = HEADER;
            System.arraycopy(json, 0, payload, 1, json.length);
            return payload;
        }

        static Header parse(Path file, ByteBuffer payload) {
            try {
                String text = new String(payload.array(), 1, payload.limit() - 1, StandardCharsets.UTF_8);
                JsonObject json = GSON.fromJson(text, JsonObject.class);
                if (!FORMAT.equals(json.get("format").getAsString())
                        || json.get("version").getAsInt() != FORMAT_VERSION) {
                    throw new LogCorruptException(file + " has format " + json.get("format") + " version "
                            + json.get("version") + "; expected " + FORMAT + " version " + FORMAT_VERSION);
                }
                JsonObject x = json.getAsJsonObject("x");
                JsonObject y = json.getAsJsonObject("y");
                return new Header(json.get("model").getAsString(), json.get("publish_every").getAsInt(),
                        x.get("dtype").getAsString(), GSON.fromJson(x.get("shape"), long[].class),
                        y.get("dtype").getAsString(), GSON.fromJson(y.get("shape"), long[].class));
            } catch (JsonParseException | NullPointerException | IllegalStateException | ClassCastException e) {
                throw new LogCorruptException(file + ": the header record is not valid (" + e.getMessage() + ")");
            }
        }

        @Override
        public boolean equals(Object other) {
            return other instanceof Header && toJson().equals(((Header) other).toJson());
        }

        @Override
        public int hashCode() {
            return toJson().hashCode();
        }

        @Override
        public String toString() {
            return toJson();
        }
    }
}
