package dev.gradbridge.spark;

import dev.gradbridge.DType;
import dev.gradbridge.Metadata;
import dev.gradbridge.Protocol;
import dev.gradbridge.Tensor;
import dev.gradbridge.TensorScope;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.internal.SeededDraws;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * One training task's copy of the module, for the run's barrier stage: loaded from the state the
 * driver holds (a module archive: parameters, optimizer state, learning rate) and stepped by the
 * task; at each epoch's end partition 0 snapshots it for the driver. Every tensor the Spark trainer
 * touches goes through here: gradients out as raw little-endian bytes straight into the exchange's
 * buffers, the combined gradient in as tensors over the exchange's buffers (no copy on the way in:
 * {@code set_gradients} clones what it is given).
 *
 * <p>A module whose training step draws random numbers (dropout; {@link Metadata#drawsRandom}) computes
 * each step's gradients from libtorch's generator seeded for that step and partition, inside {@link
 * SeededDraws}: libtorch has one generator per process, so the tasks of one executor take turns for
 * their forward and backward (the tasks of other executors do not wait). A module whose step writes
 * buffers (BatchNorm's statistics) takes, after each step, those of the step's first partition with rows
 * ({@link #shareBuffers}); its constant buffers need nothing.
 */
final class Replica implements AutoCloseable {

    private final TrainingModule module;
    private final Metadata metadata;
    /** Which parameters got a gradient, reused by every {@link #gradients} call. */
    private final boolean[] flags;
    /** The combined gradient's tensors over the buffers last given to {@link #step}, and those buffers. */
    private List<Tensor> combinedTensors;
    private ByteBuffer[] combinedBuffers;
    /** The combined flags' tensor over {@link #combinedFlags}. */
    private Tensor flagsTensor;
    private ByteBuffer combinedFlags;
    /** Whether the training step draws from libtorch's generator. */
    private final boolean draws;
    /** The buffers the training step writes, and their values as float64 (little-endian) for {@link #shareBuffers}. */
    private final Map<String, Integer> trained = new LinkedHashMap<>();
    private final ByteBuffer trainedValues;

    private Replica(TrainingModule module) {
        this.module = module;
        this.metadata = module.getMetadata();
        this.flags = new boolean[metadata.getParameters().size()];
        this.draws = metadata.drawsRandom();
        long values = 0;
        for (Metadata.TensorSpec spec : metadata.getBuffers()) {
            if (spec.isTrained()) {
                int size = Math.toIntExact(Arrays.stream(spec.getShape()).reduce(1, (a, b) -> a * b));
                trained.put(spec.getName(), size);
                values += size;
            }
        }
        this.trainedValues = Buffers.direct(values * Double.BYTES);
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
     * the metadata's order, then y's, in the metadata's dtypes, from index 0), from zeroed gradients,
     * copied into {@code exchange} ({@link GradientExchange#put}); a module that draws random numbers
     * draws them from libtorch's generator seeded with {@code seed}. The result's flags array is this
     * replica's, overwritten by the next call.
     */
    ShardResult gradients(int partition, byte[][] columns, int count, GradientExchange exchange, long seed) {
        double loss;
        try (TensorScope scope = new TensorScope()) {
            module.zeroGrad();
            List<String> names = metadata.getInputNames();
            Map<String, Tensor> inputs = new LinkedHashMap<>();
            for (int c = 0; c < names.size(); c++) {
                inputs.put(names.get(c), create(scope, columns[c], count, metadata.getInput(names.get(c))));
            }
            Tensor y = create(scope, columns[names.size()], count, metadata.getInput("y"));
            loss = draws ? SeededDraws.call(seed, () -> module.calculateLossAndBackward(inputs, y))
                    : module.calculateLossAndBackward(inputs, y);
            List<?> grads = (List<?>) module.call(Protocol.GET_GRADIENTS);
            for (int p = 0; p < grads.size(); p++) {
                try (Tensor g = (Tensor) grads.get(p)) {
                    exchange.put(p, g.buffer());
                }
            }
            try (Tensor f = (Tensor) module.call(Protocol.GRADIENT_FLAGS)) {
                ByteBuffer values = f.buffer();
                for (int p = 0; p < flags.length; p++) {
                    flags[p] = values.get(p) != 0;
                }
            }
        }
        return new ShardResult(partition, count, loss, null, flags);
    }

    /**
     * Sets the step's combined gradient and runs the exported optimizer once. The tensors over the
     * combined buffers are made once (an exchange returns the same buffers every step) and closed
     * with the replica.
     */
    void step(GradientCombiner.Combined combined) {
        if (combinedBuffers != combined.gradients) {
            closeCombined();
            combinedTensors = new ArrayList<>();
            for (int i = 0; i < combined.gradients.length; i++) {
                Metadata.TensorSpec spec = metadata.getParameters().get(i);
                combinedTensors.add(Tensor.fromBuffer(combined.gradients[i], DType.of(spec.getDtype()), spec.getShape()));
            }
            combinedFlags = ByteBuffer.allocateDirect(Math.max(1, combined.flags.length));
            flagsTensor = Tensor.fromBuffer(combinedFlags, DType.BOOL, combined.flags.length);
            combinedBuffers = combined.gradients;
        }
        for (int i = 0; i < combined.flags.length; i++) {
            combinedFlags.put(i, (byte) (combined.flags[i] ? 1 : 0));
        }
        module.call(Protocol.SET_GRADIENTS, combinedTensors, flagsTensor);
        module.call(Protocol.OPTIMIZER_STEP);
    }

    private void closeCombined() {
        if (combinedTensors != null) {
            for (Tensor t : combinedTensors) {
                t.close();
            }
            flagsTensor.close();
        }
    }

    /**
     * Gives every replica the trained buffers of partition {@code source} after a step (the step's first
     * partition with rows: as DistributedDataParallel's {@code broadcast_buffers} from its first rank): the
     * source sends them through {@code exchange}, every other replica sets them (a run of several
     * partitions of a module that {@link #writesBuffers}).
     */
    void shareBuffers(int partition, int source, GradientExchange exchange) {
        if (partition == source) {
            int at = 0;
            for (double[] values : module.getTrainedBuffers().values()) {
                for (double v : values) {
                    trainedValues.putDouble(at, v);
                    at += Double.BYTES;
                }
            }
        }
        exchange.broadcast(source, trainedValues);
        if (partition != source) {
            Map<String, double[]> values = new LinkedHashMap<>();
            int at = 0;
            for (Map.Entry<String, Integer> buffer : trained.entrySet()) {
                double[] array = new double[buffer.getValue()];
                for (int i = 0; i < array.length; i++, at += Double.BYTES) {
                    array[i] = trainedValues.getDouble(at);
                }
                values.put(buffer.getKey(), array);
            }
            module.setState(values);
        }
    }

    /** @return whether the training step draws from libtorch's generator (its gradients take a seed) */
    boolean draws() {
        return draws;
    }

    /** @return whether the training step writes buffers (they are shared after each step) */
    boolean writesBuffers() {
        return !trained.isEmpty();
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
        closeCombined();
        module.close();
    }

    /**
     * {@code count} rows of {@code spec}'s tensor, in libtorch's memory (no Java direct buffer to free per
     * step), filled with the first bytes of {@code bytes}.
     */
    private static Tensor create(TensorScope scope, byte[] bytes, int count, Metadata.TensorSpec spec) {
        Tensor tensor = scope.add(Tensor.empty(DType.of(spec.getDtype()), rowsShape(spec.getShape(), count)));
        ByteBuffer values = tensor.buffer();
        values.put(bytes, 0, values.remaining());
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
