package dev.gradbridge;

import dev.gradbridge.internal.FrozenTensors;
import dev.gradbridge.internal.GuardedSteps;
import dev.gradbridge.internal.ModuleAccess;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Optional;

/** {@link ModuleAccess}'s calls: the library's other packages reach {@link TrainingModule}'s internals through them. */
final class ModuleAccessCalls implements ModuleAccess.Calls {

    @Override
    public GuardedSteps stepWhileFinite(TrainingModule module, Tensor[] xs, Tensor[] ys) {
        try (ThreadGuard.Use use = module.use()) {
            if (xs.length != ys.length) {
                throw new InvalidInputException(Protocol.TRAIN_STEP + ": " + xs.length + " x batches but " + ys.length
                        + " y batches");
            }
            for (int i = 0; i < xs.length; i++) {
                module.calls.checkBatch(Protocol.TRAIN_STEP, xs[i], ys[i]);
            }
            double[] losses = new double[xs.length];
            MethodCallException[] failure = new MethodCallException[1];
            int stepped = module.scripted.stepWhileFinite(xs, ys, losses, failure);
            return new GuardedSteps(stepped, xs.length, losses, failure[0]);
        }
    }

    @Override
    public Optional<TrainingModule> snapshot(TrainingModule module) {
        try (ThreadGuard.Use use = module.use()) {
            ModuleEngine copy = module.scripted.snapshot();
            if (copy == null) {
                return Optional.empty();
            }
            try {
                return Optional.of(new TrainingModule(module.path, module.metadata, copy));
            } catch (RuntimeException e) {
                copy.close();
                throw e;
            }
        }
    }

    @Override
    public byte[] checkpointArchive(TrainingModule module, Metadata.Checkpoint checkpoint) {
        try {
            Path file = Files.createTempFile("gradbridge-checkpoint", ".pt");
            try {
                archive(module, checkpoint, file);
                return Files.readAllBytes(file);
            } finally {
                Files.deleteIfExists(file);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Writes what {@link TrainingModule#saveCheckpoint} writes to {@code file}. */
    static void archive(TrainingModule module, Metadata.Checkpoint checkpoint, Path file) throws IOException {
        try (ThreadGuard.Use use = module.use()) {
            CheckpointWriter.archive(module.scripted, module.metadata.withCheckpoint(checkpoint), file);
        }
    }

    @Override
    public ModuleAccess.BareCall bareTrainStep(Path model, Tensor x, Tensor y) {
        TorchScriptEngine module = TorchScriptEngine.load(model.toAbsolutePath(), Devices.CPU);
        return new ModuleAccess.BareCall() {
            @Override
            public void run() {
                module.invokeToDouble(Protocol.TRAIN_STEP, x, y);
            }

            @Override
            public void close() {
                module.close();
            }
        };
    }

    @Override
    public void keepEvalMode(TrainingModule module) {
        try (ThreadGuard.Use use = module.use()) {
            module.calls.keepEvalMode();
        }
    }

    @Override
    public FrozenTensors frozen(TrainingModule module) {
        return FrozenSharing.frozen(module);
    }

    @Override
    public int share(TrainingModule module, FrozenTensors frozen) {
        return FrozenSharing.share(module, frozen);
    }

    @Override
    public int leaveOut(TrainingModule module) {
        return FrozenSharing.leaveOut(module);
    }

    @Override
    public void manualSeed(long seed) {
        ModuleEngine.seed(seed);
    }

    @Override
    public int intraOpThreads() {
        NativeLibrary.load();
        return Native.getNumThreads();
    }

    @Override
    public int interopThreads() {
        NativeLibrary.load();
        return Native.getNumInteropThreads();
    }

    @Override
    public void setIntraOpThreads(int threads) {
        NativeLibrary.load();
        Native.setNumThreads(threads);
    }

    @Override
    public String nativeMemory() {
        return NativeMemory.describe();
    }

    @Override
    public History.EpochRecord epochRecord(TrainingModule module, int epoch, double loss, Double valLoss,
            double elapsedSeconds, boolean withValues) {
        return History.record(module, epoch, loss, valLoss, elapsedSeconds, withValues);
    }
}
