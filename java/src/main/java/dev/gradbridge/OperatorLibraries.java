package dev.gradbridge;

import dev.gradbridge.internal.PlatformMessages;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
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
                throw new ModuleLoadException(PlatformMessages.opLibraryUnloadable(library.toString(), "no such file"));
            }
            String problem = libraryProblem(file);
            if (problem != null) {
                // Checked here: the JVM warns before refusing a non-library, and dies of SIGBUS
                // when it maps a truncated one.
                throw new ModuleLoadException(PlatformMessages.opLibraryUnloadable(library.toString(), problem));
            }
            try {
                Native.loadLibrary(file.toString()); // dlopen(RTLD_GLOBAL): its operators register with libtorch
            } catch (NativeException e) {
                throw new ModuleLoadException(PlatformMessages.opLibraryUnloadable(library.toString(), e.getMessage()));
            }
        }
    }

    /**
     * Why {@code file} is not an ELF shared object this machine can map, or {@code null}: magic,
     * 64-bit little-endian, ET_DYN, this CPU, and every header and loadable segment inside the file
     * (gradbridge.ops.library_problem does the same in Python). Other systems than Linux: not checked.
     */
    static String libraryProblem(Path file) {
        if (!System.getProperty("os.name", "").toLowerCase(java.util.Locale.ROOT).startsWith("linux")) {
            return null;
        }
        try (FileChannel channel = FileChannel.open(file, StandardOpenOption.READ)) {
            long size = channel.size();
            ByteBuffer header = read(channel, 0, 64);
            if (header.limit() < 16 || header.getInt(0) != 0x464c457f) { // "\x7fELF" read little-endian
                return PlatformMessages.NOT_ELF;
            }
            if (header.get(4) != 2 || header.get(5) != 1) { // EI_CLASS 64-bit, EI_DATA little-endian
                return PlatformMessages.elfClass(header.get(4) == 1 ? 32 : 64);
            }
            if (header.limit() < 64) {
                return PlatformMessages.elfTruncated(64, size);
            }
            int type = Short.toUnsignedInt(header.getShort(16));
            int machine = Short.toUnsignedInt(header.getShort(18));
            long phoff = header.getLong(32);
            long shoff = header.getLong(40);
            int phentsize = Short.toUnsignedInt(header.getShort(54));
            int phnum = Short.toUnsignedInt(header.getShort(56));
            int shentsize = Short.toUnsignedInt(header.getShort(58));
            int shnum = Short.toUnsignedInt(header.getShort(60));
            if (type != 3) { // ET_DYN
                return PlatformMessages.elfType(type);
            }
            String arch = System.getProperty("os.arch", "");
            Integer expected = ELF_MACHINES.get(arch.toLowerCase(java.util.Locale.ROOT));
            if (expected != null && machine != expected) {
                return PlatformMessages.elfMachine(machine, PYTHON_MACHINE_NAMES.getOrDefault(arch, arch), expected);
            }
            if (phoff < 0 || shoff < 0) {
                return PlatformMessages.elfTruncated(Long.MAX_VALUE, size);
            }
            long needed = Math.max(phoff + (long) phnum * phentsize, shoff == 0 ? 0 : shoff + (long) shnum * shentsize);
            if (phnum > 0 && phentsize < 56) { // smaller than an Elf64_Phdr: not a real table
                return PlatformMessages.NOT_ELF;
            }
            if (needed > size) {
                return PlatformMessages.elfTruncated(needed, size);
            }
            ByteBuffer table = read(channel, phoff, phnum * phentsize);
            for (int i = 0; i < phnum; i++) {
                int at = i * phentsize;
                long end = table.getLong(at + 8) + table.getLong(at + 32); // p_offset + p_filesz
                if (table.getInt(at) == 1 && (end > size || end < 0)) { // PT_LOAD
                    needed = Math.max(needed, end < 0 ? Long.MAX_VALUE : end);
                }
            }
            return needed > size ? PlatformMessages.elfTruncated(needed, size) : null;
        } catch (IOException e) {
            return "cannot read it: " + e.getMessage();
        }
    }

    /** ELF e_machine by os.arch (gradbridge.ops.ELF_MACHINES holds the same by platform.machine()). */
    private static final java.util.Map<String, Integer> ELF_MACHINES = java.util.Map.of(
            "amd64", 62, "x86_64", 62, "aarch64", 183, "arm64", 183, "ppc64le", 21, "s390x", 22);

    /** os.arch as Python's platform.machine() names it, so that both languages print one line. */
    private static final java.util.Map<String, String> PYTHON_MACHINE_NAMES = java.util.Map.of("amd64", "x86_64");

    private static ByteBuffer read(FileChannel channel, long at, int length) throws IOException {
        ByteBuffer buffer = ByteBuffer.allocate(length).order(ByteOrder.LITTLE_ENDIAN);
        while (buffer.hasRemaining() && channel.read(buffer, at + buffer.position()) > 0) {
            // read until full or end of file
        }
        buffer.flip();
        return buffer;
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
