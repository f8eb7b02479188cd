package dev.gradbridge.online;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.io.OutputStream;
import java.io.RandomAccessFile;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** The write-ahead log's framing, torn-tail cut and header check (no libtorch needed). */
public class FeedbackLogTest {

    @Rule public TemporaryFolder folder = new TemporaryFolder();

    private static final FeedbackLog.Header HEADER =
            new FeedbackLog.Header("mlp", 2, "float32", new long[] {4}, "int64", new long[0]);

    private static byte[] bytes(int... values) {
        byte[] out = new byte[values.length];
        for (int i = 0; i < values.length; i++) {
            out[i] = (byte) values[i];
        }
        return out;
    }

    private static ModelVersion version(long id, long updates) {
        Map<String, String> digests = new LinkedHashMap<>();
        digests.put("weight", "ab12");
        return new ModelVersion(id, updates, 0.25, Collections.singletonMap("weight", new double[] {1}), digests);
    }

    /** Writes 3 events, a micro-batch and a version; returns the log folder. */
    private Path writeSample(FsyncPolicy policy) throws IOException {
        Path dir = folder.newFolder().toPath();
        try (FeedbackLog log = FeedbackLog.open(dir, HEADER, policy)) {
            long[] offsets = log.appendEvents(0,
                    Arrays.asList(bytes(1, 2, 3), bytes(4), bytes()), Arrays.asList(bytes(9), bytes(8, 7), bytes(6)));
            assertEquals(4, offsets.length);
            log.sync(offsets[3]);
            log.sync(log.appendBatch(0, 0, 3));
            log.sync(log.appendVersion(version(1, 1)));
            assertEquals(Files.size(dir.resolve(FeedbackLog.FILE_NAME)), log.end());
        }
        return dir;
    }

    @Test
    public void recordsRoundTripWithTheirOffsets() throws IOException {
        for (FsyncPolicy policy : FsyncPolicy.values()) {
            Path dir = writeSample(policy);
            FeedbackLog.Contents contents = FeedbackLog.read(dir, 0);
            assertEquals(HEADER, contents.getHeader());
            assertEquals(0, contents.getTornBytes());
            List<FeedbackLog.Record> records = contents.getRecords();
            assertEquals(5, records.size());
            FeedbackLog.Event first = (FeedbackLog.Event) records.get(0);
            assertEquals(0, first.getSeq());
            assertArrayEquals(bytes(1, 2, 3), first.getX());
            assertArrayEquals(bytes(9), first.getY());
            FeedbackLog.Event third = (FeedbackLog.Event) records.get(2);
            assertEquals(2, third.getSeq());
            assertArrayEquals(bytes(), third.getX());
            FeedbackLog.Batch batch = (FeedbackLog.Batch) records.get(3);
            assertEquals(3, batch.getCount());
            FeedbackLog.Version version = (FeedbackLog.Version) records.get(4);
            assertEquals(1, version.getId());
            assertEquals(0.25, version.getLoss(), 0.0);
            assertEquals("ab12", version.getDigests().get("weight"));
            // Reading from a record boundary returns the records after it.
            assertEquals(2, FeedbackLog.read(dir, batch.getOffset()).getRecords().size());
            for (int i = 1; i < records.size(); i++) {
                assertEquals(records.get(i - 1).getNext(), records.get(i).getOffset());
            }
        }
    }

    @Test
    public void aTornTailIsCutOnOpenAndAppendsContinueAfterIt() throws IOException {
        Path dir = writeSample(FsyncPolicy.ALWAYS);
        Path file = dir.resolve(FeedbackLog.FILE_NAME);
        long good = Files.size(file);
        // A crash in the middle of a record: a length that promises more bytes than were written.
        try (OutputStream out = Files.newOutputStream(file, StandardOpenOption.APPEND)) {
            out.write(new byte[] {40, 0, 0, 0, 1, 2, 3, 4, 'E', 0, 0});
        }
        assertEquals(11, FeedbackLog.read(dir, 0).getTornBytes());
        try (FeedbackLog log = FeedbackLog.open(dir, HEADER, FsyncPolicy.ALWAYS)) {
            assertEquals(11, log.getCutBytes());
            assertEquals(good, Files.size(file));
            log.sync(log.appendBatch(1, 3, 1));
        }
        List<FeedbackLog.Record> records = FeedbackLog.read(dir, 0).getRecords();
        assertEquals(6, records.size());
        assertEquals(1, ((FeedbackLog.Batch) records.get(5)).getIndex());
    }

    @Test
    public void aRecordWithABadChecksumEndsTheLog() throws IOException {
        Path dir = writeSample(FsyncPolicy.NEVER);
        Path file = dir.resolve(FeedbackLog.FILE_NAME);
        List<FeedbackLog.Record> records = FeedbackLog.read(dir, 0).getRecords();
        long versionOffset = records.get(4).getOffset();
        try (RandomAccessFile raw = new RandomAccessFile(file.toFile(), "rw")) {
            raw.seek(versionOffset + 8 + 3); // a payload byte of the last record: the CRC no longer matches
            int b = raw.read();
            raw.seek(versionOffset + 8 + 3);
            raw.write(b ^ 0x01);
        }
        try (FeedbackLog log = FeedbackLog.open(dir, HEADER, FsyncPolicy.NEVER)) {
            assertEquals(Files.size(file), versionOffset);
            assertTrue(log.getCutBytes() > 0);
        }
        assertEquals(4, FeedbackLog.read(dir, 0).getRecords().size());
    }

    @Test
    public void anotherHeaderOrAnotherFileIsRefusedWithOneLine() throws IOException {
        Path dir = writeSample(FsyncPolicy.NEVER);
        FeedbackLog.Header other = new FeedbackLog.Header("mlp", 3, "float32", new long[] {4}, "int64", new long[0]);
        LogCorruptException wrong = assertThrows(LogCorruptException.class,
                () -> FeedbackLog.open(dir, other, FsyncPolicy.NEVER));
        assertTrue(wrong.getMessage(), wrong.getMessage().contains("use another log folder"));
        assertEquals(-1, wrong.getMessage().indexOf('\n'));

        Path junk = folder.newFolder().toPath();
        Files.write(junk.resolve(FeedbackLog.FILE_NAME), "hello, I am not a log".getBytes("UTF-8"));
        LogCorruptException notLog = assertThrows(LogCorruptException.class, () -> FeedbackLog.read(junk, 0));
        assertTrue(notLog.getMessage(), notLog.getMessage().endsWith("is not a gradbridge feedback log (no header record)"));
        LogCorruptException missing =
                assertThrows(LogCorruptException.class, () -> FeedbackLog.read(folder.newFolder().toPath(), 0));
        assertTrue(missing.getMessage(), missing.getMessage().startsWith("no feedback log at "));
    }

    @Test
    public void concurrentAppendsKeepWholeRecordsAndShareFsyncs() throws Exception {
        Path dir = folder.newFolder().toPath();
        int threads = 4;
        int perThread = 50;
        try (FeedbackLog log = FeedbackLog.open(dir, HEADER, FsyncPolicy.ALWAYS)) {
            Thread[] workers = new Thread[threads];
            for (int t = 0; t < threads; t++) {
                final long base = t * 1000L;
                workers[t] = new Thread(() -> {
                    try {
                        for (int i = 0; i < perThread; i++) {
                            long[] offsets = log.appendEvents(base + i, Collections.singletonList(bytes(i)),
                                    Collections.singletonList(bytes(i, i)));
                            log.sync(offsets[1]);
                        }
                    } catch (IOException e) {
                        throw new RuntimeException(e);
                    }
                });
                workers[t].start();
            }
            for (Thread worker : workers) {
                worker.join();
            }
        }
        List<FeedbackLog.Record> records = FeedbackLog.read(dir, 0).getRecords();
        assertEquals(threads * perThread, records.size());
        long[] last = {-1, -1, -1, -1};
        for (FeedbackLog.Record record : records) {
            long seq = ((FeedbackLog.Event) record).getSeq();
            int thread = (int) (seq / 1000);
            assertTrue("per-thread order kept", seq > last[thread]);
            last[thread] = seq;
        }
    }
}
