package dev.gradbridge;

import dev.gradbridge.internal.InputMessages;
import dev.gradbridge.internal.Messages;
import java.nio.LongBuffer;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A training module's inputs checked against its metadata before a call runs (nothing runs on a wrong
 * input): the named inputs, {@code y}, and {@code train_epoch}'s order and batch size. Apart from
 * {@link TrainingModule} so that its calls read as the protocol calls they are.
 */
final class ModuleInputs {

    private final Path path;
    private final Metadata metadata;
    private final List<String> names;
    private final Map<String, Tensors.SpecCheck> checks = new LinkedHashMap<>();
    private final Tensors.SpecCheck yCheck;

    ModuleInputs(Path path, Metadata metadata) {
        this.path = path;
        this.metadata = metadata;
        this.yCheck = specCheck(metadata, "y");
        this.names = metadata.getInputNames();
        for (String name : names) {
            checks.put(name, specCheck(metadata, name));
        }
    }

    /** The allocation-free check of an input, or null when the metadata lacks it (then every call fails). */
    private static Tensors.SpecCheck specCheck(Metadata metadata, String name) {
        for (Metadata.TensorSpec spec : metadata.getInputs()) {
            if (spec.getName().equals(name)) {
                return new Tensors.SpecCheck(spec);
            }
        }
        return null;
    }

    /** @return the model's input names, in metadata order */
    List<String> names() {
        return names;
    }

    /** A one-tensor call's input as the map the named path takes; refused for a model of several inputs. */
    Map<String, Tensor> single(String method, Tensor x) {
        if (!names.equals(Collections.singletonList("x"))) {
            throw new InvalidInputException(InputMessages.namedInputsNeeded(method, names));
        }
        return Collections.singletonMap("x", x);
    }

    /**
     * The inputs as the scripted method takes them, after checking them against the metadata and
     * each other: the tensor {@code x} for a model of one input, else the list of the named inputs
     * in metadata order. With {@code target}, {@code y} is checked too, with as many samples.
     */
    Object argument(String method, Map<String, Tensor> x, Tensor y, boolean target) {
        if (x == null) {
            throw new InvalidInputException(method + ": inputs: expected a map of " + names + ", got null");
        }
        for (String name : x.keySet()) {
            if (!names.contains(name)) {
                throw new InvalidInputException(InputMessages.unknownInput(method, String.valueOf(name), names));
            }
        }
        List<Tensor> tensors = new ArrayList<>(names.size());
        String first = names.get(0);
        for (String name : names) {
            Tensor tensor = x.get(name);
            if (tensor == null && !x.containsKey(name)) {
                throw new InvalidInputException(InputMessages.missingInput(method, name, names));
            }
            checkTensor(name, tensor);
            if (!tensors.isEmpty() && tensor.size(0) != tensors.get(0).size(0)) {
                throw new InvalidInputException(method + ": " + first + " has " + tensors.get(0).size(0)
                        + " samples but " + name + " has " + tensor.size(0));
            }
            tensors.add(tensor);
        }
        long n = tensors.get(0).size(0);
        if (target) {
            checkTensor("y", y);
            if (n != y.size(0)) {
                throw new InvalidInputException(method + ": " + first + " has " + n + " samples but y has " + y.size(0));
            }
        }
        return metadata.hasNamedInputs() ? tensors : tensors.get(0);
    }

    /** The batch size of a checked {@link #argument}. */
    static long rows(Object argument) {
        return (argument instanceof Tensor ? (Tensor) argument : (Tensor) ((List<?>) argument).get(0)).size(0);
    }

    /** {@code train_epoch}'s sample order and batch size, for {@code n} checked samples. */
    static void checkEpoch(Tensor perm, int batchSize, long n) {
        if (perm == null || perm.isClosed()) {
            throw new InvalidInputException(Protocol.TRAIN_EPOCH + ": perm: expected a Tensor, got "
                    + (perm == null ? "null" : "a closed one"));
        }
        if (perm.dtype() != DType.INT64 || perm.dim() != 1) {
            throw new InvalidInputException(
                    Protocol.TRAIN_EPOCH + ": perm must be a 1-d int64 array, got "
                            + perm.dtype() + " " + Tensors.shapeText(perm.dims()));
        }
        if (batchSize < 1 || batchSize > n) {
            throw new InvalidInputException(
                    Protocol.TRAIN_EPOCH + ": " + Messages.batchSize(n, batchSize));
        }
        if (perm.size(0) > 0) { // range read from perm's memory: no copy into Java
            long[] range = minMax(perm);
            if (range[0] < 0 || range[1] >= n) {
                throw new InvalidInputException(
                        Protocol.TRAIN_EPOCH + ": perm holds index " + (range[0] < 0 ? range[0] : range[1])
                                + ", outside 0.." + (n - 1));
            }
        }
    }

    /** The smallest and largest value of a non-empty 1-d int64 tensor, read from its memory. */
    private static long[] minMax(Tensor indices) {
        LongBuffer values = indices.buffer().asLongBuffer();
        long min = Long.MAX_VALUE;
        long max = Long.MIN_VALUE;
        for (int i = 0; i < values.limit(); i++) {
            long value = values.get(i);
            min = Math.min(min, value);
            max = Math.max(max, value);
        }
        return new long[] {min, max};
    }

    private void checkTensor(String name, Tensor array) {
        if (array == null || array.isClosed()) {
            throw new InvalidInputException(name + ": expected a Tensor, got " + (array == null ? "null" : "a closed one"));
        }
        Tensors.SpecCheck fast = "y".equals(name) ? yCheck : checks.get(name);
        if (fast != null && fast.fits(array)) {
            return; // the per-call path: no allocation; anything else gets the full check's message
        }
        Tensors.checkSpec(path.getFileName().toString(), "input " + name, array, metadata.getInput(name), true);
    }
}
