package dev.gradbridge.online;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.zip.CRC32C;

/**
 * The write-ahead log's format ({@value #FILE_NAME}): its framing and record types, shared by the
 * log's reader and writer (package-private) and Python's {@code gradbridge.feedback_log}.
 *
 * <p>Every record is one frame, little-endian: {@code u32 length, u32 crc32c(payload), u32
 * crc32c(the 8 bytes before)}, then {@code length} payload bytes whose first byte is the record
 * type. The frame header checks itself, so a damaged length is never mistaken for a torn tail:
 * the only thing a reader may drop is an incomplete last frame (fewer than {@value #FRAME_HEADER}
 * bytes, or a valid frame header whose payload runs past the end of the file), or a last {@link
 * #SOURCED} or {@link #REQUEST} record whose write did not reach the file whole (with what is there
 * of that write). Anything else that does not check is corruption.
 */
public final class LogFormat {

    /** The log's file name inside the log folder. */
    public static final String FILE_NAME = "feedback.log";
    /** The header's {@code format} value. */
    public static final String FORMAT = "gradbridge-feedback-log";
    /** The header's {@code version} value. */
    public static final int FORMAT_VERSION = 2;
    /** Bytes before each payload. */
    public static final int FRAME_HEADER = 12;
    /** Longest payload a frame may declare. */
    public static final int MAX_PAYLOAD = 64 << 20;

    /** Record type: the header (first record), UTF-8 JSON. */
    public static final byte HEADER = 'H';
    /** Record type: one feedback event. */
    public static final byte EVENT = 'E';
    /**
     * Record type: the start of one request's write (a {@code learn} call, a {@code /feedback}
     * request): {@code i64} bytes of the frames after it that complete the write (the request's
     * events, then its key). A reader that finds fewer bytes than that before the end treats this
     * record and everything after it as a torn tail, so a request is in the log whole (events and
     * key) or not at all, as {@link #SOURCED} does for a read from a source. Logs of earlier versions
     * have none; their requests read as before.
     */
    public static final byte REQUEST = 'W';
    /** Record type: a request's idempotency key, after the request's events. */
    public static final byte KEY = 'K';
    /** Record type: a micro-batch, written before it is applied. */
    public static final byte BATCH = 'B';
    /** Record type: a micro-batch that was not applied, and why. */
    public static final byte QUARANTINE = 'Q';
    /** Record type: a published version. */
    public static final byte VERSION = 'V';
    /**
     * Record type: the positions in an external source (a Kafka topic's partitions) that the
     * events before it, in the same write, were read from. Only logs of earlier versions hold it;
     * they are read as before, but a write torn between its events and this record cannot be told
     * from a whole one, so the writer logs {@link #SOURCED} instead.
     */
    public static final byte POSITION = 'P';
    /**
     * Record type: a {@link #POSITION} record written <em>first</em> in its write, carrying the
     * bytes of the frames after it (the read's events and keys) that complete the write. A reader
     * that finds fewer bytes than that before the end treats this record and everything after it
     * as a torn tail, so a read from a source is in the log whole (events and offsets) or not at all.
     */
    public static final byte SOURCED = 'S';
    /**
     * Record type: a publish gate's decision on the version just logged (its loss and the serving
     * version's on the gate data, published or held back). Only logs of a gated learner hold it.
     */
    public static final byte GATE = 'G';
    /** Record type: predictions (and, under the rollback policy, the learner) returned to an earlier version. */
    public static final byte ROLLBACK = 'R';

    private LogFormat() {}

    /** @return CRC32C of {@code bytes[offset, offset + length)} as an unsigned 32-bit value in an int */
    static int crc(byte[] bytes, int offset, int length) {
        CRC32C crc = new CRC32C();
        crc.update(bytes, offset, length);
        return (int) crc.getValue();
    }

    /** Puts one frame around {@code payload} into {@code out} (little-endian). */
    static void putFrame(ByteBuffer out, byte[] payload) {
        byte[] head = new byte[8];
        ByteBuffer.wrap(head).order(ByteOrder.LITTLE_ENDIAN).putInt(payload.length).putInt(crc(payload, 0, payload.length));
        out.put(head).putInt(crc(head, 0, 8)).put(payload);
    }

    /** @return bytes of the frame around a payload of {@code payloadLength} bytes */
    static int frameLength(int payloadLength) {
        return FRAME_HEADER + payloadLength;
    }
}
