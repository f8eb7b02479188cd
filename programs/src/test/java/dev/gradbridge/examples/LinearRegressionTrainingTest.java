package dev.gradbridge.examples;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.History;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class LinearRegressionTrainingTest {

    @Rule public TemporaryFolder tmp = new TemporaryFolder();

    private static String model() {
        return Paths.get(System.getProperty("gradbridge.testModels"), "linear_regression.pt").toString();
    }

    @Test
    public void dataFollowTheSeedsGenerator() {
        LinearRegressionTraining.SeedData a = LinearRegressionTraining.generateData(42, 100);
        // java.util.Random's sequence is specified (a 48-bit LCG), so seed 42 gives these on any JVM.
        assertArrayEquals(
                new float[] {7.2756367f, 6.8322344f, 3.087194f},
                java.util.Arrays.copyOf(a.getX(), 3),
                0f);
        for (int i = 0; i < 100; i++) {
            float x = a.getX()[i];
            assertTrue(x >= 0f && x < 10f);
            float noise = a.getY()[i] - (2f * x + 1f);
            assertTrue("noise " + noise, noise >= -1.0001f && noise < 1.0001f);
        }
    }

    @Test
    public void lossFallsAndWeightApproachesTwo() throws Exception {
        Path historyFile = tmp.getRoot().toPath().resolve("history.jsonl");
        History history =
                LinearRegressionTraining.runExample(
                        "--model", model(), "--epochs", "1000", "--history", historyFile.toString());
        List<History.EpochRecord> records = history.getRecords();
        assertEquals(1000, records.size());
        for (int epoch = 20; epoch < 1000; epoch += 20) {
            assertTrue(
                    "loss at epoch " + epoch,
                    records.get(epoch).getLoss() < records.get(epoch - 20).getLoss());
        }
        double weight = records.get(999).getParameters().get("weight")[0];
        assertEquals(2.0, weight, 0.1);
        List<String> lines = Files.readAllLines(historyFile, StandardCharsets.UTF_8);
        assertEquals(1000, lines.size());
        assertTrue(lines.get(0), lines.get(0).startsWith("{\"epoch\":0,\"loss\":"));
    }
}
