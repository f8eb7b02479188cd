package dev.gradbridge;

import static dev.gradbridge.StrictJson.array;
import static dev.gradbridge.StrictJson.flag;
import static dev.gradbridge.StrictJson.hexDouble;
import static dev.gradbridge.StrictJson.integer;
import static dev.gradbridge.StrictJson.member;
import static dev.gradbridge.StrictJson.number;
import static dev.gradbridge.StrictJson.shown;
import static dev.gradbridge.StrictJson.text;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.gradbridge.StrictJson.Refusal;
import java.util.Arrays;
import java.util.List;

/**
 * A protocol-3 program's schedule and counters read as data (python: program_check.schedule and _counters):
 * every count in [low, {@code count}], StepLR's step_size, CosineAnnealingLR's T_max, LinearLR's total_iters
 * and OneCycleLR's total_steps 1 or more, factors and lrs finite and in torch's ranges, so the native
 * schedule never divides by zero or overflows.
 */
final class Schedules {

    private static final double INF = Double.POSITIVE_INFINITY;
    private static final List<String> RESTARTABLE = Arrays.asList("step", "multistep", "exponential", "cosine", "linear");

    private Schedules() {
    }

    static void schedule(JsonElement value, int groups, String where) {
        if (!value.isJsonObject()) {
            throw new Refusal(where, shown(value) + " is not an object");
        }
        JsonObject spec = value.getAsJsonObject();
        String name = text(member(spec, "name", where), where, "name");
        String at = where + " (" + shown(name) + ")";
        double[] lrs = ProgramCheck.finiteHexes(member(spec, "base_lrs", at), at, "base_lrs", 0.0);
        if (lrs.length != groups) {
            throw new Refusal(at, "base_lrs holds " + lrs.length + " values for " + groups + " parameter groups");
        }
        switch (name) {
            case "step":
                count(spec, "step_size", 1, at);
                finite(spec, "gamma", -INF, INF, false, false, at);
                break;
            case "multistep":
                counts(member(spec, "milestones", at), at, "milestones", 0);
                finite(spec, "gamma", -INF, INF, false, false, at);
                break;
            case "exponential":
                finite(spec, "gamma", 0.0, INF, false, true, at);
                break;
            case "cosine":
                count(spec, "T_max", 1, at);
                finite(spec, "eta_min", -INF, INF, false, false, at);
                break;
            case "linear":
                finite(spec, "start_factor", 0.0, 1.0, false, true, at);
                finite(spec, "end_factor", 0.0, 1.0, false, false, at);
                count(spec, "total_iters", 1, at);
                break;
            case "plateau":
                plateau(spec, groups, at);
                break;
            case "sequential":
                sequential(spec, groups, at);
                break;
            case "onecycle":
                oneCycle(spec, groups, at);
                break;
            default:
                throw new Refusal(at, "unknown scheduler " + shown(name));
        }
    }

    /** ReduceLROnPlateau's settings, one minimum learning rate per parameter group. */
    private static void plateau(JsonObject spec, int groups, String where) {
        flag(member(spec, "minimize", where), where, "minimize");
        flag(member(spec, "relative", where), where, "relative");
        finite(spec, "factor", 0.0, 1.0, true, false, where);
        count(spec, "patience", 0, where);
        finite(spec, "threshold", 0.0, INF, false, false, where);
        count(spec, "cooldown", 0, where);
        if (ProgramCheck.finiteHexes(member(spec, "min_lrs", where), where, "min_lrs", 0.0).length != groups) {
            throw new Refusal(where, "min_lrs holds another number of values than the " + groups + " parameter groups");
        }
        finite(spec, "eps", 0.0, INF, false, false, where);
    }

    /** SequentialLR: one more scheduler than milestones, each of a kind that restarts cleanly. */
    private static void sequential(JsonObject spec, int groups, String where) {
        long[] milestones = counts(member(spec, "milestones", where), where, "milestones", 1);
        JsonArray children = array(member(spec, "schedulers", where), where, "schedulers");
        if (children.size() != milestones.length + 1) {
            throw new Refusal(where, children.size() + " schedulers for " + milestones.length
                    + " milestones, expected one more");
        }
        for (int k = 0; k < children.size(); k++) {
            schedule(children.get(k), groups, where + ".schedulers[" + k + "]");
            String child = children.get(k).getAsJsonObject().get("name").getAsString();
            if (!RESTARTABLE.contains(child)) {
                throw new Refusal(where, "schedulers[" + k + "] is " + shown(child) + ", expected one of "
                        + String.join(", ", RESTARTABLE));
            }
        }
    }

    private static void oneCycle(JsonObject spec, int groups, String where) {
        integer(member(spec, "total_steps", where), where, "total_steps", 1, StrictJson.COUNT);
        boolean cycle = flag(member(spec, "cycle_momentum", where), where, "cycle_momentum");
        flag(member(spec, "cos", where), where, "cos");
        int phases = ProgramCheck.finiteHexes(member(spec, "end_steps", where), where, "end_steps", 0.0).length;
        if (phases == 0) {
            throw new Refusal(where, "end_steps is empty");
        }
        for (String key : new String[] {"initial", "max_lrs", "min_lrs", "max_momenta", "base_momenta"}) {
            int n = ProgramCheck.finiteHexes(member(spec, key, where), where, key, 0.0).length;
            if (n != groups && (cycle || !(key.equals("max_momenta") || key.equals("base_momenta")))) {
                throw new Refusal(where, key + " holds " + n + " values for " + groups + " parameter groups");
            }
        }
        for (String key : new String[] {"start_keys", "end_keys", "start_momentum_keys", "end_momentum_keys"}) {
            JsonArray keys = array(member(spec, key, where), where, key);
            if (keys.size() != phases) {
                throw new Refusal(where, key + " holds " + keys.size() + " values for " + phases + " phases");
            }
            for (int k = 0; k < keys.size(); k++) {
                integer(keys.get(k), where, key + "[" + k + "]", 0, 4);
            }
        }
    }

    private static long count(JsonObject spec, String key, long low, String where) {
        return integer(member(spec, key, where), where, key, low, StrictJson.COUNT);
    }

    private static double finite(JsonObject spec, String key, double low, double high, boolean belowHigh,
            boolean aboveLow, String where) {
        return number(member(spec, key, where), where, key, low, high, belowHigh, aboveLow);
    }

    private static long[] counts(JsonElement value, String where, String field, long low) {
        JsonArray items = array(value, where, field);
        long[] out = new long[items.size()];
        for (int k = 0; k < out.length; k++) {
            out[k] = integer(items.get(k), where, field + "[" + k + "]", low, StrictJson.COUNT);
        }
        return out;
    }

    static void counters(JsonObject counters, int groups, JsonElement spec, int children, String where) {
        integer(member(counters, "steps", where), where, "steps", 0, StrictJson.COUNT);
        if (ProgramCheck.finiteHexes(member(counters, "lrs", where), where, "lrs", 0.0).length != groups) {
            throw new Refusal(where, "lrs holds another number of learning rates than the " + groups + " parameter groups");
        }
        integer(member(counters, "last_epoch", where), where, "last_epoch", -1, StrictJson.COUNT);
        hexDouble(member(counters, "best", where), where, "best");
        integer(member(counters, "num_bad_epochs", where), where, "num_bad_epochs", 0, StrictJson.COUNT);
        integer(member(counters, "cooldown_counter", where), where, "cooldown_counter", 0, StrictJson.COUNT);
        JsonArray epochs = array(member(counters, "children_last_epochs", where), where, "children_last_epochs");
        if (epochs.size() != children) {
            throw new Refusal(where, "children_last_epochs holds " + epochs.size() + " epochs for " + children + " schedules");
        }
        for (int k = 0; k < epochs.size(); k++) {
            integer(epochs.get(k), where, "children_last_epochs[" + k + "]", -1, StrictJson.COUNT);
        }
        JsonElement given = counters.has("momenta") ? counters.get("momenta") : new JsonArray();
        double[] momenta = ProgramCheck.finiteHexes(given, where, "momenta", Double.NEGATIVE_INFINITY);
        boolean cycled = spec != null && spec.isJsonObject() && "onecycle".equals(nameOf(spec))
                && isTrue(spec.getAsJsonObject().get("cycle_momentum"));
        if (momenta.length > 0 && (!cycled || momenta.length != groups)) {
            throw new Refusal(where, "momenta holds " + momenta.length + " values for " + groups
                    + " parameter groups of a schedule that cycles " + (cycled ? "them" : "none"));
        }
    }

    private static String nameOf(JsonElement spec) {
        JsonElement name = spec.getAsJsonObject().get("name");
        return name != null && name.isJsonPrimitive() ? name.getAsString() : null;
    }

    private static boolean isTrue(JsonElement value) {
        return value != null && value.isJsonPrimitive() && value.getAsJsonPrimitive().isBoolean() && value.getAsBoolean();
    }
}
