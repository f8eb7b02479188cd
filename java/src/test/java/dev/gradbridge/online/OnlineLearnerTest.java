package dev.gradbridge.online;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.internal.Messages;
import dev.gradbridge.TrainingModule;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.List;
import java.util.concurrent.TimeUnit;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/** OnlineLearner on the modules the build exported (task exportTestModels). */
public class OnlineLearnerTest {

    @Rule public TemporaryFolder folder = new TemporaryFolder();

    static Path fixture(String name) {
        String dir = System.getProperty("gradbridge.testModels");
        if (dir == null) {
            throw new IllegalStateException("run through Gradle: -Dgradbridge.testModels is not set");
        }
        return Paths.get(dir, name);
    }

    private static HostTensor column(float... values) {
        return HostTensor.ofFloats(values, values.length, 1);
    }

    private static float[] ramp(int n, float scale, float shift) {
        float[] values = new float[n];
        for (int i = 0; i < n; i++) {
            values[i] = scale * (i % 17) / 17f + shift;
        }
        return values;
    }

    @Test
    public void aFullQueueRefusesFeedbackVisiblyAndCloseDrainsIt() throws IOException {
        Path log = folder.newFolder().toPath();
        OnlineLearner learner = OnlineLearner.builder().optMaxBatch(1000).optMaxWaitMillis(60_000)
                .optQueueCapacity(6).optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .open(fixture("linear_regression.pt"), log);
        try {
            assertEquals(0, learner.learn(column(1, 2, 3, 4), column(2, 4, 6, 8)));
            LearnerStats before = learner.stats();
            QueueFullException full =
                    assertThrows(QueueFullException.class, () -> learner.learn(column(5, 6, 7), column(1, 1, 1)));
            assertEquals("the feedback queue is full (4 of 6 events waiting); retry later", full.getMessage());
            assertEquals(4, learner.learn(column(5, 6), column(10, 12)));
            LearnerStats after = learner.stats();
            assertEquals(6, after.getQueueDepth());
            assertEquals(3, after.getRefusedEvents());
            assertEquals(6, after.getAcceptedEvents());
            assertEquals("a snapshot: later feedback does not change it", 4, before.getQueueDepth());
            assertEquals(0, before.getRefusedEvents());
            assertEquals(0, learner.currentVersion().getId());
            assertNull("phase timing is off unless asked for", learner.phaseTimes());
        } finally {
            learner.close();
        }
        LogReader.Contents contents = LogReader.read(LogReader.file(log), 0);
        long events = contents.getRecords().stream().filter(r -> r instanceof LogRecord.Event).count();
        assertEquals("refused events are not logged", 6, events);
        LogRecord.Batch batch = (LogRecord.Batch) contents.getRecords().stream()
                .filter(r -> r instanceof LogRecord.Batch).findFirst().get();
        assertEquals(6, batch.getCount());
        assertTrue(Files.isRegularFile(log.resolve(OnlineLearner.CHECKPOINT_FILE)));
    }

    @Test
    public void learnWithATimeoutWaitsForRoomInsteadOfRefusing() throws Exception {
        Path log = folder.newFolder().toPath();
        try (OnlineLearner learner = OnlineLearner.builder().optMaxBatch(1000).optMaxWaitMillis(300)
                .optQueueCapacity(4).optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .open(fixture("linear_regression.pt"), log)) {
            long started = System.nanoTime();
            learner.learn(column(1, 2, 3, 4), column(2, 4, 6, 8)); // full; the trainer waits 300 ms for more
            assertThrows(QueueFullException.class,
                    () -> learner.offer(column(5), column(10), null, 10, TimeUnit.MILLISECONDS));
            assertEquals(4, learner.offer(column(5, 6), column(10, 12), null, 10, TimeUnit.SECONDS).getFirstSeq());
            long waitedMillis = (System.nanoTime() - started) / 1_000_000;
            assertTrue("waited " + waitedMillis + " ms for the trainer to take the first 4", waitedMillis >= 250);
            assertTrue(learner.awaitIdle(10, TimeUnit.SECONDS));
            assertEquals(2, learner.stats().getUpdates());
            assertEquals(1, learner.stats().getRefusedEvents());
        }
    }

    @Test
    public void badFeedbackIsRefusedBeforeAnythingIsLogged() throws IOException {
        Path log = folder.newFolder().toPath();
        try (OnlineLearner learner = OnlineLearner.builder().optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .open(fixture("linear_regression.pt"), log)) {
            InvalidInputException shape = assertThrows(InvalidInputException.class,
                    () -> learner.learn(HostTensor.ofFloats(new float[] {1, 2}, 1, 2), column(1)));
            assertEquals(Messages.tensorSpec("", "input x", "float32", new long[] {-1, 1}, "float32", new long[] {1, 2}),
                    shape.getMessage());
            assertThrows(InvalidInputException.class,
                    () -> learner.learn(HostTensor.ofDoubles(new double[] {1}, 1, 1), column(1)));
            assertThrows(InvalidInputException.class, () -> learner.learn(column(Float.NaN), column(1)));
            assertThrows(InvalidInputException.class, () -> learner.predict(HostTensor.ofLongs(new long[] {1}, 1, 1)));
            assertEquals(0, learner.stats().getAcceptedEvents());
        }
        assertEquals(0, LogReader.read(LogReader.file(log), 0).getRecords().stream()
                .filter(r -> r instanceof LogRecord.Event).count());
    }

    @Test
    public void versionsOfABatchNormModuleCarryTheBuffersTrainingWrites() throws Exception {
        try (OnlineLearner learner = OnlineLearner.builder().optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .open(fixture("cnn_classifier.pt"), folder.newFolder().toPath())) {
            java.util.List<String> trained = learner.getMetadata().getTrainedBufferNames();
            assertFalse(trained.isEmpty()); // BatchNorm's running statistics (tests/test_online_real_models.py trains them)
            assertTrue(learner.currentVersion().getDigests().keySet().containsAll(trained));
        }
    }

    @Test
    public void predictionsRunOnTheReportedVersion() throws Exception {
        Path log = folder.newFolder().toPath();
        try (OnlineLearner learner = OnlineLearner.builder().optMaxBatch(4).optMaxWaitMillis(0).optPublishEvery(1)
                .optPredictors(2).optFsync(FsyncPolicy.NEVER).open(fixture("linear_regression.pt"), log);
                TrainingModule check = TrainingModule.load(fixture("linear_regression.pt"))) {
            Prediction before = learner.predict(column(2f));
            assertEquals(0, before.getVersion());
            learner.learn(column(1, 2, 3, 4), column(3, 5, 7, 9));
            assertTrue(learner.awaitIdle(10, TimeUnit.SECONDS));
            ModelVersion version = learner.currentVersion();
            assertEquals(1, version.getId());
            Prediction after = learner.predict(column(2f));
            assertEquals(1, after.getVersion());
            assertNotEquals(before.getOutput().toFloatArray()[0], after.getOutput().toFloatArray()[0], 0f);
            // The same parameters in another module give the same bits.
            java.util.Map<String, double[]> params = new java.util.LinkedHashMap<>();
            for (String name : check.getParameterNames()) {
                params.put(name, version.getParameter(name));
            }
            check.setParameters(params);
            try (dev.gradbridge.TensorScope scope = new dev.gradbridge.TensorScope()) {
                float[] expected = scope.add(check.forward(scope.add(dev.gradbridge.Tensor.of(new float[] {2f}, 1, 1))))
                        .toFloatArray();
                assertArrayEquals(expected, after.getOutput().toFloatArray(), 0f);
            }
        }
    }

    @Test
    public void awaitIdleUnderGroupCommitWaitsForThePublishedVersion() throws Exception {
        // fsync always: versions are published by the log's commit thread after the shared fsync,
        // so awaitIdle must also wait for actions that thread has taken but not yet run.
        Path log = folder.newFolder().toPath();
        try (OnlineLearner learner = OnlineLearner.builder().optMaxBatch(4).optMaxWaitMillis(0).optPublishEvery(1)
                .optPredictors(1).optFsync(FsyncPolicy.ALWAYS).optGroupCommitMillis(20)
                .open(fixture("linear_regression.pt"), log)) {
            for (int i = 1; i <= 5; i++) {
                learner.learn(column(1, 2, 3, 4), column(3, 5, 7, 9));
                assertTrue(learner.awaitIdle(10, TimeUnit.SECONDS));
                assertEquals(i, learner.currentVersion().getId());
            }
        }
    }

    @Test
    public void checkpointPlusLogTailEqualsReplayingTheWholeLog() throws Exception {
        Path log = folder.newFolder().toPath();
        float[] xs = ramp(48, 2f, -1f);
        float[] ys = ramp(48, 6f, -2.5f);
        OnlineLearnerBuilder options = OnlineLearner.builder().optMaxBatch(3).optMaxWaitMillis(0).optPublishEvery(2)
                .optCheckpointEvery(3).optPredictors(1).optFsync(FsyncPolicy.ALWAYS);
        OnlineLearner first = options.open(fixture("linear_regression.pt"), log);
        for (int i = 0; i < 36; i += 3) {
            first.learn(column(xs[i], xs[i + 1], xs[i + 2]), column(ys[i], ys[i + 1], ys[i + 2]));
            assertTrue(first.awaitIdle(10, TimeUnit.SECONDS));
        }
        first.halt(); // 12 micro-batches, versions 1..6, checkpoint at version 6
        assertTrue(new String(Files.readAllBytes(log.resolve(OnlineLearner.CHECKPOINT_FILE)), "UTF-8")
                .contains("\"version\":6"));
        ModelVersion atHalt = first.currentVersion();

        OnlineLearner second = options.open(fixture("linear_regression.pt"), log);
        assertEquals(atHalt.getDigests(), second.currentVersion().getDigests());
        assertEquals(atHalt.getId(), second.currentVersion().getId());
        for (int i = 36; i < 48; i += 3) {
            second.learn(column(xs[i], xs[i + 1], xs[i + 2]), column(ys[i], ys[i + 1], ys[i + 2]));
            assertTrue(second.awaitIdle(10, TimeUnit.SECONDS));
        }
        second.halt(); // 16 micro-batches, version 8: after the checkpoint at version 6
        ModelVersion resumedRun = second.currentVersion();
        assertEquals(8, resumedRun.getId());

        // Without checkpoint.json the learner replays the whole log from the exported module.
        Path copy = folder.newFolder().toPath();
        Files.copy(log.resolve(LogFormat.FILE_NAME), copy.resolve(LogFormat.FILE_NAME));
        try (OnlineLearner fromScratch = options.open(fixture("linear_regression.pt"), copy)) {
            assertEquals(resumedRun.getId(), fromScratch.currentVersion().getId());
            assertEquals(resumedRun.getDigests(), fromScratch.currentVersion().getDigests());
            assertEquals(16, fromScratch.stats().getUpdates());
        }
        // And from the checkpoint: the logged versions after it are reproduced (else opening fails).
        try (OnlineLearner fromCheckpoint = options.open(fixture("linear_regression.pt"), log)) {
            assertEquals(resumedRun.getDigests(), fromCheckpoint.currentVersion().getDigests());
        }
        List<LogRecord> records = LogReader.read(LogReader.file(log), 0).getRecords();
        assertEquals(16, records.stream().filter(r -> r instanceof LogRecord.Batch).count());
    }

    @Test
    public void aBacklogIsAppliedWithTheSameResultAsOneEventPairAtATime() throws Exception {
        float[] xs = ramp(40, 2f, -1f);
        float[] ys = ramp(40, 6f, -2.5f);
        // The learner whose queue holds the 40 events at once (maxWait 0 keeps the trainer from
        // waiting): micro-batches of 2, a version every 4, so up to 4 micro-batches per
        // train_epoch call; and a learner fed 2 events at a time, one train_step each.
        Path fusedLog = folder.newFolder().toPath();
        Path stepLog = folder.newFolder().toPath();
        OnlineLearnerBuilder fusedOptions = OnlineLearner.builder().optMaxBatch(2).optMaxWaitMillis(0)
                .optPublishEvery(4).optCheckpointEvery(1000).optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .optTimePhases(true);
        java.util.List<ModelVersion> fusedVersions = new java.util.ArrayList<>();
        try (OnlineLearner fused = fusedOptions.open(fixture("linear_regression.pt"), fusedLog)) {
            fused.learn(column(xs), column(ys));
            assertTrue(fused.awaitIdle(30, TimeUnit.SECONDS));
            assertEquals(20, fused.stats().getUpdates());
            assertEquals(5, fused.currentVersion().getId());
            fusedVersions.add(fused.currentVersion());
            // Every micro-batch waiting, up to the next version, in one native call.
            assertEquals(5L, (long) fused.phaseTimes().counts().get("train_step"));
            fused.halt();
        }
        java.util.Map<Long, ModelVersion> stepVersions = new java.util.HashMap<>();
        try (OnlineLearner stepwise = OnlineLearner.builder().optMaxBatch(2).optMaxWaitMillis(0).optPublishEvery(1)
                .optCheckpointEvery(1000).optPredictors(1).optFsync(FsyncPolicy.NEVER)
                .open(fixture("linear_regression.pt"), stepLog)) {
            for (int i = 0; i < 40; i += 2) {
                stepwise.learn(column(xs[i], xs[i + 1]), column(ys[i], ys[i + 1]));
                assertTrue(stepwise.awaitIdle(30, TimeUnit.SECONDS));
                stepVersions.put(stepwise.stats().getUpdates(), stepwise.currentVersion());
            }
        }
        ModelVersion last = fusedVersions.get(0);
        assertEquals(20, last.getUpdates());
        assertEquals(stepVersions.get(20L).getDigests(), last.getDigests());
        for (String name : last.getDigests().keySet()) {
            assertArrayEquals(stepVersions.get(20L).getParameter(name), last.getParameter(name), 0.0);
        }
        // The log holds 20 micro-batches of 2 and a version every 4 updates whose digests are
        // those of the one-by-one run.
        List<LogRecord> records = LogReader.read(LogReader.file(fusedLog), 0).getRecords();
        long index = 0;
        for (LogRecord record : records) {
            if (record instanceof LogRecord.Batch) {
                LogRecord.Batch batch = (LogRecord.Batch) record;
                assertEquals(index, batch.getIndex());
                assertEquals(2 * index, batch.getFirstSeq());
                assertEquals(2, batch.getCount());
                index++;
            } else if (record instanceof LogRecord.Version && ((LogRecord.Version) record).getUpdates() > 0) {
                LogRecord.Version version = (LogRecord.Version) record;
                assertEquals(0, version.getUpdates() % 4);
                assertEquals(stepVersions.get(version.getUpdates()).getDigests(), version.getDigests());
            }
        }
        assertEquals(20, index);
        // Resuming applies the logged micro-batches one by one and checks every logged version.
        try (OnlineLearner resumed = fusedOptions.open(fixture("linear_regression.pt"), fusedLog)) {
            assertEquals(last.getDigests(), resumed.currentVersion().getDigests());
        }
    }

    @Test
    public void aRefusalInsideOneNativeCallIsLoggedInOrderAndReplayedAlike() throws Exception {
        float[] xs = ramp(12, 2f, -1f);
        float[] ys = ramp(12, 6f, -2.5f);
        ys[4] = 3e38f; // micro-batch 2 of 6: an infinite loss, quarantined
        Path log = folder.newFolder().toPath();
        OnlineLearnerBuilder options = OnlineLearner.builder().optMaxBatch(2).optMaxWaitMillis(0).optPublishEvery(4)
                .optCheckpointEvery(1000).optPredictors(1).optFsync(FsyncPolicy.NEVER).optValidateTargets(false)
                .optTimePhases(true);
        ModelVersion fusedVersion;
        try (OnlineLearner fused = options.open(fixture("linear_regression.pt"), log)) {
            fused.learn(column(xs), column(ys));
            assertTrue(fused.awaitIdle(30, TimeUnit.SECONDS));
            assertEquals(5, fused.stats().getUpdates());
            assertEquals(1, fused.stats().getQuarantinedBatches());
            // Taken up to the version (4): 2 applied and 1 refused in one call, the 4th in a second;
            // then the 5th (the version) and the 6th.
            assertEquals(4L, (long) fused.phaseTimes().counts().get("train_step"));
            fusedVersion = fused.currentVersion();
            assertEquals(4, fusedVersion.getUpdates());
            fused.halt();
        }
        StringBuilder order = new StringBuilder();
        for (LogRecord record : LogReader.read(LogReader.file(log), 0).getRecords()) {
            if (record instanceof LogRecord.Batch) {
                LogRecord.Batch batch = (LogRecord.Batch) record;
                order.append(" B").append(batch.getIndex()).append('@').append(batch.getFirstSeq());
            } else if (record instanceof LogRecord.Quarantine) {
                LogRecord.Quarantine quarantine = (LogRecord.Quarantine) record;
                order.append(" Q").append(quarantine.getIndex()).append('@').append(quarantine.getFirstSeq());
                assertTrue(quarantine.getReason(), quarantine.getReason().startsWith("loss is"));
            } else if (record instanceof LogRecord.Version && ((LogRecord.Version) record).getUpdates() > 0) {
                order.append(" V").append(((LogRecord.Version) record).getUpdates());
            }
        }
        assertEquals(" B0@0 B1@2 B2@4 Q2@4 B2@6 B3@8 V4 B4@10", order.toString());

        // One micro-batch per call, one learn per micro-batch: the same version, bit for bit.
        Path stepLog = folder.newFolder().toPath();
        // (A norm limit no update reaches takes the one-call-per-micro-batch path.)
        OnlineLearnerBuilder stepOptions = OnlineLearner.builder().optMaxBatch(2).optMaxWaitMillis(0).optPublishEvery(4)
                .optCheckpointEvery(1000).optPredictors(1).optFsync(FsyncPolicy.NEVER).optValidateTargets(false)
                .optMaxGradNorm(1e30);
        try (OnlineLearner stepwise = stepOptions.open(fixture("linear_regression.pt"), stepLog)) {
            for (int i = 0; i < 12; i += 2) {
                stepwise.learn(column(xs[i], xs[i + 1]), column(ys[i], ys[i + 1]));
                assertTrue(stepwise.awaitIdle(30, TimeUnit.SECONDS));
            }
            assertEquals(1, stepwise.stats().getQuarantinedBatches());
            assertEquals(4, stepwise.currentVersion().getUpdates());
            assertEquals(fusedVersion.getDigests(), stepwise.currentVersion().getDigests());
        }
        // Recovery re-applies the log and reproduces its version and its quarantine (else it fails).
        try (OnlineLearner resumed = options.open(fixture("linear_regression.pt"), log)) {
            assertEquals(5, resumed.stats().getUpdates());
        }
    }

    @Test
    public void versionDigestsAreHistoryDigests() {
        ParameterDigests digests = new ParameterDigests();
        java.util.Random random = new java.util.Random(3);
        for (int n : new int[] {0, 1, 7, 1000, 3}) {
            double[] floats = new double[n];
            double[] doubles = new double[n];
            double[] longs = new double[n];
            for (int i = 0; i < n; i++) {
                floats[i] = (float) random.nextGaussian();
                doubles[i] = random.nextGaussian();
                longs[i] = random.nextInt(1000) - 500;
            }
            assertEquals(dev.gradbridge.History.digest(floats, "float32"), digests.digest(floats, "float32"));
            assertEquals(dev.gradbridge.History.digest(doubles, "float64"), digests.digest(doubles, "float64"));
            assertEquals(dev.gradbridge.History.digest(longs, "int64"), digests.digest(longs, "int64"));
        }
    }
}
