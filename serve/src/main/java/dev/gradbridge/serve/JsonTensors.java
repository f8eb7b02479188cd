package dev.gradbridge.serve;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonPrimitive;
import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.online.HostTensor;
import java.math.BigDecimal;
import java.nio.ByteBuffer;
import dev.gradbridge.Metadata;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/** JSON nested arrays <-> {@link HostTensor}, with one-line errors that name the field. */
final class JsonTensors {

    private JsonTensors() {}

    /**
     * A rectangular nested array of numbers as a tensor of {@code dtype}; for a 16-bit float, of its
     * carrier float32 ({@link DType#carrier}: the learner casts the values, which must be exactly its own).
     */
    static HostTensor parse(String field, JsonElement json, String spec) {
        HostTensor.elementSize(spec); // refuses what a HostTensor cannot hold
        String dtype = DType.of(spec).carrier().torchName();
        if (json == null || json.isJsonNull()) {
            throw new InvalidInputException("field '" + field + "' is missing");
        }
        List<Long> shape = new ArrayList<>();
        for (JsonElement probe = json; probe.isJsonArray(); ) {
            JsonArray array = probe.getAsJsonArray();
            shape.add((long) array.size());
            if (array.size() == 0) {
                break;
            }
            probe = array.get(0);
        }
        List<JsonPrimitive> values = new ArrayList<>();
        flatten(field, json, shape, 0, values);
        int width = HostTensor.elementSize(dtype);
        DType type = DType.of(dtype);
        ByteBuffer bytes = ByteBuffer.allocate(values.size() * width).order(DType.FILE_ORDER);
        for (JsonPrimitive value : values) {
            if (type.isFloating()) {
                type.put(bytes, value.getAsDouble()); // beyond the dtype's range: infinite, refused later
            } else {
                bytes.putLong(integer(field, value));
            }
        }
        long[] dims = new long[shape.size()];
        for (int i = 0; i < dims.length; i++) {
            dims[i] = shape.get(i);
        }
        return HostTensor.of(dtype, dims, bytes.array());
    }

    /**
     * The inputs of a request: for a module of one input the nested array {@code "x": [[...]]} (as
     * always), for a module of several an object of them by name, {@code "x": {"input_ids": [[...]],
     * "attention_mask": [[...]]}}, each parsed with its own dtype. Names are checked by the learner.
     */
    static Map<String, HostTensor> parseInputs(JsonElement json, Metadata metadata) {
        if (!metadata.hasNamedInputs()) {
            if (json != null && json.isJsonObject()) {
                throw new InvalidInputException("field 'x' must be a nested array of numbers (the model takes one input),"
                        + " got an object");
            }
            return Collections.singletonMap("x", parse("x", json, metadata.getInput("x").getDtype()));
        }
        List<String> names = metadata.getInputNames();
        if (json == null || json.isJsonNull()) {
            throw new InvalidInputException("field 'x' is missing");
        }
        if (!json.isJsonObject()) {
            throw new InvalidInputException("field 'x' must be an object of the model's inputs by name " + names + ", e.g. {\""
                    + names.get(0) + "\": [[...]], ...}, got " + abbreviate(json));
        }
        Map<String, HostTensor> inputs = new LinkedHashMap<>();
        for (Map.Entry<String, JsonElement> input : json.getAsJsonObject().entrySet()) {
            String name = input.getKey();
            if (!names.contains(name)) {
                throw new InvalidInputException("field 'x." + abbreviate(name) + "': the model takes no such input (it takes "
                        + names + ")");
            }
            inputs.put(name, parse("x." + name, input.getValue(), metadata.getInput(name).getDtype()));
        }
        for (String name : names) {
            if (!inputs.containsKey(name)) {
                throw new InvalidInputException("field 'x." + name + "' is missing (the model takes " + names + ")");
            }
        }
        return inputs;
    }

    /** @return the rows of the first input (a request's events) */
    static long rows(Map<String, HostTensor> inputs) {
        return inputs.values().iterator().next().rows();
    }

    /** A version number: an integer >= 0, e.g. /admin/rollback's {@code version}. */
    static long versionNumber(JsonElement json) {
        String problem = "field 'version' must be a version number (an integer >= 0), got " + abbreviate(json);
        if (!json.isJsonPrimitive() || !json.getAsJsonPrimitive().isNumber()) {
            throw new InvalidInputException(problem);
        }
        long version;
        try {
            version = integer("version", json.getAsJsonPrimitive());
        } catch (InvalidInputException e) {
            throw new InvalidInputException(problem);
        }
        if (version < 0) {
            throw new InvalidInputException(problem);
        }
        return version;
    }

    /** The number as written (exact), or a one-line refusal for text that is no number. */
    private static BigDecimal number(String field, JsonPrimitive value) {
        try {
            return new BigDecimal(value.getAsString());
        } catch (NumberFormatException e) { // NaN or Infinity, which lenient JSON lets through
            throw new InvalidInputException("field '" + field + "' must hold finite numbers, got " + abbreviate(value));
        }
    }

    /**
     * An int64 from its text, not through a double (beyond 2^53 it stays exact), without ever
     * expanding a huge exponent (1e1000000000 is refused, not computed).
     */
    private static long integer(String field, JsonPrimitive value) {
        BigDecimal number = number(field, value);
        BigDecimal whole = number.signum() == 0 ? BigDecimal.ZERO : number.stripTrailingZeros();
        if (whole.scale() > 0) {
            throw new InvalidInputException("field '" + field + "' must hold integers (int64), got " + abbreviate(value));
        }
        if (whole.precision() - whole.scale() > 19) {
            throw new InvalidInputException("field '" + field + "' must hold int64 integers (at most 2^63-1 in size), got "
                    + abbreviate(value));
        }
        try {
            return whole.longValueExact();
        } catch (ArithmeticException e) {
            throw new InvalidInputException("field '" + field + "' must hold int64 integers (at most 2^63-1 in size), got "
                    + abbreviate(value));
        }
    }

    private static void flatten(String field, JsonElement json, List<Long> shape, int depth, List<JsonPrimitive> out) {
        if (depth == shape.size()) {
            if (!json.isJsonPrimitive() || !json.getAsJsonPrimitive().isNumber()) {
                throw new InvalidInputException("field '" + field + "' must be a nested array of numbers, found " + abbreviate(json));
            }
            out.add(json.getAsJsonPrimitive());
            return;
        }
        if (!json.isJsonArray() || json.getAsJsonArray().size() != shape.get(depth)) {
            throw new InvalidInputException(
                    "field '" + field + "' is not rectangular: expected " + shape.get(depth) + " items at depth "
                            + depth + ", found " + abbreviate(json));
        }
        for (JsonElement item : json.getAsJsonArray()) {
            flatten(field, item, shape, depth + 1, out);
        }
    }

    /** At most 60 characters of a JSON value, for error lines (a request may be megabytes). */
    static String abbreviate(Object json) {
        String text = String.valueOf(json).replace('\n', ' ');
        return text.length() > 60 ? text.substring(0, 60) + "..." : text;
    }

    /**
     * A tensor as nested JSON arrays (float32 written with Float.toString, which round-trips
     * exactly); a value that is not finite is written as null, so the answer stays valid JSON.
     */
    static JsonElement write(HostTensor tensor) {
        long[] shape = tensor.getShape();
        List<JsonPrimitive> flat = new ArrayList<>();
        switch (DType.of(tensor.getDtype())) {
            case FLOAT32:
            case BFLOAT16: // widened exactly, as float32
            case FLOAT16:
                for (float v : tensor.toFloatArray()) {
                    flat.add(Float.isFinite(v) ? new JsonPrimitive(v) : null);
                }
                break;
            case FLOAT64:
                for (double v : tensor.toDoubleArray()) {
                    flat.add(Double.isFinite(v) ? new JsonPrimitive(v) : null);
                }
                break;
            default:
                for (long v : tensor.toLongArray()) {
                    flat.add(new JsonPrimitive(v));
                }
        }
        int[] next = {0};
        return nest(shape, 0, flat, next);
    }

    private static JsonElement nest(long[] shape, int depth, List<JsonPrimitive> flat, int[] next) {
        if (depth == shape.length) {
            JsonPrimitive value = flat.get(next[0]++);
            return value == null ? JsonNull.INSTANCE : value;
        }
        JsonArray array = new JsonArray();
        for (long i = 0; i < shape[depth]; i++) {
            array.add(nest(shape, depth + 1, flat, next));
        }
        return array;
    }
}
