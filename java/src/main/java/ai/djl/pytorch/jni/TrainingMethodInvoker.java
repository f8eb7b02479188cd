package ai.djl.pytorch.jni;

import ai.djl.ndarray.types.DataType;
import ai.djl.pytorch.engine.PtNDArray;
import ai.djl.pytorch.engine.PtNDManager;
import ai.djl.pytorch.engine.PtSymbolBlock;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * gradbridge's one reach into DJL internals: run a TorchScript method with autograd enabled.
 *
 * <p>Why it exists: DJL 0.36.0's public {@code IValueUtils.runMethod} always runs under {@code
 * c10::InferenceMode}, so a scripted {@code backward} fails there; its public training path
 * ({@code PtSymbolBlock.forward(..., training=true)}) accepts tensors only, but the training
 * protocol passes floats and lists too ({@code sgd_step(lr)}). The native entry point that both
 * use takes an {@code isTrain} flag; this class lives in DJL's package to call it with {@code
 * true}. It depends on DJL's package-private {@code PyTorchLibrary}, which is why the DJL version
 * is pinned (gradle.properties) and covered by the JUnit tests.
 *
 * <p>Not part of gradbridge's public API: use {@code dev.gradbridge.TrainingModule}.
 */
public final class TrainingMethodInvoker {

    private TrainingMethodInvoker() {}

    /**
     * Runs {@code method} of {@code block} with the calling thread's grad mode (no inference guard).
     *
     * @param block the loaded module
     * @param method the method name
     * @param inputs the arguments; the caller keeps ownership and closes them
     * @return the result, owned by the caller
     */
    public static IValue runWithAutograd(PtSymbolBlock block, String method, IValue... inputs) {
        long[] handles = new long[inputs.length];
        for (int i = 0; i < inputs.length; i++) {
            handles[i] = inputs[i].getHandle();
        }
        return new IValue(
                PyTorchLibrary.LIB.moduleRunMethod(block.getHandle(), method, handles, true, false));
    }

    // ---- The training hot path: handles only, no DJL wrapper objects per call ----
    // What DJL's wrappers add per call (an IValue and a PtNDArray object per tensor, each with a
    // uid string and a manager entry, a getFloat that indexes into a new tensor and copies it
    // through a ByteBuffer) cost more than the call itself on small models. These methods do what
    // the native loop does: tensor handles in, one method call, the result's bytes out.

    private static final DataType[] DATA_TYPES = DataType.values();

    /**
     * A new IValue holding {@code tensor}; free it with {@link #freeIValue}.
     *
     * @param tensor a tensor of the PyTorch engine
     * @return the IValue's native handle
     */
    public static long tensorIValue(PtNDArray tensor) {
        return PyTorchLibrary.LIB.iValueFromTensor(tensor.getHandle());
    }

    /**
     * A new IValue holding an int; free it with {@link #freeIValue}.
     *
     * @param value the int
     * @return the IValue's native handle
     */
    public static long longIValue(long value) {
        return PyTorchLibrary.LIB.iValueFromLong(value);
    }

    /**
     * Frees an IValue made by this class (0 is ignored).
     *
     * @param handle the IValue's native handle
     */
    public static void freeIValue(long handle) {
        if (handle != 0) {
            PyTorchLibrary.LIB.torchDeleteIValue(handle);
        }
    }

    /**
     * Runs {@code method} with autograd on (as {@link #runWithAutograd}) on IValue handles and
     * returns its result, a CPU tensor, as exact doubles (float32 widens without rounding; other
     * dtypes convert to float64 in libtorch first).
     *
     * @param block the loaded module
     * @param method the method name
     * @param inputs IValue handles from {@link #tensorIValue}/{@link #longIValue}; the caller frees them
     * @param scalar whether a one-element result is expected (its layout needs no check)
     * @param manager where a tensor of another dtype is converted
     * @return the result's values in order
     * @throws IllegalStateException when the method returns no tensor (nothing is leaked)
     */
    public static double[] runToDoubles(
            PtSymbolBlock block, String method, long[] inputs, boolean scalar, PtNDManager manager) {
        long result = PyTorchLibrary.LIB.moduleRunMethod(block.getHandle(), method, inputs, true, false);
        try {
            long tensor;
            try {
                tensor = PyTorchLibrary.LIB.iValueToTensor(result); // libtorch checks that it is one
            } catch (RuntimeException e) {
                throw new IllegalStateException(
                        method + "() returned " + PyTorchLibrary.LIB.iValueGetType(result) + ", not a tensor", e);
            }
            double[] values = floatValues(tensor, scalar);
            if (values != null) {
                PyTorchLibrary.LIB.torchDeleteTensor(tensor);
                return values;
            }
            // Rare (half precision, a strided result): DJL's general conversion, which owns the tensor.
            try (PtNDArray array = new PtNDArray(manager, tensor);
                    PtNDArray wide = array.toType(DataType.FLOAT64, true)) {
                return wide.toDoubleArray();
            }
        } finally {
            PyTorchLibrary.LIB.torchDeleteIValue(result);
        }
    }

    /** A float32/float64 tensor's values read from its bytes; null for other dtypes or strided layouts. */
    private static double[] floatValues(long tensor, boolean scalar) {
        DataType type = DATA_TYPES[PyTorchLibrary.LIB.torchDType(tensor)];
        if (type != DataType.FLOAT32 && type != DataType.FLOAT64) {
            return null;
        }
        int size = type == DataType.FLOAT32 ? 4 : 8;
        // One element is always contiguous; only longer results need the layout check.
        if (!scalar && !PyTorchLibrary.LIB.torchIsContiguous(tensor)) {
            return null;
        }
        ByteBuffer bytes = ByteBuffer.wrap(PyTorchLibrary.LIB.torchDataPtr(tensor)).order(ByteOrder.nativeOrder());
        if (scalar && bytes.capacity() != size && !PyTorchLibrary.LIB.torchIsContiguous(tensor)) {
            return null;
        }
        double[] values = new double[bytes.capacity() / size];
        for (int i = 0; i < values.length; i++) {
            values[i] = size == 4 ? bytes.getFloat(4 * i) : bytes.getDouble(8 * i);
        }
        return values;
    }

    /**
     * The smallest and largest value of a non-empty int64 CPU tensor: one copy of its bytes
     * scanned in Java (cheaper than two libtorch reductions for the index arrays of an epoch),
     * or libtorch's min and max when the tensor is not contiguous.
     *
     * @param tensor a 1-d int64 CPU tensor with at least one element
     * @return {min, max}
     */
    public static long[] minMax(PtNDArray tensor) {
        long handle = tensor.getHandle();
        if (!PyTorchLibrary.LIB.torchIsContiguous(handle)) {
            return new long[] {scalarLong(PyTorchLibrary.LIB.torchMin(handle)), scalarLong(PyTorchLibrary.LIB.torchMax(handle))};
        }
        ByteBuffer bytes = ByteBuffer.wrap(PyTorchLibrary.LIB.torchDataPtr(handle)).order(ByteOrder.nativeOrder());
        long min = Long.MAX_VALUE;
        long max = Long.MIN_VALUE;
        for (int i = 0; i < bytes.capacity(); i += 8) {
            long value = bytes.getLong(i);
            min = Math.min(min, value);
            max = Math.max(max, value);
        }
        return new long[] {min, max};
    }

    private static long scalarLong(long tensor) {
        try {
            return ByteBuffer.wrap(PyTorchLibrary.LIB.torchDataPtr(tensor)).order(ByteOrder.nativeOrder()).getLong(0);
        } finally {
            PyTorchLibrary.LIB.torchDeleteTensor(tensor);
        }
    }
}
