package dev.gradbridge.online;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * Reads a log strictly: every frame must check, except an incomplete last frame or a last {@code
 * S} or {@code W} record whose write is not all in the file (a torn tail, reported in {@link
 * Contents#getTornBytes()}, never cut here). Anything else throws {@link LogCorruptException}
 * naming the file and the frame's offset.
 */
final class LogReader {

    private LogReader() {}

    /**
     * Reads the log file at {@code file}.
     *
     * @param file a {@value LogFormat#FILE_NAME}
     * @param keepFrom events, batches and quarantines before this offset are checked but not kept
     *     (keys, versions, gate decisions, source positions and rollbacks are always kept)
     * @return the header (null for an empty file) and the records
     * @throws IOException when the file cannot be read
     * @throws LogCorruptException when a frame before the end does not check
     */
    static Contents read(Path file, long keepFrom) throws IOException {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
            return read(file, channel, keepFrom);
        }
    }

    /**
     * Reads the log from an open channel (see {@link #read(Path, long)}).
     *
     * @param file the file's path, for messages
     * @param channel the file, readable
     * @param keepFrom as for {@link #read(Path, long)}
     * @return the contents
     * @throws IOException when the file cannot be read
     */
    static Contents read(Path file, FileChannel channel, long keepFrom) throws IOException {
        String where = file.toAbsolutePath().toString();
        long size = channel.size();
        long offset = 0;
        LogHeader header = null;
        List<LogRecord> records = new ArrayList<>();
        ByteBuffer head = ByteBuffer.allocate(LogFormat.FRAME_HEADER).order(ByteOrder.LITTLE_ENDIAN);
        long writeStart = -1; // the last S or W record, which begins a write
        long writeEnd = -1; // the end of its write, while reading inside it
        while (offset < size) {
            if (offset < writeEnd && writeEnd - offset < LogFormat.FRAME_HEADER) {
                throw insideFrame(where, offset, writeStart, writeEnd);
            }
            if (size - offset < LogFormat.FRAME_HEADER) {
                break; // torn: the frame header itself is incomplete
            }
            head.clear();
            readFully(channel, head, offset);
            int length = frameLength(where, offset, head);
            if (offset < writeEnd && offset + LogFormat.FRAME_HEADER + length > writeEnd) {
                throw insideFrame(where, offset, writeStart, writeEnd);
            }
            if (offset + LogFormat.FRAME_HEADER + length > size) {
                break; // torn: a whole frame header whose payload was not all written
            }
            ByteBuffer payload = ByteBuffer.allocate(length);
            readFully(channel, payload, offset + LogFormat.FRAME_HEADER);
            byte[] bytes = payload.array();
            if (LogFormat.crc(bytes, 0, length) != head.getInt(4)) {
                throw new LogCorruptException(where + ": offset " + offset + ": the record's checksum does not match");
            }
            if (offset == 0) {
                header = LogHeader.parse(where, bytes);
            } else {
                byte type = bytes[0];
                if (type == LogFormat.HEADER) {
                    throw new LogCorruptException(where + ": offset " + offset + ": a second header record");
                }
                if (type == LogFormat.SOURCED || type == LogFormat.REQUEST) {
                    LogRecord.Position read = type == LogFormat.SOURCED
                            ? (LogRecord.Position) RecordParser.parse(where, offset, bytes) : null;
                    long end = offset + LogFormat.FRAME_HEADER + length
                            + (read != null ? read.getFollowing() : RecordParser.requestFollowing(where, offset, bytes));
                    if (end > size) {
                        break; // torn: the write that this record begins did not reach the file whole
                    }
                    writeStart = offset;
                    writeEnd = end;
                    if (read != null) {
                        records.add(read);
                    }
                } else if (offset >= keepFrom || type == LogFormat.KEY || type == LogFormat.VERSION
                        || type == LogFormat.POSITION || type == LogFormat.GATE || type == LogFormat.ROLLBACK) {
                    records.add(RecordParser.parse(where, offset, bytes));
                }
            }
            offset += LogFormat.FRAME_HEADER + length;
        }
        return new Contents(file, header, records, offset, size - offset);
    }

    /** A whole frame header's payload length, once its checksum and range hold (at offset 0: the log's header). */
    private static int frameLength(String where, long offset, ByteBuffer head) {
        byte[] h = head.array();
        if (offset == 0 && (LogFormat.crc(h, 0, 8) != head.getInt(8) || head.getInt(0) < 1 || head.getInt(0) > LogFormat.MAX_PAYLOAD)) {
            throw new LogCorruptException(where + " is not a gradbridge feedback log (no header record)");
        }
        if (LogFormat.crc(h, 0, 8) != head.getInt(8)) {
            throw new LogCorruptException(where + ": offset " + offset + ": the frame header's checksum does not match"
                    + " (damaged, not a torn tail)");
        }
        int length = head.getInt(0);
        if (length < 1 || length > LogFormat.MAX_PAYLOAD) {
            throw new LogCorruptException(where + ": offset " + offset + ": frame length " + Integer.toUnsignedString(length)
                    + " is outside 1.." + LogFormat.MAX_PAYLOAD);
        }
        return length;
    }

    private static LogCorruptException insideFrame(String where, long offset, long writeStart, long writeEnd) {
        return new LogCorruptException(where + ": offset " + offset + ": the write that the record at offset " + writeStart
                + " begins ends inside this frame (at offset " + writeEnd + "; damaged, not a torn tail)");
    }

    private static void readFully(FileChannel channel, ByteBuffer buffer, long offset) throws IOException {
        while (buffer.hasRemaining()) {
            if (channel.read(buffer, offset + buffer.position()) < 0) {
                throw new IOException("unexpected end of " + channel);
            }
        }
    }

    /**
     * @param dir a log folder
     * @return its log file
     */
    static Path file(Path dir) {
        return dir.resolve(LogFormat.FILE_NAME).toAbsolutePath();
    }

    /**
     * @param dir a log folder
     * @return whether it holds a log file
     */
    static boolean exists(Path dir) {
        return Files.isRegularFile(file(dir));
    }

    /** What {@link #read} found. */
    static final class Contents {
        private final Path file;
        private final LogHeader header;
        private final List<LogRecord> records;
        private final long end;
        private final long tornBytes;

        Contents(Path file, LogHeader header, List<LogRecord> records, long end, long tornBytes) {
            this.file = file;
            this.header = header;
            this.records = Collections.unmodifiableList(records);
            this.end = end;
            this.tornBytes = tornBytes;
        }

        /** @return the file read */
        Path getFile() {
            return file;
        }

        /** @return the header, or null when the file holds no whole frame */
        LogHeader getHeader() {
            return header;
        }

        /** @return the records kept, in file order */
        List<LogRecord> getRecords() {
            return records;
        }

        /** @return the offset after the last whole frame */
        long getEnd() {
            return end;
        }

        /** @return bytes of an incomplete last frame (0: none) */
        long getTornBytes() {
            return tornBytes;
        }
    }
}
