package dev.gradbridge.online;

import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.GuardedSteps;
import dev.gradbridge.DType;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.Tensor;
import dev.gradbridge.TensorScope;
import dev.gradbridge.TrainingModule;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The learner's only code that touches native tensors: host bytes in, host bytes or a loss out.
 * Everything else in this package works on {@link HostTensor}s and byte rows.
 */
final class ModuleCalls {

    private final Features features;
    private final Metadata.TensorSpec xSpec; // the first input (the only one unless named)
    private final Metadata.TensorSpec ySpec;
    private final DType xType;
    private final DType yType;
    private final ByteBuffer xBatch; // the x rows of one micro-batch, reused by the training thread
    private final ByteBuffer yBatch;
    private final ByteBuffer[] inputBatches; // several inputs: each one's rows of one micro-batch
    private final List<ByteBuffer> xRun = new ArrayList<>(); // micro-batch i's x rows in a run (training thread)
    private final List<ByteBuffer> yRun = new ArrayList<>();

    ModuleCalls(Features features, Metadata.TensorSpec ySpec, int maxBatch, int yRowBytes) {
        this.features = features;
        this.xSpec = features.specs().get(0);
        this.ySpec = ySpec;
        this.xType = DType.of(xSpec.getDtype());
        this.yType = DType.of(ySpec.getDtype());
        this.xBatch = ByteBuffer.allocateDirect(batchBytes(maxBatch, xSpec, features.rowBytes(0))).order(ByteOrder.nativeOrder());
        this.yBatch = ByteBuffer.allocateDirect(batchBytes(maxBatch, ySpec, yRowBytes)).order(ByteOrder.nativeOrder());
        this.inputBatches = new ByteBuffer[features.names().size()];
        inputBatches[0] = xBatch;
        for (int i = 1; i < inputBatches.length; i++) {
            inputBatches[i] = ByteBuffer.allocateDirect(batchBytes(maxBatch, features.specs().get(i), features.rowBytes(i)))
                    .order(ByteOrder.nativeOrder());
        }
        xRun.add(xBatch);
        yRun.add(yBatch);
    }

    /** @return whether micro-batches can go through {@link #stepWhileFinite} (a module of one input) */
    boolean fusable() {
        return !features.named();
    }

    /** Bytes of a micro-batch of {@code maxBatch} rows, which must fit one buffer. */
    private static int batchBytes(int maxBatch, Metadata.TensorSpec spec, int rowBytes) {
        long bytes = (long) maxBatch * rowBytes;
        if (bytes > Integer.MAX_VALUE - 8) {
            throw new InvalidInputException("max batch " + maxBatch + " is too large for input " + spec.getName() + ": "
                    + maxBatch + " rows of " + rowBytes + " bytes exceed a buffer's 2 GiB; at most "
                    + (Integer.MAX_VALUE - 8) / Math.max(1, rowBytes) + " rows");
        }
        return (int) bytes;
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
        if (features.named()) {
            Map<String, Tensor> x = new LinkedHashMap<>();
            try (TensorScope scope = new TensorScope()) {
                int at = 0;
                for (int i = 0; i < inputBatches.length; i++) {
                    Metadata.TensorSpec spec = features.specs().get(i);
                    x.put(spec.getName(), scope.add(slice(xs, at, features.rowBytes(i), spec, inputBatches[i])));
                    at += features.rowBytes(i);
                }
                Tensor y = scope.add(rows(ys, ySpec, yType, yBatch));
                return training.calculateLossAndBackward(x, y);
            }
        }
        try (Tensor x = rows(xs, xSpec, xType, xBatch);
                Tensor y = rows(ys, ySpec, yType, yBatch)) {
            return training.calculateLossAndBackward(x, y);
        }
    }

    /** Input {@code spec}'s part ({@code length} bytes from {@code at}) of each event row, as one tensor. */
    private static Tensor slice(List<byte[]> rows, int at, int length, Metadata.TensorSpec spec, ByteBuffer reused) {
        int bytes = length * rows.size();
        ByteBuffer buffer = bytes <= reused.capacity() ? reused : ByteBuffer.allocateDirect(bytes).order(ByteOrder.nativeOrder());
        buffer.clear();
        for (byte[] row : rows) {
            buffer.put(row, at, length);
        }
        buffer.flip();
        long[] shape = spec.getShape().clone();
        shape[0] = rows.size();
        return Tensor.fromBuffer(buffer, DType.of(spec.getDtype()), shape);
    }

    /**
     * {@link ModuleAccess#stepWhileFinite} on micro-batches of rows (training thread only): per
     * micro-batch {@link #lossAndBackward}'s calls, then {@code optimizer_step} when finite; one
     * reused buffer per micro-batch and input.
     */
    GuardedSteps stepWhileFinite(TrainingModule training, List<List<byte[]>> xs, List<List<byte[]>> ys) {
        int n = xs.size();
        Tensor[] x = new Tensor[n];
        Tensor[] y = new Tensor[n];
        try {
            for (int i = 0; i < n; i++) {
                if (xRun.size() == i) {
                    xRun.add(ByteBuffer.allocateDirect(xBatch.capacity()).order(ByteOrder.nativeOrder()));
                    yRun.add(ByteBuffer.allocateDirect(yBatch.capacity()).order(ByteOrder.nativeOrder()));
                }
                x[i] = rows(xs.get(i), xSpec, xType, xRun.get(i));
                y[i] = rows(ys.get(i), ySpec, yType, yRun.get(i));
            }
            return ModuleAccess.stepWhileFinite(training, x, y);
        } finally {
            for (int i = 0; i < n; i++) {
                if (x[i] != null) {
                    x[i].close();
                }
                if (y[i] != null) {
                    y[i].close();
                }
            }
        }
    }

    /** {@code evaluate(x, y)} on a predictor: no step, no gradient. */
    static double evaluate(TrainingModule predictor, Map<String, HostTensor> x, HostTensor y) {
        try (TensorScope scope = new TensorScope()) {
            Tensor ys = scope.add(tensor(y));
            if (!predictor.getMetadata().hasNamedInputs()) {
                return predictor.evaluate(scope.add(tensor(x.get("x"))), ys);
            }
            return predictor.evaluate(tensors(x, scope), ys);
        }
    }

    private static Map<String, Tensor> tensors(Map<String, HostTensor> x, TensorScope scope) {
        Map<String, Tensor> tensors = new LinkedHashMap<>();
        for (Map.Entry<String, HostTensor> input : x.entrySet()) {
            tensors.put(input.getKey(), scope.add(tensor(input.getValue())));
        }
        return tensors;
    }

    /**
     * {@code forward(x)} on a predictor, its input copied into {@code reused} (the predictor's
     * own buffer, replaced by a larger one when x does not fit: the buffer to keep is returned in
     * {@code reused[0]}).
     */
    static HostTensor forward(TrainingModule predictor, Map<String, HostTensor> x, ByteBuffer[] reused) {
        if (predictor.getMetadata().hasNamedInputs()) {
            try (TensorScope scope = new TensorScope()) {
                return host(scope.add(predictor.predict(tensors(x, scope))));
            }
        }
        try (Tensor input = tensor(x.get("x"), reused);
                Tensor output = predictor.predict(input)) {
            return host(output);
        }
    }

    private static HostTensor host(Tensor output) {
        if (ByteOrder.nativeOrder() != ByteOrder.LITTLE_ENDIAN && output.dtype().size() > 1) {
            throw new GradbridgeException("big-endian native tensors are not supported");
        }
        return HostTensor.wrap(output.dtype().torchName(), output.shape(), output.toBytes());
    }

    /** x's bytes in {@code reused[0]} (grown when too small) as a tensor over that memory. */
    private static Tensor tensor(HostTensor x, ByteBuffer[] reused) {
        byte[] bytes = x.bytes();
        if (reused[0] == null || reused[0].capacity() < bytes.length) {
            reused[0] = ByteBuffer.allocateDirect(Math.max(bytes.length, 256)).order(ByteOrder.nativeOrder());
        }
        ByteBuffer buffer = reused[0];
        buffer.clear();
        buffer.put(bytes).flip();
        return Tensor.fromBuffer(buffer, DType.of(x.getDtype()), x.getShape());
    }

    private static Tensor rows(List<byte[]> rows, Metadata.TensorSpec spec, DType type, ByteBuffer reused) {
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
        return Tensor.fromBuffer(buffer, type, shape);
    }

    private static Tensor tensor(HostTensor tensor) {
        byte[] bytes = tensor.bytes();
        ByteBuffer buffer = ByteBuffer.allocateDirect(bytes.length).order(ByteOrder.nativeOrder());
        buffer.put(bytes).flip();
        return Tensor.fromBuffer(buffer, DType.of(tensor.getDtype()), tensor.getShape());
    }
}
