package dev.gradbridge;

import ai.djl.engine.Engine;
import ai.djl.pytorch.jni.JniUtils;

/** Starts DJL's PyTorch engine the way gradbridge needs it and prepares calling threads. */
final class TorchRuntime {

    private static final String OFFLINE = "ai.djl.offline";
    private static final String GRAPH_OPTIMIZER = "ai.djl.pytorch.graph_optimizer";

    private TorchRuntime() {}

    /**
     * Returns the PyTorch engine, starting it on first use. Offline unless the caller said
     * otherwise: a missing native library must be an error, never a download.
     */
    static synchronized Engine engine() {
        if (System.getProperty(OFFLINE) == null && System.getenv("DJL_OFFLINE") == null) {
            System.setProperty(OFFLINE, "true");
        }
        if (System.getProperty(GRAPH_OPTIMIZER) == null) {
            System.setProperty(GRAPH_OPTIMIZER, "false"); // see prepareCallingThread
        }
        try {
            return Engine.getEngine("PyTorch");
        } catch (RuntimeException e) {
            throw new GradbridgeException(
                    "cannot start DJL's PyTorch engine: "
                            + e.getMessage()
                            + ". Put ai.djl.pytorch:pytorch-native-cpu and pytorch-jni on the"
                            + " classpath, or set PYTORCH_LIBRARY_PATH to a libtorch folder.",
                    e);
        }
    }

    /**
     * Grad mode and the graph-executor setting are thread-local in libtorch, and DJL turns grad
     * mode off on the thread that starts the engine. Set both before every call, on the calling
     * thread: autograd on; the optimizing executor off, because its differentiable subgraphs
     * drift from eager autograd in the last bits after the second call.
     */
    /** Seeds libtorch's process-wide CPU generator (what dropout draws from). */
    static void seed(long seed) {
        JniUtils.setSeed(seed);
    }

    static void prepareCallingThread() {
        JniUtils.setGradMode(true);
        JniUtils.setGraphExecutorOptimize(false);
    }
}
