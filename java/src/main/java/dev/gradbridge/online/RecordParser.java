package dev.gradbridge.online;

import com.google.gson.Gson;
import com.google.gson.JsonObject;
import java.nio.BufferUnderflowException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A record's checked payload parsed back into a {@link LogRecord} ({@link LogReader} reads the frames and
 * checks their CRC first): a payload whose fields do not add up to its length is corruption, one line naming
 * the file and offset. Apart from the record types, which {@link LogRecord} documents field by field.
 */
final class RecordParser {

    private static final Gson GSON = new Gson();

    private RecordParser() {}

    /** The bytes a checked {@code W} payload says complete its write; one that does not parse is corruption. */
    static long requestFollowing(String file, long offset, byte[] bytes) {
        long following = bytes.length == 9 ? ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN).getLong(1) : -1;
        if (following < 0) {
            throw new LogCorruptException(file + ": offset " + offset + ": the record's fields do not add up to its length");
        }
        return following;
    }

    /** Parses a checked payload; a payload that does not parse is corruption (its checksum held). */
    static LogRecord parse(String file, long offset, byte[] bytes) {
        ByteBuffer p = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN);
        try {
            byte type = p.get();
            switch (type) {
                case LogFormat.EVENT: {
                    long seq = p.getLong();
                    byte[] x = new byte[p.getInt()];
                    p.get(x);
                    byte[] y = new byte[p.getInt()];
                    p.get(y);
                    end(p);
                    return new LogRecord.Event(offset, seq, x, y);
                }
                case LogFormat.KEY: {
                    long first = p.getLong();
                    int count = p.getInt();
                    byte[] sha = new byte[32];
                    p.get(sha);
                    return new LogRecord.Key(offset, first, count, sha, rest(p));
                }
                case LogFormat.BATCH: {
                    LogRecord.Batch batch = new LogRecord.Batch(offset, p.getLong(), p.getLong(), p.getInt());
                    end(p);
                    return batch;
                }
                case LogFormat.QUARANTINE:
                    return new LogRecord.Quarantine(offset, p.getLong(), p.getLong(), p.getInt(), rest(p));
                case LogFormat.VERSION:
                    return version(offset, p);
                case LogFormat.POSITION:
                case LogFormat.SOURCED:
                    return position(offset, p, type);
                case LogFormat.GATE: {
                    LogRecord.Gate gate = new LogRecord.Gate(offset, p.getLong(), p.getLong(), p.getDouble(), p.getDouble(), p.get());
                    end(p);
                    if (gate.getDecision() < LogRecord.Gate.PUBLISHED || gate.getDecision() > LogRecord.Gate.ROLLED_BACK) {
                        throw new BufferUnderflowException();
                    }
                    return gate;
                }
                case LogFormat.ROLLBACK: {
                    LogRecord.Rollback rollback = new LogRecord.Rollback(offset, p.getLong(), p.getLong());
                    end(p);
                    return rollback;
                }
                default:
                    throw new LogCorruptException(file + ": offset " + offset + ": unknown record type " + (type & 0xff));
            }
        } catch (LogCorruptException e) {
            throw e;
        } catch (RuntimeException e) {
            throw new LogCorruptException(file + ": offset " + offset + ": the record's fields do not add up to its length");
        }
    }

    /** A {@code V} record's fields after its type byte. */
    private static LogRecord.Version version(long offset, ByteBuffer p) {
        long id = p.getLong();
        long updates = p.getLong();
        double loss = p.getDouble();
        Map<String, String> digests = new LinkedHashMap<>();
        GSON.fromJson(rest(p), JsonObject.class).entrySet()
                .forEach(e -> digests.put(e.getKey(), e.getValue().getAsString()));
        return new LogRecord.Version(offset, id, updates, loss, digests);
    }

    /** A {@code P} or {@code S} record's fields after its type byte ({@code S}: then the bytes that follow). */
    private static LogRecord.Position position(long offset, ByteBuffer p, byte type) {
        byte[] name = new byte[p.getShort() & 0xffff];
        p.get(name);
        long[][] ranges = new long[checkedCount(p, 20)][];
        for (int i = 0; i < ranges.length; i++) {
            ranges[i] = new long[] {p.getInt(), p.getLong(), p.getLong()};
        }
        long[][] items = new long[checkedCount(p, 25)][];
        for (int i = 0; i < items.length; i++) {
            items[i] = new long[] {p.getInt(), p.getLong(), p.getLong(), p.getInt() & 0xffffffffL, p.get()};
        }
        long following = -1;
        if (type == LogFormat.SOURCED) {
            following = p.getLong();
            if (following < 0) {
                throw new BufferUnderflowException();
            }
        }
        end(p);
        return new LogRecord.Position(offset, new String(name, StandardCharsets.UTF_8), ranges, items, following);
    }

    /** A count of fixed-size entries that must fit in what is left. */
    private static int checkedCount(ByteBuffer p, int entryBytes) {
        int count = p.getInt();
        if (count < 0 || (long) count * entryBytes > p.remaining()) {
            throw new BufferUnderflowException();
        }
        return count;
    }

    private static void end(ByteBuffer p) {
        if (p.hasRemaining()) {
            throw new BufferUnderflowException();
        }
    }

    private static String rest(ByteBuffer p) {
        byte[] text = new byte[p.remaining()];
        p.get(text);
        return new String(text, StandardCharsets.UTF_8);
    }
}
