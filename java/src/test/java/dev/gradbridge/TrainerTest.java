package dev.gradbridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.data.Dataset;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class TrainerTest {

    @Rule public TemporaryFolder tmp = new TemporaryFolder();

    /** A model fixture, how to make its data, and how to train it. */
    private static final class Run {
        final String model;
        final Trainer.Mode mode;
        final int batch;

        Run(String model, Trainer.Mode mode, int batch) {
            this.model = model;
            this.mode = mode;
            this.batch = batch;
        }

        /** Trains a fresh copy of the model; returns the history without wall times. */
        List<String> train(int epochs) throws Exception {
            try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture(model));
                    Dataset data = data(module, 60)) {
                History history =
                        Trainer.builder().optEpochs(epochs).optBatchSize(batch).optMode(mode).optSeed(11).build()
                                .fit(module, data);
                return comparable(history);
            }
        }
    }

    static List<String> comparable(History history) {
        List<String> lines = new ArrayList<>();
        for (History.EpochRecord r : history.getRecords()) {
            lines.add(r.getEpoch() + " " + r.getLoss() + " " + r.getValLoss() + " " + r.getDigests());
        }
        return lines;
    }

    /** Deterministic random data shaped for the module's metadata. */
    static Dataset data(TrainingModule module, int n) {
        TensorScope manager = new TensorScope();
        Random random = new Random(n);
        long[] xShape = module.getMetadata().getInput("x").getShape();
        xShape[0] = n;
        float[] xs = new float[(int) java.util.Arrays.stream(xShape).reduce(1, (a, b) -> a * b)];
        for (int i = 0; i < xs.length; i++) {
            xs[i] = (float) random.nextGaussian();
        }
        Tensor x = manager.add(Tensor.of(xs, xShape));
        Metadata.TensorSpec ySpec = module.getMetadata().getInput("y");
        long[] yShape = ySpec.getShape();
        yShape[0] = n;
        Tensor y;
        if ("int64".equals(ySpec.getDtype())) {
            long[] ys = new long[n];
            for (int i = 0; i < n; i++) {
                ys[i] = random.nextInt(3);
            }
            y = manager.add(Tensor.of(ys, yShape));
        } else {
            float[] ys = new float[n];
            for (int i = 0; i < n; i++) {
                ys[i] = (float) random.nextGaussian();
            }
            y = manager.add(Tensor.of(ys, yShape));
        }
        return Dataset.of("random " + module.getPath().getFileName(), x, y);
    }

    private static final Run[] RUNS = {
        new Run("linear_regression.pt", Trainer.Mode.FULL, 0),
        new Run("mlp_classifier.pt", Trainer.Mode.STEP, 16),
        new Run("cnn_classifier.pt", Trainer.Mode.FUSED, 20),
        new Run("mlp_regressor.pt", Trainer.Mode.STEP, 7),
    };

    @Test
    public void fourThreadsFourModelsEqualSerialRuns() throws Exception {
        List<List<String>> serial = new ArrayList<>();
        for (Run run : RUNS) {
            serial.add(run.train(4));
        }
        ExecutorService pool = Executors.newFixedThreadPool(RUNS.length);
        try {
            List<Future<List<String>>> parallel = new ArrayList<>();
            CountDownLatch start = new CountDownLatch(1);
            for (Run run : RUNS) {
                parallel.add(pool.submit(() -> {
                    start.await();
                    return run.train(4);
                }));
            }
            start.countDown();
            for (int i = 0; i < RUNS.length; i++) {
                assertEquals(RUNS[i].model, serial.get(i), parallel.get(i).get(5, TimeUnit.MINUTES));
            }
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void overlappingUseFromTwoThreadsIsRefusedAndHarmless() throws Exception {
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("mlp_classifier.pt"))) {
            double[] before = module.getParameters().get("0.weight");
            CountDownLatch inside = new CountDownLatch(1);
            CountDownLatch release = new CountDownLatch(1);
            Thread holder = new Thread(() -> {
                try (ThreadGuard.Use use = module.use()) {
                    inside.countDown();
                    release.await();
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }, "holder");
            holder.start();
            inside.await();
            ConcurrentUseException e =
                    assertThrows(ConcurrentUseException.class, () -> module.setLr(123.0));
            assertTrue(e.getMessage(), e.getMessage().contains("is in use by thread 'holder'"));
            release.countDown();
            holder.join();
            assertEquals(0.01, module.getLr(), 0.0);
            assertArrayEquals(before, module.getParameters().get("0.weight"), 0.0);
        }
    }

    @Test
    public void threePlusFourEpochsEqualSevenAndTheCheckpointLoads() throws Exception {
        Run run = RUNS[1];
        List<String> seven = run.train(7);
        Path checkpoint = tmp.getRoot().toPath().resolve("run.pt");
        List<String> resumed = new ArrayList<>();
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture(run.model));
                Dataset data = data(module, 60)) {
            Trainer trainer = Trainer.builder().optEpochs(3).optBatchSize(run.batch).optSeed(11)
                    .optCheckpoint(checkpoint).build();
            resumed.addAll(comparable(trainer.fit(module, data)));
        }
        try (TrainingModule module = TrainingModule.load(checkpoint);
                Dataset data = data(module, 60)) {
            assertEquals(3, module.getMetadata().getCheckpoint().getEpochsCompleted());
            assertEquals(11, module.getMetadata().getCheckpoint().getSeed());
            InvalidInputException e = assertThrows(InvalidInputException.class,
                    () -> Trainer.builder().optSeed(12).build().fit(module, data));
            assertTrue(e.getMessage(), e.getMessage().contains("was trained with seed 11"));
            resumed.addAll(comparable(
                    Trainer.builder().optEpochs(4).optBatchSize(run.batch).build().fit(module, data)));
        }
        assertEquals(seven, resumed);
    }

    @Test
    public void divergenceNamesEpochAndBatchAndKeepsTheLastGoodCheckpoint() throws Exception {
        Path checkpoint = tmp.getRoot().toPath().resolve("diverging.pt");
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("linear_regression.pt"));
                Dataset data = data(module, 40)) {
            Trainer.builder().optEpochs(2).optBatchSize(8).optCheckpoint(checkpoint).build().fit(module, data);
            byte[] good = Files.readAllBytes(checkpoint);
            module.setLr(1e20); // the first step throws the parameters far out; the next loss overflows
            Trainer trainer = Trainer.builder().optEpochs(10).optBatchSize(8).optCheckpoint(checkpoint).build();
            DivergenceException e = assertThrows(DivergenceException.class, () -> trainer.fit(module, data));
            assertTrue(e.getMessage(), e.getMessage().matches(
                    "loss is (NaN|Infinity) at epoch 0, batch 1 \\(samples 8\\.\\.15 of the epoch's order\\).*"));
            assertTrue(e.getMessage(), e.getMessage().endsWith(checkpoint + " holds the last good epoch, if one finished"));
            assertEquals(0, e.getEpoch());
            assertEquals(1, e.getBatch());
            assertArrayEquals("the checkpoint is untouched", good, Files.readAllBytes(checkpoint));
        }
        try (TrainingModule saved = TrainingModule.load(checkpoint)) {
            assertEquals(2, saved.getMetadata().getCheckpoint().getEpochsCompleted());
        }
    }

    @Test
    public void batchSizeOutsideTheDataIsRefused() throws Exception {
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("mlp_classifier.pt"));
                Dataset data = data(module, 10)) {
            InvalidInputException e = assertThrows(InvalidInputException.class,
                    () -> Trainer.builder().optBatchSize(11).build().fit(module, data));
            assertTrue(e.getMessage(), e.getMessage().contains("batch size must be in 1..10"));
        }
    }
}
