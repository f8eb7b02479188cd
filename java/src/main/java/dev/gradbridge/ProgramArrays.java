package dev.gradbridge;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;

/**
 * A checked protocol-3 program as the native layer reads it: three arrays read front to back (integers: counts,
 * integers, flags 0/1 and argument kinds; doubles; strings), so that nothing in the native layer parses text
 * ({@code native/oplist_arrays.h} reads them, every read bounds-checked). Written from the Gson trees that
 * {@link ProgramCheck} and {@link Schedules} checked (every field present, of its type and in its range), in this
 * order; {@code X...} is a count on the integers, then that many X:
 *
 * <pre>
 * program   = parameter name..., input name..., limits, graph..., training, counters
 * limits    = integer elements, sized argument name...     (oplist_rules.json's, as StrictJson holds them)
 * graph     = string name, integer oplist_version, input binding..., node..., (integer ref, string to)...
 * node      = string op, string overload, argument..., integer outputs
 * argument  = integer kind, then by kind: 0 null: nothing; 1 t: integer slot; 2 tl, 3 otl: integer slot...
 *             (otl's null: -1); 4 i: integer; 5 f: double; 6 b: flag; 7 il: integer...; 8 sl: (integer a,
 *             integer c)..., each the size a * batch + c (a plain integer: a = 0); 9 bx: integer a, integer c;
 *             10 fl: double...; 11 bl: flag...; 12 s, 13 dtype, 14 layout, 15 device, 16 mf: string
 * training  = string optimizer, group..., integer accumulate, string scheduler_interval, flag scheduler held,
 *             schedule (when held)
 * group     = parameter name..., double beta1, beta2, momentum, weight_decay, lr_decay (0 for a field its
 *             optimizer takes none of)
 * schedule  = string name, double base_lrs..., then by name:
 *             step: integer step_size, double gamma; multistep: integer milestones..., double gamma;
 *             exponential: double gamma; cosine: integer T_max, double eta_min;
 *             linear: double start_factor, double end_factor, integer total_iters;
 *             sequential: integer milestones..., schedule...;
 *             plateau: flag minimize, flag relative, double factor, integer patience, double threshold,
 *               integer cooldown, double min_lrs..., double eps;
 *             onecycle: integer total_steps, double... for each of initial, max_lrs, min_lrs, end_steps,
 *               max_momenta, base_momenta, integer... for each of start_keys, end_keys, start_momentum_keys,
 *               end_momentum_keys, flag cos, flag cycle_momentum
 * counters  = integer steps, double lrs..., integer last_epoch, double best, integer num_bad_epochs,
 *             integer cooldown_counter, integer children_last_epochs..., double momenta... (none when absent)
 * </pre>
 *
 * A double is the value its JSON number or {@code float.hex} text denotes, exactly. A change to this order is a
 * change to the native reader's in the same commit (the library and the jar are built together).
 */
final class ProgramArrays {

    private long[] integers = new long[1024];
    private int integerCount;
    private double[] doubles = new double[64];
    private int doubleCount;
    private final List<String> strings = new ArrayList<>();

    private ProgramArrays() {
    }

    /** The arrays of a program whose parts passed {@link ProgramCheck}: {@code graphs} by name, in file order. */
    static ProgramArrays of(List<String> parameters, List<String> inputs, Map<String, JsonObject> graphs,
            JsonObject training, JsonObject counters) {
        ProgramArrays out = new ProgramArrays();
        out.texts(parameters);
        out.texts(inputs);
        out.integer(StrictJson.ELEMENTS);
        out.texts(StrictJson.SIZED_ARGUMENTS);
        out.integer(graphs.size());
        for (Map.Entry<String, JsonObject> graph : graphs.entrySet()) {
            out.text(graph.getKey());
            out.graph(graph.getValue());
        }
        out.training(training);
        out.counters(counters);
        return out;
    }

    long[] integers() {
        return Arrays.copyOf(integers, integerCount);
    }

    double[] doubles() {
        return Arrays.copyOf(doubles, doubleCount);
    }

    String[] strings() {
        return strings.toArray(new String[0]);
    }

    // ---- op lists ----

    private void graph(JsonObject graph) {
        integer(graph.get("oplist_version").getAsLong());
        JsonArray inputs = graph.getAsJsonArray("inputs");
        integer(inputs.size());
        for (JsonElement input : inputs) {
            text(input.getAsString());
        }
        JsonArray nodes = graph.getAsJsonArray("nodes");
        integer(nodes.size());
        for (JsonElement value : nodes) {
            JsonObject node = value.getAsJsonObject();
            text(node.get("op").getAsString());
            text(node.get("overload").getAsString());
            JsonArray args = node.getAsJsonArray("args");
            integer(args.size());
            for (JsonElement arg : args) {
                argument(arg);
            }
            integer(node.get("outputs").getAsLong());
        }
        JsonArray outputs = graph.getAsJsonArray("outputs");
        integer(outputs.size());
        for (JsonElement out : outputs) {
            integer(out.getAsJsonObject().get("ref").getAsLong());
            text(out.getAsJsonObject().get("to").getAsString());
        }
    }

    private void argument(JsonElement arg) {
        if (arg.isJsonNull()) {
            integer(0);
            return;
        }
        Map.Entry<String, JsonElement> only = arg.getAsJsonObject().entrySet().iterator().next();
        String kind = only.getKey();
        JsonElement value = only.getValue();
        integer(ProgramCheck.KINDS.indexOf(kind) + 1);
        switch (kind) {
            case "t":
            case "i":
                integer(value.getAsLong());
                return;
            case "tl":
            case "otl":
            case "il":
                integer(value.getAsJsonArray().size());
                for (JsonElement item : value.getAsJsonArray()) {
                    integer(item.isJsonNull() ? -1 : item.getAsLong()); // null: otl's only
                }
                return;
            case "f":
                number(hex(value));
                return;
            case "b":
                flag(value);
                return;
            case "sl":
                integer(value.getAsJsonArray().size());
                for (JsonElement item : value.getAsJsonArray()) {
                    if (item.isJsonObject()) {
                        pair(item.getAsJsonObject().getAsJsonArray("bx"));
                    } else {
                        integer(0);
                        integer(item.getAsLong());
                    }
                }
                return;
            case "bx":
                pair(value.getAsJsonArray());
                return;
            case "fl":
                integer(value.getAsJsonArray().size());
                for (JsonElement item : value.getAsJsonArray()) {
                    number(hex(item));
                }
                return;
            case "bl":
                integer(value.getAsJsonArray().size());
                for (JsonElement item : value.getAsJsonArray()) {
                    flag(item);
                }
                return;
            default: // s, dtype, layout, device, mf
                text(value.getAsString());
        }
    }

    private void pair(JsonArray bx) {
        integer(bx.get(0).getAsLong());
        integer(bx.get(1).getAsLong());
    }

    // ---- training and counters ----

    private void training(JsonObject training) {
        String optimizer = training.get("optimizer").getAsString();
        text(optimizer);
        JsonArray groups = training.getAsJsonArray("groups");
        integer(groups.size());
        for (JsonElement value : groups) {
            JsonObject group = value.getAsJsonObject();
            JsonArray params = group.getAsJsonArray("params");
            integer(params.size());
            for (JsonElement name : params) {
                text(name.getAsString());
            }
            boolean betas = ProgramCheck.takes(optimizer, "betas");
            number(betas ? group.getAsJsonArray("betas").get(0).getAsDouble() : 0);
            number(betas ? group.getAsJsonArray("betas").get(1).getAsDouble() : 0);
            for (String field : new String[] {"momentum", "weight_decay", "lr_decay"}) {
                number(ProgramCheck.takes(optimizer, field) ? group.get(field).getAsDouble() : 0);
            }
        }
        integer(training.get("accumulate").getAsLong());
        text(training.get("scheduler_interval").getAsString());
        JsonElement spec = training.get("scheduler");
        boolean held = spec != null && spec.isJsonObject();
        integer(held ? 1 : 0);
        if (held) {
            schedule(spec.getAsJsonObject());
        }
    }

    private void schedule(JsonObject spec) {
        String name = spec.get("name").getAsString();
        text(name);
        hexes(spec, "base_lrs");
        switch (name) {
            case "step":
                integers(spec, "step_size");
                numbers(spec, "gamma");
                break;
            case "multistep":
                integerList(spec, "milestones");
                numbers(spec, "gamma");
                break;
            case "exponential":
                numbers(spec, "gamma");
                break;
            case "cosine":
                integers(spec, "T_max");
                numbers(spec, "eta_min");
                break;
            case "linear":
                numbers(spec, "start_factor", "end_factor");
                integers(spec, "total_iters");
                break;
            case "sequential":
                integerList(spec, "milestones");
                integer(spec.getAsJsonArray("schedulers").size());
                for (JsonElement child : spec.getAsJsonArray("schedulers")) {
                    schedule(child.getAsJsonObject());
                }
                break;
            case "plateau":
                flag(spec.get("minimize"));
                flag(spec.get("relative"));
                numbers(spec, "factor");
                integers(spec, "patience");
                numbers(spec, "threshold");
                integers(spec, "cooldown");
                hexes(spec, "min_lrs");
                numbers(spec, "eps");
                break;
            default: // onecycle (Schedules refused any other name)
                integers(spec, "total_steps");
                hexes(spec, "initial", "max_lrs", "min_lrs", "end_steps", "max_momenta", "base_momenta");
                integerList(spec, "start_keys", "end_keys", "start_momentum_keys", "end_momentum_keys");
                flag(spec.get("cos"));
                flag(spec.get("cycle_momentum"));
        }
    }

    private void counters(JsonObject counters) {
        integers(counters, "steps");
        hexes(counters, "lrs");
        integers(counters, "last_epoch");
        number(hex(counters.get("best")));
        integers(counters, "num_bad_epochs", "cooldown_counter");
        integerList(counters, "children_last_epochs");
        JsonArray momenta = counters.has("momenta") ? counters.getAsJsonArray("momenta") : new JsonArray();
        integer(momenta.size());
        for (JsonElement value : momenta) {
            number(hex(value));
        }
    }

    // ---- values ----

    private void integers(JsonObject object, String... keys) {
        for (String key : keys) {
            integer(object.get(key).getAsLong());
        }
    }

    private void integerList(JsonObject object, String... keys) {
        for (String key : keys) {
            JsonArray items = object.getAsJsonArray(key);
            integer(items.size());
            for (JsonElement item : items) {
                integer(item.getAsLong());
            }
        }
    }

    /** JSON numbers, as Double.parseDouble reads their text (exactly, as strtod does). */
    private void numbers(JsonObject object, String... keys) {
        for (String key : keys) {
            number(object.get(key).getAsDouble());
        }
    }

    /** Lists of doubles as {@code float.hex} text. */
    private void hexes(JsonObject object, String... keys) {
        for (String key : keys) {
            JsonArray items = object.getAsJsonArray(key);
            integer(items.size());
            for (JsonElement item : items) {
                number(hex(item));
            }
        }
    }

    private static double hex(JsonElement value) {
        return StrictJson.hexDouble(value, "program", "a double");
    }

    private void flag(JsonElement value) {
        integer(value.getAsBoolean() ? 1 : 0);
    }

    private void integer(long value) {
        if (integerCount == integers.length) {
            integers = Arrays.copyOf(integers, integers.length * 2);
        }
        integers[integerCount++] = value;
    }

    private void number(double value) {
        if (doubleCount == doubles.length) {
            doubles = Arrays.copyOf(doubles, doubles.length * 2);
        }
        doubles[doubleCount++] = value;
    }

    private void text(String value) {
        strings.add(value);
    }

    private void texts(List<String> values) {
        integer(values.size());
        values.forEach(this::text);
    }
}
