package ai.djl.pytorch.jni;

import ai.djl.pytorch.engine.PtSymbolBlock;

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
}
