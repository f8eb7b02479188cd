package dev.gradbridge;

import com.google.gson.Strictness;
import com.google.gson.stream.JsonWriter;
import dev.gradbridge.internal.AtomicFiles;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.Messages;
import java.io.IOException;
import java.io.StringWriter;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A history file as a run writes it, in the layout {@code python/gradbridge/history.py} documents:
 * the first epoch of a run replaces the file (a temporary file, then a rename), every later epoch
 * appends its line, so an epoch costs its own record, never the whole history again. A record
 * whose parameters hold more than {@link #INLINE_VALUES_LIMIT} values keeps them out of its line:
 * they are appended, float64 little-endian, to the side file {@code <history>.values} and the line
 * names where ({@code "values": {"file", "offset", "counts", "sha256"}}). Nothing passes through a
 * JSON tree: the line is written as it is produced, the values straight from the record's buffers.
 *
 * <p>An append writes the side file's block first, then the line in one write; a failed write is
 * cut back, and a process killed mid-line leaves a last line without its newline, which the
 * reader drops (an earlier line is never touched). A record whose values went to the side file
 * reads them back from there when asked ({@link History.EpochRecord#getParameterBuffers}).
 */
public final class HistoryFile {

    /** Above this many values in a record (all its parameters), they go to the side file. */
    public static final long INLINE_VALUES_LIMIT = Messages.HISTORY_INLINE_VALUES;

    /** The side file's name: the history's with this suffix. */
    public static final String VALUES_SUFFIX = ".values";

    private final Path path;
    private final Path valuesPath;
    private boolean started;

    /** @param path the .jsonl file this run writes (replaced by its first record) */
    public HistoryFile(Path path) {
        this.path = path;
        this.valuesPath = path.resolveSibling(path.getFileName() + VALUES_SUFFIX);
    }

    /** @return the side file that records above {@link #INLINE_VALUES_LIMIT} values use */
    public Path valuesPath() {
        return valuesPath;
    }

    /**
     * Adds one epoch: the run's first replaces the file, later ones append.
     *
     * @param record the epoch's record
     * @throws IOException naming the file when it cannot be written
     */
    public void append(History.EpochRecord record) throws IOException {
        if (!started) {
            replace(List.of(record));
            started = true;
            return;
        }
        Block[] block = new Block[1];
        if (valuesAside(record)) {
            appendBytes(valuesPath, channel -> block[0] = writeValues(record, channel));
        }
        byte[] line = line(record, block[0]).getBytes(StandardCharsets.UTF_8);
        appendBytes(path, channel -> writeFully(channel, ByteBuffer.wrap(line)));
        if (block[0] != null) {
            record.readValuesFrom(valuesPath, block[0].offset);
        }
    }

    /**
     * Writes these records as the whole history (and its side file when a record needs one).
     *
     * @param records the records, in epoch order
     * @throws IOException naming the file when it cannot be written
     */
    public void replace(List<History.EpochRecord> records) throws IOException {
        Block[] blocks = new Block[records.size()];
        boolean side = false;
        for (History.EpochRecord record : records) {
            side |= valuesAside(record);
        }
        if (side) {
            AtomicFiles.write(valuesPath, tmp -> {
                try (FileChannel channel = FileChannel.open(tmp, StandardOpenOption.WRITE)) {
                    for (int i = 0; i < records.size(); i++) {
                        blocks[i] = valuesAside(records.get(i)) ? writeValues(records.get(i), channel) : null;
                    }
                    channel.force(true);
                }
            });
        }
        AtomicFiles.write(path, tmp -> {
            try (FileChannel channel = FileChannel.open(tmp, StandardOpenOption.WRITE)) {
                for (int i = 0; i < records.size(); i++) {
                    writeFully(channel, ByteBuffer.wrap(line(records.get(i), blocks[i]).getBytes(StandardCharsets.UTF_8)));
                }
                channel.force(true);
            }
        });
        if (!side) {
            Files.deleteIfExists(valuesPath); // an earlier run's, which no line names now
        }
        for (int i = 0; i < records.size(); i++) {
            if (blocks[i] != null) {
                records.get(i).readValuesFrom(valuesPath, blocks[i].offset);
            }
        }
    }

    /**
     * @param record an epoch's record
     * @return whether a history file keeps its values in the side file (more than {@link #INLINE_VALUES_LIMIT})
     */
    public static boolean valuesAside(History.EpochRecord record) {
        long total = 0;
        for (long count : record.valueCounts().values()) {
            total += count;
        }
        return total > INLINE_VALUES_LIMIT;
    }

    private interface ChannelWrite {
        void write(FileChannel channel) throws IOException;
    }

    /** Where a record's values are in the side file. */
    private static final class Block {
        final long offset;
        final String sha256;

        Block(long offset, String sha256) {
            this.offset = offset;
            this.sha256 = sha256;
        }
    }

    /** Appends at the end of {@code file}; a failed write is cut back. */
    private static void appendBytes(Path file, ChannelWrite write) throws IOException {
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.CREATE, StandardOpenOption.WRITE)) {
            long before = channel.size();
            channel.position(before);
            try {
                write.write(channel);
                channel.force(true);
            } catch (IOException | RuntimeException | Error e) { // an out-of-memory too: no torn line left
                channel.truncate(before);
                throw e;
            }
        } catch (IOException e) {
            throw new IOException(Messages.cannotWrite(file.toString(), e.getMessage()), e);
        }
    }

    /** Writes the record's values, float64 little-endian, at the channel's position. */
    private static Block writeValues(History.EpochRecord record, FileChannel channel) throws IOException {
        long offset = channel.position();
        MessageDigest sha = Digests.sha256();
        ByteBuffer chunk = ByteBuffer.allocateDirect(1 << 20).order(ByteOrder.LITTLE_ENDIAN);
        for (Map.Entry<String, DoubleBuffer> entry : record.valueSources().entrySet()) {
            DoubleBuffer values = entry.getValue();
            while (values.hasRemaining()) {
                chunk.clear();
                DoubleBuffer room = chunk.asDoubleBuffer();
                int n = Math.min(room.remaining(), values.remaining());
                DoubleBuffer part = values.slice();
                part.limit(n);
                room.put(part);
                values.position(values.position() + n);
                chunk.limit(n * Double.BYTES);
                sha.update(chunk.duplicate());
                writeFully(channel, chunk);
            }
        }
        return new Block(offset, Digests.hex(sha.digest()));
    }

    private static void writeFully(FileChannel channel, ByteBuffer bytes) throws IOException {
        while (bytes.hasRemaining()) {
            channel.write(bytes);
        }
    }

    /** @return the record's line with every value inline (what {@link History#toJsonLines} joins) */
    String inlineLine(History.EpochRecord record) {
        return line(record, null);
    }

    /**
     * The record's line (with its newline): values inline, or (a block) where in the side file they
     * are. Written token by token, never as a tree.
     */
    private String line(History.EpochRecord record, Block block) {
        StringWriter out = new StringWriter();
        try (JsonWriter json = new JsonWriter(out)) {
            json.setStrictness(Strictness.LENIENT); // a diverged epoch's NaN, as both readers take it
            json.setSerializeNulls(true);
            json.beginObject();
            json.name("epoch").value(record.getEpoch());
            json.name("loss").value(record.getLoss());
            json.name("val_loss");
            if (record.getValLoss() == null) {
                json.nullValue();
            } else {
                json.value(record.getValLoss().doubleValue());
            }
            json.name("elapsed_s").value(record.getElapsedSeconds());
            json.name("parameters").beginObject();
            if (block == null) {
                inlineValues(json, record);
            }
            json.endObject();
            json.name("digests").beginObject();
            for (Map.Entry<String, String> entry : record.getDigests().entrySet()) {
                json.name(entry.getKey()).value(entry.getValue());
            }
            json.endObject();
            double[] lrs = record.getLrs();
            if (lrs != null) {
                json.name("lrs").beginArray();
                for (double lr : lrs) {
                    json.value(lr);
                }
                json.endArray();
            }
            if (record.getThreads() != null) {
                json.name("threads").value(record.getThreads());
            }
            ShardedRun sharded = record.getSharded();
            if (sharded != null) {
                sharded(json, sharded);
            }
            if (record.getDevice() != null) {
                json.name("device").value(record.getDevice());
                json.name("deterministic").value(record.getDeterministic());
            }
            if (block != null) {
                valuesBlock(json, record, block);
            }
            json.endObject();
        } catch (IOException e) {
            throw new UncheckedIOException(e); // a StringWriter does not fail
        }
        return out.append('\n').toString();
    }

    /** A record's values inline, each parameter's as an array (no side file). */
    private static void inlineValues(JsonWriter json, History.EpochRecord record) throws IOException {
        for (Map.Entry<String, DoubleBuffer> entry : record.valueSources().entrySet()) {
            json.name(entry.getKey()).beginArray();
            DoubleBuffer values = entry.getValue();
            while (values.hasRemaining()) {
                json.value(values.get());
            }
            json.endArray();
        }
    }

    /** A data-parallel run's settings (the {@code sharded} key). */
    private static void sharded(JsonWriter json, ShardedRun sharded) throws IOException {
        json.name("sharded").beginObject();
        json.name("partitions").value(sharded.getPartitions());
        json.name("batch_size").value(sharded.getBatchSize());
        json.name("seed").value(sharded.getSeed());
        json.name("shuffle").value(sharded.isShuffle());
        json.name("rule").value(sharded.getRule());
        json.name("shards_sha256").value(sharded.getShardsSha256());
        json.endObject();
    }

    /** Where in the side file a record's values are (the {@code values} key). */
    private void valuesBlock(JsonWriter json, History.EpochRecord record, Block block) throws IOException {
        json.name("values").beginObject();
        json.name("file").value(valuesPath.getFileName().toString());
        json.name("offset").value(block.offset);
        json.name("counts").beginObject();
        for (Map.Entry<String, Long> entry : record.valueCounts().entrySet()) {
            json.name(entry.getKey()).value(entry.getValue());
        }
        json.endObject();
        json.name("sha256").value(block.sha256);
        json.endObject();
    }
}
