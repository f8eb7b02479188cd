package dev.gradbridge;

import java.util.ArrayList;
import java.util.List;

/**
 * Closes every tensor added to it, last added first: one {@code try} block for the tensors of a
 * computation.
 *
 * <pre>{@code
 * try (TensorScope scope = new TensorScope()) {
 *     Tensor x = scope.add(Tensor.of(xs, n, 4));
 *     Tensor out = scope.add(module.forward(x));
 * }
 * }</pre>
 */
public final class TensorScope implements AutoCloseable {

    private final List<Tensor> tensors = new ArrayList<>();

    /**
     * @param tensor a tensor this scope now closes
     * @param <T> the tensor's type
     * @return the tensor
     */
    public <T extends Tensor> T add(T tensor) {
        tensors.add(tensor);
        return tensor;
    }

    /**
     * Adds every tensor of a method result (a list of tensors, or one tensor).
     *
     * @param result what {@link TrainingModule#call} returned
     * @return the result
     */
    public Object addAll(Object result) {
        if (result instanceof Tensor) {
            add((Tensor) result);
        } else if (result instanceof List) {
            for (Object item : (List<?>) result) {
                addAll(item);
            }
        }
        return result;
    }

    /** Closes the tensors, last added first. */
    @Override
    public void close() {
        for (int i = tensors.size() - 1; i >= 0; i--) {
            tensors.get(i).close();
        }
        tensors.clear();
    }
}
