package dev.gradbridge;

/**
 * Saves a loaded module with its current state (parameters, buffers, optimizer state, learning
 * rate: all module attributes) as a TorchScript archive that {@code torch.jit.load} reads, with
 * {@code <archive>/extra/gradbridge.json} written by libtorch's own save ({@link
 * TrainingModule#saveCheckpoint} writes it atomically).
 */
final class CheckpointWriter {

    private CheckpointWriter() {}

    /** @return the archive's bytes, with the metadata at {@code <archive>/extra/gradbridge.json} */
    static byte[] archive(ScriptedModule module, String metadataJson) {
        return module.save(Protocol.METADATA_FILE, metadataJson);
    }
}
