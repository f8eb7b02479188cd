package dev.gradbridge;

import java.nio.file.Path;
import java.util.function.Consumer;

/**
 * The settings every gradbridge trainer shares ({@link Trainer} in one process, gradbridge-spark's
 * {@code SparkTrainer} over partitions) and the one way they are applied: a setting given by the
 * caller, else the resumed checkpoint's, else the default, a caller's value that differs from the
 * checkpoint's refused; the batch size checked against the data; a resumed run refused on other
 * data; the outputs prepared before the first step and written after every epoch.
 */
public final class RunSettings {

    private final int epochs;
    private final Integer batchSize;
    private final Long seed;
    private final boolean allowDifferentData;
    private final Path checkpoint;
    private final Path historyFile;
    private final boolean recordValues;
    private final Consumer<History.EpochRecord> epochListener;

    private RunSettings(Builder<?> b) {
        if (b.epochs < 1) {
            throw new InvalidInputException("epochs must be at least 1, got " + b.epochs);
        }
        this.epochs = b.epochs;
        this.batchSize = b.batchSize;
        this.seed = b.seed;
        this.allowDifferentData = b.allowDifferentData;
        this.checkpoint = b.checkpoint;
        this.historyFile = b.historyFile;
        this.recordValues = b.recordValues;
        this.epochListener = b.epochListener;
    }

    /**
     * The options of a trainer's builder that every trainer has.
     *
     * @param <B> the trainer's builder
     */
    public abstract static class Builder<B extends Builder<B>> {
        private int epochs = Protocol.DEFAULT_EPOCHS;
        private Integer batchSize;
        private Long seed;
        private boolean allowDifferentData;
        private Path checkpoint;
        private Path historyFile;
        private boolean recordValues = true;
        private Consumer<History.EpochRecord> epochListener;

        /** Only trainers' builders extend this. */
        protected Builder() {}

        /** @return this builder, as the trainer's type */
        protected abstract B self();

        /** @return the settings given so far (refuses fewer than one epoch) */
        public final RunSettings settings() {
            return new RunSettings(this);
        }

        /**
         * @param epochs epochs to train in this run (a resumed run adds them), at least 1; default
         *     {@value Protocol#DEFAULT_EPOCHS}
         * @return this builder
         */
        public B optEpochs(int epochs) {
            this.epochs = epochs;
            return self();
        }

        /**
         * @param batchSize samples per optimizer step (over all partitions in a data-parallel run),
         *     1..n; default {@value Protocol#DEFAULT_BATCH_SIZE}, or the checkpoint's when resuming (a
         *     different value is refused)
         * @return this builder
         */
        public B optBatchSize(int batchSize) {
            this.batchSize = batchSize;
            return self();
        }

        /**
         * @param seed the run's seed (default {@value Protocol#DEFAULT_SEED}, or the checkpoint's when resuming;
         *     a different value is refused)
         * @return this builder
         */
        public B optSeed(long seed) {
            this.seed = seed;
            return self();
        }

        /**
         * @param allowDifferentData resume on data other than the checkpoint's run started with
         *     (refused by default: shapes and SHA-256 are compared)
         * @return this builder
         */
        public B optAllowDifferentData(boolean allowDifferentData) {
            this.allowDifferentData = allowDifferentData;
            return self();
        }

        /**
         * @param checkpoint written atomically after every epoch
         * @return this builder
         */
        public B optCheckpoint(Path checkpoint) {
            this.checkpoint = checkpoint;
            return self();
        }

        /**
         * @param historyFile written after every epoch (after the checkpoint): the first epoch replaces
         *     it, later ones append their record ({@link HistoryFile}: large values in a side file), so a
         *     run that stops for any reason leaves every completed epoch in it
         * @return this builder
         */
        public B optHistory(Path historyFile) {
            this.historyFile = historyFile;
            return self();
        }

        /**
         * @param recordValues keep parameter values in the history (false: digests only)
         * @return this builder
         */
        public B optRecordValues(boolean recordValues) {
            this.recordValues = recordValues;
            return self();
        }

        /**
         * @param epochListener called with each epoch's record once the epoch's checkpoint and
         *     history are written (e.g. to print progress)
         * @return this builder
         */
        public B optEpochListener(Consumer<History.EpochRecord> epochListener) {
            this.epochListener = epochListener;
            return self();
        }
    }

    /** @return epochs to train in this run */
    public int getEpochs() {
        return epochs;
    }

    /** @return the checkpoint written after every epoch, or {@code null} */
    public Path getCheckpoint() {
        return checkpoint;
    }

    /** @return the history written after every epoch, or {@code null} */
    public Path getHistory() {
        return historyFile;
    }

    /** @return whether the history keeps parameter values (else digests only) */
    public boolean isRecordValues() {
        return recordValues;
    }

    /**
     * @return the caller's batch size, or {@code null} (then the checkpoint's, else
     *     {@value Protocol#DEFAULT_BATCH_SIZE})
     */
    public Integer getBatchSize() {
        return batchSize;
    }

    /** @return the caller's seed, or {@code null} (then the checkpoint's, else {@value Protocol#DEFAULT_SEED}) */
    public Long getSeed() {
        return seed;
    }

    /** @return whether a resumed run may train on other data than it started with */
    public boolean isAllowDifferentData() {
        return allowDifferentData;
    }

    /** @return what is called after every epoch, or {@code null} */
    public Consumer<History.EpochRecord> getEpochListener() {
        return epochListener;
    }
}
