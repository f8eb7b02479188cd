package dev.gradbridge.spark;

import dev.gradbridge.DType;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.Tensor;
import dev.gradbridge.TensorScope;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One training task's copy of the module, for the run's barrier stage: loaded from the state the
 * driver holds (a module archive: parameters, optimizer state, learning rate) and stepped by the
 * task; at each epoch's end partition 0 snapshots it for the driver. Every tensor the Spark trainer
 * touches goes through here: gradients out as raw little-endian bytes, the combined gradient in.
 */
final class Replica implements AutoCloseable {

    private final TrainingModule module;
    private final Metadata metadata;
    /** The gradients' arrays, one per parameter, reused by every {@link #gradients} call. */
    private final byte[][] reused;

    private Replica(TrainingModule module) {
        this.module = module;
        this.metadata = module.getMetadata();
        this.reused = new byte[metadata.getParameters().size()][];
    }

    /** Loads a module archive (the bytes of a .pt) through a temporary file. */
    static Replica load(byte[] archive) {
        Path file = null;
        try {
            file = Files.createTempFile("gradbridge-spark-", ".pt");
            Files.write(file, archive);
            return new Replica(TrainingModule.load(file));
        } catch (IOException e) {
            throw new UncheckedIOException("cannot write the training module to a temporary file", e);
        } finally {
            deleteQuietly(file);
        }
    }

    /**
     * The gradients of the mean loss over {@code count} rows ({@code columns}: the bytes of each input in
     * the metadata's order, then y's, in the metadata's dtypes), from zeroed gradients. Their arrays are
     * this replica's, overwritten by the next call (a step's megabytes are not garbage every step): the
     * exchange reads them before.
     */
    ShardResult gradients(int partition, byte[][] columns, int count) {
        byte[][] gradients = new byte[metadata.getParameters().size()][];
        boolean[] flags;
        double loss;
        try (TensorScope scope = new TensorScope()) {
            module.zeroGrad();
            List<String> names = metadata.getInputNames();
            Map<String, Tensor> inputs = new LinkedHashMap<>();
            for (int c = 0; c < names.size(); c++) {
                inputs.put(names.get(c), create(scope, columns[c], count, metadata.getInput(names.get(c))));
            }
            loss = module.calculateLossAndBackward(inputs,
                    create(scope, columns[names.size()], count, metadata.getInput("y")));
            List<?> grads = (List<?>) module.call(Protocol.GET_GRADIENTS);
            for (int p = 0; p < grads.size(); p++) {
                try (Tensor g = (Tensor) grads.get(p)) {
                    ByteBuffer values = g.buffer();
                    if (reused[p] == null || reused[p].length != values.remaining()) {
                        reused[p] = new byte[values.remaining()];
                    }
                    values.get(reused[p]);
                    gradients[p] = reused[p];
                }
            }
            try (Tensor f = (Tensor) module.call(Protocol.GRADIENT_FLAGS)) {
                flags = f.toBooleanArray();
            }
        }
        return new ShardResult(partition, count, loss, gradients, flags);
    }

    /** Sets the step's combined gradient and runs the exported optimizer once. */
    void step(GradientCombiner.Combined combined) {
        try (TensorScope scope = new TensorScope()) {
            List<Tensor> gradients = new ArrayList<>();
            for (int i = 0; i < combined.gradients.length; i++) {
                Metadata.TensorSpec spec = metadata.getParameters().get(i);
                gradients.add(create(scope, combined.gradients[i], spec.getShape(), spec.getDtype()));
            }
            module.call(Protocol.SET_GRADIENTS, gradients, scope.add(Tensor.of(combined.flags, combined.flags.length)));
            module.call(Protocol.OPTIMIZER_STEP);
        }
    }

    /** The end-of-epoch schedule step, on the epoch's training loss. */
    void scheduleEpoch(double loss) {
        module.scheduleEpoch(loss);
    }

    /** @return the module (partition 0 snapshots it at each epoch's end, for the driver) */
    TrainingModule module() {
        return module;
    }

    @Override
    public void close() {
        module.close();
    }

    /** {@code count} rows of {@code spec}'s tensor, filled with {@code bytes}. */
    private static Tensor create(TensorScope scope, byte[] bytes, int count, Metadata.TensorSpec spec) {
        return create(scope, bytes, rowsShape(spec.getShape(), count), spec.getDtype());
    }

    /** A tensor in libtorch's memory, filled with {@code bytes} (no Java direct buffer to free per step). */
    private static Tensor create(TensorScope scope, byte[] bytes, long[] shape, String dtype) {
        Tensor tensor = scope.add(Tensor.empty(DType.of(dtype), shape));
        tensor.buffer().put(bytes);
        return tensor;
    }

    private static long[] rowsShape(long[] spec, int count) {
        long[] shape = spec.clone();
        shape[0] = count;
        return shape;
    }

    private static void deleteQuietly(Path file) {
        if (file != null) {
            try {
                Files.deleteIfExists(file);
            } catch (IOException ignored) {
                // a leftover temporary file only; the module is in memory
            }
        }
    }
}
