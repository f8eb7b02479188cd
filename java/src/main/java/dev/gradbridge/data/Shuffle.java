package dev.gradbridge.data;

/**
 * The mini-batch order and per-epoch torch seed, bit for bit the same as {@code
 * python/gradbridge/_runtime/shuffle.py} (which states the specification); both suites check {@code
 * tests/vectors/shuffle.json}.
 *
 * <p>One SplitMix64 stream per (seed, epoch) starting at {@code seed ^ (epoch *
 * 0xD1B54A32D192ED03)}: its first output, shifted right by one, seeds libtorch for the epoch; the
 * following outputs drive a Fisher-Yates shuffle ({@code j = output mod (i + 1)}, unsigned).
 */
public final class Shuffle {

    private static final long GOLDEN_GAMMA = 0x9E3779B97F4A7C15L;
    private static final long EPOCH_MIX = 0xD1B54A32D192ED03L;

    private Shuffle() {}

    /** SplitMix64 (Steele, Lea, Flood), as in Vigna's reference code. */
    static final class SplitMix64 {
        private long state;

        SplitMix64(long state) {
            this.state = state;
        }

        long next() {
            state += GOLDEN_GAMMA;
            long z = state;
            z = (z ^ (z >>> 30)) * 0xBF58476D1CE4E5B9L;
            z = (z ^ (z >>> 27)) * 0x94D049BB133111EBL;
            return z ^ (z >>> 31);
        }
    }

    private static SplitMix64 stream(long seed, long epoch) {
        return new SplitMix64(seed ^ (epoch * EPOCH_MIX));
    }

    /**
     * Returns the libtorch generator seed of an epoch.
     *
     * @param seed the run's seed (any 64-bit value)
     * @param epoch the epoch index, from 0
     * @return a non-negative seed below 2^63
     */
    public static long torchSeed(long seed, long epoch) {
        return stream(seed, epoch).next() >>> 1;
    }

    /**
     * Returns the sample order of an epoch.
     *
     * @param seed the run's seed
     * @param epoch the epoch index, from 0
     * @param n the number of samples
     * @return a permutation of {@code 0..n-1}
     */
    public static long[] permutation(long seed, long epoch, int n) {
        SplitMix64 random = stream(seed, epoch);
        random.next(); // the first output is the epoch's torch seed
        long[] perm = new long[n];
        for (int i = 0; i < n; i++) {
            perm[i] = i;
        }
        for (int i = n - 1; i > 0; i--) {
            int j = (int) Long.remainderUnsigned(random.next(), i + 1);
            long swap = perm[i];
            perm[i] = perm[j];
            perm[j] = swap;
        }
        return perm;
    }
}
