package dev.gradbridge;

import dev.gradbridge.internal.RunStart;
import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.ValueRanges;
import dev.gradbridge.data.Dataset;
import dev.gradbridge.data.Shuffle;
import java.io.IOException;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
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
 *
 * <p>Devices: a run trains where its module is ({@link TrainingModule#load(Path, String)}), or on {@link
 * Builder#optDevice}'s device, where it moves the module first. On a CUDA device each batch is copied
 * there from page-locked memory per step, a step's loss comes back as it returns (fused: the epoch's
 * losses at its end), and libtorch's deterministic algorithms are on for the run ({@link
 * Builder#optDeterministic}; with {@code CUBLAS_WORKSPACE_CONFIG=:4096:8}, which must be set before CUDA
 * starts: gradbridge's native library sets it when it loads CUDA, unless the process has it set). Each
 * epoch's record names the device and that setting; a CPU run's records are as they always were.
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

    private final RunSettings settings;
    private final Mode mode;
    private final Dataset validation;
    private final boolean progressBar;
    private final String device;
    private final boolean deterministic;
    private volatile boolean stopRequested;
    private volatile boolean stopped;

    private Trainer(Builder builder) {
        this.settings = builder.settings();
        this.mode = builder.mode;
        this.validation = builder.validation;
        this.progressBar = builder.progressBar;
        this.device = builder.device;
        this.deterministic = builder.deterministic;
    }

    /**
     * @return a builder with the defaults: {@value Protocol#DEFAULT_EPOCHS} epoch, mode {@value Protocol#DEFAULT_MODE},
     *     batch size {@value Protocol#DEFAULT_BATCH_SIZE}, seed {@value Protocol#DEFAULT_SEED}
     */
    public static Builder builder() {
        return new Builder();
    }

    /** Settings of a {@link Trainer}: the {@link RunSettings} every trainer has, and these. */
    public static final class Builder extends RunSettings.Builder<Builder> {
        private Mode mode;
        private Dataset validation;
        private boolean progressBar;
        private String device;
        private boolean deterministic = true;

        private Builder() {}

        @Override
        protected Builder self() {
            return this;
        }

        /**
         * @param mode full, step or fused; default {@value Protocol#DEFAULT_MODE}, or the checkpoint's when
         *     resuming (a different value is refused)
         * @return this builder
         */
        public Builder optMode(Mode mode) {
            this.mode = mode;
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
         * @param progressBar show a progress bar on the console
         * @return this builder
         */
        public Builder optProgressBar(boolean progressBar) {
            this.progressBar = progressBar;
            return this;
        }

        /**
         * @param device where the run trains: {@code cpu}, {@code cuda} or {@code cuda:N}; default: where the
         *     module is. A module elsewhere is moved there first (and stays there)
         * @return this builder
         * @throws InvalidInputException when {@code device} names no device
         */
        public Builder optDevice(String device) {
            this.device = Devices.canonical(device);
            return this;
        }

        /**
         * @param deterministic on a CUDA device, run with libtorch's deterministic algorithms (default true:
         *     runs repeat bit for bit, and an op without a deterministic kernel fails); no effect on the CPU
         * @return this builder
         */
        public Builder optDeterministic(boolean deterministic) {
            this.deterministic = deterministic;
            return this;
        }

        /** @return the trainer */
        public Trainer build() {
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
     * @throws InvalidInputException when data, batch size or seed do not fit (nothing trained), or
     *     when a step or the validation loss fails on an id or label the model cannot take (naming the
     *     data and the array: {@link ValueRanges})
     * @throws MethodCallException when a step fails inside libtorch for another reason
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
        Plan plan = plan(module, train);
        int epochs = settings.getEpochs();
        if (device != null) {
            module.moveTo(device);
        }
        plan.on = module.getDevice();
        plan.cuda = Devices.isCuda(plan.on);
        logger.info(
                "training {} for {} epochs from epoch {}: {} samples, mode {}, batch {}, seed {}{}",
                module.getPath().getFileName(), epochs, plan.first, plan.n, plan.mode, plan.batch, plan.seed,
                plan.cuda ? ", on " + plan.on : "");

        History history = new History();
        long started = System.nanoTime();
        boolean before = plan.cuda && Native.setDeterministic(deterministic);
        try (ProgressBar bar = progressBar ? newProgressBar() : null;
                TensorScope pinned = new TensorScope()) {
            Map<String, Tensor> x = train.getInputs();
            Tensor y = train.getY();
            if (plan.cuda && plan.mode != Mode.STEP) { // the whole data set crosses every epoch: from page-locked memory
                Map<String, Tensor> copies = new LinkedHashMap<>();
                for (Map.Entry<String, Tensor> input : x.entrySet()) {
                    copies.put(input.getKey(), pinned.add(input.getValue().pinned()));
                }
                x = copies;
                y = pinned.add(y.pinned());
            }
            for (int epoch = plan.first; epoch < plan.first + epochs; epoch++) {
                double loss = epoch(module, train, plan, x, y, epoch, history, started);
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
        } finally {
            if (plan.cuda) {
                Native.setDeterministic(before);
            }
        }
        return history;
    }

    /** What a run resolved before its first epoch: seed, mode, batch size, where it starts, the data it checked. */
    private static final class Plan {
        RunStart run;
        long seed;
        String modeName;
        Mode mode;
        int n;
        int batch;
        int first;
        long[] xShape;
        long[] yShape;
        String fingerprint;
        String on; // the device, once the module is on it
        boolean cuda;
    }

    /** Checks the data against the module and the run against its checkpoint, and prepares the outputs. */
    private Plan plan(TrainingModule module, Dataset train) throws IOException {
        Metadata metadata = module.getMetadata();
        train.check(metadata);
        if (validation != null) {
            validation.check(metadata);
        }
        Metadata.Checkpoint resumed = metadata.getCheckpoint();
        Plan plan = new Plan();
        RunStart run = new RunStart(settings, module.getPath(), resumed);
        plan.run = run;
        plan.seed = run.seed();
        plan.modeName = run.resolve("mode", mode == null ? null : mode.name().toLowerCase(Locale.ROOT),
                resumed == null ? null : resumed.getMode(), Protocol.DEFAULT_MODE);
        plan.mode = Mode.parse(plan.modeName);
        int n = train.size();
        plan.n = n;
        plan.batch = plan.mode == Mode.FULL ? run.checkBatch(n, n, train.getSource()) : run.batchSize(n, train.getSource());
        plan.first = run.firstEpoch();
        // a model of several inputs: its first input's shape (the data's digest covers them all)
        plan.xShape = train.getInputs().values().iterator().next().shape();
        plan.yShape = train.getY().shape();
        plan.fingerprint = resumed != null || settings.getCheckpoint() != null ? train.fingerprint() : null;
        run.checkSameData(train.getSource(), plan.xShape, plan.yShape, resumed == null ? null : resumed.getDataSha256(),
                plan.fingerprint);
        run.prepareOutputs();
        return plan;
    }

    /** One epoch: its steps, the validation loss, the per-epoch schedule, its record and checkpoint; its loss. */
    private double epoch(TrainingModule module, Dataset train, Plan plan, Map<String, Tensor> x, Tensor y, int epoch,
            History history, long started) throws IOException {
        ModuleEngine.seed(Shuffle.torchSeed(plan.seed, epoch));
        double[] losses;
        try {
            losses = runEpoch(module, x, y, plan.n, plan.cuda, plan.mode, plan.seed, epoch, plan.batch, history);
        } catch (MethodCallException e) { // an id or label the model cannot take: the data's line
            throw ValueRanges.blame(module, train, e);
        }
        double loss = RunStart.epochLoss(losses);
        Double valLoss = null;
        if (validation != null) {
            try {
                valLoss = module.evaluate(validation.getInputs(), validation.getY());
            } catch (MethodCallException e) {
                throw ValueRanges.blame(module, validation, e);
            }
        }
        // Per-epoch schedules step here, as the Python reference does (ReduceLROnPlateau
        // on the validation loss, else on the training loss).
        module.scheduleEpoch(valLoss != null ? valLoss : loss);
        double elapsed = (System.nanoTime() - started) / 1e9;
        History.EpochRecord record =
                History.record(module, epoch, loss, valLoss, elapsed, settings.isRecordValues());
        if (plan.cuda) {
            record = record.withDevice(plan.on, deterministic);
        }
        history.add(record);
        logger.debug("epoch {}: loss {} validation {}", epoch, loss, valLoss);
        Metadata.Checkpoint saved = new Metadata.Checkpoint(epoch + 1, plan.seed, plan.batch, plan.modeName, plan.xShape,
                plan.yShape, plan.fingerprint);
        plan.run.endEpoch(history, record, target -> module.saveCheckpoint(target, saved));
        return loss;
    }

    private ProgressBar newProgressBar() {
        return new ProgressBarBuilder()
                .setTaskName("epochs")
                .setInitialMax(settings.getEpochs())
                .setStyle(ProgressBarStyle.ASCII)
                .build();
    }

    private double[] runEpoch(TrainingModule module, Map<String, Tensor> x, Tensor y, int n, boolean pin, Mode mode,
            long runSeed, int epoch, int batch, History done) {
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
            try (TensorScope scope = new TensorScope()) {
                Map<String, Tensor> xs = new LinkedHashMap<>();
                for (Map.Entry<String, Tensor> input : x.entrySet()) {
                    xs.put(input.getKey(), gathered(scope, input.getValue(), order, pin));
                }
                Tensor ys = gathered(scope, y, order, pin);
                for (int b = 0; b < losses.length; b++) {
                    long from = (long) b * batch;
                    long to = Math.min(n, (long) (b + 1) * batch);
                    try (TensorScope rows = new TensorScope()) {
                        Map<String, Tensor> xb = new LinkedHashMap<>();
                        for (Map.Entry<String, Tensor> input : xs.entrySet()) {
                            xb.put(input.getKey(), rows.add(input.getValue().rows(from, to)));
                        }
                        losses[b] = module.trainStep(xb, rows.add(ys.rows(from, to)));
                    }
                    checkFinite(losses[b], epoch, b, batch, n, done);
                }
            }
            return losses;
        }
    }

    /** {@code values} in the epoch's order, in page-locked memory where {@code pin} (batches go to a CUDA device). */
    private static Tensor gathered(TensorScope scope, Tensor values, Tensor order, boolean pin) {
        if (!pin) {
            return scope.add(values.index(order));
        }
        try (Tensor rows = values.index(order)) {
            return scope.add(rows.pinned());
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
                    Messages.divergence(loss, epoch, index, from, Math.min(n, from + batch) - 1) + "; " + RunStart.kept(settings, done),
                    epoch, index, done);
        }
    }
}
