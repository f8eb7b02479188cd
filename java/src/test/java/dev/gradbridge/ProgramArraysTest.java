package dev.gradbridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import com.google.gson.JsonObject;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.BeforeClass;
import org.junit.Test;

/**
 * The native layer reads a protocol-3 program from {@link ProgramArrays}' three arrays, never from text: a checked
 * program's arrays load and run; arrays Java did not write (cut short, values changed, an unknown kind, a slot out
 * of range, a count past the end) are one line in a {@link NativeException}, never a read past an array's end or
 * a crash of the JVM (the arrays are fuzzed here; the fault suite fuzzes whole files).
 */
public class ProgramArraysTest {

    private static final String FORWARD = "{\"oplist_version\": 4, \"inputs\": [\"param:w\", \"input:x\"], \"nodes\": ["
            + "{\"op\": \"aten::mul\", \"overload\": \"Tensor\", \"args\": [{\"t\": 1}, {\"t\": 0}], \"outputs\": 1},"
            + "{\"op\": \"aten::sum\", \"overload\": \"dim_IntList\", \"args\": [{\"t\": 2}, {\"il\": [0]}, {\"b\": false},"
            + " null], \"outputs\": 1},"
            + "{\"op\": \"aten::add\", \"overload\": \"Tensor\", \"args\": [{\"t\": 2}, {\"t\": 3}, {\"f\": \"0x1p+0\"}],"
            + " \"outputs\": 1}], \"outputs\": [{\"ref\": 4, \"to\": \"output\"}]}";
    private static final String TRAINING = "{\"optimizer\": \"adam\", \"groups\": [{\"params\": [\"w\"], \"lr\": 0.1,"
            + " \"betas\": [0.9, 0.999], \"eps\": 1e-8, \"weight_decay\": 0.0, \"amsgrad\": false, \"maximize\": false}],"
            + " \"accumulate\": 1, \"scheduler_interval\": \"step\", \"scheduler\": {\"name\": \"sequential\","
            + " \"base_lrs\": [\"0x1.999999999999ap-4\"], \"milestones\": [2], \"schedulers\": ["
            + "{\"name\": \"step\", \"base_lrs\": [\"0x1.999999999999ap-4\"], \"step_size\": 1, \"gamma\": 0.5},"
            + "{\"name\": \"cosine\", \"base_lrs\": [\"0x1.999999999999ap-4\"], \"T_max\": 3, \"eta_min\": 0.0}]}}";
    private static final String COUNTERS = "{\"steps\": 0, \"lrs\": [\"0x1.999999999999ap-4\"], \"last_epoch\": 0,"
            + " \"best\": \"inf\", \"num_bad_epochs\": 0, \"cooldown_counter\": 0, \"children_last_epochs\": [0, 0]}";

    private static ProgramArrays arrays;

    @BeforeClass
    public static void write() {
        NativeLibrary.load();
        JsonObject forward = json(FORWARD, "op list forward");
        ProgramCheck.graph(forward, "op list forward");
        JsonObject training = json(TRAINING, "training");
        JsonObject counters = json(COUNTERS, "counters");
        ProgramCheck.training(training, counters, "program");
        Map<String, JsonObject> graphs = new LinkedHashMap<>();
        graphs.put("forward", forward);
        arrays = ProgramArrays.of(List.of("w"), List.of("x"), graphs, training, counters);
    }

    private static JsonObject json(String text, String where) {
        return StrictJson.read(text.getBytes(StandardCharsets.UTF_8), where).getAsJsonObject();
    }

    /** Loads the arrays with a state of {@code w = [2, 3]}: the handle, or NativeException's line. */
    private static long load(long[] integers, double[] doubles, String[] strings) {
        try (Tensor w = Tensor.of(new float[] {2, 3}, 2)) {
            return Native.exportedLoad(integers, doubles, strings, new String[] {"param:w"}, new long[] {w.handle()},
                    "cpu");
        }
    }

    /** One line, or a module (freed here). */
    private static String outcome(long[] integers, double[] doubles, String[] strings) {
        try {
            Native.exportedFree(load(integers, doubles, strings));
            return "ok";
        } catch (NativeException e) {
            assertFalse(e.getMessage(), e.getMessage().contains("\n"));
            assertTrue(e.getMessage(), e.getMessage().length() < 1000);
            return e.getMessage();
        }
    }

    @Test
    public void theArraysOfACheckedProgramLoadAndRun() {
        // the doubles: the graph's constant 1.0; the group's beta1, beta2, momentum, weight_decay, lr_decay; the
        // schedules' base_lrs, gamma, base_lrs, eta_min; the counters' lrs and best
        assertArrayEquals(new double[] {1.0, 0.9, 0.999, 0, 0, 0, 0.1, 0.1, 0.5, 0.1, 0, 0.1, Double.POSITIVE_INFINITY},
                arrays.doubles(), 0.0);
        long module = load(arrays.integers(), arrays.doubles(), arrays.strings());
        try (Tensor x = Tensor.of(new float[] {5, 7}, 2)) {
            long[] out = Native.exportedCall(module, "forward", new long[] {x.handle()}, 0);
            try (Tensor y = new Tensor(out[0])) {
                assertArrayEquals(new float[] {41, 52}, y.toFloatArray(), 0f); // w * x + sum(w * x)
            }
            assertArrayEquals(new double[] {0.1}, Native.exportedLrs(module), 0.0);
        } finally {
            Native.exportedFree(module);
        }
    }

    @Test
    public void arraysCutShortOrLeftOverAreOneLine() {
        long[] integers = arrays.integers();
        double[] doubles = arrays.doubles();
        String[] strings = arrays.strings();
        for (int n = 0; n < integers.length; n++) {
            assertTrue(outcome(Arrays.copyOf(integers, n), doubles, strings).startsWith("program arrays: "));
        }
        for (int n = 0; n < doubles.length; n++) {
            assertTrue(outcome(integers, Arrays.copyOf(doubles, n), strings).startsWith("program arrays: "));
        }
        for (int n = 0; n < strings.length; n++) {
            assertTrue(outcome(integers, doubles, Arrays.copyOf(strings, n)).startsWith("program arrays: "));
        }
        assertEquals("program arrays: 1 integers, 0 doubles and 0 strings left unread",
                outcome(Arrays.copyOf(integers, integers.length + 1), doubles, strings));
        assertEquals("the program's integers is null", outcome(null, doubles, strings));
    }

    @Test
    public void aSlotOutOfRangeAnUnknownKindOrACountPastTheEndIsOneLine() {
        long[] integers = arrays.integers();
        // the graph's first node's first argument: kind 1 (t), slot 1
        int at = indexOf(integers, new long[] {2, 1, 1, 1, 0}); // 2 args, {t: 1}, {t: 0}
        long[] slot = integers.clone();
        slot[at + 2] = 1 << 20;
        assertEquals("op list forward node 0 (aten::mul.Tensor): argument refers to slot 1048576 before it is computed",
                outcome(slot, arrays.doubles(), arrays.strings()));
        long[] kind = integers.clone();
        kind[at + 1] = 99;
        assertEquals("op list forward node 0 (aten::mul.Tensor): unknown argument kind 99",
                outcome(kind, arrays.doubles(), arrays.strings()));
        long[] count = integers.clone();
        count[at] = Long.MAX_VALUE;
        assertTrue(outcome(count, arrays.doubles(), arrays.strings()),
                outcome(count, arrays.doubles(), arrays.strings()).startsWith("program arrays: node args counts "));
    }

    private static int indexOf(long[] values, long[] part) {
        for (int i = 0; i + part.length <= values.length; i++) {
            if (Arrays.equals(Arrays.copyOfRange(values, i, i + part.length), part)) {
                return i;
            }
        }
        throw new AssertionError("not in the arrays: " + Arrays.toString(part));
    }

    @Test
    public void fuzzedArraysLoadOrAreOneLine() {
        long[] edges = {-1, 0, 1, 2, 3, 4, 16, 17, 64, 1L << 31, 1L << 40, Long.MIN_VALUE, Long.MAX_VALUE};
        double[] doubleEdges = {Double.NaN, -0.0, Double.POSITIVE_INFINITY, Double.NEGATIVE_INFINITY, 1e308, -1};
        String[] stringEdges = {"", "#item", "aten::relu", "default", "param:w", "input:x", "nope", "output", "step"};
        Random random = new Random(50);
        int loaded = 0;
        for (int k = 0; k < 3000; k++) {
            long[] integers = arrays.integers();
            double[] doubles = arrays.doubles();
            String[] strings = arrays.strings();
            for (int m = 1 + random.nextInt(3); m > 0; m--) {
                int roll = random.nextInt(10);
                if (roll < 7) {
                    integers[random.nextInt(integers.length)] = random.nextBoolean() ? edges[random.nextInt(edges.length)]
                            : integers[random.nextInt(integers.length)];
                } else if (roll < 8) {
                    doubles[random.nextInt(doubles.length)] = doubleEdges[random.nextInt(doubleEdges.length)];
                } else {
                    strings[random.nextInt(strings.length)] = stringEdges[random.nextInt(stringEdges.length)];
                }
            }
            loaded += "ok".equals(outcome(integers, doubles, strings)) ? 1 : 0;
        }
        assertTrue("some mutations load (a value no check reads), most are refused: " + loaded, loaded < 3000);
    }
}
