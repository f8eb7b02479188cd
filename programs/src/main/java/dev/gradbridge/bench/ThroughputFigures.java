package dev.gradbridge.bench;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** What {@link OnlineBenchmark}'s throughput rounds measure, by variant, and the figures it reports from them. */
final class ThroughputFigures {

    final Map<String, List<Double>> perRound = new LinkedHashMap<>();
    final Map<String, Map<String, Long>> phaseNanos = new LinkedHashMap<>();
    final Map<String, Long> phaseBatches = new LinkedHashMap<>();
    final Map<String, Long> wallNanos = new LinkedHashMap<>();
    final Map<String, Long> trainCalls = new LinkedHashMap<>();
    final Map<String, long[]> cpuNanos = new LinkedHashMap<>(); // the batch loops' thread CPU time
    final Map<String, Map<String, Long>> phaseCpu = new LinkedHashMap<>();
    long onlineUpdates;

    /** Events/s by round and their medians; each online variant's per-round ratio to each baseline, with its spread. */
    void rates(Map<String, Object> out, List<String> variants, int rounds) {
        Map<String, Object> rates = new LinkedHashMap<>();
        for (String variant : variants) {
            rates.put(variant, perRound.get(variant));
        }
        out.put("rounds", rounds);
        out.put("events_per_s_by_round", rates);
        out.put("online_events_per_s", medianOf("online_never"));
        out.put("online_always_events_per_s", medianOf("online_always"));
        out.put("step_events_per_s", medianOf("trainer_step"));
        out.put("fused_events_per_s", medianOf("fused_epoch"));
        out.put("online_updates", onlineUpdates);
        Map<String, Object> ratios = new LinkedHashMap<>();
        for (String online : new String[] {"online_never", "online_always"}) {
            for (String base : new String[] {"fused_epoch", "trainer_step"}) {
                if (!perRound.containsKey(online) || !perRound.containsKey(base)) {
                    continue;
                }
                List<Double> values = new ArrayList<>();
                for (int r = 0; r < rounds; r++) {
                    values.add(perRound.get(online).get(r) / perRound.get(base).get(r));
                }
                Map<String, Object> spread = new LinkedHashMap<>();
                spread.put("median", OnlineBenchmark.median(values));
                spread.put("min", values.stream().mapToDouble(Double::doubleValue).min().orElse(Double.NaN));
                spread.put("max", values.stream().mapToDouble(Double::doubleValue).max().orElse(Double.NaN));
                ratios.put(online + "/" + base, spread);
            }
        }
        out.put("throughput_ratios", ratios);
    }

    /** Wall and CPU time per micro-batch, by phase and in all, of each variant ({@code microBatches} each). */
    void phases(Map<String, Object> out, long microBatches) {
        Map<String, Object> phases = new LinkedHashMap<>();
        for (Map.Entry<String, Map<String, Long>> e : phaseNanos.entrySet()) {
            long batches = Math.max(1, phaseBatches.get(e.getKey()));
            Map<String, Object> perBatch = new LinkedHashMap<>();
            perBatch.put("wall", wallNanos.get(e.getKey()) / 1e3 / batches);
            perBatch.put("micro_batches_per_call", batches / (double) Math.max(1, trainCalls.get(e.getKey())));
            for (Map.Entry<String, Long> phase : e.getValue().entrySet()) {
                perBatch.put(phase.getKey(), phase.getValue() / 1e3 / batches);
            }
            phases.put(e.getKey(), perBatch);
        }
        out.put("phase_us_per_micro_batch", phases);
        // CPU time per micro-batch: robust to a loaded machine (descheduled time is not counted).
        // Online: the training thread's phases plus the feeding threads' learn_* phases.
        Map<String, Object> cpuPhases = new LinkedHashMap<>();
        Map<String, Double> cpuPerBatch = new LinkedHashMap<>();
        for (Map.Entry<String, Map<String, Long>> e : phaseCpu.entrySet()) {
            long batches = Math.max(1, phaseBatches.get(e.getKey()));
            Map<String, Object> perBatch = new LinkedHashMap<>();
            long total = 0;
            for (Map.Entry<String, Long> phase : e.getValue().entrySet()) {
                perBatch.put(phase.getKey(), phase.getValue() / 1e3 / batches);
                total += phase.getValue();
            }
            cpuPhases.put(e.getKey(), perBatch);
            cpuPerBatch.put(e.getKey(), total / 1e3 / batches);
        }
        for (Map.Entry<String, long[]> e : cpuNanos.entrySet()) {
            cpuPerBatch.put(e.getKey(), e.getValue()[0] / 1e3 / microBatches);
        }
        out.put("phase_cpu_us_per_micro_batch", cpuPhases);
        out.put("cpu_us_per_micro_batch", cpuPerBatch);
    }

    /** The median of a variant's rounds (NaN for a variant that did not run). */
    private double medianOf(String variant) {
        return OnlineBenchmark.median(perRound.getOrDefault(variant, new ArrayList<>()));
    }
}
