package dev.gradbridge.online;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.GradbridgeException;
import java.io.RandomAccessFile;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class LogWriterTest {

    @Rule public final TemporaryFolder folder = new TemporaryFolder();

    private static final LogHeader HEADER =
            new LogHeader("mlp", "ab12", 2, 0, 0, 0, "float32", new long[] {4}, "int64", new long[0]);

    private Path write(Path dir) throws Exception {
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.ALWAYS, true)) {
            log.begin(log.read(0), HEADER);
            List<byte[]> xs = Arrays.asList(new byte[16], new byte[16]);
            List<byte[]> ys = Arrays.asList(new byte[8], new byte[8]);
            long[] offsets = log.appendEvents(0, xs, ys, "retry-1", new byte[32]);
            log.sync(offsets[2]);
            log.appendBatch(0, 0, 2);
            log.appendVersion(1, 1, 0.5, Collections.singletonMap("w", "d"));
            assertEquals(Files.size(LogReader.file(dir)), log.end());
        }
        return LogReader.file(dir);
    }

    @Test
    public void recordsRoundTripAndASecondWriterIsRefused() throws Exception {
        Path dir = folder.newFolder().toPath();
        Path file = write(dir);
        LogReader.Contents contents = LogReader.read(file, 0);
        assertEquals(HEADER, contents.getHeader());
        List<LogRecord> records = contents.getRecords();
        assertEquals(5, records.size());
        assertEquals(1, ((LogRecord.Event) records.get(1)).getSeq());
        assertEquals("retry-1", ((LogRecord.Key) records.get(2)).getKey());
        assertEquals(2, ((LogRecord.Batch) records.get(3)).getCount());
        assertEquals(1, ((LogRecord.Version) records.get(4)).getId());
        try (LogWriter first = LogWriter.lock(dir, FsyncPolicy.NEVER, false)) {
            GradbridgeException e = assertThrows(GradbridgeException.class, () -> LogWriter.lock(dir, FsyncPolicy.NEVER, false));
            assertTrue(e.getMessage(), e.getMessage().contains("is in use by another process"));
        }
    }

    @Test
    public void aSourcedWriteHoldsItsEventsKeysAndOffsetsAndIsKeptBeforeTheScanOffset() throws Exception {
        Path dir = folder.newFolder().toPath();
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, true)) {
            log.begin(log.read(0), HEADER);
            long[] offsets = log.appendSourced(7, Arrays.asList(new byte[16], new byte[16]), Arrays.asList(new byte[8], new byte[8]),
                    Collections.singletonList(new LogWriter.KeyEntry(8, 1, new byte[32], "k-1")), "clicks",
                    new long[][] {{0, 10, 12}, {2, 0, 5}},
                    new long[][] {{0, 10, 7, 1, LogRecord.Position.LOGGED}, {0, 11, 8, 1, LogRecord.Position.LOGGED},
                        {2, 4, -1, 0, LogRecord.Position.REFUSED}});
            assertEquals(3, offsets.length);
            assertEquals(log.end(), offsets[2]);
        }
        // S and K records are kept even before keepFrom (a checkpoint's scan offset); events are not
        List<LogRecord> records = LogReader.read(LogReader.file(dir), Long.MAX_VALUE).getRecords();
        assertEquals(2, records.size());
        LogRecord.Position position = (LogRecord.Position) records.get(0);
        assertEquals("clicks", position.getSource());
        assertArrayEquals(new long[] {2, 0, 5}, position.ranges()[1]);
        assertArrayEquals(new long[] {2, 4, -1, 0, LogRecord.Position.REFUSED}, position.items()[2]);
        assertEquals("k-1", ((LogRecord.Key) records.get(1)).getKey());
    }

    @Test
    public void onlyAnIncompleteLastFrameIsATornTail() throws Exception {
        Path dir = folder.newFolder().toPath();
        Path file = write(dir);
        long size = Files.size(file);
        try (RandomAccessFile raf = new RandomAccessFile(file.toFile(), "rw")) {
            raf.setLength(size - 3); // the last frame cut short
        }
        LogReader.Contents torn = LogReader.read(file, 0);
        assertEquals(4, torn.getRecords().size());
        assertEquals(size - 3 - torn.getEnd(), torn.getTornBytes());
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, false)) {
            log.begin(log.read(0), HEADER);
            assertEquals(torn.getEnd(), Files.size(file));
        }
        byte[] bytes = Files.readAllBytes(file);
        long second = LogReader.read(file, 0).getRecords().get(1).getOffset();
        bytes[(int) second + LogFormat.FRAME_HEADER + 3] ^= 1; // a payload byte in the middle
        Files.write(file, bytes);
        LogCorruptException e = assertThrows(LogCorruptException.class, () -> LogReader.read(file, 0));
        assertEquals(file + ": offset " + second + ": the record's checksum does not match", e.getMessage());
        bytes[(int) second + LogFormat.FRAME_HEADER + 3] ^= 1;
        bytes[(int) second + 3] ^= 0x40; // a length byte: never mistaken for a torn tail
        Files.write(file, bytes);
        e = assertThrows(LogCorruptException.class, () -> LogReader.read(file, 0));
        assertTrue(e.getMessage(), e.getMessage().contains("offset " + second + ": the frame header's checksum"));
        assertArrayEquals(bytes, Files.readAllBytes(file)); // reading changes nothing
    }

    private static long[] appendRead(LogWriter log, long firstSeq, long partitionFrom) throws Exception {
        return log.appendSourced(firstSeq, Arrays.asList(new byte[16], new byte[16]), Arrays.asList(new byte[8], new byte[8]),
                Collections.singletonList(new LogWriter.KeyEntry(firstSeq, 1, new byte[32], "k-" + firstSeq)), "clicks",
                new long[][] {{0, partitionFrom, partitionFrom + 2}},
                new long[][] {{0, partitionFrom, firstSeq, 1, LogRecord.Position.LOGGED},
                    {0, partitionFrom + 1, firstSeq + 1, 1, LogRecord.Position.LOGGED}});
    }

    @Test
    public void aReadFromASourceTornAnywhereIsCutWhole() throws Exception {
        Path dir = folder.newFolder().toPath();
        long first;
        long second;
        int sourced; // the second S record's payload bytes
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, true)) {
            log.begin(log.read(0), HEADER);
            first = appendRead(log, 0, 0)[2];
            long[] offsets = appendRead(log, 2, 2);
            second = offsets[2];
            sourced = (int) (offsets[0] - first - LogFormat.FRAME_HEADER);
        }
        Path file = LogReader.file(dir);
        byte[] whole = Files.readAllBytes(file);
        List<LogRecord> records = LogReader.read(file, 0).getRecords();
        assertEquals(8, records.size()); // S (first in its write), two events, a key; twice
        assertEquals(first, records.get(4).getOffset());
        assertEquals(second - first - LogFormat.FRAME_HEADER - sourced, ((LogRecord.Position) records.get(4)).getFollowing());
        for (long cut = first + 1; cut < second; cut++) {
            Files.write(file, Arrays.copyOf(whole, (int) cut));
            LogReader.Contents torn = LogReader.read(file, 0);
            assertEquals("cut at " + cut, first, torn.getEnd());
            assertEquals(cut - first, torn.getTornBytes());
            assertEquals(4, torn.getRecords().size()); // nothing of the second read: no event without its offsets
        }
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, false)) {
            log.begin(log.read(0), HEADER); // cuts the torn read
            assertEquals(first, Files.size(file));
        }
        // a length that does not end on a frame boundary is damage, not a torn tail
        byte[] bad = Arrays.copyOf(whole, whole.length);
        ByteBuffer payload = ByteBuffer.wrap(Arrays.copyOfRange(whole, (int) first + LogFormat.FRAME_HEADER,
                (int) first + LogFormat.FRAME_HEADER + sourced))
                .order(ByteOrder.LITTLE_ENDIAN);
        payload.putLong(payload.capacity() - 8, payload.getLong(payload.capacity() - 8) - 5);
        ByteBuffer frame = ByteBuffer.allocate(LogFormat.FRAME_HEADER + payload.capacity()).order(ByteOrder.LITTLE_ENDIAN);
        LogFormat.putFrame(frame, payload.array());
        System.arraycopy(frame.array(), 0, bad, (int) first, frame.capacity());
        Files.write(file, bad);
        LogCorruptException e = assertThrows(LogCorruptException.class, () -> LogReader.read(file, 0));
        assertTrue(e.getMessage(), e.getMessage().contains("offset " + first + " begins ends inside this frame"));
    }

    private static long[] appendRequest(LogWriter log, long firstSeq) throws Exception {
        return log.appendEvents(firstSeq, Arrays.asList(new byte[16], new byte[16], new byte[16]),
                Arrays.asList(new byte[8], new byte[8], new byte[8]), "request-" + firstSeq, new byte[32]);
    }

    @Test
    public void aRequestTornAnywhereInItsWriteIsCutWhole() throws Exception {
        Path dir = folder.newFolder().toPath();
        long first;
        long second;
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, true)) {
            log.begin(log.read(0), HEADER);
            first = appendRequest(log, 0)[3];
            long[] offsets = appendRequest(log, 3);
            second = offsets[3];
            assertEquals(first + LogFormat.frameLength(9), offsets[0]); // the W record, then the events
        }
        Path file = LogReader.file(dir);
        byte[] whole = Files.readAllBytes(file);
        List<LogRecord> records = LogReader.read(file, 0).getRecords();
        assertEquals(8, records.size()); // three events and a key, twice (W records frame the writes, never returned)
        assertEquals("request-3", ((LogRecord.Key) records.get(7)).getKey());
        for (long cut = first + 1; cut < second; cut++) {
            Files.write(file, Arrays.copyOf(whole, (int) cut));
            LogReader.Contents torn = LogReader.read(file, 0);
            assertEquals("cut at " + cut, first, torn.getEnd());
            assertEquals(cut - first, torn.getTornBytes());
            assertEquals(4, torn.getRecords().size()); // nothing of the second request: no event without its key
        }
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, false)) {
            log.begin(log.read(0), HEADER); // cuts the torn request
            assertEquals(first, Files.size(file));
        }
        // a length that does not end on a frame boundary is damage, not a torn tail
        byte[] bad = Arrays.copyOf(whole, whole.length);
        ByteBuffer frame = ByteBuffer.allocate(LogFormat.frameLength(9)).order(ByteOrder.LITTLE_ENDIAN);
        LogFormat.putFrame(frame, LogRecord.request(second - first - LogFormat.frameLength(9) - 5));
        System.arraycopy(frame.array(), 0, bad, (int) first, frame.capacity());
        Files.write(file, bad);
        LogCorruptException e = assertThrows(LogCorruptException.class, () -> LogReader.read(file, 0));
        long keyFrame = records.get(7).getOffset(); // the frame that the damaged length ends in
        assertEquals(file + ": offset " + keyFrame + ": the write that the record at offset "
                + first + " begins ends inside this frame (at offset " + (second - 5) + "; damaged, not a torn tail)",
                e.getMessage());
    }

    @Test
    public void aLogWhoseRequestsHaveNoLengthRecordStillReads() throws Exception {
        Path dir = folder.newFolder().toPath();
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, true)) {
            log.begin(log.read(0), HEADER);
        }
        byte[] event = LogRecord.event(0, new byte[16], new byte[8]);
        byte[] key = LogRecord.key(0, 1, new byte[32], "old-1");
        ByteBuffer frames = ByteBuffer.allocate(LogFormat.frameLength(event.length) + LogFormat.frameLength(key.length))
                .order(ByteOrder.LITTLE_ENDIAN);
        LogFormat.putFrame(frames, event);
        LogFormat.putFrame(frames, key);
        Files.write(LogReader.file(dir), frames.array(), StandardOpenOption.APPEND);
        List<LogRecord> records = LogReader.read(LogReader.file(dir), 0).getRecords();
        assertEquals(2, records.size());
        assertEquals("old-1", ((LogRecord.Key) records.get(1)).getKey());
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, false)) {
            log.begin(log.read(0), HEADER);
            long[] offsets = appendRequest(log, 1); // new requests in an old log get their W record
            assertEquals(log.end(), offsets[3]);
        }
        assertEquals(6, LogReader.read(LogReader.file(dir), 0).getRecords().size());
    }

    @Test
    public void aLogWhosePositionsFollowTheirEventsStillReads() throws Exception {
        Path dir = folder.newFolder().toPath();
        try (LogWriter log = LogWriter.lock(dir, FsyncPolicy.NEVER, true)) {
            log.begin(log.read(0), HEADER);
        }
        byte[] name = "clicks".getBytes(StandardCharsets.UTF_8);
        byte[] p = LogRecord.payload(1 + 2 + name.length + 4 + 20 + 4 + 25).put(LogFormat.POSITION)
                .putShort((short) name.length).put(name).putInt(1).putInt(0).putLong(0).putLong(1)
                .putInt(1).putInt(0).putLong(0).putLong(0).putInt(1).put((byte) LogRecord.Position.LOGGED).array();
        byte[] event = LogRecord.event(0, new byte[16], new byte[8]);
        ByteBuffer frames = ByteBuffer.allocate(2 * LogFormat.FRAME_HEADER + event.length + p.length)
                .order(ByteOrder.LITTLE_ENDIAN);
        LogFormat.putFrame(frames, event);
        LogFormat.putFrame(frames, p);
        Files.write(LogReader.file(dir), frames.array(), StandardOpenOption.APPEND);
        List<LogRecord> records = LogReader.read(LogReader.file(dir), 0).getRecords();
        assertEquals(2, records.size());
        LogRecord.Position position = (LogRecord.Position) records.get(1);
        assertEquals(-1, position.getFollowing());
        assertArrayEquals(new long[] {0, 0, 1}, position.ranges()[0]);
    }
}
