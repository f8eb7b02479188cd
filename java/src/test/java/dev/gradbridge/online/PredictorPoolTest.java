package dev.gradbridge.online;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.Tensor;
import dev.gradbridge.TrainingModule;
import dev.gradbridge.internal.FrozenTensors;
import dev.gradbridge.internal.ModuleAccess;
import java.nio.file.Path;
import java.util.Arrays;
import org.junit.Test;

/** Predictors hold the training module's frozen tensors: one copy of them, however many predictors. */
public class PredictorPoolTest {

    @Test
    public void predictorsHoldTheTrainingModulesFrozenTensorsNotCopiesOfThem() {
        Path model = OnlineLearnerTest.fixture("mlp_finetune.pt"); // its first layer (0.*) frozen
        float[] rows = {0.5f, -1f, 2f, 0.25f, -0.75f, 1.5f, 0f, 3f};
        try (TrainingModule training = TrainingModule.load(model);
                FrozenTensors frozen = ModuleAccess.frozen(training);
                PredictorPool pool = new PredictorPool(model, 3, frozen);
                Tensor x = Tensor.of(rows, 2, 4);
                Tensor expected = training.predict(x)) {
            assertEquals(Arrays.asList("0.weight", "0.bias"), frozen.names());
            for (TrainingModule predictor : pool.modules()) {
                // a native identity check: sharing again changes no reference when it holds these very tensors
                assertEquals(0, ModuleAccess.share(predictor, frozen));
                try (Tensor y = predictor.predict(x)) {
                    assertArrayEquals(expected.toBytes(), y.toBytes());
                }
            }
            try (TrainingModule alone = TrainingModule.load(model)) {
                assertTrue("a module loaded on its own holds copies", ModuleAccess.share(alone, frozen) > 0);
                assertEquals(0, ModuleAccess.share(alone, frozen));
                // left out (as a checkpoint or a backup is taken) and given back: the same predictions
                assertTrue(ModuleAccess.leaveOut(alone) > 0);
                assertTrue(ModuleAccess.share(alone, frozen) > 0);
                try (Tensor y = alone.predict(x)) {
                    assertArrayEquals(expected.toBytes(), y.toBytes());
                }
            }
        }
    }
}
