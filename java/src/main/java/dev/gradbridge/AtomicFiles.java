package dev.gradbridge;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/** Writes that never leave a half-written file: a temporary file beside the target, then a rename. */
final class AtomicFiles {

    /** Fills a temporary file. */
    interface Writer {
        void writeTo(Path tmp) throws IOException;
    }

    private AtomicFiles() {}

    static void write(Path path, byte[] content) throws IOException {
        write(path, tmp -> Files.write(tmp, content));
    }

    static void write(Path path, Writer writer) throws IOException {
        Path target = path.toAbsolutePath();
        Files.createDirectories(target.getParent());
        Path tmp = Files.createTempFile(target.getParent(), "." + target.getFileName(), ".tmp");
        try {
            writer.writeTo(tmp);
            Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } finally {
            Files.deleteIfExists(tmp);
        }
    }
}
