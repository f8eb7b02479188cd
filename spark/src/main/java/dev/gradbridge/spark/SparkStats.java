package dev.gradbridge.spark;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;

/**
 * A {@link SparkTrainer}'s counters and timings, summed over its runs (for the benchmark and the tests,
 * {@code --stats}): read them as {@link #toJson}; the trainer alone updates them.
 */
final class SparkStats {
    /** Steps taken (by the stage attempt that succeeded: a retry repeats the epoch a failed one was in). */
    long steps;
    /** Per step the slowest task's whole step (compute, exchange, optimizer), summed, ns. */
    long stepNanos;
    /** Per step the slowest task's compute (its rows' forward and backward), summed, ns. */
    long computeNanos;
    /**
     * Per step the slowest task's compute minus the fastest's, summed, ns: what the fastest waits for
     * in the exchange's first collective (the tasks start each step together, after the last one's).
     */
    long computeSpreadNanos;
    /** The slowest task's time in the gradient exchange, all steps, ns. */
    long exchangeNanos;
    /**
     * Per partition, per {@link GradientExchange#PHASES} entry ({@code copy_in}: the gradients into the
     * exchange's buffers; {@code alltoall}, {@code allgather}: the task's waits for the collectives, a
     * wait for a slower task inside (over Gloo by slice: the waits for each slice to arrive, then for the
     * all-gathers after the last combine; the parts that overlap a combine are not counted again);
     * {@code combine}; {@code copy_out}: the combined gradient out of them), all steps, ns.
     */
    final List<long[]> exchangePhaseNanos = new ArrayList<>();
    /** The slowest task's time combining nothing but setting gradients and stepping the optimizer, ns. */
    long optimizerNanos;
    /** The driver's time in the run's barrier stage (launch, module loads, steps, epoch ends, results), ns. */
    long stageNanos;
    /** Partition 0's time at the epochs' ends on its step path (the snapshot, the wait for the last hand-over), ns. */
    long epochEndNanos;
    /** The slowest module load at the stage's start, ns. */
    long loadNanos;
    /** Bytes the busiest task sent in the exchange, all steps. */
    long bytesSent;
    /** Bytes the busiest task received in the exchange, all steps. */
    long bytesReceived;
    /** Parameter bytes of the model (one copy). */
    long parameterBytes;
    /** Replicas loaded by the stage attempt that succeeded (K per run). */
    long moduleLoads;
    /** Task attempts that failed. */
    int failedTasks;
    /** Barrier stage attempts that failed and were retried as a whole. */
    int stagesRetried;
    /** Partitions. */
    int partitions;
    /** Per epoch trained, the executors of the stage attempt that trained it, in partition order. */
    final List<List<String>> executors = new ArrayList<>();
    /** The exchange in use. */
    String exchange;
    /** The setting {@value GradientExchange#ONE_ROUND_SETTING} in use. */
    long oneRoundBytes;
    /** Per partition: libtorch's intra-op threads its task ran on (the stage attempt that succeeded last). */
    int[] threads = new int[0];

    /** @return the counters as a JSON object */
    String toJson() {
        return String.format(
                Locale.ROOT,
                "{\"steps\": %d, \"step_s\": %.6f, \"compute_s\": %.6f, \"compute_spread_s\": %.6f, \"exchange_s\": %.6f,"
                        + " \"optimizer_s\": %.6f, \"stage_s\": %.6f, \"epoch_end_s\": %.6f, \"load_s\": %.6f,"
                        + " \"bytes_sent\": %d,"
                        + " \"bytes_received\": %d, \"parameter_bytes\": %d, \"module_loads\": %d,"
                        + " \"failed_tasks\": %d, \"stages_retried\": %d, \"partitions\": %d, \"exchange\": \"%s\","
                        + " \"one_round_bytes\": %d, \"threads\": %s, \"executors\": %s, \"exchange_phases_s\": %s}",
                steps, stepNanos / 1e9, computeNanos / 1e9, computeSpreadNanos / 1e9, exchangeNanos / 1e9, optimizerNanos / 1e9,
                stageNanos / 1e9, epochEndNanos / 1e9, loadNanos / 1e9, bytesSent, bytesReceived, parameterBytes, moduleLoads,
                failedTasks, stagesRetried, partitions, exchange, oneRoundBytes, Arrays.toString(threads), executorsJson(),
                phasesJson());
    }

    /** @return per phase, each partition's seconds in it: {"copy_in": [p0, p1, ...], ...} */
    private String phasesJson() {
        List<String> phases = new ArrayList<>();
        for (int f = 0; f < GradientExchange.PHASES.length; f++) {
            List<String> seconds = new ArrayList<>();
            for (long[] partition : exchangePhaseNanos) {
                seconds.add(String.format(Locale.ROOT, "%.6f", partition[f] / 1e9));
            }
            phases.add("\"" + GradientExchange.PHASES[f] + "\": [" + String.join(", ", seconds) + "]");
        }
        return "{" + String.join(", ", phases) + "}";
    }

    private String executorsJson() {
        List<String> epochs = new ArrayList<>();
        for (List<String> ids : executors) {
            epochs.add(ids.isEmpty() ? "[]" : "[\"" + String.join("\", \"", ids) + "\"]");
        }
        return "[" + String.join(", ", epochs) + "]";
    }
}
