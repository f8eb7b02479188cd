package dev.gradbridge.online;

import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The training module and the updates applied to it: one micro-batch's guarded step and the
 * parameter snapshots that become versions. One thread at a time (opening, then the training
 * thread, then closing).
 */
final class Updater implements AutoCloseable {

    private final TrainingModule training;
    private final Metadata metadata;
    private final ModuleCalls calls;
    private final UpdateGuard guard;
    private final PhaseTimes phases;
    private final ParameterDigests digester = new ParameterDigests();
    private volatile long updates; // read by any thread
    private double lastLoss = Double.NaN;

    Updater(TrainingModule training, ModuleCalls calls, UpdateGuard guard, PhaseTimes phases) {
        this.training = training;
        this.metadata = training.getMetadata();
        this.calls = calls;
        this.guard = guard;
        this.phases = phases;
    }

    /** Continues from a checkpoint that holds {@code updates} updates. */
    void resumeAt(long updates) {
        this.updates = updates;
    }

    /**
     * The micro-batch's loss and gradients, then the optimizer step unless the guard refuses: the
     * same calls as {@code train_step} when it goes through, no step (gradients zeroed) when not.
     *
     * @return null when applied (and counted), else why not
     */
    String apply(List<byte[]> xs, List<byte[]> ys) {
        long t = PhaseTimes.clock(phases);
        double loss = calls.lossAndBackward(training, xs, ys);
        // Without a norm limit, finiteness is decided in libtorch; the values are read only to say why.
        String refusal = guard.needsValues(loss, Double.isFinite(loss) && training.gradientsFinite())
                ? guard.refuse(loss, training.getParameterNames(), training.getGradients())
                : null;
        if (refusal == null) {
            training.optimizerStep();
            updates++;
            lastLoss = loss;
        } else {
            training.zeroGrad();
        }
        PhaseTimes.lap(phases, PhaseTimes.Phase.TRAIN_STEP, t);
        return refusal;
    }

    /**
     * Applies micro-batches in order until one is refused: with no norm limit, in one native call
     * ({@link TrainingModule#stepWhileFinite}: {@link #apply}'s calls for each, finiteness decided
     * in libtorch), else one {@link #apply} each. A refused micro-batch has its gradients zeroed.
     *
     * @return how many were applied, and why the next was not (if it was reached)
     */
    Run applyUntilRefused(List<List<byte[]>> xs, List<List<byte[]>> ys) {
        if (guard.readsGradients()) {
            for (int i = 0; i < xs.size(); i++) {
                String refusal;
                try {
                    refusal = apply(xs.get(i), ys.get(i));
                } catch (RuntimeException e) {
                    return new Run(i, null, e);
                }
                if (refusal != null) {
                    return new Run(i, refusal, null);
                }
            }
            return new Run(xs.size(), null, null);
        }
        long t = PhaseTimes.clock(phases);
        TrainingModule.GuardedSteps steps;
        try {
            steps = calls.stepWhileFinite(training, xs, ys);
        } catch (RuntimeException e) {
            return new Run(0, null, e); // refused before any call
        }
        int applied = steps.stepped();
        updates += applied;
        if (applied > 0) {
            lastLoss = steps.loss(applied - 1);
        }
        Run run = new Run(applied, null, steps.failure());
        if (!steps.complete() && steps.failure() == null) {
            double loss = steps.loss(applied);
            String refusal = guard.refuse(loss, training.getParameterNames(), training.getGradients());
            if (refusal == null) { // libtorch and the guard disagree: the guard decides, as in apply
                training.optimizerStep();
                updates++;
                lastLoss = loss;
                run = new Run(applied + 1, null, null);
            } else {
                training.zeroGrad();
                run = new Run(applied, refusal, null);
            }
        }
        PhaseTimes.lap(phases, PhaseTimes.Phase.TRAIN_STEP, t);
        return run;
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

    /** @return the parameters now, whole, with their digests, as version {@code id} */
    ModelVersion snapshot(long id) {
        return snapshot(id, updates, lastLoss);
    }

    /** @return the parameters now as version {@code id} of {@code atUpdates} updates with {@code loss} */
    ModelVersion snapshot(long id, long atUpdates, double loss) {
        Map<String, double[]> parameters = training.getParameters();
        Map<String, String> digests = new LinkedHashMap<>();
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            digests.put(spec.getName(), digester.digest(parameters.get(spec.getName()), spec.getDtype()));
        }
        return new ModelVersion(id, atUpdates, loss, parameters, digests);
    }

    /** @return updates applied (optimizer steps), including those applied again on resume */
    long updates() {
        return updates;
    }

    /** @return the module, e.g. to checkpoint it */
    TrainingModule module() {
        return training;
    }

    @Override
    public void close() {
        training.close();
    }
}
