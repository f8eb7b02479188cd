package dev.gradbridge.internal;

import dev.gradbridge.Tensor;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;

/**
 * What training never changes in a module: its frozen parameters ({@code requires_grad=False}, a LoRA
 * model's base) and its constant buffers (rotary frequencies, position ids, masks), the tensors
 * themselves rather than copies ({@link ModuleAccess#frozen}), for other modules of the same file to
 * hold in place of their own ({@link ModuleAccess#share}). Closing it drops these references only: a
 * module that shares the tensors keeps them.
 */
public final class FrozenTensors implements AutoCloseable {

    private final List<String> names;
    private final List<Tensor> tensors;

    /**
     * @param names parameter and buffer names, in metadata order (parameters first)
     * @param tensors their tensors, as many; this holder closes them
     */
    public FrozenTensors(List<String> names, List<Tensor> tensors) {
        if (names.size() != tensors.size()) {
            throw new IllegalArgumentException(names.size() + " names but " + tensors.size() + " tensors");
        }
        this.names = Collections.unmodifiableList(new ArrayList<>(names));
        this.tensors = Collections.unmodifiableList(new ArrayList<>(tensors));
    }

    /** @return the parameter and buffer names, in metadata order */
    public List<String> names() {
        return names;
    }

    /** @return the tensors, in the order of {@link #names()} (not copies: never write into them) */
    public List<Tensor> tensors() {
        return tensors;
    }

    /** @return whether there are none (every parameter trains, every buffer is trained, or an older module) */
    public boolean isEmpty() {
        return names.isEmpty();
    }

    /** @return the tensors' bytes */
    public long bytes() {
        long total = 0;
        for (Tensor tensor : tensors) {
            total += tensor.numel() * tensor.dtype().size();
        }
        return total;
    }

    @Override
    public void close() {
        for (Tensor tensor : tensors) {
            tensor.close();
        }
    }
}
