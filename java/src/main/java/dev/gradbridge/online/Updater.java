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
