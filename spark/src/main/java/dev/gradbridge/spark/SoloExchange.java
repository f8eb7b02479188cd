package dev.gradbridge.spark;

import java.util.List;

/**
 * The exchange of a one-partition run: nothing to exchange, so no round trip and no copy; the
 * task's own gradients are the combined ones ({@link GradientCombiner#alone}: weight 1, and
 * {@code g * 1} is {@code g}), so the bits are the relay's with K=1.
 */
final class SoloExchange implements GradientExchange {

    @Override
    public GradientCombiner.Combined combine(ShardResult mine, List<String> dtypes, long[] sizes) {
        return GradientCombiner.alone(mine, dtypes, sizes);
    }

    @Override
    public long bytesSent() {
        return 0;
    }

    @Override
    public long bytesReceived() {
        return 0;
    }
}
