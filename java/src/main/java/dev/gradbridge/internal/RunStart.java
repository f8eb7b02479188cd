package dev.gradbridge.internal;

import dev.gradbridge.History;
import dev.gradbridge.HistoryFile;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.RunSettings;
import java.io.IOException;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.List;

/**
 * A trainer's {@link RunSettings} applied to one run's start, a new run or the one a checkpoint
 * resumes: the one way every trainer ({@code Trainer}, gradbridge-spark's {@code SparkTrainer})
 * resolves its settings, checks the batch size and the data, and writes its outputs.
 */
public final class RunStart {
    private final RunSettings settings;
    private final Path from;
    private final Metadata.Checkpoint resumed;
    private HistoryFile historyFile; // the run's history, appended epoch by epoch

    /**
     * @param settings the trainer's settings
     * @param from the module's file (named in refusals)
     * @param resumed the checkpoint entry it resumes, or {@code null} for a new run
     */
    public RunStart(RunSettings settings, Path from, Metadata.Checkpoint resumed) {
        this.settings = settings;
        this.from = from;
        this.resumed = resumed;
    }

    /** The keys of a checkpoint entry a resume continues the run by: without one it would start over or guess. */
    public static final List<String> RUN_KEYS = List.of("epochs_completed", "seed", "batch_size", "mode");
    /** The keys a resume checks its data by, besides the digest (waived by allowing other data). */
    public static final List<String> DATA_KEYS = List.of("x_shape", "y_shape");
    /** The digest of a run's data that {@code Trainer} records (gradbridge-spark's: {@code shards_sha256}). */
    public static final String DATA_SHA256 = "data_sha256";

    /**
     * A file given to resume ({@code --resume}) must be a checkpoint a training run wrote: a
     * {@code checkpoint} entry holding {@link #RUN_KEYS}, and, unless other data is allowed,
     * {@link #DATA_KEYS} and one of {@code digestKeys}. An edited one is refused in one line naming
     * the file and what is missing: without the entry the run would silently start over, without its
     * digest the same-data check would be skipped.
     *
     * @param file the checkpoint (named in the refusal)
     * @param checkpoint its entry, or {@code null} when it has none
     * @param allowDifferentData whether the caller allows other data
     * @param digestKeys the keys that name the run's data, any one of them enough (the first named when none is there)
     * @throws InvalidInputException when something is missing
     */
    public static void checkResumable(Path file, Metadata.Checkpoint checkpoint, boolean allowDifferentData,
            String... digestKeys) {
        if (checkpoint == null) {
            throw new InvalidInputException(Messages.resumeWithoutCheckpoint(file.toString()));
        }
        for (String key : RUN_KEYS) {
            if (!checkpoint.has(key)) {
                throw new InvalidInputException(Messages.resumeKeyMissing(file.toString(), key, false));
            }
        }
        if (allowDifferentData) {
            return;
        }
        for (String key : DATA_KEYS) {
            if (!checkpoint.has(key)) {
                throw new InvalidInputException(Messages.resumeKeyMissing(file.toString(), key, true));
            }
        }
        if (Arrays.stream(digestKeys).noneMatch(checkpoint::has)) {
            throw new InvalidInputException(Messages.resumeKeyMissing(file.toString(), digestKeys[0], true));
        }
    }

    /** Writes a checkpoint to a path (the trainer knows what its state is). */
    public interface CheckpointSave {
        /**
         * @param target where to write, atomically
         * @throws IOException when it cannot be written
         */
        void save(Path target) throws IOException;
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

    /** @return the run's seed: the caller's, else the checkpoint's, else {@value Protocol#DEFAULT_SEED} */
    public long seed() {
        return resolve("seed", settings.getSeed(), resumed == null ? null : resumed.getSeed(), Protocol.DEFAULT_SEED);
    }

    /**
     * @param n samples in the training data
     * @param source the data's name in the refusal
     * @return the run's batch size (the caller's, else the checkpoint's, else {@value Protocol#DEFAULT_BATCH_SIZE}),
     *     in 1..n
     */
    public int batchSize(long n, String source) {
        return checkBatch(resolve("batch size", settings.getBatchSize(),
                resumed == null ? null : resumed.getBatchSize(), Protocol.DEFAULT_BATCH_SIZE), n, source);
    }

    /**
     * @param batch a batch size the run fixes itself (one batch of all samples)
     * @param n samples in the training data
     * @param source the data's name in the refusal
     * @return {@code batch}, once checked to be in 1..n
     */
    public int checkBatch(int batch, long n, String source) {
        if (batch < 1 || batch > n) {
            throw new InvalidInputException(source + ": " + Messages.batchSize(n, batch));
        }
        return batch;
    }

    /** @return the first epoch of this run (the checkpoint's epochs completed), with room for all epochs */
    public int firstEpoch() {
        int first = resumed == null ? 0 : resumed.getEpochsCompleted();
        if (first < 0 || (long) first + settings.getEpochs() > Integer.MAX_VALUE) {
            throw new InvalidInputException(Messages.epochCount(from.toString(), first, settings.getEpochs(),
                    Integer.MAX_VALUE));
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
        if (resumed == null || settings.isAllowDifferentData()) {
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
        for (Path output : new Path[] {settings.getCheckpoint(), settings.getHistory()}) {
            if (output != null) {
                AtomicFiles.prepare(output);
            }
        }
    }

    /**
     * After an epoch: the checkpoint, then the history (the run's first epoch replaces the file, every
     * later one appends its record: {@link HistoryFile}), then the listener.
     *
     * @param history the run's history, {@code record} already added
     * @param record the epoch's record
     * @param save writes the checkpoint
     * @throws IOException when a file cannot be written
     */
    public void endEpoch(History history, History.EpochRecord record, CheckpointSave save) throws IOException {
        if (settings.getCheckpoint() != null) {
            save.save(settings.getCheckpoint());
        }
        if (settings.getHistory() != null) {
            if (historyFile == null) {
                historyFile = new HistoryFile(settings.getHistory());
            }
            historyFile.append(record);
        }
        if (settings.getEpochListener() != null) {
            settings.getEpochListener().accept(record);
        }
    }

    /**
     * @param settings the stopped run's settings
     * @param done the epochs it completed
     * @return what it kept, and where (the end of a divergence line, the same for every trainer)
     */
    public static String kept(RunSettings settings, History done) {
        int completed = done.getRecords().size();
        Path historyFile = settings.getHistory();
        Path checkpoint = settings.getCheckpoint();
        String epochs = completed == 0
                ? "no epoch completed in this run"
                : completed + " completed epoch(s) kept" + (historyFile == null ? "" : " in " + historyFile);
        return epochs + (checkpoint == null ? "" : "; " + checkpoint + " holds the last good epoch, if one finished");
    }

    private static String shortHash(String hash) {
        return hash == null ? "?" : hash.substring(0, Math.min(12, hash.length()));
    }

    /**
     * The epoch loss of the history's schema, for every trainer: batch losses summed in order in
     * double, over their count (Python's {@code history.epoch_loss}).
     *
     * @param batchLosses the epoch's batch losses, in order
     * @return their mean
     */
    public static double epochLoss(double[] batchLosses) {
        double total = 0;
        for (double value : batchLosses) {
            total += value;
        }
        return total / batchLosses.length;
    }
}
