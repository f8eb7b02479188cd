package dev.gradbridge;

import dev.gradbridge.internal.ModuleAccess;
import dev.gradbridge.internal.GuardedSteps;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.junit.After;
import org.junit.Before;
import org.junit.Test;

/** An MLP classifier with Adam, trained without model-specific Java code. */
public class GeneralModuleTest {

    private static final int N = 24;

    private TrainingModule module;
    private TensorScope data;
    private Tensor x;
    private Tensor y;

    @Before
    public void load() {
        module = TrainingModule.load(TrainingModuleTest.fixture("mlp_classifier.pt"));
        data = new TensorScope();
        Random random = new Random(3);
        float[] xs = new float[N * 4];
        long[] ys = new long[N];
        for (int i = 0; i < N; i++) {
            for (int j = 0; j < 4; j++) {
                xs[i * 4 + j] = (float) random.nextGaussian();
            }
            ys[i] = xs[i * 4] > 0 ? (xs[i * 4 + 1] > 0 ? 2 : 1) : 0;
        }
        x = data.add(Tensor.of(xs, N, 4));
        y = data.add(Tensor.of(ys, N));
    }

    @After
    public void close() {
        module.close();
    }

    @Test
    public void metadataDescribesTheModel() {
        Metadata metadata = module.getMetadata();
        assertEquals("mlp", metadata.getModel());
        assertEquals("cross_entropy", metadata.getLoss().get("name"));
        assertEquals("adam", metadata.getOptimizer().get("name"));
        assertEquals(0.01, (Double) metadata.getOptimizer().get("lr"), 0.0);
        assertEquals(Arrays.asList("0.weight", "0.bias", "2.weight", "2.bias"), module.getParameterNames());
        assertArrayEquals(new long[] {16, 4}, metadata.getParameters().get(0).getShape());
        assertEquals("int64", metadata.getInput("y").getDtype());
        assertEquals(0.01, module.getLr(), 0.0);
    }

    @Test
    public void predictEqualsForwardBitForBit() {
        module.trainStep(x, y); // parameters that are not the file's
        try (Tensor expected = module.forward(x);
                Tensor predicted = module.predict(x);
                Tensor again = module.predict(x)) {
            assertArrayEquals(expected.shape(), predicted.shape());
            assertArrayEquals(expected.toBytes(), predicted.toBytes());
            assertArrayEquals(expected.toBytes(), again.toBytes());
        }
    }

    @Test
    public void gradientsFiniteSeesANonFiniteGradient() {
        module.calculateLossAndBackward(x, y);
        assertTrue(module.gradientsFinite());
        module.zeroGrad();
        float[] poisoned = x.toFloatArray();
        poisoned[5] = Float.NaN;
        module.calculateLossAndBackward(data.add(Tensor.of(poisoned, N, 4)), y);
        assertFalse(module.gradientsFinite());
    }

    @Test
    public void stepWhileFiniteEqualsTrainStepsAndStopsAtANonFiniteBatch() {
        float[] values = x.toFloatArray();
        float[] poisoned = values.clone();
        poisoned[5] = Float.NaN;
        Tensor[] xs = {x, x, data.add(Tensor.of(poisoned, N, 4)), x};
        Tensor[] ys = {y, y, y, y};
        double[] expected = {module.trainStep(x, y), module.trainStep(x, y)};
        Map<String, double[]> stepped = module.getParameters();
        module.close();
        module = TrainingModule.load(TrainingModuleTest.fixture("mlp_classifier.pt"));

        GuardedSteps steps = ModuleAccess.stepWhileFinite(module, xs, ys);
        assertEquals(2, steps.stepped());
        assertFalse(steps.complete());
        assertEquals(null, steps.failure());
        assertEquals(Double.doubleToRawLongBits(expected[0]), Double.doubleToRawLongBits(steps.loss(0)));
        assertEquals(Double.doubleToRawLongBits(expected[1]), Double.doubleToRawLongBits(steps.loss(1)));
        assertTrue(Double.isNaN(steps.loss(2)));
        for (Map.Entry<String, double[]> e : module.getParameters().entrySet()) {
            assertArrayEquals(e.getKey(), stepped.get(e.getKey()), e.getValue(), 0.0);
        }
        assertFalse(module.gradientsFinite()); // left for the caller to explain
        module.zeroGrad();
        assertTrue(ModuleAccess.stepWhileFinite(module, new Tensor[] {x}, new Tensor[] {y}).complete());
    }

    @Test
    public void trainStepsLowerTheLoss() {
        double first = module.trainStep(x, y);
        double last = first;
        for (int i = 0; i < 60; i++) {
            last = module.trainStep(x, y);
        }
        assertTrue(first + " -> " + last, last < 0.5 * first);
        Map<String, List<double[]>> state = module.getOptimizerState();
        assertEquals(61.0, state.get("step").get(0)[0], 0.0);
        assertEquals(16 * 4, state.get("exp_avg").get(0).length);
    }

    @Test
    public void trainEpochEqualsTheSameBatchesStepped() {
        TrainingModule twin = TrainingModule.load(module.getPath());
        try {
            long[] order = {5, 3, 0, 1, 2, 4, 23, 22, 21, 20, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
            Tensor perm = data.add(Tensor.of(order, order.length));
            double[] fused = module.trainEpoch(x, y, perm, 10);
            assertEquals(3, fused.length);
            for (int start = 0, b = 0; start < N; start += 10, b++) {
                Tensor index = data.add(Tensor.of(Arrays.copyOfRange(order, start, Math.min(start + 10, N)), Math.min(start + 10, N) - start));
                double stepped = twin.trainStep(data.add(x.index(index)), data.add(y.index(index)));
                assertEquals("batch " + b, fused[b], stepped, 0.0);
            }
            assertEquals(module.getParameters().keySet(), twin.getParameters().keySet());
            for (String name : module.getParameterNames()) {
                assertArrayEquals(name, module.getParameters().get(name), twin.getParameters().get(name), 0.0);
            }
        } finally {
            twin.close();
        }
    }

    @Test
    public void evaluateLeavesParametersAlone() {
        Map<String, double[]> before = module.getParameters();
        double loss = module.evaluate(x, y);
        assertTrue(loss > 0);
        assertArrayEquals(before.get("0.weight"), module.getParameters().get("0.weight"), 0.0);
        assertEquals(loss, module.evaluate(x, y), 0.0);
    }

    @Test
    public void badEpochArgumentsAreNamed() {
        Tensor floats = data.add(Tensor.of(new float[N], N));
        InvalidInputException dtype =
                assertThrows(InvalidInputException.class, () -> module.trainEpoch(x, y, floats, 4));
        assertTrue(dtype.getMessage(), dtype.getMessage().contains("perm must be a 1-d int64 array"));
        Tensor outside = data.add(Tensor.of(new long[] {0, 1, 99}, 3));
        InvalidInputException range =
                assertThrows(InvalidInputException.class, () -> module.trainEpoch(x, y, outside, 2));
        assertTrue(range.getMessage(), range.getMessage().contains("perm holds index 99, outside 0..23"));
        Tensor perm = data.add(Tensor.arange(N));
        InvalidInputException size =
                assertThrows(InvalidInputException.class, () -> module.trainEpoch(x, y, perm, 0));
        assertTrue(size.getMessage(), size.getMessage().contains("batch size must be in 1..24, got 0"));
    }

    @Test
    public void floatTargetsAreRejectedForCrossEntropy() {
        Tensor floats = data.add(Tensor.of(new float[N], N));
        InvalidInputException e =
                assertThrows(InvalidInputException.class, () -> module.trainStep(x, floats));
        assertTrue(e.getMessage(), e.getMessage().contains("input y must be int64 of shape [-1]"));
    }

    @Test
    public void setParametersChecksNamesAndSizes() {
        Map<String, double[]> values = new LinkedHashMap<>(module.getParameters());
        values.put("0.bias", new double[3]);
        InvalidInputException e =
                assertThrows(InvalidInputException.class, () -> module.setParameters(values));
        assertTrue(e.getMessage(), e.getMessage().contains("0.bias needs 16 values for shape (16), got 3"));
        values.put("0.bias", new double[16]);
        module.setParameters(values);
        assertArrayEquals(new double[16], module.getParameters().get("0.bias"), 0.0);
    }
}
