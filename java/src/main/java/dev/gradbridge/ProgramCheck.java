package dev.gradbridge;

import static dev.gradbridge.StrictJson.array;
import static dev.gradbridge.StrictJson.finiteHex;
import static dev.gradbridge.StrictJson.flag;
import static dev.gradbridge.StrictJson.hexDouble;
import static dev.gradbridge.StrictJson.integer;
import static dev.gradbridge.StrictJson.isInt;
import static dev.gradbridge.StrictJson.member;
import static dev.gradbridge.StrictJson.number;
import static dev.gradbridge.StrictJson.shown;
import static dev.gradbridge.StrictJson.text;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import dev.gradbridge.StrictJson.Refusal;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A protocol-3 file read as data, before the native layer sees any of it: every op list (version, keys,
 * bindings, each operator on the allow-list, each argument of a known kind and type, each slot computed
 * before it is read, the limits) and every optimizer, schedule and counter field (the type and range torch
 * accepts: no schedule divides by zero or overflows). The Python twin is {@code _runtime/oplist_check.py}
 * and {@code program_check.py}, check for check; tests/vectors/protocol3/ pins the two together.
 */
final class ProgramCheck {

    private static final double INF = Double.POSITIVE_INFINITY;
    private static final List<String> GRAPH_KEYS = Arrays.asList("oplist_version", "inputs", "nodes", "outputs");
    private static final List<String> NODE_KEYS = Arrays.asList("op", "overload", "args", "outputs");
    /** The argument kinds, in the order {@link ProgramArrays} numbers them (from 1; 0 is null). */
    static final List<String> KINDS = Arrays.asList("t", "tl", "otl", "i", "f", "b", "il", "sl", "bx", "fl",
            "bl", "s", "dtype", "layout", "device", "mf");
    private static final List<String> PREFIXES = Arrays.asList("param:", "buffer:", "grad:", "const:", "state:",
            "input:", "scalar:");
    private static final List<String> BINDINGS = Arrays.asList("target", "output", "loss");
    private static final List<String> DTYPES = Arrays.asList("uint8", "int8", "int16", "int32", "int64", "float16",
            "float32", "float64", "bool", "bfloat16");
    private static final int[] ITEMSIZE = {1, 1, 2, 4, 8, 2, 4, 8, 1, 2};
    private static final List<String> FORMATS = Arrays.asList("contiguous_format", "preserve_format", "channels_last",
            "channels_last_3d");
    private static final List<String> INTERVALS = Arrays.asList("step", "epoch", "none");
    private static final List<String> RESTARTABLE = Arrays.asList("step", "multistep", "exponential", "cosine", "linear");
    private static final Map<String, String[]> OPTIMIZERS = new LinkedHashMap<>();

    static {
        // per optimizer its groups' fields, each "name:kind" (number: >= 0 but dampening)
        OPTIMIZERS.put("sgd", new String[] {"lr:number", "momentum:number", "dampening:signed", "weight_decay:number",
            "nesterov:bool", "maximize:bool"});
        OPTIMIZERS.put("adam", new String[] {"lr:number", "betas:betas", "eps:number", "weight_decay:number",
            "amsgrad:bool", "maximize:bool"});
        OPTIMIZERS.put("rmsprop", new String[] {"lr:number", "alpha:number", "eps:number", "weight_decay:number",
            "momentum:number", "centered:bool", "maximize:bool"});
        OPTIMIZERS.put("adagrad", new String[] {"lr:number", "lr_decay:number", "weight_decay:number",
            "initial_accumulator_value:number", "eps:number", "maximize:bool"});
        OPTIMIZERS.put("adamw", OPTIMIZERS.get("adam"));
    }

    private ProgramCheck() {
    }

    /** Whether {@code optimizer}'s groups take {@code field} (a field of its list above). */
    static boolean takes(String optimizer, String field) {
        for (String declared : OPTIMIZERS.get(optimizer)) {
            if (declared.startsWith(field + ":")) {
                return true;
            }
        }
        return false;
    }

    // ---- op lists (python: oplist_check.check_graph) ----

    static void graph(JsonElement value, String where) {
        JsonElement version = value.isJsonObject() ? value.getAsJsonObject().get("oplist_version") : null;
        if (!isInt(version) || version.getAsLong() != StrictJson.VERSION) {
            throw new Refusal(where, "op-list version " + shown(String.valueOf(version))
                    + ", this gradbridge runs version " + StrictJson.VERSION);
        }
        JsonObject graph = value.getAsJsonObject();
        for (String key : graph.keySet()) {
            if (!GRAPH_KEYS.contains(key)) {
                throw new Refusal(where, "unknown key " + shown(key));
            }
        }
        JsonArray inputs = array(member(graph, "inputs", where), where, "inputs");
        for (int k = 0; k < inputs.size(); k++) {
            binding(inputs.get(k), where, "inputs[" + k + "]");
        }
        JsonArray nodes = array(member(graph, "nodes", where), where, "nodes");
        if (nodes.size() > StrictJson.NODES) {
            throw new Refusal(where, nodes.size() + " nodes, more than the limit of " + StrictJson.NODES);
        }
        long slots = inputs.size();
        for (int k = 0; k < nodes.size(); k++) {
            slots += node(nodes.get(k), slots, where + " node " + k);
        }
        JsonArray outputs = array(member(graph, "outputs", where), where, "outputs");
        for (int k = 0; k < outputs.size(); k++) {
            String at = where + " outputs[" + k + "]";
            JsonElement out = outputs.get(k);
            if (!out.isJsonObject() || out.getAsJsonObject().size() != 2 || !out.getAsJsonObject().has("ref")
                    || !out.getAsJsonObject().has("to")) {
                throw new Refusal(at, shown(out) + " is not an object of 'ref' and 'to'");
            }
            integer(out.getAsJsonObject().get("ref"), at, "ref", 0, slots - 1);
            binding(out.getAsJsonObject().get("to"), at, "to");
        }
    }

    private static void binding(JsonElement value, String where, String field) {
        String name = text(value, where, field);
        if (!BINDINGS.contains(name) && PREFIXES.stream().noneMatch(name::startsWith)) {
            throw new Refusal(where, field + " is " + shown(name) + ", not a binding (param:, buffer:, grad:, const:,"
                    + " state:, input:, scalar:, target, output or loss)");
        }
    }

    private static long node(JsonElement value, long slots, String where) {
        if (!value.isJsonObject()) {
            throw new Refusal(where, shown(value) + " is not an object");
        }
        JsonObject node = value.getAsJsonObject();
        for (String key : NODE_KEYS) {
            member(node, key, where);
        }
        for (String key : node.keySet()) {
            if (!NODE_KEYS.contains(key)) {
                throw new Refusal(where, "unknown key " + shown(key));
            }
        }
        String op = text(node.get("op"), where, "op");
        String overload = text(node.get("overload"), where, "overload");
        JsonArray args = array(node.get("args"), where, "args");
        String name = op + "." + overload;
        if (op.equals("#item")) {
            if (!overload.isEmpty() || args.size() != 2 || !isInt(node.get("outputs")) || node.get("outputs").getAsLong() != 1
                    || !single(args.get(0), "t") || !single(args.get(1), "i")) {
                throw new Refusal(where, "#item takes a list slot and an index ({\"t\": n}, {\"i\": k}) and has one output");
            }
        } else if (!StrictJson.OPERATORS.contains(name)) {
            throw new Refusal(where, "operator " + shown(name) + " is not on protocol 3's operator allow-list");
        }
        long outputs = integer(node.get("outputs"), where, "outputs", 0, 64);
        for (int k = 0; k < args.size(); k++) {
            argument(args.get(k), slots, where + " (" + shown(name) + ") args[" + k + "]");
        }
        return Math.max(outputs, 1);
    }

    private static boolean single(JsonElement value, String kind) {
        return value.isJsonObject() && value.getAsJsonObject().size() == 1 && value.getAsJsonObject().has(kind);
    }

    private static void argument(JsonElement arg, long slots, String where) {
        if (arg.isJsonNull()) {
            return;
        }
        if (!arg.isJsonObject() || arg.getAsJsonObject().size() != 1) {
            throw new Refusal(where, shown(arg) + " is not null or an object of one kind");
        }
        Map.Entry<String, JsonElement> only = arg.getAsJsonObject().entrySet().iterator().next();
        String kind = only.getKey();
        JsonElement value = only.getValue();
        if (!KINDS.contains(kind)) {
            throw new Refusal(where, "unknown argument kind '" + shown(kind) + "'");
        }
        switch (kind) {
            case "t":
                integer(value, where, kind, 0, slots - 1);
                return;
            case "tl":
            case "otl":
            case "il":
            case "fl":
            case "bl":
            case "sl":
                JsonArray items = array(value, where, kind);
                for (int k = 0; k < items.size(); k++) {
                    listItem(kind, items.get(k), slots, where, kind + "[" + k + "]");
                }
                return;
            default:
                scalar(kind, value, where);
        }
    }

    private static void listItem(String kind, JsonElement item, long slots, String where, String field) {
        switch (kind) {
            case "il":
                integer(item, where, field);
                break;
            case "otl":
                if (!item.isJsonNull()) {
                    integer(item, where, field, 0, slots - 1);
                }
                break;
            case "tl":
                integer(item, where, field, 0, slots - 1);
                break;
            case "fl":
                hexDouble(item, where, field);
                break;
            case "bl":
                flag(item, where, field);
                break;
            default: // sl
                if (isInt(item)) {
                    break;
                }
                if (single(item, "bx")) {
                    scalar("bx", item.getAsJsonObject().get("bx"), where);
                    break;
                }
                throw new Refusal(where, field + " is " + shown(item) + ", expected an integer or {\"bx\": [a, c]}");
        }
    }

    private static void scalar(String kind, JsonElement value, String where) {
        switch (kind) {
            case "i":
                integer(value, where, kind);
                return;
            case "b":
                flag(value, where, kind);
                return;
            case "f":
                hexDouble(value, where, kind);
                return;
            case "s":
                text(value, where, kind);
                return;
            case "bx":
                if (!value.isJsonArray() || value.getAsJsonArray().size() != 2) {
                    throw new Refusal(where, "bx is " + shown(value) + ", expected [a, c]");
                }
                integer(value.getAsJsonArray().get(0), where, "bx[0]");
                integer(value.getAsJsonArray().get(1), where, "bx[1]");
                return;
            default:
                List<String> known = kind.equals("dtype") ? DTYPES : kind.equals("mf") ? FORMATS
                        : Arrays.asList(kind.equals("layout") ? "strided" : "cpu");
                if (!value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString() || !known.contains(value.getAsString())) {
                    throw new Refusal(where, kind + " is " + shown(value) + ", expected one of " + String.join(", ", known));
                }
        }
    }

    private static final Map<String, String> GRAPH_OUTPUTS = new LinkedHashMap<>();
    private static final List<String> ONE_SAMPLE = Arrays.asList("train", "train_accumulate", "forward", "loss");
    private static final List<String> REQUIRED_GRAPHS = Arrays.asList("train", "forward", "loss", "optimizer");

    static {
        GRAPH_OUTPUTS.put("train", "loss");
        GRAPH_OUTPUTS.put("train_accumulate", "loss");
        GRAPH_OUTPUTS.put("forward", "output");
        GRAPH_OUTPUTS.put("loss", "loss");
        GRAPH_OUTPUTS.put("clip", null);
        GRAPH_OUTPUTS.put("optimizer", null);
        GRAPH_OUTPUTS.put("optimizer_first", null);
    }

    /** A graph's name is one a program holds, and its outputs hold the binding its method reads (python: check_role). */
    static void role(String name, JsonObject graph, String where) {
        String base = name.endsWith("@1") ? name.substring(0, name.length() - 2) : name;
        if (!GRAPH_OUTPUTS.containsKey(base) || (!base.equals(name) && !ONE_SAMPLE.contains(base))) {
            throw new Refusal(where, "unknown graph (a program holds " + String.join(", ", GRAPH_OUTPUTS.keySet()) + ")");
        }
        String wanted = GRAPH_OUTPUTS.get(base);
        if (wanted == null) {
            return;
        }
        for (JsonElement out : graph.getAsJsonArray("outputs")) {
            if (out.getAsJsonObject().get("to").getAsString().equals(wanted)) {
                return;
            }
        }
        throw new Refusal(where, "outputs no " + wanted);
    }

    static void required(JsonObject graphs, String where) {
        for (String name : REQUIRED_GRAPHS) {
            if (!graphs.has(name)) {
                throw new Refusal(where, "lacks graph " + name);
            }
        }
    }

    // ---- training and counters (python: program_check.check_training) ----

    static void training(JsonObject training, JsonObject counters, String where) {
        String at = where + ".training";
        String optimizer = text(member(training, "optimizer", at), at, "optimizer");
        if (!OPTIMIZERS.containsKey(optimizer)) {
            throw new Refusal(at, "optimizer is " + shown(optimizer) + ", expected one of " + String.join(", ", OPTIMIZERS.keySet()));
        }
        JsonArray groups = array(member(training, "groups", at), at, "groups");
        if (groups.size() == 0) {
            throw new Refusal(at, "groups is empty");
        }
        for (int g = 0; g < groups.size(); g++) {
            group(optimizer, groups.get(g), at + ".groups[" + g + "]");
        }
        integer(member(training, "accumulate", at), at, "accumulate", 1, StrictJson.ACCUMULATE);
        String interval = text(member(training, "scheduler_interval", at), at, "scheduler_interval");
        if (!INTERVALS.contains(interval)) {
            throw new Refusal(at, "scheduler_interval is " + shown(interval) + ", expected one of " + String.join(", ", INTERVALS));
        }
        JsonElement spec = training.get("scheduler");
        int children = 0;
        if (spec != null && !spec.isJsonNull()) {
            Schedules.schedule(spec, groups.size(), at + ".scheduler");
            JsonObject object = spec.getAsJsonObject();
            children = object.get("name").getAsString().equals("sequential") ? object.getAsJsonArray("schedulers").size() : 0;
        }
        Schedules.counters(counters, groups.size(), spec, children, where + ".counters");
    }

    private static void group(String optimizer, JsonElement value, String where) {
        if (!value.isJsonObject()) {
            throw new Refusal(where, shown(value) + " is not an object");
        }
        JsonObject group = value.getAsJsonObject();
        JsonArray params = array(member(group, "params", where), where, "params");
        for (int k = 0; k < params.size(); k++) {
            text(params.get(k), where, "params[" + k + "]");
        }
        for (String field : OPTIMIZERS.get(optimizer)) {
            String name = field.substring(0, field.indexOf(':'));
            String kind = field.substring(field.indexOf(':') + 1);
            JsonElement x = member(group, name, where);
            if (kind.equals("bool")) {
                flag(x, where, name);
            } else if (kind.equals("betas")) {
                JsonArray betas = array(x, where, name);
                if (betas.size() != 2) {
                    throw new Refusal(where, "betas is " + shown(betas) + ", expected [beta1, beta2]");
                }
                for (int k = 0; k < 2; k++) {
                    number(betas.get(k), where, "betas[" + k + "]", 0.0, 1.0, true, false);
                }
            } else {
                number(x, where, name, kind.equals("signed") ? -INF : 0.0, INF, false, false);
            }
        }
    }

    // ---- state entries (python: program_check.state_entry) ----

    /** A state entry's byte count (at most {@code state_bytes}, computed without overflow). */
    static long stateEntry(JsonElement value, String where) {
        if (!value.isJsonObject()) {
            throw new Refusal(where, shown(value) + " is not an object");
        }
        JsonObject entry = value.getAsJsonObject();
        String name = text(member(entry, "name", where), where, "name");
        String at = where + " (" + shown(name) + ")";
        text(member(entry, "file", at), at, "file");
        String dtype = text(member(entry, "dtype", at), at, "dtype");
        JsonArray dims = array(member(entry, "shape", at), at, "shape");
        long[] shape = new long[dims.size()];
        for (int k = 0; k < shape.length; k++) {
            shape[k] = integer(dims.get(k), at, "shape[" + k + "]", 0, StrictJson.STATE_BYTES);
        }
        if (shape.length > 64) {
            throw new Refusal(at, "shape has " + shape.length + " dimensions, more than 64");
        }
        int index = DTYPES.indexOf(dtype);
        long size = index < 0 ? 1 : ITEMSIZE[index];
        for (long d : shape) {
            size *= d; // both at most state_bytes (2^31): no overflow
            if (size > StrictJson.STATE_BYTES) {
                throw new Refusal(at, "shape " + Arrays.toString(shape) + " holds more than the limit of "
                        + StrictJson.STATE_BYTES + " bytes");
            }
        }
        return size;
    }

    static double[] finiteHexes(JsonElement value, String where, String field, double low) {
        JsonArray items = array(value, where, field);
        double[] out = new double[items.size()];
        for (int k = 0; k < out.length; k++) {
            out[k] = finiteHex(items.get(k), where, field + "[" + k + "]", low);
        }
        return out;
    }
}
