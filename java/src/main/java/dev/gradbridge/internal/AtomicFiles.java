package dev.gradbridge.internal;

import dev.gradbridge.InvalidInputException;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.file.DirectoryStream;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFileAttributeView;
import java.util.Random;
import java.util.regex.Pattern;

/**
 * Writes that never leave a half-written file: a temporary file beside the target, then a rename.
 *
 * <p>Temporary files are named {@code .<target name>.<id>.tmp} (or {@code .raw}) and created
 * like any other file, so the user's umask applies; an existing target keeps its permissions.
 * A process killed while writing can leave one behind: {@link #prepare} removes them before the
 * next run writes the same target. Errors name the target the user asked for, not a temp file.
 */
public final class AtomicFiles {

    /** Fills a temporary file. */
    public interface Writer {
        void writeTo(Path tmp) throws IOException;
    }

    private static final Random IDS = new Random();

    private AtomicFiles() {}

    /**
     * Writes {@code content} to {@code path} through a temporary file and a rename.
     *
     * @param path the file to (re)place
     * @param content its new bytes
     * @throws IOException naming {@code path} when it cannot be written
     */
    public static void write(Path path, byte[] content) throws IOException {
        write(path, tmp -> Files.write(tmp, content));
    }

    public static void write(Path path, Writer writer) throws IOException {
        Path target = path.toAbsolutePath();
        Path tmp = null;
        try {
            Files.createDirectories(target.getParent());
            tmp = createTemp(target, ".tmp");
            writer.writeTo(tmp);
            keepPermissions(target, tmp);
            Files.move(tmp, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
        } catch (IOException e) {
            throw new IOException(Messages.cannotWrite(path.toString(), reason(e)), e);
        } finally {
            if (tmp != null) {
                Files.deleteIfExists(tmp);
            }
        }
    }

    /**
     * A new empty file {@code .<target name>.<id><suffix>} beside {@code target}, created with the
     * default permissions (0666 minus the umask), unlike {@code Files.createTempFile} (0600).
     */
    static Path createTemp(Path target, String suffix) throws IOException {
        for (int attempt = 0; ; attempt++) {
            Path tmp = target.resolveSibling(
                    "." + target.getFileName() + "." + Long.toUnsignedString(IDS.nextLong(), 36) + suffix);
            try (OutputStream created = Files.newOutputStream(tmp, StandardOpenOption.CREATE_NEW)) {
                return tmp;
            } catch (FileAlreadyExistsException e) {
                if (attempt > 100) {
                    throw e;
                }
            }
        }
    }

    /** Replacing a file must not change who may read it (a 0644 checkpoint stays 0644). */
    private static void keepPermissions(Path target, Path tmp) throws IOException {
        PosixFileAttributeView view = Files.getFileAttributeView(target, PosixFileAttributeView.class);
        if (view != null && Files.isRegularFile(target)) {
            Files.setPosixFilePermissions(tmp, Files.getPosixFilePermissions(target));
        }
    }

    /**
     * Before a run writes {@code path}: removes temp files a killed run left beside it, and checks
     * that it can be written, so a bad path fails before training instead of after an epoch.
     *
     * @param path a file the run will write (checkpoint, history); gradbridge-spark calls this too
     * @throws InvalidInputException naming {@code path} when it cannot be written
     */
    public static void prepare(Path path) {
        Path target = path.toAbsolutePath();
        try {
            removeLeftovers(target);
            if (Files.isDirectory(target)) {
                throw new InvalidInputException(Messages.cannotWrite(path.toString(), "it is a directory"));
            }
            Path folder = target.getParent();
            while (folder != null && !Files.exists(folder)) {
                folder = folder.getParent();
            }
            if (folder == null || !Files.isDirectory(folder)) {
                throw new InvalidInputException(
                        Messages.cannotWrite(path.toString(), folder + " is not a directory"));
            }
            if (folder.equals(target.getParent())) {
                Files.delete(createTemp(target, ".tmp")); // the only sure test: write there
            } else if (!Files.isWritable(folder)) {
                throw new InvalidInputException(Messages.cannotWrite(path.toString(), folder + " is not writable"));
            }
        } catch (IOException e) {
            throw new InvalidInputException(Messages.cannotWrite(path.toString(), reason(e)));
        }
    }

    private static void removeLeftovers(Path target) throws IOException {
        Path folder = target.getParent();
        if (folder == null || !Files.isDirectory(folder)) {
            return;
        }
        // Java's ids (and older .NAME<digits>.tmp) and Python's mkstemp ids alike.
        Pattern leftover =
                Pattern.compile("\\." + Pattern.quote(target.getFileName().toString()) + "\\.?[A-Za-z0-9_]+\\.(tmp|raw)");
        try (DirectoryStream<Path> entries = Files.newDirectoryStream(folder)) {
            for (Path entry : entries) {
                if (leftover.matcher(entry.getFileName().toString()).matches() && Files.isRegularFile(entry)) {
                    Files.deleteIfExists(entry);
                }
            }
        }
    }

    /** The operating system's reason without the temp file's name (e.g. "No space left on device"). */
    static String reason(IOException e) {
        if (e instanceof FileSystemException && ((FileSystemException) e).getReason() != null) {
            return ((FileSystemException) e).getReason();
        }
        if (e instanceof FileSystemException) {
            return e.getClass().getSimpleName().replace("Exception", "").replaceAll("([a-z])([A-Z])", "$1 $2").toLowerCase();
        }
        return String.valueOf(e.getMessage());
    }
}
