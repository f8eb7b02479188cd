package dev.gradbridge;

import dev.gradbridge.data.Dataset;
import dev.gradbridge.data.Shuffle;
import java.io.IOException;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.Locale;
import java.util.function.Consumer;
import me.tongfei.progressbar.ProgressBar;
import me.tongfei.progressbar.ProgressBarBuilder;
import me.tongfei.progressbar.ProgressBarStyle;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Trains an exported module on a dataset for a number of epochs, the same way the Python
 * reference ({@code gradbridge.reference.train}) does, and returns the per-epoch {@link History}.
 *
 * <p>Modes: {@link Mode#FULL} (one {@code train_step} on all data per epoch), {@link Mode#STEP}
 * (mini-batches cut in Java, one {@code train_step} call each), {@link Mode#FUSED} (one {@code
 * train_epoch} call per epoch). Each epoch seeds libtorch with {@link Shuffle#torchSeed} and, in
 * the mini-batch modes, orders samples with {@link Shuffle#permutation}; so runs are
 * reproducible, and a run resumed from a checkpoint continues exactly where it stopped.
 *
 * <pre>{@code
 * Trainer trainer = Trainer.builder().optEpochs(5).optBatchSize(32).optSeed(7).build();
 * try (TrainingModule module = TrainingModule.load(model);
 *         Dataset data = Dataset.loadNpz(npz)) {
 *     History history = trainer.fit(module, data);
 * }
 * }</pre>
 *
 * <p>Dropout draws from libtorch's process-wide generator: several modules with dropout trained
 * on concurrent threads interleave their draws. Models without randomness are exact on any thread.
 */
public final class Trainer {

    private static final Logger logger = LoggerFactory.getLogger(Trainer.class);

    /** How an epoch is driven. */
    public enum Mode {
        /** One {@code train_step} on the whole dataset. */
        FULL,
        /** Shuffled mini-batches, one {@code train_step} call from Java each. */
        STEP,
        /** Shuffled mini-batches in one native {@code train_epoch} call. */
        FUSED;

        /**
         * Parses {@code full}, {@code step} or {@code fused}.
         *
         * @param name the mode's name
         * @return the mode
         */
        public static Mode parse(String name) {
            try {
                return valueOf(name.toUpperCase(Locale.ROOT));
            } catch (IllegalArgumentException e) {
                throw new InvalidInputException(Messages.unknownMode(name));
            }
        }
    }

    private final int epochs;
    private final Integer batchSize;
    private final Long seed;
    private final Mode mode;
    private final boolean allowDifferentData;
    private final Dataset validation;
    private final Path checkpoint;
    private final Path historyFile;
    private final boolean recordValues;
    private final boolean progressBar;
    private final Consumer<History.EpochRecord> epochListener;
    private volatile boolean stopRequested;
    private volatile boolean stopped;

    private Trainer(Builder builder) {
        this.epochs = builder.epochs;
        this.batchSize = builder.batchSize;
        this.seed = builder.seed;
        this.mode = builder.mode;
        this.allowDifferentData = builder.allowDifferentData;
        this.validation = builder.validation;
        this.checkpoint = builder.checkpoint;
        this.historyFile = builder.historyFile;
        this.recordValues = builder.recordValues;
        this.progressBar = builder.progressBar;
        this.epochListener = builder.epochListener;
    }

    /** @return a builder with defaults: 1 epoch, step mode, batch size 32, seed 0 */
    public static Builder builder() {
        return new Builder();
    }

    /** Settings of a {@link Trainer}. */
    public static final class Builder {
        private int epochs = 1;
        private Integer batchSize;
        private Long seed;
        private Mode mode;
        private boolean allowDifferentData;
        private Dataset validation;
        private Path checkpoint;
        private Path historyFile;
        private boolean recordValues = true;
        private boolean progressBar;
        private Consumer<History.EpochRecord> epochListener;

        private Builder() {}

        /**
         * @param epochs epochs to train in this run (a resumed run adds them), at least 1
         * @return this builder
         */
        public Builder optEpochs(int epochs) {
            this.epochs = epochs;
            return this;
        }

        /**
         * @param batchSize samples per mini-batch, 1..n (ignored in full mode); default 32, or the
         *     checkpoint's when resuming (a different value is refused)
         * @return this builder
         */
        public Builder optBatchSize(int batchSize) {
            this.batchSize = batchSize;
            return this;
        }

        /**
         * @param seed the run's seed (default 0, or the checkpoint's when resuming; a different
         *     value is refused)
         * @return this builder
         */
        public Builder optSeed(long seed) {
            this.seed = seed;
            return this;
        }

        /**
         * @param mode full, step or fused; default step, or the checkpoint's when resuming (a
         *     different value is refused)
         * @return this builder
         */
        public Builder optMode(Mode mode) {
            this.mode = mode;
            return this;
        }

        /**
         * @param allowDifferentData resume on data other than the checkpoint's run started with
         *     (refused by default: shapes and SHA-256 are compared)
         * @return this builder
         */
        public Builder optAllowDifferentData(boolean allowDifferentData) {
            this.allowDifferentData = allowDifferentData;
            return this;
        }

        /**
         * @param validation data for a validation loss after every epoch
         * @return this builder
         */
        public Builder optValidation(Dataset validation) {
            this.validation = validation;
            return this;
        }

        /**
         * @param checkpoint written atomically after every epoch
         * @return this builder
         */
        public Builder optCheckpoint(Path checkpoint) {
            this.checkpoint = checkpoint;
            return this;
        }

        /**
         * @param historyFile written atomically after every epoch (after the checkpoint), so a
         *     run that stops for any reason leaves every completed epoch in it
         * @return this builder
         */
        public Builder optHistory(Path historyFile) {
            this.historyFile = historyFile;
            return this;
        }

        /**
         * @param recordValues keep parameter values in the history (false: digests only)
         * @return this builder
         */
        public Builder optRecordValues(boolean recordValues) {
            this.recordValues = recordValues;
            return this;
        }

        /**
         * @param progressBar show a progress bar on the console
         * @return this builder
         */
        public Builder optProgressBar(boolean progressBar) {
            this.progressBar = progressBar;
            return this;
        }

        /**
         * @param epochListener called on the training thread with each epoch's record, once the
         *     epoch's checkpoint and history are written (e.g. to print progress)
         * @return this builder
         */
        public Builder optEpochListener(Consumer<History.EpochRecord> epochListener) {
            this.epochListener = epochListener;
            return this;
        }

        /** @return the trainer */
        public Trainer build() {
            if (epochs < 1) {
                throw new InvalidInputException("epochs must be at least 1, got " + epochs);
            }
            return new Trainer(this);
        }
    }

    /**
     * Asks a running {@link #fit} to stop after the epoch in progress, once that epoch's
     * checkpoint and history are written (e.g. from a SIGTERM handler). Safe from any thread.
     */
    public void requestStop() {
        stopRequested = true;
    }

    /** @return whether the last {@link #fit} ended early because of {@link #requestStop} */
    public boolean wasStopped() {
        return stopped;
    }

    /**
     * Trains {@code module} on {@code train}.
     *
     * @param module the module; resumes after its checkpoint's epochs if it was loaded from one
     * @param train the training data, checked against the module's metadata first
     * @return one record per epoch of this run
     * @throws InvalidInputException when data, batch size or seed do not fit; nothing trained
     * @throws DivergenceException when a loss becomes NaN or infinite
     * @throws IOException when the checkpoint cannot be written
     */
    public History fit(TrainingModule module, Dataset train) throws IOException {
        // Hold the module for the whole run, before anything else: a refused second caller must
        // not reseed libtorch's generator (the first run's dropout draws from it) nor interleave
        // its steps with the first run's.
        try (ThreadGuard.Use use = module.use()) {
            return fitHeld(module, train);
        }
    }

    private History fitHeld(TrainingModule module, Dataset train) throws IOException {
        Metadata metadata = module.getMetadata();
        train.check(metadata);
        if (validation != null) {
            validation.check(metadata);
        }
        Metadata.Checkpoint resumed = metadata.getCheckpoint();
        Path from = module.getPath();
        long runSeed = resolve(from, resumed, "seed", seed, resumed == null ? null : resumed.getSeed(), 0L);
        String modeName =
                resolve(from, resumed, "mode", mode == null ? null : mode.name().toLowerCase(Locale.ROOT),
                        resumed == null ? null : resumed.getMode(), "step");
        Mode runMode = Mode.parse(modeName);
        int n = train.size();
        int batch;
        if (runMode == Mode.FULL) {
            batch = n;
        } else {
            batch = resolve(from, resumed, "batch size", batchSize, resumed == null ? null : resumed.getBatchSize(), 32);
        }
        if (batch < 1 || batch > n) {
            throw new InvalidInputException(
                    "batch size must be in 1.." + n + " (the number of samples in " + train.getSource()
                            + "), got " + batch);
        }
        int first = resumed == null ? 0 : resumed.getEpochsCompleted();
        if (first < 0 || (long) first + epochs > Integer.MAX_VALUE) {
            throw new InvalidInputException(
                    Messages.epochCount(from.toString(), first, epochs, Integer.MAX_VALUE));
        }
        long[] xShape = train.getX().shape();
        long[] yShape = train.getY().shape();
        String fingerprint = resumed != null || checkpoint != null ? train.fingerprint() : null;
        if (resumed != null && !allowDifferentData) {
            checkSameData(from, resumed, train, xShape, yShape, fingerprint);
        }
        for (Path output : new Path[] {checkpoint, historyFile}) {
            if (output != null) {
                AtomicFiles.prepare(output);
            }
        }
        logger.info(
                "training {} for {} epochs from epoch {}: {} samples, mode {}, batch {}, seed {}",
                from.getFileName(), epochs, first, n, runMode, batch, runSeed);

        History history = new History();
        long started = System.nanoTime();
        try (ProgressBar bar = progressBar ? newProgressBar() : null) {
            for (int epoch = first; epoch < first + epochs; epoch++) {
                ScriptedModule.seed(Shuffle.torchSeed(runSeed, epoch));
                double[] losses = runEpoch(module, train, runMode, runSeed, epoch, batch, history);
                double loss = History.epochLoss(losses);
                Double valLoss =
                        validation == null ? null : module.evaluate(validation.getX(), validation.getY());
                // Per-epoch schedules step here, as the Python reference does (ReduceLROnPlateau
                // on the validation loss, else on the training loss).
                module.scheduleEpoch(valLoss != null ? valLoss : loss);
                double elapsed = (System.nanoTime() - started) / 1e9;
                History.EpochRecord record = History.record(module, epoch, loss, valLoss, elapsed, recordValues);
                history.add(record);
                logger.debug("epoch {}: loss {} validation {}", epoch, loss, valLoss);
                if (checkpoint != null) {
                    module.saveCheckpoint(
                            checkpoint,
                            new Metadata.Checkpoint(epoch + 1, runSeed, batch, modeName, xShape, yShape, fingerprint));
                }
                if (historyFile != null) {
                    history.save(historyFile);
                }
                if (epochListener != null) {
                    epochListener.accept(record);
                }
                if (bar != null) {
                    bar.step();
                    bar.setExtraMessage(String.format(Locale.ROOT, "loss %.4g", loss));
                }
                if (stopRequested) {
                    // A consistent point: the epoch, its checkpoint and its history are written.
                    logger.info("stop requested: stopping after epoch {}", epoch);
                    stopped = true;
                    break;
                }
            }
        }
        return history;
    }

    /**
     * A run setting: the caller's value, else the checkpoint's, else the default. A caller's
     * value that differs from the checkpoint's is refused: the resumed run would not be the run.
     */
    private static <T> T resolve(Path from, Metadata.Checkpoint resumed, String what, T given, T saved, T fallback) {
        if (given != null && saved != null && !given.equals(saved)) {
            throw new InvalidInputException(Messages.resumeConflict(from.toString(), what, saved, given));
        }
        return given != null ? given : saved != null ? saved : fallback;
    }

    /** A resumed run must see the data it started with (shapes and SHA-256 of the bytes). */
    private static void checkSameData(
            Path from, Metadata.Checkpoint resumed, Dataset train, long[] xShape, long[] yShape, String fingerprint) {
        boolean sameShapes =
                (resumed.getXShape() == null || Arrays.equals(resumed.getXShape(), xShape))
                        && (resumed.getYShape() == null || Arrays.equals(resumed.getYShape(), yShape));
        boolean sameBytes = resumed.getDataSha256() == null || resumed.getDataSha256().equals(fingerprint);
        if (!sameShapes || !sameBytes) {
            throw new InvalidInputException(
                    Messages.differentData(
                            train.getSource(), from.toString(),
                            "x " + Arrays.toString(resumed.getXShape()) + " y " + Arrays.toString(resumed.getYShape())
                                    + " sha256 " + shortHash(resumed.getDataSha256()),
                            "x " + Arrays.toString(xShape) + " y " + Arrays.toString(yShape)
                                    + " sha256 " + shortHash(fingerprint)));
        }
    }

    private static String shortHash(String hash) {
        return hash == null ? "?" : hash.substring(0, Math.min(12, hash.length()));
    }

    private ProgressBar newProgressBar() {
        return new ProgressBarBuilder()
                .setTaskName("epochs")
                .setInitialMax(epochs)
                .setStyle(ProgressBarStyle.ASCII)
                .build();
    }

    private double[] runEpoch(
            TrainingModule module, Dataset train, Mode mode, long runSeed, int epoch, int batch, History done) {
        Tensor x = train.getX();
        Tensor y = train.getY();
        int n = train.size();
        if (mode == Mode.FULL) {
            double[] losses = {module.trainStep(x, y)};
            checkFinite(losses, epoch, n, n, done);
            return losses;
        }
        long[] perm = Shuffle.permutation(runSeed, epoch, n);
        try (Tensor order = Tensor.of(perm, perm.length)) {
            if (mode == Mode.FUSED) {
                double[] losses = module.trainEpoch(x, y, order, batch);
                checkFinite(losses, epoch, batch, n, done);
                return losses;
            }
            // Gather the epoch's order once, then step through contiguous row slices: the same
            // values as gathering each batch, without a gather between every two steps (which
            // measured about twice as slow per epoch).
            double[] losses = new double[(n + batch - 1) / batch];
            try (Tensor xs = x.index(order);
                    Tensor ys = y.index(order)) {
                for (int b = 0; b < losses.length; b++) {
                    try (Tensor xb = xs.rows((long) b * batch, Math.min(n, (long) (b + 1) * batch));
                            Tensor yb = ys.rows((long) b * batch, Math.min(n, (long) (b + 1) * batch))) {
                        losses[b] = module.trainStep(xb, yb);
                    }
                    checkFinite(losses[b], epoch, b, batch, n, done);
                }
            }
            return losses;
        }
    }

    private void checkFinite(double[] losses, int epoch, int batch, int n, History done) {
        for (int b = 0; b < losses.length; b++) {
            checkFinite(losses[b], epoch, b, batch, n, done);
        }
    }

    private void checkFinite(double loss, int epoch, int index, int batch, int n, History done) {
        if (Double.isNaN(loss) || Double.isInfinite(loss)) {
            int from = index * batch;
            throw new DivergenceException(
                    Messages.divergence(loss, epoch, index, from, Math.min(n, from + batch) - 1) + "; " + kept(done),
                    epoch, index, done);
        }
    }

    /** What a stopped run kept: its completed epochs, where they are. */
    private String kept(History done) {
        int completed = done.getRecords().size();
        String epochs = completed == 0
                ? "no epoch completed in this run"
                : completed + " completed epoch(s) kept" + (historyFile == null ? "" : " in " + historyFile);
        return epochs + (checkpoint == null ? "" : "; " + checkpoint + " holds the last good epoch, if one finished");
    }
}
