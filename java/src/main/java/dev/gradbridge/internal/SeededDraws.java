package dev.gradbridge.internal;

import dev.gradbridge.data.Shuffle;
import java.util.function.Supplier;

/**
 * Training steps that draw random numbers (dropout), each from libtorch's generator seeded for it
 * alone, one at a time in the JVM. libtorch has one CPU generator per process: two seeded steps on
 * two threads (two Spark tasks of one executor, two online learners) would take each other's draws.
 * Predictions and validation run in eval mode and draw nothing, so they never wait here.
 */
public final class SeededDraws {

    private static final Object LOCK = new Object();

    private SeededDraws() {}

    /**
     * Seeds libtorch's generator with {@code seed} and runs {@code body} while no other seeded
     * region of the JVM runs.
     *
     * @param seed the generator's seed ({@link #seed})
     * @param body the step
     * @param <T> its result
     * @return what {@code body} returned
     */
    public static <T> T call(long seed, Supplier<T> body) {
        synchronized (LOCK) {
            ModuleAccess.calls().manualSeed(seed);
            return body.get();
        }
    }

    /**
     * The seed of one step of a run: {@link Shuffle#torchSeed} chained over {@code ids} (an online
     * micro-batch's number; a Spark step's number, then its partition). Python's twin is
     * {@code gradbridge._runtime.shuffle.step_seed}.
     *
     * @param runSeed the run's seed
     * @param ids what identifies the step within the run
     * @return a non-negative seed below 2^63
     */
    public static long seed(long runSeed, long... ids) {
        long seed = runSeed;
        for (long id : ids) {
            seed = Shuffle.torchSeed(seed, id);
        }
        return seed;
    }
}
