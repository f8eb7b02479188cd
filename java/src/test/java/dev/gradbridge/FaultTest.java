package dev.gradbridge;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.internal.AtomicFiles;
import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.data.Dataset;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

/**
 * The Java side of the fault suite (tests/test_faults_*.py has the rest): disk errors name the
 * user's file, killed runs' temp files are removed, resume refuses what would change the run, a
 * diverged run keeps its completed epochs, and data files Java would misread are refused.
 */
public class FaultTest {

    @Rule public TemporaryFolder tmp = new TemporaryFolder();

    private static List<String> names(Path folder) throws IOException {
        try (Stream<Path> files = Files.list(folder)) {
            return files.map(p -> p.getFileName().toString()).sorted().collect(Collectors.toList());
        }
    }

    @Test
    public void fullDiskNamesTheTargetAndLeavesNoTempFile() throws Exception {
        Path target = tmp.getRoot().toPath().resolve("c.pt");
        IOException e =
                assertThrows(IOException.class, () -> AtomicFiles.write(target, tmp -> {
                    Files.write(tmp, new byte[] {1, 2, 3});
                    throw new IOException("No space left on device");
                }));
        assertEquals("cannot write " + target + ": No space left on device", e.getMessage());
        assertEquals(new ArrayList<String>(), names(tmp.getRoot().toPath()));
    }

    @Test
    public void prepareRemovesOnlyThisTargetsLeftovers() throws Exception {
        Path folder = tmp.getRoot().toPath();
        for (String name : new String[] {".c.pt.k3j9x.tmp", ".c.pt.77.raw", ".c.pt1234.tmp", ".c.pt.a1b2c3d4.tmp",
                ".other.pt.k3j9x.tmp", "c.pt.notes"}) {
            Files.write(folder.resolve(name), new byte[0]);
        }
        AtomicFiles.prepare(folder.resolve("c.pt"));
        assertEquals(java.util.Arrays.asList(".other.pt.k3j9x.tmp", "c.pt.notes"), names(folder));
    }

    @Test
    public void unwritablePathIsRefusedNamingIt() throws Exception {
        Path blocker = tmp.newFile("blocker").toPath();
        Path target = blocker.resolve("c.pt");
        InvalidInputException e = assertThrows(InvalidInputException.class, () -> AtomicFiles.prepare(target));
        assertEquals("cannot write " + target + ": " + blocker + " is not a directory", e.getMessage());
    }

    @Test
    public void resumeRefusesAConflictingBatchSizeAndOtherData() throws Exception {
        Path checkpoint = tmp.getRoot().toPath().resolve("run.pt");
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("mlp_classifier.pt"));
                Dataset data = TrainerTest.data(module, 40)) {
            Trainer.builder().optBatchSize(16).optSeed(3).optCheckpoint(checkpoint).build().fit(module, data);
        }
        try (TrainingModule module = TrainingModule.load(checkpoint);
                Dataset data = TrainerTest.data(module, 40);
                Dataset other = TrainerTest.data(module, 41)) {
            Metadata.Checkpoint saved = module.getMetadata().getCheckpoint();
            assertEquals(Integer.valueOf(16), saved.getBatchSize());
            assertEquals("step", saved.getMode());
            assertArrayEquals(new long[] {40, 4}, saved.getXShape());
            InvalidInputException conflict =
                    assertThrows(InvalidInputException.class,
                            () -> Trainer.builder().optBatchSize(8).build().fit(module, data));
            assertTrue(conflict.getMessage(), conflict.getMessage().endsWith(
                    "was trained with batch size 16; resume with the same batch size (or none) to continue the"
                            + " same run, not 8"));
            InvalidInputException different =
                    assertThrows(InvalidInputException.class, () -> Trainer.builder().build().fit(module, other));
            assertTrue(different.getMessage(), different.getMessage().contains("not the data"));
            History resumed = Trainer.builder().build().fit(module, data);
            assertEquals(1, resumed.getRecords().get(0).getEpoch());
        }
    }

    @Test
    public void divergenceKeepsTheCompletedEpochs() throws Exception {
        Path history = tmp.getRoot().toPath().resolve("h.jsonl");
        try (TrainingModule module = TrainingModule.load(TrainingModuleTest.fixture("linear_regression.pt"));
                TensorScope scope = new TensorScope()) {
            float[] xs = new float[50];
            float[] ys = new float[50];
            for (int i = 0; i < xs.length; i++) {
                xs[i] = i * 2f;
                ys[i] = 2 * xs[i] + 1;
            }
            Tensor x = scope.add(Tensor.of(xs, 50, 1));
            Tensor y = scope.add(Tensor.of(ys, 50, 1));
            DivergenceException e =
                    assertThrows(DivergenceException.class, () -> Trainer.builder().optEpochs(60)
                            .optMode(Trainer.Mode.FULL).optHistory(history).build()
                            .fit(module, Dataset.of("exploding", x, y)));
            int completed = e.getHistory().getRecords().size();
            assertTrue("epochs before the divergence: " + completed, completed > 2);
            assertEquals(e.getEpoch(), completed);
            assertEquals(completed, Files.readAllLines(history).size());
        }
    }

    @Test
    public void bigEndianNpyIsRefused() throws Exception {
        Path file = tmp.getRoot().toPath().resolve("x.npy");
        String header = "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 1), }";
        StringBuilder padded = new StringBuilder(header);
        while ((10 + padded.length() + 1) % 64 != 0) {
            padded.append(' ');
        }
        padded.append('\n');
        ByteBuffer bytes = ByteBuffer.allocate(10 + padded.length() + 8).order(ByteOrder.LITTLE_ENDIAN);
        bytes.put(new byte[] {(byte) 0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0});
        bytes.putShort((short) padded.length());
        bytes.put(padded.toString().getBytes(StandardCharsets.ISO_8859_1));
        bytes.order(ByteOrder.BIG_ENDIAN).putFloat(0.805f).putFloat(1.5f);
        Files.write(file, bytes.array());
        InvalidInputException e = assertThrows(InvalidInputException.class, () -> Dataset.loadNpy(file, file));
        assertEquals(Messages.bigEndian(file.toString(), "x", ">f4"), e.getMessage());
        assertFalse(Messages.bigEndian("f", "x", ">f4").contains("\n"));
    }
}
