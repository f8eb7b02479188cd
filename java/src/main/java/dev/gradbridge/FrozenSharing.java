package dev.gradbridge;

import dev.gradbridge.internal.FrozenTensors;
import dev.gradbridge.internal.ModuleAccess;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * {@link ModuleAccess}'s frozen tensors: one copy of what training never changes (frozen parameters,
 * constant buffers) held by several modules of one file (the online learner's training module, its
 * predictors, its backups), through the native layer's {@code moduleTensors}/{@code moduleShare}
 * (TorchScript) and {@code exportedTensors}/{@code exportedShare} (protocol 3): references, never copies.
 * A module shares them only when its versions carry what training changes alone ({@code set_state}): in an
 * older module a version sets every parameter, which would write into the shared ones.
 */
final class FrozenSharing {

    private FrozenSharing() {}

    /** The names of the module's frozen parameters, then its constant buffers, in metadata order. */
    static List<String> names(TrainingModule module) {
        List<String> names = new ArrayList<>();
        if (!module.getMethodNames().contains(Protocol.SET_STATE)) {
            return names;
        }
        for (Metadata.TensorSpec spec : module.metadata.getParameters()) {
            if (!spec.isTrainable()) {
                names.add(spec.getName());
            }
        }
        for (Metadata.TensorSpec spec : module.metadata.getBuffers()) {
            if (!spec.isTrained()) {
                names.add(spec.getName());
            }
        }
        return names;
    }

    /** @see ModuleAccess#frozen */
    static FrozenTensors frozen(TrainingModule module) {
        List<String> names = names(module);
        List<Tensor> tensors = new ArrayList<>();
        if (!names.isEmpty()) {
            try (ThreadGuard.Use use = module.use()) {
                long handle = module.scripted.handle();
                long[] handles = opLists(module) ? Native.exportedTensors(handle, bindings(module, names))
                        : Native.moduleTensors(handle, names.toArray(new String[0]));
                for (long h : handles) {
                    tensors.add(new Tensor(h));
                }
            }
        }
        return new FrozenTensors(names, tensors);
    }

    /** @see ModuleAccess#share */
    static int share(TrainingModule module, FrozenTensors frozen) {
        List<String> names = names(module);
        if (!names.equals(frozen.names())) {
            throw new IllegalArgumentException(module.getPath() + ": its frozen tensors are " + names + ", not "
                    + frozen.names());
        }
        long[] handles = new long[names.size()];
        for (int i = 0; i < handles.length; i++) {
            Tensor tensor = frozen.tensors().get(i);
            Metadata.TensorSpec spec = spec(module, names.get(i));
            if (!tensor.dtype().torchName().equals(spec.getDtype()) || !Arrays.equals(tensor.shape(), spec.getShape())) {
                throw new IllegalArgumentException(module.getPath() + ": " + names.get(i) + " is " + spec.getDtype()
                        + Arrays.toString(spec.getShape()) + ", not " + tensor.dtype().torchName()
                        + Arrays.toString(tensor.shape()));
            }
            handles[i] = tensor.handle();
        }
        return replace(module, names, handles);
    }

    /** @see ModuleAccess#leaveOut */
    static int leaveOut(TrainingModule module) {
        List<String> names = names(module);
        return replace(module, names, new long[names.size()]);
    }

    private static int replace(TrainingModule module, List<String> names, long[] handles) {
        if (names.isEmpty()) {
            return 0;
        }
        try (ThreadGuard.Use use = module.use()) {
            long handle = module.scripted.handle();
            return opLists(module) ? Native.exportedShare(handle, bindings(module, names), handles)
                    : Native.moduleShare(handle, names.toArray(new String[0]), handles);
        }
    }

    /**
     * Whether a parameter or buffer of this shape is a frozen one (or a constant buffer) left out, as an online
     * checkpoint leaves them ({@link #leaveOut}: zero elements): the learner gives the module its file's.
     */
    static boolean leftOut(Metadata.TensorSpec spec, long[] shape) {
        return shape.length == 1 && shape[0] == 0 && !(spec.getShape().length == 1 && spec.getShape()[0] == 0)
                && (!spec.isTrainable() || !spec.isTrained());
    }

    /** {@link #leftOut} of a protocol-3 state entry ({@code param:NAME}, {@code buffer:NAME}). */
    static boolean leftOut(Metadata metadata, String binding, long[] shape) {
        String[] parts = binding.split(":", 2);
        List<Metadata.TensorSpec> specs = parts.length != 2 ? new ArrayList<>() : "param".equals(parts[0])
                ? metadata.getParameters() : "buffer".equals(parts[0]) ? metadata.getBuffers() : new ArrayList<>();
        return specs.stream().anyMatch(spec -> spec.getName().equals(parts[1]) && leftOut(spec, shape));
    }

    private static boolean opLists(TrainingModule module) {
        return module.metadata.getProtocolVersion() == Protocol.EXPORT_VERSION;
    }

    /** Protocol 3's state bindings of parameter and buffer names: {@code param:NAME}, {@code buffer:NAME}. */
    private static String[] bindings(TrainingModule module, List<String> names) {
        String[] keys = new String[names.size()];
        for (int i = 0; i < keys.length; i++) {
            keys[i] = (module.getParameterNames().contains(names.get(i)) ? "param:" : "buffer:") + names.get(i);
        }
        return keys;
    }

    private static Metadata.TensorSpec spec(TrainingModule module, String name) {
        for (Metadata.TensorSpec spec : module.metadata.getParameters()) {
            if (spec.getName().equals(name)) {
                return spec;
            }
        }
        for (Metadata.TensorSpec spec : module.metadata.getBuffers()) {
            if (spec.getName().equals(name)) {
                return spec;
            }
        }
        throw new IllegalArgumentException(module.getPath() + " has no parameter or buffer " + name);
    }
}
