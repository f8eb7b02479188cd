package dev.gradbridge.online.log;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.GradbridgeException;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
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
        // P and K records are kept even before keepFrom (a checkpoint's scan offset); events are not
        List<LogRecord> records = LogReader.read(LogReader.file(dir), Long.MAX_VALUE).getRecords();
        assertEquals(2, records.size());
        LogRecord.Position position = (LogRecord.Position) records.get(1);
        assertEquals("clicks", position.getSource());
        assertArrayEquals(new long[] {2, 0, 5}, position.ranges()[1]);
        assertArrayEquals(new long[] {2, 4, -1, 0, LogRecord.Position.REFUSED}, position.items()[2]);
        assertEquals("k-1", ((LogRecord.Key) records.get(0)).getKey());
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
}
