package dev.gradbridge;

import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.GuardedSteps;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.After;
import org.junit.Before;
import org.junit.Test;

/** TrainingModule on modules that the build exported (task exportTestModels). */
public class TrainingModuleTest {

    static Path fixture(String name) {
        String dir = System.getProperty("gradbridge.testModels");
        if (dir == null) {
            throw new IllegalStateException("run through Gradle: -Dgradbridge.testModels is not set");
        }
        return Paths.get(dir, name);
    }

    private TrainingModule module;
    private TensorScope data;

    @Before
    public void load() {
        module = TrainingModule.load(fixture("linear_regression.pt"));
        data = new TensorScope();
    }

    @After
    public void close() {
        data.close();
        module.close();
    }

    private Tensor column(float... values) {
        return data.add(Tensor.of(values, values.length, 1));
    }

    @Test
    public void exposesMetadataAndProtocol() {
        Metadata metadata = module.getMetadata();
        assertEquals("linear-regression", metadata.getModel());
        assertEquals(Protocol.VERSION, metadata.getProtocolVersion());
        assertEquals("2.7.1", metadata.getTorchVersion());
        assertEquals(Arrays.asList("weight", "bias"), module.getParameterNames());
        assertEquals("mse", metadata.getLoss().get("name"));
        assertEquals("sgd", metadata.getOptimizer().get("name"));
        assertArrayEquals(new long[] {-1, 1}, metadata.getInput("x").getShape());
        assertTrue(module.getMethodNames().containsAll(Protocol.REQUIRED_METHODS));
        List<String> methods = new ArrayList<>(Protocol.REQUIRED_METHODS);
        methods.addAll(Protocol.OPTIONAL_METHODS); // written by exports with fine-tuning support
        methods.addAll(Protocol.DATA_PARALLEL_METHODS); // protocol 2
        assertEquals(methods, metadata.getMethods());
    }

    @Test
    public void backwardComputesTheMseGradient() {
        Map<String, double[]> params = module.getParameters();
        double w = params.get("weight")[0];
        double b = params.get("bias")[0];
        float[] xs = {1f, 2f, 3f};
        float[] ys = {3f, 5f, 7f};
        double loss = module.calculateLossAndBackward(column(xs), column(ys));

        double expectedLoss = 0;
        double gradW = 0;
        double gradB = 0;
        for (int i = 0; i < xs.length; i++) {
            double residual = w * xs[i] + b - ys[i];
            expectedLoss += residual * residual / xs.length;
            gradW += 2 * residual * xs[i] / xs.length;
            gradB += 2 * residual / xs.length;
        }
        Map<String, double[]> grads = module.getGradients();
        assertEquals(expectedLoss, loss, 1e-5 * expectedLoss);
        assertEquals(gradW, grads.get("weight")[0], 1e-5 * Math.abs(gradW));
        assertEquals(gradB, grads.get("bias")[0], 1e-5 * Math.abs(gradB));
    }

    @Test
    public void gradientsAccumulateUntilZeroGrad() {
        Tensor x = column(1f, 2f);
        Tensor y = column(0f, 1f);
        module.calculateLossAndBackward(x, y);
        double once = module.getGradients().get("weight")[0];
        module.calculateLossAndBackward(x, y);
        assertEquals(2 * once, module.getGradients().get("weight")[0], 1e-6 * Math.abs(once));
        module.zeroGrad();
        assertEquals(0.0, module.getGradients().get("weight")[0], 0.0);
    }

    @Test
    public void sgdStepAppliesLrTimesGradientThenZeroesIt() {
        double w0 = module.getParameters().get("weight")[0];
        module.calculateLossAndBackward(column(1f, 2f), column(3f, 5f));
        double g = module.getGradients().get("weight")[0];
        module.sgdStep(0.1);
        assertEquals(w0 - 0.1 * g, module.getParameters().get("weight")[0], 1e-6);
        assertEquals(0.0, module.getGradients().get("weight")[0], 0.0);
    }

    @Test
    public void forwardPredictsWeightTimesXPlusBias() {
        Map<String, double[]> params = module.getParameters();
        try (Tensor prediction = module.forward(column(2f))) {
            assertEquals(
                    params.get("weight")[0] * 2 + params.get("bias")[0],
                    prediction.toExactDoubles()[0],
                    1e-6);
        }
    }

    @Test
    public void predictEqualsForwardBitForBitOnEveryTestModel() {
        // predict runs forward compiled once with its nested calls inlined: the same ops, the same bytes
        for (String name : new String[] {"linear_regression.pt", "mlp_classifier.pt", "cnn_classifier.pt",
                "mlp_regressor.pt", "mlp_finetune.pt"}) {
            try (TrainingModule model = TrainingModule.load(fixture(name));
                    TensorScope scope = new TensorScope()) {
                Metadata.TensorSpec spec = model.getMetadata().getInput("x");
                long[] shape = spec.getShape().clone();
                shape[0] = 3;
                int count = 1;
                for (long dim : shape) {
                    count *= (int) dim;
                }
                java.util.Random random = new java.util.Random(name.hashCode());
                float[] values = new float[count];
                for (int i = 0; i < count; i++) {
                    values[i] = (float) random.nextGaussian();
                }
                Tensor x = scope.add(Tensor.of(values, shape));
                Tensor expected = scope.add(model.forward(x));
                Tensor predicted = scope.add(model.predict(x));
                assertArrayEquals(name, expected.shape(), predicted.shape());
                assertArrayEquals(name, expected.toBytes(), predicted.toBytes());
            }
        }
    }

    @Test
    public void stepWhileFiniteEqualsTrainStepsBitForBitOnEveryTestModel() {
        // the guarded steps run zero_grad, the loss and backward, and the optimizer step compiled
        // once with their nested calls inlined; train_step goes through the graph executor
        for (String name : new String[] {"linear_regression.pt", "mlp_classifier.pt", "cnn_classifier.pt",
                "mlp_regressor.pt", "mlp_finetune.pt"}) {
            try (TrainingModule stepped = TrainingModule.load(fixture(name));
                    TrainingModule guarded = TrainingModule.load(fixture(name));
                    TensorScope scope = new TensorScope()) {
                java.util.Random random = new java.util.Random(name.hashCode());
                Tensor[] xs = new Tensor[3];
                Tensor[] ys = new Tensor[3];
                for (int i = 0; i < xs.length; i++) {
                    xs[i] = scope.add(randomInput(stepped.getMetadata().getInput("x"), random));
                    ys[i] = scope.add(randomInput(stepped.getMetadata().getInput("y"), random));
                }
                double[] losses = new double[xs.length];
                for (int i = 0; i < xs.length; i++) {
                    losses[i] = stepped.trainStep(xs[i], ys[i]);
                }
                GuardedSteps steps = ModuleAccess.stepWhileFinite(guarded, xs, ys);
                assertTrue(name, steps.complete());
                for (int i = 0; i < xs.length; i++) {
                    assertEquals(name, Double.doubleToRawLongBits(losses[i]), Double.doubleToRawLongBits(steps.loss(i)));
                }
                Map<String, double[]> parameters = guarded.getParameters();
                for (Map.Entry<String, double[]> e : stepped.getParameters().entrySet()) {
                    assertArrayEquals(name + " " + e.getKey(), e.getValue(), parameters.get(e.getKey()), 0.0);
                }
                Map<String, List<double[]>> state = guarded.getOptimizerState();
                for (Map.Entry<String, List<double[]>> e : stepped.getOptimizerState().entrySet()) {
                    for (int k = 0; k < e.getValue().size(); k++) {
                        assertArrayEquals(name + " " + e.getKey(), e.getValue().get(k), state.get(e.getKey()).get(k), 0.0);
                    }
                }
            }
        }
    }

    /** Random values of a spec's shape (3 rows): standard normal floats, or 0 for integer labels. */
    private static Tensor randomInput(Metadata.TensorSpec spec, java.util.Random random) {
        long[] shape = spec.getShape().clone();
        shape[0] = 3;
        int count = 1;
        for (long dim : shape) {
            count *= (int) dim;
        }
        if (spec.getDtype().startsWith("int")) {
            return Tensor.of(new long[count], shape);
        }
        float[] values = new float[count];
        for (int i = 0; i < count; i++) {
            values[i] = (float) random.nextGaussian();
        }
        return Tensor.of(values, shape);
    }

    @Test
    public void callRunsAnyMethodByName() {
        Object names = module.call(Protocol.PARAMETER_NAMES);
        assertEquals(Arrays.asList("weight", "bias"), names);
        List<?> params = (List<?>) module.call(Protocol.GET_PARAMETERS);
        assertEquals(2, params.size());
        ((Tensor) params.get(0)).close();
        ((Tensor) params.get(1)).close();
        assertEquals(null, module.call(Protocol.ZERO_GRAD));
    }

    @Test
    public void missingFileNamesThePath() {
        ModuleLoadException e =
                assertThrows(ModuleLoadException.class, () -> TrainingModule.load(fixture("absent.pt")));
        assertTrue(e.getMessage(), e.getMessage().contains("absent.pt"));
        assertTrue(e.getMessage(), e.getMessage().contains("not found"));
    }

    @Test
    public void textFileIsNotTorchScript() {
        ModuleLoadException e =
                assertThrows(
                        ModuleLoadException.class, () -> TrainingModule.load(fixture("not_torchscript.pt")));
        assertTrue(e.getMessage(), e.getMessage().contains("not_torchscript.pt is not a TorchScript file"));
    }

    @Test
    public void torchScriptWithoutMetadataIsNotAGradbridgeModule() {
        ProtocolException e =
                assertThrows(ProtocolException.class, () -> TrainingModule.load(fixture("no_protocol.pt")));
        assertTrue(e.getMessage(), e.getMessage().contains("no_protocol.pt is a TorchScript module without gradbridge.json"));
    }

    @Test
    public void torchScriptWithoutProtocolMethodsNamesThem() {
        ProtocolException e =
                assertThrows(
                        ProtocolException.class, () -> TrainingModule.load(fixture("missing_methods.pt")));
        assertTrue(e.getMessage(), e.getMessage().contains("lacks protocol methods [calculate_loss_and_backward, zero_grad"));
    }

    @Test
    public void unknownMethodIsNamedAndTheModuleStaysUsable() {
        ProtocolException e = assertThrows(ProtocolException.class, () -> module.call("no_such_method"));
        assertTrue(e.getMessage(), e.getMessage().contains("has no method 'no_such_method'"));
        assertEquals(2, module.getParameters().size());
    }

    @Test
    public void wrongShapeIsRejectedBeforeRunning() {
        Map<String, double[]> before = module.getParameters();
        Tensor flat = data.add(Tensor.of(new float[] {1f, 2f}, 2));
        InvalidInputException e =
                assertThrows(
                        InvalidInputException.class,
                        () -> module.calculateLossAndBackward(flat, column(1f, 2f)));
        assertTrue(e.getMessage(), e.getMessage().contains("input x must be float32 of shape [-1, 1]"));
        assertTrue(e.getMessage(), e.getMessage().contains("got float32 of shape [2]"));
        assertArrayEquals(before.get("weight"), module.getParameters().get("weight"), 0.0);
        assertEquals(0.0, module.getGradients().get("weight")[0], 0.0);
    }

    @Test
    public void wrongDtypeIsRejectedBeforeRunning() {
        Tensor doubles = data.add(Tensor.of(new double[] {1, 2}, 2, 1));
        InvalidInputException e =
                assertThrows(
                        InvalidInputException.class,
                        () -> module.calculateLossAndBackward(column(1f, 2f), doubles));
        assertTrue(e.getMessage(), e.getMessage().contains("input y must be float32"));
        assertTrue(e.getMessage(), e.getMessage().contains("got float64 of shape [2, 1]"));
    }

    @Test
    public void mismatchedBatchSizesAreRejected() {
        InvalidInputException e =
                assertThrows(
                        InvalidInputException.class,
                        () -> module.calculateLossAndBackward(column(1f, 2f), column(1f)));
        assertTrue(e.getMessage(), e.getMessage().contains("x has 2 samples but y has 1"));
    }

    @Test
    public void libtorchErrorsBecomeMethodCallExceptions() {
        // Through call() no metadata check runs: libtorch itself rejects the broadcast.
        Tensor x = data.add(Tensor.of(new float[] {1f, 2f, 3f}, 3, 1));
        Tensor y = data.add(Tensor.of(new float[] {1f, 2f}, 2, 1));
        MethodCallException e =
                assertThrows(
                        MethodCallException.class,
                        () -> module.call(Protocol.CALCULATE_LOSS_AND_BACKWARD, x, y));
        assertTrue(e.getMessage(), e.getMessage().contains("calculate_loss_and_backward() failed"));
        assertTrue(e.getMessage(), e.getMessage().contains("The size of tensor a (3) must match the size of tensor b (2)"));
        assertNotEquals(0, module.getParameters().size());
    }

    @Test
    public void closedModuleSaysSo() {
        module.close();
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> module.getParameters());
        assertTrue(e.getMessage(), e.getMessage().contains("is closed"));
    }

    /** One Adam step of the MLP classifier (4 features, 3 classes) on fixed rows. */
    private static void stepOnce(TrainingModule mlp, float shift) {
        try (TensorScope scope = new TensorScope()) {
            float[] xs = new float[8 * 4];
            for (int i = 0; i < xs.length; i++) {
                xs[i] = (i % 7) * 0.25f - shift;
            }
            mlp.calculateLossAndBackward(scope.add(Tensor.of(xs, 8, 4)),
                    scope.add(Tensor.of(new long[] {0, 1, 2, 0, 1, 2, 0, 1}, 8)));
            mlp.optimizerStep();
        }
    }

    @Test
    public void aSnapshotSavesTheModulesBytesAndKeepsThemWhileTheModuleTrainsOn() {
        Metadata.Checkpoint checkpoint = Metadata.Checkpoint.progress(1, 0);
        for (String name : new String[] {"linear_regression.pt", "cnn_classifier.pt", "mlp_regressor.pt", "mlp_finetune.pt"}) {
            try (TrainingModule loaded = TrainingModule.load(fixture(name));
                    TrainingModule copy = ModuleAccess.snapshot(loaded).get()) {
                assertArrayEquals(name, ModuleAccess.checkpointArchive(loaded, checkpoint), ModuleAccess.checkpointArchive(copy, checkpoint));
            }
        }
        try (TrainingModule mlp = TrainingModule.load(fixture("mlp_classifier.pt"))) {
            stepOnce(mlp, 0f);
            stepOnce(mlp, 0.5f); // Adam's moments and step count are set
            byte[] now = ModuleAccess.checkpointArchive(mlp, checkpoint);
            try (TrainingModule copy = ModuleAccess.snapshot(mlp).get()) {
                assertArrayEquals(now, ModuleAccess.checkpointArchive(copy, checkpoint));
                stepOnce(mlp, 1f);
                assertArrayEquals(now, ModuleAccess.checkpointArchive(copy, checkpoint));
                assertNotEquals(Arrays.toString(now), Arrays.toString(ModuleAccess.checkpointArchive(mlp, checkpoint)));
                assertEquals(mlp.getMetadata().getParameters().size(), copy.getParameters().size());
            }
        }
    }
}
