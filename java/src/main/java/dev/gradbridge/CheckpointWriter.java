package dev.gradbridge;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Enumeration;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipFile;
import java.util.zip.ZipOutputStream;

/**
 * Saves a loaded module with its current state (parameters, buffers, optimizer state, learning
 * rate: all module attributes) as a TorchScript archive that {@code torch.jit.load} reads.
 *
 * <p>DJL serializes the module without extra files, so the archive is copied once more with
 * {@code <archive>/extra/gradbridge.json} added (stored, uncompressed, like every record
 * torch writes). The result replaces the target atomically.
 */
final class CheckpointWriter {

    private CheckpointWriter() {}

    static void write(ScriptedModule module, String metadataJson, Path target) throws IOException {
        AtomicFiles.write(
                target,
                tmp -> {
                    Path raw = AtomicFiles.createTemp(target.toAbsolutePath(), ".raw");
                    try {
                        try (OutputStream out = Files.newOutputStream(raw)) {
                            module.write(out);
                        }
                        addMetadata(raw, tmp, metadataJson);
                    } finally {
                        Files.deleteIfExists(raw);
                    }
                });
    }

    private static void addMetadata(Path source, Path target, String metadataJson) throws IOException {
        try (ZipFile archive = new ZipFile(source.toFile());
                ZipOutputStream out = new ZipOutputStream(Files.newOutputStream(target))) {
            String prefix = null;
            Enumeration<? extends ZipEntry> entries = archive.entries();
            byte[] buffer = new byte[1 << 16];
            while (entries.hasMoreElements()) {
                ZipEntry entry = entries.nextElement();
                String name = entry.getName();
                if (prefix == null) {
                    prefix = name.substring(0, name.indexOf('/') + 1);
                }
                if (name.endsWith("/extra/" + Protocol.METADATA_FILE)) {
                    continue;
                }
                ZipEntry copy = new ZipEntry(name);
                copy.setMethod(ZipEntry.STORED);
                copy.setSize(entry.getSize());
                copy.setCompressedSize(entry.getSize());
                copy.setCrc(entry.getCrc());
                out.putNextEntry(copy);
                try (InputStream in = archive.getInputStream(entry)) {
                    for (int read; (read = in.read(buffer)) > 0; ) {
                        out.write(buffer, 0, read);
                    }
                }
                out.closeEntry();
            }
            byte[] json = metadataJson.getBytes(StandardCharsets.UTF_8);
            CRC32 crc = new CRC32();
            crc.update(json);
            ZipEntry metadata = new ZipEntry(prefix + "extra/" + Protocol.METADATA_FILE);
            metadata.setMethod(ZipEntry.STORED);
            metadata.setSize(json.length);
            metadata.setCompressedSize(json.length);
            metadata.setCrc(crc.getValue());
            out.putNextEntry(metadata);
            out.write(json);
            out.closeEntry();
        }
    }
}
