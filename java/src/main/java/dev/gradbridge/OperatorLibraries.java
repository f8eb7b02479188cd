package dev.gradbridge;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;

/**
 * Custom-operator libraries: loaded into the JVM before a module that needs them. A library
 * registers its operators with libtorch's dispatcher when it is loaded, so it must be built
 * against the libtorch this JVM runs; the dynamic linker binds it to the libtorch already loaded.
 */
final class OperatorLibraries {

    private OperatorLibraries() {}

    /** Loads each library (after the engine, so that libtorch is there to bind to). */
    static void load(List<Path> libraries) {
        if (libraries.isEmpty()) {
            return;
        }
        NativeLibrary.load();
        for (Path library : libraries) {
            Path file = library.toAbsolutePath();
            if (!Files.isRegularFile(file)) {
                throw new ModuleLoadException(Messages.opLibraryUnloadable(library.toString(), "no such file"));
            }
            if (!isSharedLibrary(file)) {
                // Checked here: the JVM prints warnings of its own before refusing a non-library.
                throw new ModuleLoadException(
                        Messages.opLibraryUnloadable(library.toString(), "not a shared library"));
            }
            try {
                Native.loadLibrary(file.toString()); // dlopen(RTLD_GLOBAL): its operators register with libtorch
            } catch (NativeException e) {
                throw new ModuleLoadException(Messages.opLibraryUnloadable(library.toString(), e.getMessage()));
            }
        }
    }

    /** ELF (Linux), Mach-O (macOS) or PE (Windows) magic bytes. */
    private static boolean isSharedLibrary(Path file) {
        byte[] head = new byte[4];
        try (InputStream in = Files.newInputStream(file)) {
            if (in.read(head) != 4) {
                return false;
            }
        } catch (IOException e) {
            return false;
        }
        int magic = ((head[0] & 0xff) << 24) | ((head[1] & 0xff) << 16) | ((head[2] & 0xff) << 8) | (head[3] & 0xff);
        return magic == 0x7f454c46 // \x7fELF
                || magic == 0xcffaedfe || magic == 0xcefaedfe || magic == 0xfeedfacf || magic == 0xfeedface
                || magic == 0xcafebabe // Mach-O, 64/32-bit either byte order, universal
                || (head[0] == 'M' && head[1] == 'Z'); // PE
    }

    /**
     * @return the custom operator (from the metadata) that libtorch's load error complains about,
     *     or {@code null} when the error is about something else
     */
    static String missingOperator(Metadata metadata, Throwable error) {
        String message = String.valueOf(error.getMessage());
        for (String operator : metadata.getCustomOps()) {
            if (message.contains(operator)) {
                return operator;
            }
        }
        return null;
    }
}
