package dev.gradbridge.online;

import dev.gradbridge.GradbridgeException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.channels.FileLock;
import java.nio.channels.OverlappingFileLockException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The one writer of a log folder. {@link #lock} takes an exclusive lock on {@value #LOCK_FILE}
 * in the folder (held until {@link #close}, released by the operating system when the process
 * dies), so a second service on the same folder is refused. The lock is on a file of its own
 * because POSIX locks go away when the process closes <em>any</em> descriptor of the locked file,
 * and readers in the same process (an in-process replay) open the log; {@link #read} and the caller's checks come before {@link
 * #begin}, the first write, so a refused start changes nothing.
 *
 * <p>Each append is one positional write of whole frames; when it fails (a full disk) the file
 * is truncated back, so a request is logged whole or not at all. {@link #sync} forces the file as
 * the {@link FsyncPolicy} says, one {@code fsync} for every caller waiting (group commit); {@link
 * #afterSync} runs an action once the records before an offset are durable without waiting for it:
 * a thread of the writer forces the file at most {@code groupCommitMillis} after the first such
 * request, one {@code fsync} for every request that arrived meanwhile.
 */
final class LogWriter implements AutoCloseable {

    /** The lock file's name in the log folder. */
    static final String LOCK_FILE = "feedback.lock";

    private static final Logger logger = LoggerFactory.getLogger(LogWriter.class);

    private final Path file;
    private final FileChannel channel;
    private final FileChannel lockChannel;
    private final FsyncPolicy policy;
    private final Object syncLock = new Object();
    private long end; // guarded by this
    private boolean broken; // guarded by this: a failed append could not be undone
    private volatile long synced;
    private final GroupCommit group; // afterSync's actions, run once their records are durable

    private LogWriter(Path file, FileChannel channel, FileChannel lockChannel, FsyncPolicy policy) {
        this.file = file;
        this.channel = channel;
        this.lockChannel = lockChannel;
        this.policy = policy;
        this.group = new GroupCommit(this, policy, file);
    }

    /**
     * Opens and locks the log file of {@code dir}.
     *
     * @param dir the log folder, which must exist
     * @param policy when appends are forced
     * @param create create the file when it is missing
     * @return the locked log, not yet written
     * @throws IOException when the file cannot be opened
     * @throws GradbridgeException when another process holds the lock
     */
    static LogWriter lock(Path dir, FsyncPolicy policy, boolean create) throws IOException {
        Path file = LogReader.file(dir);
        Path lockFile = dir.resolve(LOCK_FILE).toAbsolutePath();
        FileChannel lockChannel = FileChannel.open(lockFile, StandardOpenOption.CREATE, StandardOpenOption.WRITE);
        FileLock lock;
        try {
            lock = lockChannel.tryLock();
        } catch (OverlappingFileLockException e) {
            lock = null;
        } catch (IOException e) {
            lockChannel.close();
            throw e;
        }
        if (lock == null) {
            lockChannel.close();
            throw new GradbridgeException("log folder " + dir.toAbsolutePath() + " is in use by another process (it holds"
                    + " the lock on " + lockFile + "); stop it first or use another --log");
        }
        FileChannel channel;
        try {
            channel = create
                    ? FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.READ, StandardOpenOption.WRITE)
                    : FileChannel.open(file, StandardOpenOption.READ, StandardOpenOption.WRITE);
        } catch (IOException | RuntimeException e) {
            lockChannel.close();
            throw e;
        }
        return new LogWriter(file, channel, lockChannel, policy);
    }

    /**
     * Reads the locked file strictly (see {@link LogReader}); changes nothing.
     *
     * @param keepFrom as for {@link LogReader#read(Path, long)}
     * @return the contents
     * @throws IOException when the file cannot be read
     */
    LogReader.Contents read(long keepFrom) throws IOException {
        return LogReader.read(file, channel, keepFrom);
    }

    /**
     * Starts appending after {@code contents}: cuts its torn tail (the only thing ever cut) and
     * writes {@code header} when the log holds no header yet.
     *
     * @param contents what {@link #read} returned
     * @param header the header of a new log
     * @throws IOException when the file cannot be written
     */
    synchronized void begin(LogReader.Contents contents, LogHeader header) throws IOException {
        if (contents.getTornBytes() > 0) {
            logger.warn("{}: cut a torn tail of {} bytes at offset {} (an incomplete last record: never acknowledged)",
                    file, contents.getTornBytes(), contents.getEnd());
            channel.truncate(contents.getEnd());
            channel.force(true);
        }
        end = contents.getEnd();
        if (contents.getHeader() == null) {
            sync(append(frames(header.payload())));
        }
        synced = end;
    }

    /** @return the log file */
    Path getFile() {
        return file;
    }

    /** @return the offset just after the last appended record */
    synchronized long end() {
        return end;
    }

    /**
     * Appends one request in one write: a {@code W} record with the length of the rest of the
     * write, the events (one sample each) as consecutive records and, when {@code key} is not null,
     * the request's key; not yet forced. The length comes first so that a write torn anywhere is a
     * torn tail as a whole: no event without its key, no key without its events.
     *
     * @param firstSeq the first event's sequence number
     * @param xRows x bytes of each event
     * @param yRows y bytes of each event, as many as {@code xRows}
     * @param key the request's idempotency key, or null
     * @param sha256 SHA-256 of the request's x and y bytes (with a key)
     * @return each event's offset, then the end offset (one more element than events)
     * @throws IOException when the write fails; nothing of it stays in the file
     */
    synchronized long[] appendEvents(long firstSeq, List<byte[]> xRows, List<byte[]> yRows, String key,
            byte[] sha256) throws IOException {
        int n = xRows.size();
        byte[][] payloads = new byte[1 + n + (key == null ? 0 : 1)][];
        long following = 0;
        for (int i = 0; i < n; i++) {
            payloads[1 + i] = LogRecord.event(firstSeq + i, xRows.get(i), yRows.get(i));
            following += LogFormat.frameLength(payloads[1 + i].length);
        }
        if (key != null) {
            payloads[1 + n] = LogRecord.key(firstSeq, n, sha256, key);
            following += LogFormat.frameLength(payloads[1 + n].length);
        }
        payloads[0] = LogRecord.request(following);
        long[] offsets = new long[n + 1];
        long position = end + LogFormat.frameLength(payloads[0].length);
        for (int i = 0; i < n; i++) {
            offsets[i] = position;
            position += LogFormat.frameLength(payloads[1 + i].length);
        }
        offsets[n] = append(frames(payloads));
        return offsets;
    }

    /** A request's idempotency key as {@link #appendSourced} logs it. */
    static final class KeyEntry {
        final long firstSeq;
        final int count;
        final byte[] sha256;
        final String key;

        /**
         * @param firstSeq the request's first event
         * @param count its events
         * @param sha256 SHA-256 of its x and y bytes
         * @param key the key
         */
        KeyEntry(long firstSeq, int count, byte[] sha256, String key) {
            this.firstSeq = firstSeq;
            this.count = count;
            this.sha256 = sha256;
            this.key = key;
        }
    }

    /**
     * Appends what one read from an external source gave, in one write: the {@code S} record of
     * the source offsets consumed (see {@link LogRecord.Position}) with the length of the rest of
     * the write, then the events (consecutive numbers from {@code firstSeq}) and the keys of the
     * requests among them; not yet forced. The record comes first so that a write torn anywhere is
     * a torn tail as a whole: no event is logged without the offsets it came from.
     *
     * @param firstSeq the first event's sequence number
     * @param xRows x bytes of each event
     * @param yRows y bytes of each event
     * @param keys the keyed requests among the events
     * @param source the source's name (a topic)
     * @param ranges per partition {partition, from, to}
     * @param items per source record {partition, offset, first seq, count, status}
     * @return each event's offset, then the end offset
     * @throws IOException when the write fails; nothing of it stays in the file
     */
    synchronized long[] appendSourced(long firstSeq, List<byte[]> xRows, List<byte[]> yRows, List<KeyEntry> keys,
            String source, long[][] ranges, long[][] items) throws IOException {
        int n = xRows.size();
        byte[][] payloads = new byte[1 + n + keys.size()][];
        long following = 0;
        for (int i = 0; i < n; i++) {
            payloads[1 + i] = LogRecord.event(firstSeq + i, xRows.get(i), yRows.get(i));
            following += LogFormat.frameLength(payloads[1 + i].length);
        }
        for (int i = 0; i < keys.size(); i++) {
            KeyEntry k = keys.get(i);
            payloads[1 + n + i] = LogRecord.key(k.firstSeq, k.count, k.sha256, k.key);
            following += LogFormat.frameLength(payloads[1 + n + i].length);
        }
        payloads[0] = LogRecord.sourced(source, ranges, items, following);
        long[] offsets = new long[n + 1];
        long position = end + LogFormat.frameLength(payloads[0].length);
        for (int i = 0; i < n; i++) {
            offsets[i] = position;
            position += LogFormat.frameLength(payloads[1 + i].length);
        }
        offsets[n] = append(frames(payloads));
        return offsets;
    }

    /**
     * Appends a micro-batch boundary (before the batch is applied).
     *
     * @param index updates applied before it
     * @param firstSeq its first event
     * @param count its number of events
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendBatch(long index, long firstSeq, int count) throws IOException {
        return append(frames(LogRecord.batch(index, firstSeq, count)));
    }

    /**
     * Appends a quarantine: the micro-batch just logged was not applied.
     *
     * @param index updates applied before it
     * @param firstSeq its first event
     * @param count its number of events
     * @param reason why
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendQuarantine(long index, long firstSeq, int count, String reason) throws IOException {
        return append(frames(LogRecord.quarantine(index, firstSeq, count, reason)));
    }

    /**
     * Appends a published version.
     *
     * @param id the version id
     * @param updates updates applied in it
     * @param loss the loss of its last micro-batch
     * @param digests its parameters' digests by name
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendVersion(long id, long updates, double loss, Map<String, String> digests)
            throws IOException {
        return append(frames(LogRecord.version(id, updates, loss, digests)));
    }

    /**
     * Appends a publish gate's decision on the version just logged.
     *
     * @param version the version decided on
     * @param serving the version predictions used
     * @param loss the version's loss on the gate data
     * @param servingLoss the serving version's
     * @param decision {@link LogRecord.Gate#PUBLISHED}, {@link LogRecord.Gate#HELD} or {@link
     *     LogRecord.Gate#ROLLED_BACK}
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendGate(long version, long serving, double loss, double servingLoss, int decision)
            throws IOException {
        return append(frames(LogRecord.gate(version, serving, loss, servingLoss, decision)));
    }

    /**
     * Appends an operator's rollback.
     *
     * @param version the version predictions return to
     * @param from the version they used
     * @return the end offset
     * @throws IOException when the write fails
     */
    synchronized long appendRollback(long version, long from) throws IOException {
        return append(frames(LogRecord.rollback(version, from)));
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

    /** @see GroupCommit#start */
    void startGroupCommit(long delayMillis, Consumer<Throwable> onFailure) {
        group.start(delayMillis, onFailure);
    }

    /** @see GroupCommit#afterSync */
    void afterSync(long offset, Runnable action) {
        group.afterSync(offset, action);
    }

    /** @see GroupCommit#awaitActions */
    boolean awaitActions(long timeoutNanos) throws InterruptedException {
        return group.awaitActions(timeoutNanos);
    }

    /** @return the end offset up to which the file is forced */
    long synced() {
        return synced;
    }

    private static ByteBuffer frames(byte[]... payloads) {
        int total = 0;
        for (byte[] payload : payloads) {
            total += LogFormat.frameLength(payload.length);
        }
        ByteBuffer frames = ByteBuffer.allocate(total).order(ByteOrder.LITTLE_ENDIAN);
        for (byte[] payload : payloads) {
            LogFormat.putFrame(frames, payload);
        }
        frames.flip();
        return frames;
    }

    /** Writes whole frames at the end; on failure truncates back, so the file holds all of them or none. */
    private long append(ByteBuffer frames) throws IOException {
        if (broken) {
            throw new IOException(file + " cannot be appended to: an earlier failed write could not be undone");
        }
        long start = end;
        long position = start;
        try {
            while (frames.hasRemaining()) {
                position += channel.write(frames, position);
            }
        } catch (IOException e) {
            try {
                channel.truncate(start);
            } catch (IOException undo) {
                broken = true;
                e.addSuppressed(undo);
            }
            throw e;
        }
        end = position;
        return end;
    }

    /** Stops group commit (actions still waiting are dropped, as in a crash), forces under ALWAYS and closes. */
    @Override
    public void close() throws IOException {
        group.stop();
        closeChannel();
    }

    private synchronized void closeChannel() throws IOException {
        if (!channel.isOpen()) {
            return;
        }
        try {
            if (policy == FsyncPolicy.ALWAYS && !broken) {
                channel.force(false);
            }
        } finally {
            channel.close();
            lockChannel.close(); // releases the lock
        }
    }
}
