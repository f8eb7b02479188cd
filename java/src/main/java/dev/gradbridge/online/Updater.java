package dev.gradbridge.online;

import dev.gradbridge.internal.FrozenTensors;
import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.GuardedSteps;
import dev.gradbridge.internal.SeededDraws;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.TrainingModule;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;

/**
 * The training module and the updates applied to it: one micro-batch's guarded step and the
 * parameter snapshots that become versions. One thread at a time (opening, then the training
 * thread, then closing).
 *
 * <p>What training never changes (frozen parameters, constant buffers: {@link FrozenTensors}) exists
 * once: the module file's tensors, held by the training module, its backups and copies ({@link
 * #copyOf}), the predictors and the modules read back from the log folder ({@link #shared}); a copy
 * or a checkpoint ({@link #archive}) is taken with them left out.
 */
final class Updater implements AutoCloseable {

    /** Updates after which a new backup is taken (see {@link #refreshBackup}). */
    static final int BACKUP_EVERY = 64;

    private TrainingModule training; // replaced by the backup when an update is undone
    private final FrozenTensors frozen; // the module file's frozen tensors, which every module here holds
    private TrainingModule backup; // a copy of the module some updates ago, or null
    private final List<Applied> since = new ArrayList<>(); // micro-batches applied after the backup
    private final Metadata metadata;
    private final ModuleCalls calls;
    private final UpdateGuard guard;
    private final PhaseTimes phases;
    private final ParameterDigests digester = new ParameterDigests();
    private volatile long updates; // read by any thread
    private double lastLoss = Double.NaN;
    private final Long runSeed; // null: draws unseeded (a module that draws nothing, or an older log)

    /** A micro-batch applied after the backup: what applying it again takes. */
    private static final class Applied {
        final long firstSeq;
        final List<byte[]> xs;
        final List<byte[]> ys;

        Applied(long firstSeq, List<byte[]> xs, List<byte[]> ys) {
            this.firstSeq = firstSeq;
            this.xs = new ArrayList<>(xs);
            this.ys = new ArrayList<>(ys);
        }
    }

    /**
     * @param runSeed the log's seed: a module that draws random numbers (dropout) draws each micro-batch's
     *     from libtorch's generator seeded with {@link SeededDraws#seed}(runSeed, its first event's sequence
     *     number), as the replay does; null for a log written before micro-batches were seeded
     */
    Updater(TrainingModule training, FrozenTensors frozen, ModuleCalls calls, UpdateGuard guard, PhaseTimes phases,
            Long runSeed) {
        this.training = training;
        this.frozen = frozen;
        this.metadata = training.getMetadata();
        this.calls = calls;
        this.guard = guard;
        this.phases = phases;
        this.runSeed = metadata.drawsRandom() ? runSeed : null;
    }

    /** Forward, loss and backward of one micro-batch, its draws seeded when the module draws. */
    private double lossAndBackward(TrainingModule module, long firstSeq, List<byte[]> xs, List<byte[]> ys) {
        if (runSeed == null) {
            return calls.lossAndBackward(module, xs, ys);
        }
        return SeededDraws.call(SeededDraws.seed(runSeed, firstSeq), () -> calls.lossAndBackward(module, xs, ys));
    }

    /** Continues from a checkpoint that holds {@code updates} updates. */
    void resumeAt(long updates) {
        this.updates = updates;
    }

    /**
     * The micro-batch's loss and gradients, then the optimizer step unless the guard refuses: the
     * same calls as {@code train_step} when it goes through, no step (gradients zeroed) when not. A
     * step that leaves a parameter or the optimizer's state not finite (finite but extreme inputs
     * can do that with a finite loss and finite gradients) is undone: the module goes back to the
     * copy taken before the step, and the micro-batch is refused like a non-finite gradient.
     *
     * @return null when applied (and counted), else why not
     */
    String apply(long firstSeq, List<byte[]> xs, List<byte[]> ys) {
        phases.start();
        double loss = lossAndBackward(training, firstSeq, xs, ys);
        // Without a norm limit, finiteness is decided in libtorch; the values are read only to say why.
        String refusal = guard.needsValues(loss, Double.isFinite(loss) && training.gradientsFinite())
                ? guard.refuse(loss, training.getParameterNames(), training.getGradients())
                : null;
        if (refusal == null) {
            refusal = checkedStep(firstSeq, xs, ys, loss);
        } else {
            training.zeroGrad();
        }
        phases.lap(PhaseTimes.Phase.TRAIN_STEP);
        return refusal;
    }

    /** The optimizer step on the gradients in place, undone when it leaves the state not finite. */
    private String checkedStep(long firstSeq, List<byte[]> xs, List<byte[]> ys, double loss) {
        refreshBackup();
        training.optimizerStep();
        if (!training.stateFinite()) {
            String reason = "the update makes " + firstNotFinite() + " not finite";
            rollBack(reason);
            return reason;
        }
        since.add(new Applied(firstSeq, xs, ys));
        updates++;
        lastLoss = loss;
        return null;
    }

    /**
     * Before a step: a copy of the module (parameters, optimizer state, learning rate) when there is
     * none or {@value #BACKUP_EVERY} updates came after it. Copying is dear next to a small step, so
     * the copy is taken now and then and the micro-batches applied since are kept: undoing a step
     * is going back to the copy and applying them again, which gives the same bits.
     */
    private void refreshBackup() {
        if (backup == null || since.size() >= BACKUP_EVERY) {
            if (backup != null) {
                backup.close();
            }
            backup = copyOf(training).orElse(null);
            since.clear();
        }
    }

    /**
     * Brings the module back to where it was before the step (or run) in progress: the backup plus
     * the micro-batches applied since it, applied again with the same calls.
     *
     * @throws IllegalStateException when there is no backup (two tensors of the module share a
     *     storage, so it cannot be copied): training cannot go on without poisoning the model
     */
    private void rollBack(String reason) {
        if (backup == null) {
            throw new IllegalStateException(reason + ", and the module cannot be restored (two of its tensors share a"
                    + " storage, so it cannot be copied)");
        }
        training.close();
        training = backup;
        backup = copyOf(training).orElse(null); // still the backup of training + since (null: a new one next time)
        for (Applied batch : since) {
            lossAndBackward(training, batch.firstSeq, batch.xs, batch.ys);
            training.optimizerStep();
        }
    }

    /** The first parameter (protocol order), else the first optimizer state (by key, then parameter), that is not finite. */
    private String firstNotFinite() {
        Map<String, double[]> parameters = training.getParameters();
        List<String> names = training.getParameterNames();
        for (String name : names) {
            if (!finite(parameters.get(name))) {
                return "parameter " + name;
            }
        }
        for (Map.Entry<String, List<double[]>> state : training.getOptimizerState().entrySet()) {
            List<double[]> perParameter = state.getValue();
            for (int i = 0; i < perParameter.size(); i++) {
                if (!finite(perParameter.get(i))) {
                    return "the optimizer's " + state.getKey() + (i < names.size() ? " of " + names.get(i) : "");
                }
            }
        }
        return "the optimizer's state";
    }

    private static boolean finite(double[] values) {
        if (values != null) {
            for (double value : values) {
                if (!Double.isFinite(value)) {
                    return false;
                }
            }
        }
        return true;
    }

    /**
     * Applies micro-batches in order until one is refused: with no norm limit (and one input), in one native call
     * ({@link ModuleAccess#stepWhileFinite}: {@link #apply}'s calls for each, finiteness decided
     * in libtorch), else one {@link #apply} each. A refused micro-batch has its gradients zeroed.
     * The native call's run is checked once at its end (a parameter or optimizer state that is not
     * finite stays so under every later step of the exported optimizers: NaN and infinity
     * propagate): when it is not finite, the module goes back to the copy taken before the run and
     * the run is applied again one {@link #apply} at a time, which finds the micro-batch to refuse.
     *
     * @return how many were applied, and why the next was not (if it was reached)
     */
    Run applyUntilRefused(long[] firstSeqs, List<List<byte[]>> xs, List<List<byte[]>> ys) {
        if (guard.readsGradients() || !calls.fusable() || runSeed != null) { // seeded: one micro-batch at a time
            return applyEach(firstSeqs, xs, ys);
        }
        phases.start();
        refreshBackup();
        GuardedSteps steps;
        try {
            steps = calls.stepWhileFinite(training, xs, ys);
        } catch (RuntimeException e) {
            return new Run(0, null, e); // refused before any call
        }
        int applied = steps.stepped();
        if (applied > 0 && !training.stateFinite()) {
            // A step of this run left the state not finite: back to before the run, then one at a time.
            rollBack("an update of micro-batches " + updates + ".." + (updates + applied - 1) + " leaves the state not finite");
            phases.lap(PhaseTimes.Phase.TRAIN_STEP);
            return applyEach(firstSeqs, xs, ys);
        }
        for (int i = 0; i < applied; i++) {
            since.add(new Applied(firstSeqs[i], xs.get(i), ys.get(i)));
        }
        updates += applied;
        if (applied > 0) {
            lastLoss = steps.loss(applied - 1);
        }
        Run run = new Run(applied, null, steps.failure());
        if (!steps.complete() && steps.failure() == null) {
            double loss = steps.loss(applied);
            String refusal = guard.refuse(loss, training.getParameterNames(), training.getGradients());
            if (refusal == null) { // libtorch and the guard disagree: the guard decides, as in apply
                refusal = checkedStep(firstSeqs[applied], xs.get(applied), ys.get(applied), loss);
            } else {
                training.zeroGrad();
            }
            run = refusal == null ? new Run(applied + 1, null, null) : new Run(applied, refusal, null);
        }
        phases.lap(PhaseTimes.Phase.TRAIN_STEP);
        return run;
    }

    /** One {@link #apply} per micro-batch until one is refused or fails. */
    private Run applyEach(long[] firstSeqs, List<List<byte[]>> xs, List<List<byte[]>> ys) {
        for (int i = 0; i < xs.size(); i++) {
            String refusal;
            try {
                refusal = apply(firstSeqs[i], xs.get(i), ys.get(i));
            } catch (RuntimeException e) {
                return new Run(i, null, e);
            }
            if (refusal != null) {
                return new Run(i, refusal, null);
            }
        }
        return new Run(xs.size(), null, null);
    }

    /**
     * What {@link #applyUntilRefused} did: the first {@code applied} micro-batches went through;
     * the next, if reached, was refused ({@code refusal}) or its call failed ({@code failure}, the
     * module as that call left it).
     */
    static final class Run {
        final int applied;
        final String refusal;
        final RuntimeException failure;

        Run(int applied, String refusal, RuntimeException failure) {
            this.applied = applied;
            this.refusal = refusal;
            this.failure = failure;
        }
    }

    /** @return the trainable parameters and trained buffers now, with their digests, as version {@code id} */
    ModelVersion snapshot(long id) {
        return snapshot(id, updates, lastLoss);
    }

    /** @return the parameters now as version {@code id} of {@code atUpdates} updates with {@code loss} */
    ModelVersion snapshot(long id, long atUpdates, double loss) {
        return versionOf(training, id, atUpdates, loss);
    }

    /**
     * @return a copy of the learner as it is now (parameters, optimizer state, learning rate), for
     *     a publish gate's rollback; the caller closes it
     * @throws IllegalStateException when two of the module's tensors share a storage (no copy)
     */
    TrainingModule copyState() {
        return copyOf(training).orElseThrow(() -> new IllegalStateException("--gate-on-hold rollback cannot copy "
                + training.getPath() + ": two of its tensors share a storage"));
    }

    /**
     * Returns the learner to {@code state} (a {@link #copyState} of an earlier version, kept by its
     * owner): the module becomes a copy of it. The update count goes on: it counts the micro-batches
     * the log holds, applied or since rolled back.
     */
    void restore(TrainingModule state) {
        TrainingModule restored = copyOf(state).orElseThrow(IllegalStateException::new); // copyState copied it before
        training.close();
        training = restored;
        if (backup != null) {
            backup.close();
            backup = null; // the next step takes a new one
        }
        since.clear();
    }

    /** @return {@code module}'s parameters as version {@code id} (a serving version read back from its file) */
    ModelVersion versionOf(TrainingModule module, long id, long atUpdates, double loss) {
        // What training changes, not the frozen rest (a LoRA model's base), where predictors can take a part.
        Map<String, double[]> parameters = module.getMethodNames().contains(Protocol.SET_STATE)
                ? module.getTrainableParameters() : module.getParameters();
        Map<String, double[]> buffers = module.getTrainedBuffers();
        Map<String, String> digests = new LinkedHashMap<>();
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            if (parameters.containsKey(spec.getName())) {
                digests.put(spec.getName(), digester.digest(parameters.get(spec.getName()), spec.getDtype()));
            }
        }
        for (Metadata.TensorSpec spec : metadata.getBuffers()) {
            if (buffers.containsKey(spec.getName())) {
                digests.put(spec.getName(), digester.digest(buffers.get(spec.getName()), spec.getDtype()));
            }
        }
        return new ModelVersion(id, atUpdates, loss, parameters, buffers, digests);
    }

    /** @return updates applied (optimizer steps), including those applied again on resume */
    long updates() {
        return updates;
    }

    /** @return the module, e.g. to checkpoint it */
    TrainingModule module() {
        return training;
    }

    /** @return the module file's frozen tensors, which the predictors share */
    FrozenTensors frozen() {
        return frozen;
    }

    /**
     * A copy of {@code module} (parameters, optimizer state, learning rate) that shares its frozen
     * tensors: they are left out while the copy is taken (nothing of them copied), then both hold them.
     *
     * @return the copy, or empty when two of the module's tensors share a storage
     */
    Optional<TrainingModule> copyOf(TrainingModule module) {
        if (frozen.isEmpty()) {
            return ModuleAccess.snapshot(module);
        }
        ModuleAccess.leaveOut(module);
        Optional<TrainingModule> copy;
        try {
            copy = ModuleAccess.snapshot(module);
        } finally {
            ModuleAccess.share(module, frozen);
        }
        copy.ifPresent(this::shared);
        return copy;
    }

    /**
     * {@code module} (this file's, or one read back from the log folder: a checkpoint or a serving version, which
     * leave the frozen tensors out) holding the frozen tensors; closed when that fails.
     */
    TrainingModule shared(TrainingModule module) {
        try {
            ModuleAccess.share(module, frozen);
            return module;
        } catch (RuntimeException e) {
            module.close();
            throw e;
        }
    }

    /**
     * The archive of {@code module} that a checkpoint or a serving version writes: everything but the frozen
     * tensors (left out while it is written: zero-element placeholders in their place), which a restart takes
     * from the module file.
     */
    byte[] archive(TrainingModule module, Metadata.Checkpoint progress) {
        ModuleAccess.leaveOut(module);
        try {
            return ModuleAccess.checkpointArchive(module, progress);
        } finally {
            ModuleAccess.share(module, frozen);
        }
    }

    @Override
    public void close() {
        if (backup != null) {
            backup.close();
        }
        training.close();
        frozen.close();
    }
}
