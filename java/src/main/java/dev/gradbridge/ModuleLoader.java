package dev.gradbridge;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.PlatformMessages;
import dev.gradbridge.internal.Protocol3Messages;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Set;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Loading a training module and checking that the file is one before anything calls it: the file, its
 * metadata, the torch release, operator libraries, the device, then the protocol's methods and the
 * parameters the metadata promises. Apart from {@link TrainingModule}, which then trusts what this checked.
 */
final class ModuleLoader {

    // TrainingModule's logger: the warning about another torch release has always been logged under it
    private static final Logger logger = LoggerFactory.getLogger(TrainingModule.class);

    private ModuleLoader() {}

    /** @see TrainingModule#load(Path, List, String) */
    static TrainingModule load(Path path, List<Path> opLibraries, String device) {
        String on = Devices.canonical(device);
        Path file = path.toAbsolutePath();
        if (!Files.isRegularFile(file)) {
            throw new ModuleLoadException(
                    "no training module at " + file + " (file not found). Export one with"
                            + " `gradbridge export linear-regression -o " + path + "`.");
        }
        Metadata metadata = Metadata.read(file);
        NativeLibrary.requireDevice(on); // before libtorch's first use: a CUDA device loads its CUDA libraries
        String engineVersion = ModuleEngine.engineVersion();
        if (metadata.getProtocolVersion() == Protocol.EXPORT_VERSION
                && !minorRelease(engineVersion).equals(minorRelease(metadata.getTorchVersion()))) {
            // op lists hold the ops one torch release's autograd and export chose: another release's kernels
            // and formulas are not bitwise with it
            throw new ModuleLoadException(Protocol3Messages.protocol3OtherTorch(file.toString(),
                    metadata.getTorchVersion(),
                    engineVersion));
        }
        if (!engineVersion.equals(metadata.getTorchVersion())) {
            logger.warn(
                    "{} was exported with torch {} but libtorch here is {}; results may differ",
                    file, metadata.getTorchVersion(), engineVersion);
        }
        OperatorLibraries.load(opLibraries);
        ModuleEngine scripted;
        try {
            scripted = ModuleEngine.load(file, metadata, on);
        } catch (NativeException e) {
            String operator = OperatorLibraries.missingOperator(metadata, e);
            if (operator != null) {
                throw new ModuleLoadException(PlatformMessages.missingCustomOp(file.toString(), operator), e);
            }
            throw new ModuleLoadException(
                    "libtorch cannot load " + file + ": " + ModuleEngine.libtorchSummary(e), e);
        }
        try {
            return new TrainingModule(file, metadata, scripted);
        } catch (RuntimeException e) {
            scripted.close();
            throw e;
        }
    }

    /** {@code 2.15} of {@code 2.15.0+cpu}. */
    private static String minorRelease(String version) {
        String[] parts = String.valueOf(version).split("[.+]");
        return parts.length < 2 ? String.valueOf(version) : parts[0] + "." + parts[1];
    }

    /** Refuses a module that lacks one of the protocol's required methods. */
    static void requireMethods(Path path, Set<String> methodNames) {
        List<String> missing = new ArrayList<>();
        for (String method : Protocol.REQUIRED_METHODS) {
            if (!methodNames.contains(method)) {
                missing.add(method);
            }
        }
        if (!missing.isEmpty()) {
            throw new ProtocolException(
                    path + " lacks protocol methods " + missing + "; it has " + methodNames);
        }
    }

    /** What a method that returns a list of strings returns ({@code parameter_names}, {@code buffer_names}). */
    static List<String> stringList(ModuleEngine scripted, String method) {
        List<?> values = (List<?>) scripted.invoke(method);
        List<String> strings = new ArrayList<>(values.size());
        for (Object value : values) {
            strings.add((String) value);
        }
        return strings;
    }

    /**
     * The metadata's parameter names, shapes and dtypes are trusted by every check after this: verify them
     * once against what the module holds.
     */
    static void checkParameters(Path path, Metadata metadata, ModuleEngine scripted, List<String> parameterNames) {
        List<String> declared = new ArrayList<>();
        for (Metadata.TensorSpec spec : metadata.getParameters()) {
            declared.add(spec.getName());
        }
        if (!declared.equals(parameterNames)) {
            throw new ProtocolException(
                    path + ": parameter_names() returns " + parameterNames
                            + " but the metadata lists " + declared);
        }
        List<?> values = (List<?>) scripted.invoke(Protocol.GET_PARAMETERS);
        try {
            List<Metadata.TensorSpec> specs = metadata.getParameters();
            for (int i = 0; i < specs.size(); i++) {
                Metadata.TensorSpec spec = specs.get(i);
                Tensor value = (Tensor) values.get(i);
                String dtype = value.dtype().torchName();
                long[] shape = value.shape();
                if (!spec.getDtype().equals(dtype) || !Arrays.equals(spec.getShape(), shape) && !FrozenSharing.leftOut(spec, shape)) {
                    throw new ProtocolException(
                            Messages.parameterMismatch(
                                    path.toString(), spec.getName(),
                                    spec.getDtype() + " " + Arrays.toString(spec.getShape()),
                                    dtype + " " + Arrays.toString(shape)));
                }
            }
        } finally {
            Tensors.closeAll(values);
        }
    }
}
