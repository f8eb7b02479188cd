package dev.gradbridge.online;

import ai.djl.ndarray.NDArray;
import ai.djl.ndarray.NDManager;
import ai.djl.ndarray.types.DataType;
import ai.djl.ndarray.types.Shape;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.Metadata;
import dev.gradbridge.TrainingModule;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.List;
import java.util.Locale;

/**
 * The learner's only code that touches native tensors: host bytes in, host bytes or a loss out.
 * Everything else in this package works on {@link HostTensor}s and byte rows.
 */
final class ModuleCalls {

    private final Metadata.TensorSpec xSpec;
    private final Metadata.TensorSpec ySpec;
    private final ByteBuffer xBatch; // the x rows of one micro-batch, reused by the training thread
    private final ByteBuffer yBatch;

    ModuleCalls(Metadata.TensorSpec xSpec, Metadata.TensorSpec ySpec, int maxBatch, int xRowBytes, int yRowBytes) {
        this.xSpec = xSpec;
        this.ySpec = ySpec;
        this.xBatch = ByteBuffer.allocateDirect(Math.multiplyExact(maxBatch, xRowBytes)).order(ByteOrder.nativeOrder());
        this.yBatch = ByteBuffer.allocateDirect(Math.multiplyExact(maxBatch, yRowBytes)).order(ByteOrder.nativeOrder());
    }

    /**
     * {@code zero_grad}, then {@code calculate_loss_and_backward} on the rows (training thread
     * only): with {@code optimizer_step} after it, exactly {@code train_step}'s calls.
     *
     * @return the loss; the gradients are in the module
     */
    double lossAndBackward(TrainingModule training, List<byte[]> xs, List<byte[]> ys) {
        // One reused native-order buffer per input becomes one tensor each, closed right after the
        // call (the tensors may share the buffers' memory, so they go before the buffers refill).
        training.zeroGrad();
        try (NDArray x = rows(training.getManager(), xs, xSpec, xBatch);
                NDArray y = rows(training.getManager(), ys, ySpec, yBatch)) {
            return training.calculateLossAndBackward(x, y);
        }
    }

    /** {@code evaluate(x, y)} on a predictor: no step, no gradient. */
    static double evaluate(TrainingModule predictor, HostTensor x, HostTensor y) {
        try (NDManager scope = predictor.getManager().newSubManager()) {
            return predictor.evaluate(array(scope, x), array(scope, y));
        }
    }

    /** {@code forward(x)} on a predictor. */
    static HostTensor forward(TrainingModule predictor, HostTensor x) {
        try (NDManager scope = predictor.getManager().newSubManager()) {
            NDArray output = predictor.forward(array(scope, x));
            ByteBuffer buffer = output.toByteBuffer();
            if (buffer.order() != ByteOrder.LITTLE_ENDIAN && output.getDataType().getNumOfBytes() > 1) {
                throw new GradbridgeException("big-endian native tensors are not supported");
            }
            byte[] bytes = new byte[buffer.remaining()];
            buffer.get(bytes);
            return HostTensor.of(output.getDataType().name().toLowerCase(Locale.ROOT), output.getShape().getShape(), bytes);
        }
    }

    private static NDArray rows(NDManager manager, List<byte[]> rows, Metadata.TensorSpec spec, ByteBuffer reused) {
        int bytes = rows.get(0).length * rows.size();
        // A logged micro-batch may be larger than this run's B (resume checks the shapes, not B).
        ByteBuffer buffer = bytes <= reused.capacity() ? reused : ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
        buffer.clear();
        for (byte[] row : rows) {
            buffer.put(row);
        }
        buffer.flip();
        long[] shape = spec.getShape().clone();
        shape[0] = rows.size();
        return manager.create(buffer, new Shape(shape), dataType(spec.getDtype()));
    }

    private static NDArray array(NDManager manager, HostTensor tensor) {
        byte[] bytes = tensor.bytes();
        ByteBuffer buffer = ByteBuffer.allocateDirect(bytes.length).order(ByteOrder.nativeOrder());
        buffer.put(bytes).flip();
        return manager.create(buffer, new Shape(tensor.getShape()), dataType(tensor.getDtype()));
    }

    private static DataType dataType(String dtype) {
        return DataType.valueOf(dtype.toUpperCase(Locale.ROOT));
    }
}
