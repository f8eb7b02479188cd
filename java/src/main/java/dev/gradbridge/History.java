package dev.gradbridge;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * What a training run did, epoch by epoch, written as JSON Lines in the schema that {@code
 * python/gradbridge/history.py} defines and reads: {@code {"epoch", "loss", "parameters"}}.
 */
public final class History {

    private static final Gson GSON = new GsonBuilder().serializeSpecialFloatingPointValues().create();

    private final List<EpochRecord> records = new ArrayList<>();

    /** One epoch: its index (from 0), the loss computed in it, the parameters after its step. */
    public static final class EpochRecord {
        // Field order is the JSON key order of the schema.
        private final int epoch;
        private final double loss;
        private final Map<String, double[]> parameters;

        /**
         * Creates a record.
         *
         * @param epoch epoch index, from 0
         * @param loss the loss computed during the epoch
         * @param parameters parameter values after the epoch's step, by name, flattened
         */
        public EpochRecord(int epoch, double loss, Map<String, double[]> parameters) {
            this.epoch = epoch;
            this.loss = loss;
            this.parameters = Collections.unmodifiableMap(new LinkedHashMap<>(parameters));
        }

        /** @return epoch index, from 0 */
        public int getEpoch() {
            return epoch;
        }

        /** @return the loss computed during the epoch */
        public double getLoss() {
            return loss;
        }

        /** @return parameters after the epoch's step, by name */
        public Map<String, double[]> getParameters() {
            return parameters;
        }
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

    /** @return one JSON object per line, one line per epoch */
    public String toJsonLines() {
        StringBuilder out = new StringBuilder();
        for (EpochRecord record : records) {
            out.append(GSON.toJson(record)).append('\n');
        }
        return out.toString();
    }

    /**
     * Writes the history atomically: a temporary file beside {@code path}, then a rename.
     *
     * @param path the .jsonl file
     * @throws IOException when the folder cannot be written
     */
    public void save(Path path) throws IOException {
        Path target = path.toAbsolutePath();
        Files.createDirectories(target.getParent());
        Path tmp = Files.createTempFile(target.getParent(), "." + target.getFileName(), ".tmp");
        try {
            Files.write(tmp, toJsonLines().getBytes(StandardCharsets.UTF_8));
            Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } finally {
            Files.deleteIfExists(tmp);
        }
    }
}
