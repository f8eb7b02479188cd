package dev.gradbridge.online;

import dev.gradbridge.Protocol;
import dev.gradbridge.TrainingModule;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A published model version: an immutable snapshot of what training changes after {@code updates}
 * micro-batches: the parameters that train (frozen ones, a LoRA model's base, stay as the module file
 * has them; every parameter in modules exported before {@code set_state}) and the buffers training
 * writes (BatchNorm's statistics; constant buffers stay as the file has them). Predictions run on
 * exactly one version and report its id.
 */
public final class ModelVersion {

    private final long id;
    private final long updates;
    private final double loss;
    private final Map<String, double[]> parameters;
    private final Map<String, double[]> buffers;
    private final Map<String, String> digests;

    ModelVersion(long id, long updates, double loss, Map<String, double[]> parameters, Map<String, double[]> buffers,
            Map<String, String> digests) {
        this.id = id;
        this.updates = updates;
        this.loss = loss;
        this.parameters = Collections.unmodifiableMap(new LinkedHashMap<>(parameters));
        this.buffers = Collections.unmodifiableMap(new LinkedHashMap<>(buffers));
        this.digests = Collections.unmodifiableMap(new LinkedHashMap<>(digests));
    }

    /** @return the version id: 0 for the loaded model, then 1, 2, ... */
    public long getId() {
        return id;
    }

    /** @return micro-batches (optimizer steps) applied in this version */
    public long getUpdates() {
        return updates;
    }

    /** @return the loss of the last micro-batch before it (NaN for version 0) */
    public double getLoss() {
        return loss;
    }

    /**
     * A parameter's values.
     *
     * @param name a parameter name
     * @return a copy of its flattened values (float32 widened to double exactly); null for a frozen one
     */
    public double[] getParameter(String name) {
        double[] values = parameters.get(name);
        return values == null ? null : values.clone();
    }

    /** The snapshot itself, for this package (never modified). */
    Map<String, double[]> parameters() {
        return parameters;
    }

    /**
     * Sets this version on {@code module} (a predictor, or a copy to checkpoint): its parameters and trained
     * buffers through {@code set_state}, the frozen rest left as the module has it; every parameter in a
     * module exported before {@code set_state} (whose versions hold every parameter and no buffer).
     */
    void applyTo(TrainingModule module) {
        if (!module.getMethodNames().contains(Protocol.SET_STATE)) {
            module.setParameters(parameters);
            return;
        }
        Map<String, double[]> state = new LinkedHashMap<>(parameters);
        state.putAll(buffers);
        module.setState(state);
    }

    /**
     * @return SHA-256 digests of the version's parameters, then of the buffers training writes, by name ({@code
     *     dev.gradbridge.History#digest})
     */
    public Map<String, String> getDigests() {
        return digests;
    }

    @Override
    public String toString() {
        return "version " + id + " (" + updates + " updates)";
    }
}
