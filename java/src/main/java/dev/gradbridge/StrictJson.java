package dev.gradbridge;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonNull;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import com.google.gson.Strictness;
import com.google.gson.internal.LazilyParsedNumber;
import com.google.gson.stream.JsonReader;
import com.google.gson.stream.JsonToken;
import java.io.IOException;
import java.io.InputStream;
import java.io.StringReader;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * Protocol 3's rules ({@code oplist_rules.json}, the one file Python's {@code _runtime/oplist_check.py} reads
 * too: op-list version, limits, operator allow-list) and strict JSON (RFC 8259: no NaN, no duplicate keys,
 * UTF-8 only, nesting and size bounded) read with Gson's strict reader. Failures are {@link Refusal}s, one
 * line saying where and what.
 */
final class StrictJson {

    /** One line naming what is wrong and where (python: oplist_check.fail's OpListError). */
    static final class Refusal extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Refusal(String where, String what) {
            super(where + ": " + what, null, false, false);
        }
    }

    private static final JsonObject RULES = rules();
    static final int VERSION = RULES.get("oplist_version").getAsInt();
    static final Set<String> OPERATORS;
    static final long DEPTH = limit("json_depth");
    static final long JSON_BYTES = limit("json_bytes");
    static final long STATE_BYTES = limit("state_bytes");
    static final long NODES = limit("nodes");
    static final long NAME_CHARS = limit("name_chars");
    static final int SHOWN_CHARS = (int) limit("shown_chars");
    static final long ELEMENTS = limit("elements");
    static final long COUNT = limit("count");
    static final long ACCUMULATE = limit("accumulate");
    /** The arguments the native layer checks as the op lists run (at most ELEMENTS elements each), by name. */
    static final List<String> SIZED_ARGUMENTS;
    private static final Pattern INTEGER = Pattern.compile("-?(0|[1-9][0-9]*)");
    private static final Pattern HEX = Pattern.compile("-?(0x[0-9a-f]+(\\.[0-9a-f]*)?p[+-]?[0-9]{1,6}|inf|nan)");

    static {
        Set<String> operators = new HashSet<>();
        for (JsonElement op : RULES.getAsJsonArray("operators")) {
            operators.add(op.getAsString());
        }
        OPERATORS = Collections.unmodifiableSet(operators);
        List<String> sized = new ArrayList<>();
        for (JsonElement name : RULES.getAsJsonArray("sized_arguments")) {
            sized.add(name.getAsString());
        }
        SIZED_ARGUMENTS = Collections.unmodifiableList(sized);
    }

    private StrictJson() {
    }

    private static JsonObject rules() {
        try (InputStream in = StrictJson.class.getResourceAsStream("oplist_rules.json")) {
            if (in == null) {
                throw new IllegalStateException("the jar lacks dev/gradbridge/oplist_rules.json");
            }
            return JsonParser.parseString(new String(in.readAllBytes(), StandardCharsets.UTF_8)).getAsJsonObject();
        } catch (IOException e) {
            throw new IllegalStateException("cannot read dev/gradbridge/oplist_rules.json: " + e, e);
        }
    }

    private static long limit(String name) {
        return RULES.getAsJsonObject("limits").get(name).getAsLong();
    }

    /** A value of the file as a line shows it: its JSON text cut at {@code shown_chars} (python: shown). */
    static String shown(JsonElement value) {
        String text = value != null && value.isJsonPrimitive() && value.getAsJsonPrimitive().isString()
                ? value.getAsString() : String.valueOf(value);
        return shown(text);
    }

    static String shown(String text) {
        int chars = text.codePointCount(0, text.length());
        if (chars <= SHOWN_CHARS) {
            return text;
        }
        return text.substring(0, text.offsetByCodePoints(0, SHOWN_CHARS)) + "... (" + chars + " characters)";
    }

    /** RFC 8259 JSON of at most {@code json_bytes} bytes nested at most {@code json_depth} deep (python: load_json). */
    static JsonElement read(byte[] data, String where) {
        if (data.length > JSON_BYTES) {
            throw new Refusal(where, data.length + " bytes of JSON, more than the limit of " + JSON_BYTES);
        }
        String text;
        try {
            text = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(data)).toString();
        } catch (CharacterCodingException e) {
            throw new Refusal(where, "invalid JSON (not UTF-8)");
        }
        if (deepest(text) > DEPTH) {
            throw new Refusal(where, "invalid JSON (nesting deeper than " + DEPTH + ")");
        }
        try (JsonReader reader = new JsonReader(new StringReader(text))) {
            reader.setStrictness(Strictness.STRICT);
            JsonElement value = value(reader, where);
            if (reader.peek() != JsonToken.END_DOCUMENT) {
                throw new Refusal(where, "invalid JSON (extra data after the value)");
            }
            return value;
        } catch (IOException | IllegalStateException | NumberFormatException e) {
            throw new Refusal(where, "invalid JSON (" + String.valueOf(e.getMessage()).split("\n", 2)[0] + ")");
        }
    }

    /** The deepest nesting of brackets outside strings, counted without recursion. */
    private static int deepest(String text) {
        int depth = 0;
        int deepest = 0;
        boolean inString = false;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (inString) {
                if (c == '\\') {
                    i++;
                } else if (c == '"') {
                    inString = false;
                }
            } else if (c == '"') {
                inString = true;
            } else if (c == '[' || c == '{') {
                deepest = Math.max(deepest, ++depth);
            } else if (c == ']' || c == '}') {
                depth--;
            }
        }
        return deepest;
    }

    private static JsonElement value(JsonReader reader, String where) throws IOException {
        switch (reader.peek()) {
            case BEGIN_ARRAY:
                JsonArray array = new JsonArray();
                reader.beginArray();
                while (reader.hasNext()) {
                    array.add(value(reader, where));
                }
                reader.endArray();
                return array;
            case BEGIN_OBJECT:
                Map<String, JsonElement> fields = new LinkedHashMap<>();
                reader.beginObject();
                while (reader.hasNext()) {
                    String key = reader.nextName();
                    if (fields.put(key, value(reader, where)) != null) {
                        throw new Refusal(where, "invalid JSON (duplicate key " + shown(key) + ")");
                    }
                }
                reader.endObject();
                JsonObject object = new JsonObject();
                fields.forEach(object::add);
                return object;
            case STRING:
                return new JsonPrimitive(reader.nextString());
            case NUMBER:
                return new JsonPrimitive(new LazilyParsedNumber(reader.nextString()));
            case BOOLEAN:
                return new JsonPrimitive(reader.nextBoolean());
            case NULL:
                reader.nextNull();
                return JsonNull.INSTANCE;
            default:
                throw new Refusal(where, "invalid JSON (" + reader.peek() + " at " + reader.getPath() + ")");
        }
    }

    // ---- typed values (python: oplist_check's integer, flag, text, array, member, hex_double, number) ----

    static boolean isInt(JsonElement value) {
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isNumber()) {
            return false;
        }
        String text = value.getAsString();
        if (!INTEGER.matcher(text).matches()) {
            return false;
        }
        try {
            Long.parseLong(text);
            return true;
        } catch (NumberFormatException e) {
            return false;
        }
    }

    static long integer(JsonElement value, String where, String field) {
        return integer(value, where, field, Long.MIN_VALUE, Long.MAX_VALUE);
    }

    static long integer(JsonElement value, String where, String field, long low, long high) {
        if (!isInt(value)) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected an integer");
        }
        long x = value.getAsLong();
        if (x < low || x > high) {
            throw new Refusal(where, field + " is " + x + ", expected " + low + (high == Long.MAX_VALUE ? " or more" : " to " + high));
        }
        return x;
    }

    static boolean flag(JsonElement value, String where, String field) {
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isBoolean()) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected true or false");
        }
        return value.getAsBoolean();
    }

    static String text(JsonElement value, String where, String field) {
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a string");
        }
        String text = value.getAsString();
        if (text.codePointCount(0, text.length()) > NAME_CHARS) {
            throw new Refusal(where, field + " is " + shown(text) + ", longer than the limit of " + NAME_CHARS + " characters");
        }
        return text;
    }

    static JsonArray array(JsonElement value, String where, String field) {
        if (value == null || !value.isJsonArray()) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a list");
        }
        return value.getAsJsonArray();
    }

    static JsonElement member(JsonObject object, String key, String where) {
        if (!object.has(key)) {
            throw new Refusal(where, "lacks '" + key + "'");
        }
        return object.get(key);
    }

    /** A double as {@code float.hex} text (exact; inf and nan too). */
    static double hexDouble(JsonElement value, String where, String field) {
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isString()
                || !HEX.matcher(value.getAsString()).matches()) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a double as float.hex text");
        }
        String text = value.getAsString();
        boolean negative = text.startsWith("-");
        String magnitude = negative ? text.substring(1) : text;
        if (magnitude.equals("nan")) {
            return negative ? Math.copySign(Double.NaN, -1.0) : Double.NaN; // -nan keeps its sign, as strtod's
        }
        if (magnitude.equals("inf")) {
            return negative ? Double.NEGATIVE_INFINITY : Double.POSITIVE_INFINITY;
        }
        double x = Double.parseDouble(text);
        if (Double.isInfinite(x)) { // Python's float.fromhex raises OverflowError
            throw new Refusal(where, field + " is " + shown(value) + ", beyond a double's range");
        }
        return x;
    }

    static double finiteHex(JsonElement value, String where, String field, double low) {
        double x = hexDouble(value, where, field);
        if (!Double.isFinite(x) || x < low) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a finite double"
                    + (low == Double.NEGATIVE_INFINITY ? "" : " >= " + pyRepr(low)));
        }
        return x;
    }

    /** A finite JSON number in [low, high] ({@code belowHigh}: high excluded; {@code aboveLow}: low excluded). */
    static double number(JsonElement value, String where, String field, double low, double high, boolean belowHigh,
            boolean aboveLow) {
        if (value == null || !value.isJsonPrimitive() || !value.getAsJsonPrimitive().isNumber()) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a number");
        }
        double x = Double.parseDouble(value.getAsString());
        if (!Double.isFinite(x)) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a finite number");
        }
        if (x < low || x > high || (belowHigh && x == high) || (aboveLow && x == low)) {
            throw new Refusal(where, field + " is " + shown(value) + ", expected a number in " + (aboveLow ? "(" : "[")
                    + bound(low) + ", " + bound(high) + (belowHigh ? ")" : "]"));
        }
        return x;
    }

    private static String bound(double x) {
        return x == Double.POSITIVE_INFINITY ? "inf" : x == Double.NEGATIVE_INFINITY ? "-inf" : pyRepr(x);
    }

    private static String pyRepr(double x) {
        return x == Math.rint(x) && Math.abs(x) < 1e16 ? (long) x + ".0" : Double.toString(x);
    }
}
