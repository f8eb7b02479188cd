package dev.gradbridge;

import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.Messages;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What a training run did, epoch by epoch, written as JSON Lines in the schema that {@code
 * python/gradbridge/history.py} defines and documents: {@code {"epoch", "loss", "val_loss",
 * "elapsed_s", "parameters", "digests"}} plus the optional {@code "lrs"} (learning rate per
 * parameter group after the epoch), {@code "threads"} (libtorch's intra-op threads of a
 * gradbridge-spark run's tasks in the epoch), {@code "sharded"} (a gradbridge-spark run's partitions, batch
 * size, seed, shuffling, rule and data digest: {@link ShardedRun}), {@code "device"} and {@code "deterministic"} (the device of a
 * run on one other than the CPU, and whether libtorch's deterministic algorithms were on), each left out when
 * unknown, and {@code "values"} (where in the side file a large record's values are: {@link HistoryFile}).
 */
public final class History {

    private final List<EpochRecord> records = new ArrayList<>();

    /** One epoch of a run. */
    public static final class EpochRecord {
        // Field names and order are the JSON keys of the schema.
        private final int epoch;
        private final double loss;
        private final Double val_loss; // NOPMD: the schema's key
        private final double elapsed_s; // NOPMD: the schema's key
        private volatile Map<String, double[]> parameters; // built from `buffers` when first asked
        private final Map<String, String> digests;
        private volatile Map<String, ByteBuffer> buffers; // float64 values, native order
        private final double[] lrs; // optional key of the schema: null is not written
        private volatile SideValues side; // set once the values went to a history's side file
        private final Integer threads; // optional key of the schema: null is not written
        private final ShardedRun sharded; // optional key of the schema: null is not written
        private final String device; // optional key of the schema: null (the CPU) is not written
        private final Boolean deterministic; // optional key, with device

        /**
         * Creates a record.
         *
         * @param epoch epoch index over the whole run, from 0
         * @param loss the epoch's training loss (mean of its batch losses)
         * @param valLoss the validation loss after the epoch, or {@code null}
         * @param elapsedSeconds wall time since the run started
         * @param parameters values after the epoch, by name, flattened; empty for digests only
         * @param digests SHA-256 of each parameter's bytes ({@link #digest})
         */
        public EpochRecord(
                int epoch, double loss, Double valLoss, double elapsedSeconds,
                Map<String, double[]> parameters, Map<String, String> digests) {
            this(epoch, loss, valLoss, elapsedSeconds, parameters, digests, null);
        }

        /**
         * Creates a record with each parameter group's learning rate.
         *
         * @param epoch epoch index over the whole run, from 0
         * @param loss the epoch's training loss (mean of its batch losses)
         * @param valLoss the validation loss after the epoch, or {@code null}
         * @param elapsedSeconds wall time since the run started
         * @param parameters values after the epoch, by name, flattened; empty for digests only
         * @param digests SHA-256 of each parameter's bytes ({@link #digest})
         * @param lrs learning rate per parameter group after the epoch, or {@code null}
         */
        public EpochRecord(
                int epoch, double loss, Double valLoss, double elapsedSeconds,
                Map<String, double[]> parameters, Map<String, String> digests, double[] lrs) {
            this(epoch, loss, valLoss, elapsedSeconds, Collections.unmodifiableMap(new LinkedHashMap<>(parameters)),
                    Collections.<String, ByteBuffer>emptyMap(), digests, lrs, null, null, null, null);
        }

        /**
         * {@code parameters} null: built from {@code buffers} when first asked. A record of an epoch
         * then costs one native copy per parameter, not a Java array (see {@link #getParameterBuffers}).
         */
        private EpochRecord(
                int epoch, double loss, Double valLoss, double elapsedSeconds, Map<String, double[]> parameters,
                Map<String, ByteBuffer> buffers, Map<String, String> digests, double[] lrs, Integer threads,
                ShardedRun sharded, String device, Boolean deterministic) {
            this.lrs = lrs == null ? null : lrs.clone();
            this.threads = threads;
            this.sharded = sharded;
            this.device = device;
            this.deterministic = deterministic;
            this.epoch = epoch;
            this.loss = loss;
            this.val_loss = valLoss;
            this.elapsed_s = elapsedSeconds;
            this.parameters = parameters;
            this.digests = Collections.unmodifiableMap(new LinkedHashMap<>(digests));
            this.buffers = Collections.unmodifiableMap(new LinkedHashMap<>(buffers));
        }

        /** @return epoch index, from 0 */
        public int getEpoch() {
            return epoch;
        }

        /** @return the epoch's training loss */
        public double getLoss() {
            return loss;
        }

        /** @return the validation loss, or {@code null} */
        public Double getValLoss() {
            return val_loss;
        }

        /** @return seconds since the run started */
        public double getElapsedSeconds() {
            return elapsed_s;
        }

        /** @return parameters after the epoch's step, by name (empty for digests only) */
        public Map<String, double[]> getParameters() {
            Map<String, double[]> values = parameters;
            if (values == null) {
                Map<String, double[]> built = new LinkedHashMap<>();
                for (Map.Entry<String, ByteBuffer> entry : getParameterBuffers().entrySet()) {
                    DoubleBuffer doubles = entry.getValue().duplicate().order(ByteOrder.nativeOrder()).asDoubleBuffer();
                    double[] array = new double[doubles.remaining()];
                    doubles.get(array);
                    built.put(entry.getKey(), array);
                }
                values = Collections.unmodifiableMap(built);
                if (side == null) {
                    parameters = values; // racing readers build equal maps; a side file's are read again
                }
            }
            return values;
        }

        /**
         * The same values as {@link #getParameters()} without a Java array: each parameter's float64
         * values in a read-only direct buffer in native byte order (empty when the record keeps digests
         * only, or was made from arrays). Python's {@code History.from_java} reads these. A record whose
         * values a run wrote to its history's side file ({@link HistoryFile}) maps them from there.
         *
         * @return the buffers by name, in protocol order
         */
        public Map<String, ByteBuffer> getParameterBuffers() {
            SideValues spilled = side;
            if (spilled != null) {
                return spilled.map();
            }
            Map<String, ByteBuffer> views = new LinkedHashMap<>();
            for (Map.Entry<String, ByteBuffer> entry : buffers.entrySet()) {
                views.put(entry.getKey(), entry.getValue().asReadOnlyBuffer().order(ByteOrder.nativeOrder()));
            }
            return views;
        }

        /** @return parameter digests by name */
        public Map<String, String> getDigests() {
            return digests;
        }

        /** @return learning rate per parameter group after the epoch, or {@code null} */
        public double[] getLrs() {
            return lrs == null ? null : lrs.clone();
        }

        /**
         * @return libtorch's intra-op threads each task of a gradbridge-spark run trained the epoch on
         *     (its replay runs on as many), or {@code null}
         */
        public Integer getThreads() {
            return threads;
        }

        /**
         * @param count libtorch's intra-op threads of the run's tasks in this epoch
         * @return this record with that count
         */
        public EpochRecord withThreads(int count) {
            return new EpochRecord(epoch, loss, val_loss, elapsed_s, parameters, buffers, digests, lrs, count, sharded,
                    device, deterministic);
        }

        /** @return the data-parallel run this epoch belongs to (gradbridge-spark's), or {@code null} */
        public ShardedRun getSharded() {
            return sharded;
        }

        /**
         * @param run the data-parallel run this epoch belongs to
         * @return this record with it
         */
        public EpochRecord withSharded(ShardedRun run) {
            return new EpochRecord(epoch, loss, val_loss, elapsed_s, parameters, buffers, digests, lrs, threads, run,
                    device, deterministic);
        }

        /**
         * @return the device the epoch trained on when not the CPU ({@code cuda:0}), or {@code null}
         */
        public String getDevice() {
            return device;
        }

        /**
         * @return with {@link #getDevice()}: whether libtorch's deterministic algorithms were on; else {@code null}
         */
        public Boolean getDeterministic() {
            return deterministic;
        }

        /** @return this record of an epoch trained on {@code device} (not the CPU), deterministic or not */
        EpochRecord withDevice(String on, boolean deterministicAlgorithms) {
            return new EpochRecord(epoch, loss, val_loss, elapsed_s, parameters, buffers, digests, lrs, threads,
                    sharded, on, deterministicAlgorithms);
        }

        /** The values as float64 views from their start, by name (what a history file writes). */
        Map<String, DoubleBuffer> valueSources() {
            Map<String, DoubleBuffer> sources = new LinkedHashMap<>();
            Map<String, double[]> arrays = parameters;
            if (side == null && buffers.isEmpty() && arrays != null) {
                for (Map.Entry<String, double[]> entry : arrays.entrySet()) {
                    sources.put(entry.getKey(), DoubleBuffer.wrap(entry.getValue()));
                }
                return sources;
            }
            for (Map.Entry<String, ByteBuffer> entry : getParameterBuffers().entrySet()) {
                sources.put(entry.getKey(), entry.getValue().asDoubleBuffer());
            }
            return sources;
        }

        /** @return how many values each parameter has, by name (none for digests only) */
        Map<String, Long> valueCounts() {
            SideValues spilled = side;
            if (spilled != null) {
                return spilled.counts;
            }
            Map<String, Long> counts = new LinkedHashMap<>();
            for (Map.Entry<String, DoubleBuffer> entry : valueSources().entrySet()) {
                counts.put(entry.getKey(), (long) entry.getValue().remaining());
            }
            return counts;
        }

        /**
         * The values are now in {@code file} from {@code offset} (float64 little-endian, in order):
         * the record lets go of its own copy and reads them there when asked.
         */
        void readValuesFrom(Path file, long offset) {
            side = new SideValues(file.toAbsolutePath(), offset, valueCounts());
            buffers = Collections.emptyMap();
            parameters = null;
        }
    }

    /** A record's values in a history's side file. */
    private static final class SideValues {
        final Path file;
        final long offset;
        final Map<String, Long> counts;

        SideValues(Path file, long offset, Map<String, Long> counts) {
            this.file = file;
            this.offset = offset;
            this.counts = Collections.unmodifiableMap(new LinkedHashMap<>(counts));
        }

        /** Read-only maps of the file, in native order (copied where the machine is not little-endian). */
        Map<String, ByteBuffer> map() {
            Map<String, ByteBuffer> views = new LinkedHashMap<>();
            try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
                long at = offset;
                for (Map.Entry<String, Long> entry : counts.entrySet()) {
                    long bytes = entry.getValue() * Double.BYTES;
                    ByteBuffer mapped = channel.map(FileChannel.MapMode.READ_ONLY, at, bytes).order(ByteOrder.LITTLE_ENDIAN);
                    if (!ByteOrder.nativeOrder().equals(ByteOrder.LITTLE_ENDIAN)) {
                        ByteBuffer copy = ByteBuffer.allocateDirect((int) bytes).order(ByteOrder.nativeOrder());
                        copy.asDoubleBuffer().put(mapped.asDoubleBuffer());
                        mapped = copy;
                    }
                    views.put(entry.getKey(), mapped.asReadOnlyBuffer().order(ByteOrder.nativeOrder()));
                    at += bytes;
                }
            } catch (IOException e) {
                throw new InvalidInputException(Messages.cannotRead(file.toString(), e.getMessage()));
            }
            return views;
        }
    }

    /**
     * SHA-256 hex of values as little-endian bytes of their dtype, as {@code history.digest} in
     * Python: equal digests mean bitwise equal tensors.
     *
     * @param values flattened values (float32 and int64 values widened to double exactly)
     * @param dtype {@code float32}, {@code float64} or {@code int64}
     * @return lowercase hex digest
     */
    public static String digest(double[] values, String dtype) {
        DType type = Digests.digestType(dtype);
        ByteBuffer bytes = ByteBuffer.allocate(values.length * type.size()).order(DType.FILE_ORDER);
        for (double value : values) {
            type.put(bytes, value);
        }
        return Digests.sha256Hex(bytes.array());
    }

    /**
     * The digest of a tensor's values, the same as {@link #digest(double[], String)} of its exact
     * values: hashed straight from the tensor's memory when it holds {@code dtype} in the digest's
     * byte order (no copy), else through its values.
     *
     * @param tensor the tensor
     * @param dtype {@code float32}, {@code float64} or {@code int64}
     * @return lowercase hex digest
     */
    static String digest(Tensor tensor, String dtype) {
        if (tensor.dtype() == Digests.digestType(dtype) && ByteOrder.nativeOrder().equals(DType.FILE_ORDER)) {
            MessageDigest sha = Digests.sha256();
            sha.update(tensor.buffer());
            return Digests.hex(sha.digest());
        }
        return digest(tensor.toExactDoubles(), dtype);
    }

    /**
     * Records the module's parameters after an epoch, with their digests.
     *
     * @param module the module being trained
     * @param epoch epoch index, from 0
     * @param loss the epoch's training loss
     * @param valLoss the validation loss, or {@code null}
     * @param elapsedSeconds wall time since the run started
     * @param withValues keep the values too ({@code false}: digests only, for large models)
     * @return the record
     */
    static EpochRecord record(
            TrainingModule module, int epoch, double loss, Double valLoss, double elapsedSeconds,
            boolean withValues) {
        Map<String, ByteBuffer> values = new LinkedHashMap<>();
        Map<String, String> digests = new LinkedHashMap<>();
        module.readParameters(digests, withValues ? values : null);
        return new EpochRecord(epoch, loss, valLoss, elapsedSeconds,
                values.isEmpty() ? Collections.<String, double[]>emptyMap() : null, values, digests, module.getLrs(),
                null, null, null, null);
    }

    /**
     * Appends one epoch.
     *
     * @param record the epoch's record
     */
    public void add(EpochRecord record) {
        records.add(record);
    }

    /** @return the records, in epoch order */
    public List<EpochRecord> getRecords() {
        return Collections.unmodifiableList(records);
    }

    /**
     * @return one JSON object per line, one line per epoch, every value inline (a record whose
     *     values went to a history's side file reads them back for this)
     */
    public String toJsonLines() {
        StringBuilder out = new StringBuilder();
        HistoryFile inline = new HistoryFile(Path.of("history.jsonl"));
        for (EpochRecord record : records) {
            out.append(inline.inlineLine(record));
        }
        return out.toString();
    }

    /**
     * Writes the history atomically: a temporary file beside {@code path}, then a rename; the
     * values of a record of more than {@link HistoryFile#INLINE_VALUES_LIMIT} go to the side file
     * {@code path + ".values"} (the layout {@link HistoryFile} describes).
     *
     * @param path the .jsonl file
     * @throws IOException when the folder cannot be written
     */
    public void save(Path path) throws IOException {
        new HistoryFile(path).replace(records);
    }
}
