package dev.gradbridge.spark;

import java.io.InterruptedIOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * The state of a run the driver holds, on an endpoint of its RPC environment ({@link
 * DriverEndpoint}): the module archive at the start of the next epoch to train. The run's one
 * barrier stage reads it at each attempt's start, and partition 0 hands it each epoch's end state
 * without ending the stage; the driver's main thread takes those ends in order ({@link #next}) and
 * writes the history record and the checkpoint. So a retried stage (a task failed) starts from the
 * last epoch end the driver holds.
 *
 * <p>Requests: {@code {"start", Integer attempt, Integer partition, String executor}} answers
 * {@code Object[] {Integer epoch, byte[] archive}}, the same for every task of one stage attempt
 * (fixed by its first request, so that the tasks of an attempt start from the same epoch even when an
 * end arrives between their requests); {@code {"end", Integer attempt, Integer epoch, double[] losses,
 * byte[] archive, LinkedHashMap digests, LinkedHashMap values, double[] lrs, Integer threads}} (the history record's
 * inputs, read from partition 0's replica: the driver loads no module) answers {@code Boolean.TRUE}
 * once the driver holds it. An end of an epoch the driver already holds (a failed attempt's
 * partition 0 may finish an epoch after the retry began from its start: the same bits) is
 * acknowledged and dropped.
 */
final class DriverState extends DriverEndpoint {

    static final String START = "start";
    static final String END = "end";

    /** One epoch's end, as partition 0 handed it over. */
    static final class EpochEnd {
        final int epoch;
        final double[] losses;
        final byte[] archive;
        /** The parameters' digests after the epoch, by name. */
        final Map<String, String> digests;
        /** Their values (empty for digests only). */
        final Map<String, double[]> values;
        /** The learning rate per parameter group after the epoch, or null. */
        final double[] lrs;
        /** The executors of the stage attempt that trained the epoch, in partition order. */
        final List<String> executors;
        /** libtorch's intra-op threads of each task of that attempt (the replay runs on as many). */
        final int threads;

        @SuppressWarnings("unchecked")
        EpochEnd(Object[] message, List<String> executors) {
            this.epoch = (Integer) message[2];
            this.losses = (double[]) message[3];
            this.archive = (byte[]) message[4];
            this.digests = (Map<String, String>) message[5];
            this.values = (Map<String, double[]>) message[6];
            this.lrs = (double[]) message[7];
            this.threads = (Integer) message[8];
            this.executors = executors;
        }
    }

    private final int partitions;
    private final BlockingQueue<EpochEnd> ends = new LinkedBlockingQueue<>();
    private final Map<Integer, Object[]> attemptStarts = new HashMap<>();
    private final Map<Integer, String[]> attemptExecutors = new HashMap<>();
    private int nextEpoch;
    private byte[] archive;

    private DriverState(int partitions, int firstEpoch, byte[] archive, byte[] secret) {
        super("gradbridge-run", secret);
        this.partitions = partitions;
        this.nextEpoch = firstEpoch;
        this.archive = archive;
    }

    /**
     * Registers the run's state on the driver's RPC environment, starting at {@code firstEpoch} from
     * {@code archive}, answering requests that carry the run's {@code secret}.
     */
    static DriverState start(int partitions, int firstEpoch, byte[] archive, byte[] secret) {
        DriverState state = new DriverState(partitions, firstEpoch, archive, secret);
        state.register();
        return state;
    }

    /** @return the next epoch end handed over, or null after {@code millis} without one */
    EpochEnd next(long millis) throws InterruptedIOException {
        try {
            return ends.poll(millis, TimeUnit.MILLISECONDS);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while training");
        }
    }

    @Override
    synchronized void arrive(Object[] message, SparkInternals.Reply caller) {
        caller.reply(answer(message));
    }

    private Object answer(Object[] message) {
        int attempt = (Integer) message[1];
        if (START.equals(message[0])) {
            attemptExecutors.computeIfAbsent(attempt, a -> new String[partitions])[(Integer) message[2]] =
                    (String) message[3];
            return attemptStarts.computeIfAbsent(attempt, a -> new Object[] {nextEpoch, archive});
        }
        int epoch = (Integer) message[2];
        if (epoch == nextEpoch) {
            nextEpoch = epoch + 1;
            archive = (byte[]) message[4];
            String[] executors = attemptExecutors.getOrDefault(attempt, new String[0]);
            ends.add(new EpochEnd(message, new ArrayList<>(Arrays.asList(executors))));
        }
        return Boolean.TRUE;
    }
}
