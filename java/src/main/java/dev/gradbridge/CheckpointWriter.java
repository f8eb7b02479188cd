package dev.gradbridge;

import java.io.IOException;
import java.nio.file.Path;

/**
 * Saves a loaded module with its current state (parameters, buffers, optimizer state, learning
 * rate: all module attributes) as a TorchScript archive that {@code torch.jit.load} reads, with
 * {@code <archive>/extra/gradbridge.json} written by libtorch's own save ({@link
 * TrainingModule#saveCheckpoint} writes it atomically).
 */
final class CheckpointWriter {

    private CheckpointWriter() {}

    /** Writes the archive to {@code file}, with the metadata at {@code <archive>/extra/gradbridge.json}. */
    static void archive(ModuleEngine module, String metadataJson, Path file) throws IOException {
        module.save(file, Protocol.METADATA_FILE, metadataJson);
    }
}
