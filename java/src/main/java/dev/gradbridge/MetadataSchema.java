package dev.gradbridge;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonPrimitive;
import dev.gradbridge.internal.InputMessages;
import dev.gradbridge.internal.Messages;
import java.math.BigDecimal;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.HashSet;
import java.util.List;

/**
 * The shape of gradbridge.json, checked before Gson maps it onto {@link Metadata}: a missing
 * key, a null or a value of the wrong type gives one line naming the key, never a
 * NullPointerException later. {@code protocol.check_schema} in Python makes the same checks in
 * the same order with the same words.
 */
final class MetadataSchema {

    static final String MISSING = "nothing (the key is missing)";
    /**
     * The dtypes of parameters and of inputs: float32, float64, int64 and the 16-bit floats (Python:
     * {@code protocol.PARAMETER_DTYPES}, {@code protocol.INPUT_DTYPES}).
     */
    private static final List<String> PARAMETER_DTYPES =
            Arrays.asList("float32", "float64", "int64", "bfloat16", "float16");
    /** The dtypes of buffers: every {@link DType} (Python: {@code protocol.BUFFER_DTYPES}). */
    private static final List<String> BUFFER_DTYPES = bufferDtypes();

    private final String path;

    private MetadataSchema(Path path) {
        this.path = path.toString();
    }

    static void check(Path path, JsonElement root) {
        new MetadataSchema(path).document(root);
    }

    private void document(JsonElement root) {
        if (!root.isJsonObject()) {
            throw new ProtocolException(Messages.metadataDocument(path, text(root)));
        }
        JsonObject doc = root.getAsJsonObject();
        String format = string(doc, "format", "format");
        if (!Protocol.METADATA_FORMAT.equals(format)) {
            throw new ProtocolException(
                    path + ": " + Protocol.METADATA_FILE + " has format '" + format + "', expected '"
                            + Protocol.METADATA_FORMAT + "'");
        }
        integer(doc, "protocol_version", "protocol_version");
        JsonArray methods = array(doc, "methods", "methods", "a list of strings");
        for (int i = 0; i < methods.size(); i++) {
            if (!isString(methods.get(i))) {
                throw fail("methods[" + i + "]", "a string", text(methods.get(i)));
            }
        }
        specs(doc, "parameters", PARAMETER_DTYPES);
        specs(doc, "buffers", BUFFER_DTYPES);
        named(doc, "loss");
        named(doc, "optimizer");
        List<String> names = new ArrayList<>();
        JsonArray inputs = specs(doc, "inputs", PARAMETER_DTYPES);
        for (JsonElement spec : inputs) {
            names.add(spec.getAsJsonObject().get("name").getAsString());
        }
        if (names.size() < 2 || !names.get(names.size() - 1).equals("y") || new HashSet<>(names).size() != names.size()) {
            throw fail("inputs", InputMessages.INPUT_SPECS, text(toJson(names)));
        }
    }

    private JsonArray specs(JsonObject doc, String key, List<String> dtypes) {
        JsonArray specs = array(doc, key, key, "a list of tensor specs");
        for (int i = 0; i < specs.size(); i++) {
            String where = key + "[" + i + "]";
            JsonElement spec = specs.get(i);
            if (!spec.isJsonObject()) {
                throw fail(where, "an object with name, shape and dtype", text(spec));
            }
            JsonObject object = spec.getAsJsonObject();
            string(object, "name", where + ".name");
            JsonArray shape = array(object, "shape", where + ".shape", "a list of integers");
            for (JsonElement dim : shape) {
                if (!isInteger(dim)) {
                    throw fail(where + ".shape", "a list of integers", text(shape));
                }
            }
            String dtype = string(object, "dtype", where + ".dtype");
            if (!dtypes.contains(dtype)) {
                throw fail(where + ".dtype", "one of " + String.join(", ", dtypes), text(object.get("dtype")));
            }
            for (String flag : new String[] {"persistent", "trained"}) {
                JsonElement value = object.get(flag);
                if (value != null && !(value.isJsonPrimitive() && value.getAsJsonPrimitive().isBoolean())) {
                    throw fail(where + "." + flag, "true or false", text(value));
                }
            }
        }
        return specs;
    }

    private void named(JsonObject doc, String key) {
        JsonElement value = doc.get(key);
        if (value == null || !value.isJsonObject()) {
            throw fail(key, "an object with a name", value == null ? MISSING : text(value));
        }
        string(value.getAsJsonObject(), "name", key + ".name");
    }

    private String string(JsonObject object, String key, String where) {
        JsonElement value = object.get(key);
        if (!isString(value)) {
            throw fail(where, "a string", value == null ? MISSING : text(value));
        }
        return value.getAsString();
    }

    private void integer(JsonObject object, String key, String where) {
        JsonElement value = object.get(key);
        if (!isInteger(value)) {
            throw fail(where, "an integer", value == null ? MISSING : text(value));
        }
    }

    private JsonArray array(JsonObject object, String key, String where, String expected) {
        JsonElement value = object.get(key);
        if (value == null || !value.isJsonArray()) {
            throw fail(where, expected, value == null ? MISSING : text(value));
        }
        return value.getAsJsonArray();
    }

    private static List<String> bufferDtypes() {
        List<String> names = new ArrayList<>();
        for (DType type : DType.values()) {
            names.add(type.torchName());
        }
        return Collections.unmodifiableList(names);
    }

    private static boolean isString(JsonElement value) {
        return value != null && value.isJsonPrimitive() && value.getAsJsonPrimitive().isString();
    }

    private static boolean isInteger(JsonElement value) {
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isNumber()) {
            return false;
        }
        try {
            new BigDecimal(value.getAsString()).longValueExact();
            return !value.getAsString().contains(".") && !value.getAsString().toLowerCase().contains("e");
        } catch (ArithmeticException | NumberFormatException e) {
            return false;
        }
    }

    private static JsonElement toJson(List<String> names) {
        JsonArray array = new JsonArray();
        for (String name : names) {
            array.add(new JsonPrimitive(name));
        }
        return array;
    }

    private static String text(JsonElement value) {
        return Messages.jsonText(value.toString());
    }

    private ProtocolException fail(String key, String expected, String actual) {
        return new ProtocolException(Messages.metadataKey(path, key, expected, actual));
    }
}
