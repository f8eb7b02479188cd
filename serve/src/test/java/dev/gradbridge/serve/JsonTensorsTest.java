package dev.gradbridge.serve;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;

import com.google.gson.JsonElement;
import com.google.gson.JsonParser;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.online.HostTensor;
import org.junit.Test;

/** Request JSON to tensors and back, without a server. */
public class JsonTensorsTest {

    private static JsonElement json(String text) {
        return JsonParser.parseString(text);
    }

    private static String refusal(String field, String text, String dtype) {
        return assertThrows(InvalidInputException.class, () -> JsonTensors.parse(field, json(text), dtype)).getMessage();
    }

    @Test
    public void aRectangularArrayIsATensorOfTheDtype() {
        HostTensor x = JsonTensors.parse("x", json("[[1, 2.5], [3, -4]]"), "float32");
        assertArrayEquals(new long[] {2, 2}, x.getShape());
        assertArrayEquals(new float[] {1f, 2.5f, 3f, -4f}, x.toFloatArray(), 0f);
        HostTensor empty = JsonTensors.parse("y", json("[]"), "int64");
        assertArrayEquals(new long[] {0}, empty.getShape());
    }

    @Test
    public void int64ValuesStayExactBeyondTwoToThe53() {
        HostTensor y = JsonTensors.parse("y", json("[9007199254740993, -9223372036854775808, 1e3]"), "int64");
        assertArrayEquals(new long[] {9007199254740993L, Long.MIN_VALUE, 1000L}, y.toLongArray());
    }

    @Test
    public void badArraysAreOneLineNamingTheField() {
        assertEquals("field 'x' is missing", assertThrows(InvalidInputException.class,
                () -> JsonTensors.parse("x", null, "float32")).getMessage());
        assertEquals("field 'x' is not rectangular: expected 2 items at depth 1, found [3]",
                refusal("x", "[[1, 2], [3]]", "float32"));
        assertEquals("field 'x' must be a nested array of numbers, found \"a\"", refusal("x", "[[1, \"a\"]]", "float32"));
        assertEquals("field 'y' must hold integers (int64), got 1.5", refusal("y", "[1.5]", "int64"));
        assertEquals("field 'y' must hold int64 integers (at most 2^63-1 in size), got 9223372036854775808",
                refusal("y", "[9223372036854775808]", "int64"));
        // a huge exponent is refused from its text, never expanded
        assertEquals("field 'y' must hold int64 integers (at most 2^63-1 in size), got 1e1000000000",
                refusal("y", "[1e1000000000]", "int64"));
    }

    @Test
    public void aVersionNumberIsAnIntegerOfAtLeastZero() {
        assertEquals(7, JsonTensors.versionNumber(json("7")));
        for (String bad : new String[] {"-1", "1.5", "\"7\"", "[7]"}) {
            assertEquals("field 'version' must be a version number (an integer >= 0), got " + bad,
                    assertThrows(InvalidInputException.class, () -> JsonTensors.versionNumber(json(bad))).getMessage());
        }
    }

    @Test
    public void writtenFloatsRoundTripAndWhatIsNotFiniteIsNull() {
        float[] values = {0.1f, Float.NaN, -3.4028235e38f, Float.POSITIVE_INFINITY};
        JsonElement written = JsonTensors.write(HostTensor.ofFloats(values, 2, 2));
        assertEquals("[[0.1,null],[-3.4028235E38,null]]", written.toString());
        HostTensor back = JsonTensors.parse("y", json("[[0.1, 0], [-3.4028235E38, 0]]"), "float32");
        assertEquals(Float.floatToIntBits(values[0]), Float.floatToIntBits(back.toFloatArray()[0]));
        assertEquals(Float.floatToIntBits(values[2]), Float.floatToIntBits(back.toFloatArray()[2]));
    }

    @Test
    public void longValuesAreAbbreviatedInErrorLines() {
        String line = JsonTensors.abbreviate("x".repeat(100));
        assertEquals(63, line.length());
        assertEquals("x".repeat(60) + "...", line);
    }
}
