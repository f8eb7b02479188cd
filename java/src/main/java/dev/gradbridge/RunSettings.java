package dev.gradbridge;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.AtomicFiles;
import java.io.IOException;
import java.nio.file.Path;
import java.util.Arrays;
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
        private int epochs = 1;
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
         * @param epochs epochs to train in this run (a resumed run adds them), at least 1
         * @return this builder
         */
        public B optEpochs(int epochs) {
            this.epochs = epochs;
            return self();
        }

        /**
         * @param batchSize samples per optimizer step (over all partitions in a data-parallel run),
         *     1..n; default 32, or the checkpoint's when resuming (a different value is refused)
         * @return this builder
         */
        public B optBatchSize(int batchSize) {
            this.batchSize = batchSize;
            return self();
        }

        /**
         * @param seed the run's seed (default 0, or the checkpoint's when resuming; a different
         *     value is refused)
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
         * @param historyFile written atomically after every epoch (after the checkpoint), so a
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

    /**
     * @param done the epochs a stopped run completed
     * @return what it kept, and where (the end of a divergence line, the same for every trainer)
     */
    public String kept(History done) {
        int completed = done.getRecords().size();
        String epochs = completed == 0
                ? "no epoch completed in this run"
                : completed + " completed epoch(s) kept" + (historyFile == null ? "" : " in " + historyFile);
        return epochs + (checkpoint == null ? "" : "; " + checkpoint + " holds the last good epoch, if one finished");
    }

    /** @return whether the history keeps parameter values (else digests only) */
    public boolean isRecordValues() {
        return recordValues;
    }

    /**
     * @param from the module's file (named in refusals)
     * @param resumed the checkpoint entry it resumes, or {@code null} for a new run
     * @return the settings applied to that start
     */
    public Run start(Path from, Metadata.Checkpoint resumed) {
        return new Run(from, resumed);
    }

    /** Writes a checkpoint to a path (the trainer knows what its state is). */
    public interface CheckpointSave {
        /**
         * @param target where to write, atomically
         * @throws IOException when it cannot be written
         */
        void save(Path target) throws IOException;
    }

    /** The settings applied to one run's start: a new run, or the one a checkpoint resumes. */
    public final class Run {
        private final Path from;
        private final Metadata.Checkpoint resumed;

        private Run(Path from, Metadata.Checkpoint resumed) {
            this.from = from;
            this.resumed = resumed;
        }

        /**
         * A setting: the caller's value, else the checkpoint's, else the default. A caller's value
         * that differs from the checkpoint's is refused: the resumed run would not be the run.
         *
         * @param what the setting's name in the refusal
         * @param given the caller's value, or {@code null}
         * @param saved the checkpoint's, or {@code null}
         * @param fallback the default
         * @param <T> its type
         * @return the value the run uses
         */
        public <T> T resolve(String what, T given, T saved, T fallback) {
            if (given != null && saved != null && !given.equals(saved)) {
                throw new InvalidInputException(Messages.resumeConflict(from.toString(), what, saved, given));
            }
            return given != null ? given : saved != null ? saved : fallback;
        }

        /** @return the run's seed: the caller's, else the checkpoint's, else 0 */
        public long seed() {
            return resolve("seed", seed, resumed == null ? null : resumed.getSeed(), 0L);
        }

        /**
         * @param n samples in the training data
         * @param source the data's name in the refusal
         * @return the run's batch size (the caller's, else the checkpoint's, else 32), in 1..n
         */
        public int batchSize(long n, String source) {
            return checkBatch(resolve("batch size", batchSize, resumed == null ? null : resumed.getBatchSize(), 32),
                    n, source);
        }

        /**
         * @param batch a batch size the run fixes itself (one batch of all samples)
         * @param n samples in the training data
         * @param source the data's name in the refusal
         * @return {@code batch}, once checked to be in 1..n
         */
        public int checkBatch(int batch, long n, String source) {
            if (batch < 1 || batch > n) {
                throw new InvalidInputException(
                        "batch size must be in 1.." + n + " (the number of samples in " + source + "), got " + batch);
            }
            return batch;
        }

        /** @return the first epoch of this run (the checkpoint's epochs completed), with room for all epochs */
        public int firstEpoch() {
            int first = resumed == null ? 0 : resumed.getEpochsCompleted();
            if (first < 0 || (long) first + epochs > Integer.MAX_VALUE) {
                throw new InvalidInputException(Messages.epochCount(from.toString(), first, epochs, Integer.MAX_VALUE));
            }
            return first;
        }

        /**
         * A resumed run must see the data it started with: refused, unless the caller allows
         * other data, when the shapes or the digests differ (a checkpoint without them checks none).
         *
         * @param source the data's name
         * @param xShape the data's input shape
         * @param yShape the data's target shape
         * @param saved the checkpoint's digest of its data, or {@code null}
         * @param digest the same digest of this data
         */
        public void checkSameData(String source, long[] xShape, long[] yShape, String saved, String digest) {
            if (resumed == null || allowDifferentData) {
                return;
            }
            boolean sameShapes = (resumed.getXShape() == null || Arrays.equals(resumed.getXShape(), xShape))
                    && (resumed.getYShape() == null || Arrays.equals(resumed.getYShape(), yShape));
            boolean sameBytes = saved == null || saved.equals(digest);
            if (!sameShapes || !sameBytes) {
                throw new InvalidInputException(Messages.differentData(source, from.toString(),
                        "x " + Arrays.toString(resumed.getXShape()) + " y " + Arrays.toString(resumed.getYShape())
                                + " sha256 " + shortHash(saved),
                        "x " + Arrays.toString(xShape) + " y " + Arrays.toString(yShape) + " sha256 " + shortHash(digest)));
            }
        }

        /**
         * Checks, before the first step, that the checkpoint and history can be written there.
         *
         * @throws IOException when they cannot
         */
        public void prepareOutputs() throws IOException {
            for (Path output : new Path[] {checkpoint, historyFile}) {
                if (output != null) {
                    AtomicFiles.prepare(output);
                }
            }
        }

        /**
         * After an epoch: the checkpoint, then the history, then the listener.
         *
         * @param history the run's history, {@code record} already added
         * @param record the epoch's record
         * @param save writes the checkpoint
         * @throws IOException when a file cannot be written
         */
        public void endEpoch(History history, History.EpochRecord record, CheckpointSave save) throws IOException {
            if (checkpoint != null) {
                save.save(checkpoint);
            }
            if (historyFile != null) {
                history.save(historyFile);
            }
            if (epochListener != null) {
                epochListener.accept(record);
            }
        }
    }

    private static String shortHash(String hash) {
        return hash == null ? "?" : hash.substring(0, Math.min(12, hash.length()));
    }
}
