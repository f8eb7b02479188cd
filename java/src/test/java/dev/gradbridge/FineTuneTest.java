package dev.gradbridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.data.Dataset;
import java.util.Arrays;
import java.util.Collections;
import java.util.Map;
import java.util.Random;
import org.junit.Test;

/** Fine-tuning from Java: frozen parameters, learning rate per group, per-epoch schedule in the history. */
public class FineTuneTest {

    private static Dataset randomData(TensorScope manager, int n) {
        Random random = new Random(3);
        float[] xs = new float[n * 4];
        long[] ys = new long[n];
        for (int i = 0; i < n; i++) {
            for (int j = 0; j < 4; j++) {
                xs[i * 4 + j] = (float) random.nextGaussian();
            }
            ys[i] = xs[i * 4] > 0 ? (xs[i * 4 + 1] > 0 ? 2 : 1) : 0;
        }
        Tensor x = manager.add(Tensor.of(xs, n, 4));
        Tensor y = manager.add(Tensor.of(ys, n));
        return Dataset.of("random", x, y);
    }

    @Test
    public void metadataSaysWhichParametersTrain() {
        Metadata metadata = Metadata.read(TrainingModuleTest.fixture("mlp_finetune.pt"));
        assertEquals(Arrays.asList("2.weight", "2.bias", "4.weight", "4.bias"), metadata.getTrainableParameterNames());
        assertFalse(metadata.getParameters().get(0).isTrainable());
        assertEquals("epoch", metadata.getFineTuning().get("scheduler_interval"));
        // modules exported before the flag existed: every parameter trains
        Metadata old = Metadata.read(TrainingModuleTest.fixture("mlp_classifier.pt"));
        assertEquals(old.getParameters().size(), old.getTrainableParameterNames().size());
    }

    @Test
    public void learningRatePerGroupIsReadAndSet() {
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("mlp_finetune.pt"))) {
            assertArrayEquals(new double[] {0.1, 0.05}, module.getLrs(), 0.0);
            module.setLr(1, 0.2);
            assertArrayEquals(new double[] {0.1, 0.2}, module.getLrs(), 0.0);
            assertEquals(0.1, module.getLr(), 0.0);
            module.setLr(0.3);
            assertArrayEquals(new double[] {0.3, 0.3}, module.getLrs(), 0.0);
            assertThrows(InvalidInputException.class, () -> module.setLr(2, 0.1));
            assertThrows(InvalidInputException.class, () -> module.setLr(0, -1.0));
        }
    }

    @Test
    public void frozenParametersStayAndTheEpochScheduleIsRecorded() throws Exception {
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("mlp_finetune.pt"));
                TensorScope data = new TensorScope()) {
            Map<String, double[]> before = module.getParameters();
            History history =
                    Trainer.builder().optEpochs(3).optBatchSize(16).build().fit(module, randomData(data, 64));
            Map<String, double[]> after = module.getParameters();
            assertArrayEquals(before.get("0.weight"), after.get("0.weight"), 0.0);
            assertArrayEquals(before.get("0.bias"), after.get("0.bias"), 0.0);
            assertFalse(Arrays.equals(before.get("4.weight"), after.get("4.weight")));
            // StepLR(step_size=1, gamma=0.5) per epoch: halved after every epoch, both groups
            assertArrayEquals(new double[] {0.05, 0.025}, history.getRecords().get(0).getLrs(), 0.0);
            assertArrayEquals(new double[] {0.0125, 0.00625}, history.getRecords().get(2).getLrs(), 0.0);
            assertTrue(history.toJsonLines().contains("\"lrs\":[0.05,0.025]"));
            // the frozen layer has no gradient and its optimizer state is absent (SGD: the momentum buffer)
            assertEquals(Collections.singleton("momentum_buffer"), module.getOptimizerState().keySet());
            assertEquals(4, module.getOptimizerState().get("momentum_buffer").size());
        }
    }
}
