package dev.gradbridge;

import java.nio.ByteBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

/**
 * A training module's state read out by name and written back, checked whole before anything changes:
 * parameters, buffers, the optimizer's state and learning rates. {@link TrainingModule} holds the thread
 * guard around each of these; this class only converts between Java arrays and the module's tensors.
 */
final class ModuleState {

    private final Path path;
    private final Metadata metadata;
    private final ModuleEngine scripted;
    private final Set<String> methodNames;

    ModuleState(Path path, Metadata metadata, ModuleEngine scripted, Set<String> methodNames) {
        this.path = path;
        this.metadata = metadata;
        this.scripted = scripted;
        this.methodNames = methodNames;
    }

    /** The method's tensors by name, converted only where {@code wanted} (null: all) holds the name. */
    Map<String, double[]> named(String method, List<String> names, Set<String> wanted, Object... args) {
        List<?> values = (List<?>) scripted.invoke(method, args);
        try {
            Map<String, double[]> named = new LinkedHashMap<>();
            for (int i = 0; i < names.size(); i++) {
                if (wanted == null || wanted.contains(names.get(i))) {
                    named.put(names.get(i), ((Tensor) values.get(i)).toExactDoubles());
                }
            }
            return named;
        } finally {
            Tensors.closeAll(values);
        }
    }

    /** Named values through {@code get_state}, or in older modules all of {@code whole}'s then those wanted. */
    Map<String, double[]> subset(List<String> wanted, String whole, List<String> wholeNames) {
        if (!methodNames.contains(Protocol.GET_STATE)) {
            return named(whole, wholeNames, new LinkedHashSet<>(wanted));
        }
        return named(Protocol.GET_STATE, wanted, null, wanted);
    }

    /**
     * One {@code get_parameters} call for an epoch's record: each parameter's digest hashed from the
     * tensor's own bytes, and its exact values (float64, in a direct buffer) only into {@code values}
     * when that is not null. A record then copies no parameter into a Java array (widening every value
     * to a Java double[] and back to bytes cost ~0.2 s an epoch on a 1.5M-parameter model).
     */
    void readParameters(Map<String, String> digests, Map<String, ByteBuffer> values) {
        List<?> tensors = (List<?>) scripted.invoke(Protocol.GET_PARAMETERS);
        try {
            List<Metadata.TensorSpec> specs = metadata.getParameters();
            for (int i = 0; i < specs.size(); i++) {
                Tensor tensor = (Tensor) tensors.get(i);
                String name = specs.get(i).getName();
                digests.put(name, History.digest(tensor, specs.get(i).getDtype()));
                if (values != null) {
                    values.put(name, tensor.exactDoubleBuffer());
                }
            }
        } finally {
            Tensors.closeAll(tensors);
        }
    }

    /** @see TrainingModule#setState */
    void setState(Map<String, double[]> values) {
        if (!methodNames.contains(Protocol.SET_STATE)) {
            throw new ProtocolException(path + " has no method " + Protocol.SET_STATE
                    + " (exported by an older gradbridge): export the model again");
        }
        Map<String, Metadata.TensorSpec> byName = new LinkedHashMap<>();
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            byName.put(spec.getName(), spec);
        }
        for (Metadata.TensorSpec spec : metadata.getBuffers()) {
            byName.put(spec.getName(), spec);
        }
        List<String> names = new ArrayList<>();
        List<Tensor> tensors = new ArrayList<>();
        try {
            for (Map.Entry<String, double[]> entry : values.entrySet()) {
                Metadata.TensorSpec spec = byName.get(entry.getKey());
                if (spec == null) {
                    throw new InvalidInputException(Protocol.SET_STATE + ": no parameter or buffer " + entry.getKey()
                            + "; the module's: " + byName.keySet());
                }
                names.add(entry.getKey());
                tensors.add(Tensor.ofDoubles(DType.of(spec.getDtype()), entry.getValue(), spec.getShape()));
            }
            scripted.invoke(Protocol.SET_STATE, names, tensors);
        } finally {
            Tensors.closeAll(tensors);
        }
    }

    /** @see TrainingModule#setParameters */
    void setParameters(Map<String, double[]> values, List<String> parameterNames) {
        if (!values.keySet().equals(new LinkedHashSet<>(parameterNames))) {
            throw new InvalidInputException(
                    Protocol.SET_PARAMETERS + ": expected values for " + parameterNames + ", got "
                            + values.keySet());
        }
        List<Tensor> tensors = new ArrayList<>();
        try {
            for (Metadata.TensorSpec spec : metadata.getParameters()) {
                double[] data = values.get(spec.getName());
                long[] shape = spec.getShape();
                long size = 1;
                for (long dim : shape) {
                    size *= dim;
                }
                if (data.length != size) {
                    throw new InvalidInputException(
                            Protocol.SET_PARAMETERS + ": " + spec.getName() + " needs " + size
                                    + " values for shape " + Tensors.shapeText(shape) + ", got " + data.length);
                }
                tensors.add(Tensor.ofDoubles(DType.of(spec.getDtype()), data, shape));
            }
            scripted.invoke(Protocol.SET_PARAMETERS, tensors);
        } finally {
            Tensors.closeAll(tensors);
        }
    }

    /** @see TrainingModule#getOptimizerState */
    Map<String, List<double[]>> optimizerState() {
        Map<?, ?> state = (Map<?, ?>) scripted.invoke(Protocol.OPTIMIZER_STATE);
        try {
            Map<String, List<double[]>> converted = new TreeMap<>();
            for (Map.Entry<?, ?> entry : state.entrySet()) {
                List<double[]> arrays = new ArrayList<>();
                for (Object tensor : (List<?>) entry.getValue()) {
                    arrays.add(((Tensor) tensor).toExactDoubles());
                }
                converted.put((String) entry.getKey(), arrays);
            }
            return converted;
        } finally {
            for (Object tensors : state.values()) {
                Tensors.closeAll((List<?>) tensors);
            }
        }
    }

    /** @see TrainingModule#getLrs */
    double[] lrs() {
        if (!methodNames.contains(Protocol.GET_LRS)) {
            return new double[] {(Double) scripted.invoke(Protocol.GET_LR)};
        }
        List<?> values = (List<?>) scripted.invoke(Protocol.GET_LRS);
        double[] lrs = new double[values.size()];
        for (int i = 0; i < lrs.length; i++) {
            lrs[i] = (Double) values.get(i);
        }
        return lrs;
    }

    /** @see TrainingModule#setLr(int, double) */
    void setLr(int group, double lr) {
        if (!(lr >= 0) || Double.isInfinite(lr)) {
            throw new InvalidInputException(Protocol.SET_GROUP_LR + ": invalid learning rate " + lr);
        }
        int groups = lrs().length;
        if (group < 0 || group >= groups) {
            throw new InvalidInputException(
                    Protocol.SET_GROUP_LR + ": no parameter group " + group + "; the module has " + groups);
        }
        if (!methodNames.contains(Protocol.SET_GROUP_LR)) {
            scripted.invoke(Protocol.SET_LR, lr);
            return;
        }
        scripted.invoke(Protocol.SET_GROUP_LR, (long) group, lr);
    }
}
