package dev.gradbridge.data;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.junit.Test;

/** The shared test vectors of tests/vectors/shuffle.json, also read by tests/test_shuffle.py. */
public class ShuffleTest {

    private static JsonObject vectors() throws IOException {
        return JsonParser.parseString(
                        new String(Files.readAllBytes(Paths.get("tests", "vectors", "shuffle.json")), StandardCharsets.UTF_8))
                .getAsJsonObject();
    }

    @Test
    public void splitMix64MatchesTheReferenceOutputs() throws IOException {
        JsonObject reference = vectors().getAsJsonObject("splitmix64");
        Shuffle.SplitMix64 random = new Shuffle.SplitMix64(Long.parseUnsignedLong(reference.get("state").getAsString()));
        for (JsonElement expected : reference.getAsJsonArray("outputs")) {
            assertEquals(expected.getAsString(), Long.toUnsignedString(random.next()));
        }
    }

    @Test
    public void everyCaseMatches() throws IOException {
        JsonArray cases = vectors().getAsJsonArray("cases");
        for (JsonElement element : cases) {
            JsonObject c = element.getAsJsonObject();
            long seed = Long.parseUnsignedLong(c.get("seed").getAsString());
            int epoch = c.get("epoch").getAsInt();
            JsonArray expected = c.getAsJsonArray("permutation");
            long[] perm = new long[expected.size()];
            for (int i = 0; i < perm.length; i++) {
                perm[i] = expected.get(i).getAsLong();
            }
            assertArrayEquals(c.toString(), perm, Shuffle.permutation(seed, epoch, c.get("n").getAsInt()));
            assertEquals(c.toString(), c.get("torch_seed").getAsString(), Long.toString(Shuffle.torchSeed(seed, epoch)));
        }
    }
}
