package dev.gradbridge.internal;

import dev.gradbridge.History;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Tensor;
import dev.gradbridge.TrainingModule;
import java.nio.file.Path;
import java.util.Optional;

/**
 * What the library's other packages (the online learner, gradbridge-spark, the benchmark programs)
 * call on a {@link TrainingModule} and the native layer beyond the user API. {@code dev.gradbridge}
 * implements {@link Calls} and registers it when {@link TrainingModule} loads, so that these calls
 * reach its package-private parts while {@link TrainingModule}'s public methods stay the user API.
 */
public final class ModuleAccess {

    /** The calls; implemented in {@code dev.gradbridge} only. */
    public interface Calls {
        /** @see ModuleAccess#stepWhileFinite */
        GuardedSteps stepWhileFinite(TrainingModule module, Tensor[] xs, Tensor[] ys);

        /** @see ModuleAccess#snapshot */
        Optional<TrainingModule> snapshot(TrainingModule module);

        /** @see ModuleAccess#checkpointArchive */
        byte[] checkpointArchive(TrainingModule module, Metadata.Checkpoint checkpoint);

        /** @see ModuleAccess#bareTrainStep */
        BareCall bareTrainStep(Path model, Tensor x, Tensor y);

        /** @see SeededDraws */
        void manualSeed(long seed);

        /** @see ModuleAccess#keepEvalMode */
        void keepEvalMode(TrainingModule module);

        /** @see ModuleAccess#frozen */
        FrozenTensors frozen(TrainingModule module);

        /** @see ModuleAccess#share */
        int share(TrainingModule module, FrozenTensors frozen);

        /** @see ModuleAccess#leaveOut */
        int leaveOut(TrainingModule module);

        /** @see ModuleAccess#intraOpThreads */
        int intraOpThreads();

        /** @see ModuleAccess#interopThreads */
        int interopThreads();

        /** @see ModuleAccess#setIntraOpThreads */
        void setIntraOpThreads(int threads);

        /** @see ModuleAccess#nativeMemory */
        String nativeMemory();

        /** @see ModuleAccess#epochRecord */
        History.EpochRecord epochRecord(TrainingModule module, int epoch, double loss, Double valLoss,
                double elapsedSeconds, boolean withValues);
    }

    /** {@code train_step(x, y)} on a module of its own, straight through the native layer: no checks, no guard. */
    public interface BareCall extends Runnable, AutoCloseable {
        @Override
        void close();
    }

    private static volatile Calls calls;

    private ModuleAccess() {}

    /**
     * Called once, by {@link TrainingModule}'s class initializer.
     *
     * @param implementation the calls
     */
    public static synchronized void register(Calls implementation) {
        if (calls != null) {
            throw new IllegalStateException("ModuleAccess is registered already");
        }
        calls = implementation;
    }

    static Calls calls() {
        if (calls == null) {
            try { // initializing TrainingModule registers the calls
                Class.forName(TrainingModule.class.getName(), true, TrainingModule.class.getClassLoader());
            } catch (ClassNotFoundException e) {
                throw new IllegalStateException(e);
            }
        }
        return calls;
    }

    /**
     * {@code train_step}'s calls for several micro-batches in one native call, each step guarded:
     * for each {@code (xs[i], ys[i])} in order, {@code zero_grad}, {@code
     * calculate_loss_and_backward}, then {@code optimizer_step} only when the loss and every
     * gradient are finite (as {@link TrainingModule#gradientsFinite}). Stops at the first
     * micro-batch that is not finite, leaving its gradients in place (neither stepped nor zeroed),
     * or whose call fails. Between two micro-batches the thread yields its core to any thread
     * waiting for one ({@code sched_yield}), so a long run holds a core for one micro-batch at a
     * time rather than for a whole scheduler tick (predictions served beside training wait less).
     *
     * @param module the module
     * @param xs inputs matching the metadata's {@code x} spec, one per micro-batch
     * @param ys targets matching the metadata's {@code y} spec, as many, each as large as its x
     * @return what went through
     * @throws InvalidInputException when an input does not match the metadata; nothing ran
     */
    public static GuardedSteps stepWhileFinite(TrainingModule module, Tensor[] xs, Tensor[] ys) {
        return calls().stepWhileFinite(module, xs, ys);
    }

    /**
     * A copy of the module as it is now (every attribute's tensors cloned: parameters, optimizer
     * state, learning rate), to save or read on another thread while this one trains on: its
     * {@link #checkpointArchive} is the bytes the module's gives now. The caller closes it.
     *
     * @param module the module
     * @return the copy, or empty when two of the module's tensors share a storage (a copy would
     *     split them)
     */
    public static Optional<TrainingModule> snapshot(TrainingModule module) {
        return calls().snapshot(module);
    }

    /**
     * The bytes {@link TrainingModule#saveCheckpoint} writes, in memory (what a distributed
     * trainer sends to the process that writes the file).
     *
     * @param module the module
     * @param checkpoint epochs trained so far, and the run's settings and data
     * @return the archive's bytes
     */
    public static byte[] checkpointArchive(TrainingModule module, Metadata.Checkpoint checkpoint) {
        return calls().checkpointArchive(module, checkpoint);
    }

    /**
     * For {@code gradbridge bench} only: {@code train_step} below {@link TrainingModule}, timed on its own.
     *
     * @param model the module file (loaded once more, apart from any TrainingModule)
     * @param x one batch of inputs
     * @param y its targets
     * @return the bare call; close it
     */
    public static BareCall bareTrainStep(Path model, Tensor x, Tensor y) {
        return calls().bareTrainStep(model, x, y);
    }

    /**
     * Puts {@code module} in eval mode for good: a predictor, which never trains, then runs {@code forward}
     * and {@code evaluate} without switching modes around each call.
     *
     * @param module a module this caller owns
     */
    public static void keepEvalMode(TrainingModule module) {
        calls().keepEvalMode(module);
    }

    /**
     * What training never changes in {@code module} (its frozen parameters, then its constant buffers), the
     * tensors themselves, not copies: for other modules of the same file to {@link #share}. None for a module
     * exported before {@code set_state}, whose versions set every parameter.
     *
     * @param module a module this caller owns
     * @return the tensors; the caller closes the holder (the module keeps its own references)
     */
    public static FrozenTensors frozen(TrainingModule module) {
        return calls().frozen(module);
    }

    /**
     * Makes {@code module} hold {@code frozen} in place of its own frozen parameters and constant buffers
     * (every reference to them: attributes, lists, a traced eval model's), no copy: its own are freed
     * unless something else holds them. Training never writes them (no gradient, no optimizer state,
     * never in a version), and predictions only read them, so modules on several threads share them.
     *
     * @param module a module of the same file (or a checkpoint of it) this caller owns
     * @param frozen {@link #frozen} of a module of that file
     * @return the references changed (0: it held these tensors already)
     * @throws IllegalArgumentException when the names, dtypes or shapes are not the module's
     */
    public static int share(TrainingModule module, FrozenTensors frozen) {
        return calls().share(module, frozen);
    }

    /**
     * Replaces {@code module}'s frozen parameters and constant buffers with zero-element placeholders, until
     * {@link #share} gives them back: what a copy or a checkpoint taken meanwhile holds of them costs nothing
     * (the online learner's backups and checkpoints). The module cannot run in between.
     *
     * @param module a module this caller owns
     * @return the references changed
     */
    public static int leaveOut(TrainingModule module) {
        return calls().leaveOut(module);
    }

    /** @return libtorch's intra-op thread count */
    public static int intraOpThreads() {
        return calls().intraOpThreads();
    }

    /** @return libtorch's inter-op thread count */
    public static int interopThreads() {
        return calls().interopThreads();
    }

    /** The most intra-op threads {@link #setIntraOpThreads} (and {@code -Dgradbridge.numThreads}) take: OpenMP aborts the process when it cannot create them. */
    public static final int MAX_THREADS = 4096;

    /**
     * Sets libtorch's intra-op thread count for the calling thread's parallel work, and the count every
     * thread that has not run any yet starts with ({@code at::set_num_threads}; under OpenMP a thread's
     * own count stays as it was set). A data-parallel task calls it on its thread, so that tasks sharing
     * a JVM each run on their share of its cores.
     *
     * @param threads 1..{@link #MAX_THREADS}
     */
    public static void setIntraOpThreads(int threads) {
        if (threads < 1 || threads > MAX_THREADS) {
            throw new IllegalArgumentException("intra-op threads must be in 1.." + MAX_THREADS + ", got " + threads);
        }
        calls().setIntraOpThreads(threads);
    }

    /** @return the allocator settings applied when the engine started, in words, or "not applied yet" */
    public static String nativeMemory() {
        return calls().nativeMemory();
    }

    /**
     * An epoch's record of the module's parameters (their digests, hashed from the tensors' memory,
     * and, when asked, their values): what every trainer adds to its {@link History}.
     *
     * @param module the module being trained
     * @param epoch epoch index, from 0
     * @param loss the epoch's training loss
     * @param valLoss the validation loss, or {@code null}
     * @param elapsedSeconds wall time since the run started
     * @param withValues keep the values too ({@code false}: digests only, for large models)
     * @return the record
     */
    public static History.EpochRecord epochRecord(TrainingModule module, int epoch, double loss, Double valLoss,
            double elapsedSeconds, boolean withValues) {
        return calls().epochRecord(module, epoch, loss, valLoss, elapsedSeconds, withValues);
    }
}
