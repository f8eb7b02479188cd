package dev.gradbridge.online;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Enumeration;
import java.util.zip.CRC32;
import java.util.zip.ZipEntry;
import java.util.zip.ZipException;
import java.util.zip.ZipFile;

/**
 * Checks a TorchScript archive's content before libtorch reads it. libtorch reads archives with
 * miniz's CRC checks off and unpickles some records (debug information) only when they are
 * needed, e.g. when the module is saved: a damaged byte there loads fine and fails the first
 * checkpoint. Every entry is read here and its CRC-32 compared with the one the zip records.
 */
final class ModuleArchives {

    private ModuleArchives() {}

    /**
     * @param file a module file (the exported module, a checkpoint)
     * @return null when every entry is whole, else what is wrong (to follow the file's name)
     * @throws IOException when it cannot be read
     */
    static String problem(Path file) throws IOException {
        if (!Files.isRegularFile(file)) {
            return "is missing";
        }
        CRC32 crc = new CRC32();
        byte[] buffer = new byte[1 << 16];
        try (ZipFile zip = new ZipFile(file.toFile())) {
            Enumeration<? extends ZipEntry> entries = zip.entries();
            if (!entries.hasMoreElements()) {
                return "is damaged: the archive holds no entry";
            }
            while (entries.hasMoreElements()) {
                ZipEntry entry = entries.nextElement();
                crc.reset();
                long size = 0;
                try (InputStream in = zip.getInputStream(entry)) {
                    for (int n; (n = in.read(buffer)) > 0; ) {
                        crc.update(buffer, 0, n);
                        size += n;
                    }
                }
                if ((entry.getCrc() != -1 && crc.getValue() != entry.getCrc()) || (entry.getSize() != -1 && size != entry.getSize())) {
                    return "is damaged: its entry " + entry.getName() + " does not match its checksum";
                }
            }
        } catch (ZipException e) {
            return "is damaged or not a TorchScript archive (" + e.getMessage() + ")";
        }
        return null;
    }
}
