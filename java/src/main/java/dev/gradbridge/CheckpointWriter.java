package dev.gradbridge;

import java.io.IOException;
import java.nio.file.Path;

/**
 * Saves a loaded module with its current state (parameters, buffers, optimizer state, learning
 * rate: all module attributes) as a TorchScript archive that {@code torch.jit.load} reads, with
 * {@code <archive>/extra/gradbridge.json} written by libtorch's own save. The result replaces the
 * target atomically.
 */
final class CheckpointWriter {

    private CheckpointWriter() {}

    static void write(ScriptedModule module, String metadataJson, Path target) throws IOException {
        AtomicFiles.write(target, module.save(Protocol.METADATA_FILE, metadataJson));
    }
}
