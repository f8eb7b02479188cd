package dev.gradbridge.internal;

import dev.gradbridge.MethodCallException;

/** What {@link ModuleAccess#stepWhileFinite} did. */
public final class GuardedSteps {
    private final int stepped;
    private final int count;
    private final double[] losses;
    private final MethodCallException failure;

    /**
     * @param stepped micro-batches stepped, from the first
     * @param count micro-batches asked for
     * @param losses each computed loss
     * @param failure the failed call that stopped it, or null
     */
    public GuardedSteps(int stepped, int count, double[] losses, MethodCallException failure) {
        this.stepped = stepped;
        this.count = count;
        this.losses = losses;
        this.failure = failure;
    }

    /** @return how many micro-batches, from the first, were stepped */
    public int stepped() {
        return stepped;
    }

    /** @return whether every micro-batch was stepped */
    public boolean complete() {
        return stepped == count;
    }

    /**
     * @param i a stepped micro-batch, or the one it stopped at when its loss was computed
     * @return its loss, exactly (float32 widened to double)
     */
    public double loss(int i) {
        return losses[i];
    }

    /**
     * @return the failed call that stopped it at micro-batch {@link #stepped()}, or null
     *     (then, unless complete, that micro-batch's loss or a gradient is not finite)
     */
    public MethodCallException failure() {
        return failure;
    }
}
