package dev.gradbridge;

import java.nio.file.Path;

/**
 * For {@code gradbridge bench} only (dev.gradbridge.bench.StepBenchmark): the layers below
 * {@link TrainingModule}, timed on their own. Not for applications.
 */
public final class CallBreakdown {

    private CallBreakdown() {}

    /** {@code train_step(x, y)} on a module of its own, straight through the native layer: no checks, no guard. */
    public static final class BareCall implements Runnable, AutoCloseable {
        private final TorchScriptModule module;
        private final Tensor x;
        private final Tensor y;

        private BareCall(TorchScriptModule module, Tensor x, Tensor y) {
            this.module = module;
            this.x = x;
            this.y = y;
        }

        @Override
        public void run() {
            module.invokeToDouble(Protocol.TRAIN_STEP, x, y);
        }

        @Override
        public void close() {
            module.close();
        }
    }

    /**
     * @param model the module file (loaded once more, apart from any TrainingModule)
     * @param x one batch of inputs
     * @param y its targets
     * @return the bare call; close it
     */
    public static BareCall bareTrainStep(Path model, Tensor x, Tensor y) {
        return new BareCall(TorchScriptModule.load(model.toAbsolutePath()), x, y);
    }

    /** @return libtorch's intra-op thread count */
    public static int intraOpThreads() {
        NativeLibrary.load();
        return Native.getNumThreads();
    }

    /** @return libtorch's inter-op thread count */
    public static int interopThreads() {
        NativeLibrary.load();
        return Native.getNumInteropThreads();
    }
}
