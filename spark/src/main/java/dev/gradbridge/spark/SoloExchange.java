package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.util.List;

/**
 * The exchange of a one-partition run: nothing to exchange, so no round trip and no arithmetic; the
 * task's own gradients are the combined ones (weight {@code rows / rows = 1.0} exactly, and IEEE 754
 * {@code g * 1} is {@code g}, a NaN staying NaN), so the bits are the relay's with K=1. A parameter
 * without a gradient gets zeros, as the combine gives it.
 */
final class SoloExchange implements GradientExchange {

    private final GradientCombiner.Combined combined;
    private final long[] phases = new long[PHASES.length];

    SoloExchange(List<String> dtypes, long[] sizes) {
        ByteBuffer[] gradients = new ByteBuffer[sizes.length];
        for (int i = 0; i < sizes.length; i++) {
            GradientCombiner.requireFloating(dtypes.get(i));
            gradients[i] = Buffers.direct(sizes[i] * ShardedData.bytesOf(dtypes.get(i)));
        }
        combined = new GradientCombiner.Combined(gradients, new boolean[sizes.length]);
    }

    @Override
    public void put(int parameter, ByteBuffer values) {
        long t0 = System.nanoTime();
        ByteBuffer into = combined.gradients[parameter];
        into.put(0, values, 0, into.limit());
        phases[0] += System.nanoTime() - t0;
    }

    @Override
    public GradientCombiner.Combined combine(ShardResult mine) {
        for (int i = 0; i < combined.flags.length; i++) {
            combined.flags[i] = mine.rows > 0 && mine.flags[i];
            if (!combined.flags[i]) {
                ByteBuffer zeros = combined.gradients[i];
                for (int b = 0; b < zeros.limit(); b++) {
                    zeros.put(b, (byte) 0);
                }
            }
        }
        combined.loss = mine.rows > 0 ? mine.loss : 0.0;
        combined.rows = mine.rows;
        return combined;
    }

    @Override
    public void broadcast(int source, ByteBuffer values) {
        // one task: its bytes are every task's
    }

    @Override
    public long[] phaseNanos() {
        return phases.clone();
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
