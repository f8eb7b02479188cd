package dev.gradbridge.online;

import com.google.gson.Gson;
import com.google.gson.GsonBuilder;
import com.google.gson.JsonObject;
import com.google.gson.JsonParseException;
import com.google.gson.reflect.TypeToken;
import dev.gradbridge.internal.AtomicFiles;
import dev.gradbridge.internal.Digests;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.DirectoryStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Locale;
import java.util.Map;

/**
 * The online checkpoint in a log folder: {@code checkpoint-vNNNNNNNN.pt} (the training module with
 * its optimizer state) and {@value #FILE} naming it, with the log position to resume from. Both
 * are written atomically, the descriptor last, so a crash in between leaves the previous
 * checkpoint in force.
 *
 * <p>A module with frozen parameters or constant buffers checkpoints what training changes only:
 * {@code checkpoint-vNNNNNNNN.trained.pt} is the module with those left out (zero-element
 * placeholders in their place), which a restart takes from the module file, the one the descriptor's
 * {@code model_sha256} names (so is a gated checkpoint's {@code serving-vNNNNNNNN.trained.pt}). A
 * gradbridge before it refuses that name in one line; one after it reads a whole {@code .pt} too.
 */
final class Checkpoints {

    /** The descriptor's file name. */
    static final String FILE = "checkpoint.json";

    private static final Gson GSON = new GsonBuilder().serializeSpecialFloatingPointValues().create();
    /** What a checkpoint module's name ends with when it leaves the frozen tensors out. */
    static final String TRAINED_SUFFIX = ".trained.pt";

    /** A checkpoint descriptor. */
    static final class Descriptor {
        final String file;
        final String modelSha256;
        final long version;
        final long updates;
        final double loss;
        final long nextSeq;
        final long scanOffset;
        final Map<String, String> digests;
        String fileSha256; // the checkpoint module's SHA-256 (null in descriptors written before it was kept)
        // With a publish gate: the serving version, its file (null: this checkpoint's own version) and
        // SHA-256, and the log offset from which gate decisions and rollbacks come after the checkpoint.
        Long servingVersion;
        String servingFile;
        String servingSha256;
        long stateOffset;

        Descriptor(String file, String modelSha256, long version, long updates, double loss, long nextSeq,
                long scanOffset, Map<String, String> digests) {
            this.file = file;
            this.modelSha256 = modelSha256;
            this.version = version;
            this.updates = updates;
            this.loss = loss;
            this.nextSeq = nextSeq;
            this.scanOffset = scanOffset;
            this.digests = digests;
        }
    }

    private Checkpoints() {}

    static boolean exists(Path dir) {
        return Files.isRegularFile(dir.resolve(FILE));
    }

    /** @return the descriptor, or null when the folder has none */
    static Descriptor read(Path dir) throws IOException {
        Path file = dir.resolve(FILE).toAbsolutePath();
        if (!Files.isRegularFile(file)) {
            return null;
        }
        try {
            JsonObject json = GSON.fromJson(new String(Files.readAllBytes(file), StandardCharsets.UTF_8), JsonObject.class);
            for (String key : new String[] {"file", "model_sha256", "version", "updates", "next_seq", "scan_offset", "digests"}) {
                if (json == null || !json.has(key)) {
                    throw new LogCorruptException(file + " lacks '" + key + "'");
                }
            }
            double loss = json.has("loss") && !json.get("loss").isJsonNull() ? json.get("loss").getAsDouble() : Double.NaN;
            Map<String, String> digests =
                    GSON.fromJson(json.get("digests"), new TypeToken<Map<String, String>>() {}.getType());
            Descriptor descriptor = new Descriptor(json.get("file").getAsString(), json.get("model_sha256").getAsString(),
                    json.get("version").getAsLong(), json.get("updates").getAsLong(), loss,
                    json.get("next_seq").getAsLong(), json.get("scan_offset").getAsLong(), digests);
            if (json.has("file_sha256")) {
                descriptor.fileSha256 = json.get("file_sha256").getAsString();
            }
            if (!descriptor.file.matches("checkpoint-v[0-9]+(\\.trained)?\\.pt")) {
                throw new LogCorruptException(file + " names '" + descriptor.file + "', not a checkpoint-vNNNNNNNN.pt of its folder");
            }
            if (json.has("serving")) {
                JsonObject serving = json.getAsJsonObject("serving");
                descriptor.servingVersion = serving.get("version").getAsLong();
                descriptor.stateOffset = serving.get("state_offset").getAsLong();
                if (serving.has("file") && !serving.get("file").isJsonNull()) {
                    descriptor.servingFile = serving.get("file").getAsString();
                    descriptor.servingSha256 = serving.get("file_sha256").getAsString();
                    if (!descriptor.servingFile.matches("serving-v[0-9]+(\\.trained)?\\.pt")) {
                        throw new LogCorruptException(file + " names '" + descriptor.servingFile
                                + "', not a serving-vNNNNNNNN.pt of its folder");
                    }
                }
            }
            return descriptor;
        } catch (JsonParseException | IllegalStateException | ClassCastException | NumberFormatException
                | NullPointerException e) {
            throw new LogCorruptException(file + " is not a valid checkpoint descriptor");
        }
    }

    /**
     * Refuses a checkpoint that does not belong to {@code modelSha256} or that the log contradicts:
     * the log must hold the checkpoint's version, with the same digests, before its scan offset.
     */
    static void check(Path dir, Descriptor checkpoint, String modelSha256, LogReader.Contents log) {
        Path file = dir.resolve(FILE).toAbsolutePath();
        if (!checkpoint.modelSha256.equals(modelSha256)) {
            throw new LogCorruptException(file + " belongs to the module with SHA-256 " + checkpoint.modelSha256 + ", not "
                    + modelSha256 + "; start another log folder for another --model");
        }
        if (log.getEnd() < checkpoint.scanOffset) {
            throw new LogCorruptException(log.getFile() + " ends at offset " + log.getEnd() + " but " + file
                    + " resumes at offset " + checkpoint.scanOffset + ": the log was cut or replaced");
        }
        for (LogRecord record : log.getRecords()) {
            if (record instanceof LogRecord.Version && ((LogRecord.Version) record).getId() == checkpoint.version) {
                LogRecord.Version version = (LogRecord.Version) record;
                if (version.getUpdates() != checkpoint.updates || !version.getDigests().equals(checkpoint.digests)) {
                    throw new LogCorruptException(log.getFile() + ": offset " + version.getOffset() + ": version "
                            + checkpoint.version + " differs from the one " + file + " holds");
                }
                return;
            }
        }
        throw new LogCorruptException(log.getFile() + " does not hold version " + checkpoint.version + ", which " + file
                + " checkpoints: the log was cut or replaced");
    }

    /**
     * Refuses a checkpoint module that is missing, damaged (a zip entry whose checksum does not
     * match) or other than the one the descriptor recorded (its SHA-256), before libtorch reads it.
     */
    static void verifyModule(Path dir, Descriptor checkpoint) throws IOException {
        Path module = dir.resolve(checkpoint.file).toAbsolutePath();
        String what = "checkpoint " + module + " (named by " + dir.resolve(FILE).toAbsolutePath() + ")";
        String problem = ModuleArchives.problem(module);
        if (problem != null) {
            throw new LogCorruptException(what + " " + problem + "; move the log folder's checkpoint.json aside to"
                    + " resume from the whole log instead");
        }
        if (checkpoint.fileSha256 != null && !checkpoint.fileSha256.equals(Digests.sha256Hex(module))) {
            throw new LogCorruptException(what + " is damaged: its SHA-256 is not the one recorded when it was"
                    + " written; move the log folder's checkpoint.json aside to resume from the whole log instead");
        }
    }

    /**
     * Refuses the serving version's file a gated checkpoint names when it is missing, damaged or
     * other than the one recorded, before libtorch reads it.
     */
    static void verifyServing(Path dir, Descriptor checkpoint) throws IOException {
        if (checkpoint.servingFile == null) {
            return;
        }
        Path module = dir.resolve(checkpoint.servingFile).toAbsolutePath();
        String what = "serving version " + module + " (named by " + dir.resolve(FILE).toAbsolutePath() + ")";
        String problem = ModuleArchives.problem(module);
        if (problem == null && !checkpoint.servingSha256.equals(Digests.sha256Hex(module))) {
            problem = "is damaged: its SHA-256 is not the one recorded when it was written";
        }
        if (problem != null) {
            throw new LogCorruptException(what + " " + problem + "; move the log folder's checkpoint.json aside to"
                    + " resume from the whole log instead");
        }
    }

    /**
     * Writes the serving version's file (when given), the module's archive, then the descriptor;
     * removes older checkpoint and serving modules.
     */
    static void write(Path dir, byte[] archive, Descriptor checkpoint, byte[] servingArchive) throws IOException {
        if (servingArchive != null) {
            AtomicFiles.write(dir.resolve(checkpoint.servingFile), servingArchive);
        }
        AtomicFiles.write(dir.resolve(checkpoint.file), archive);
        JsonObject json = new JsonObject();
        json.addProperty("file", checkpoint.file);
        json.addProperty("model_sha256", checkpoint.modelSha256);
        json.addProperty("version", checkpoint.version);
        json.addProperty("updates", checkpoint.updates);
        json.addProperty("loss", Double.isFinite(checkpoint.loss) ? checkpoint.loss : null);
        json.addProperty("next_seq", checkpoint.nextSeq);
        json.addProperty("scan_offset", checkpoint.scanOffset);
        json.add("digests", GSON.toJsonTree(checkpoint.digests));
        json.addProperty("file_sha256", Digests.sha256Hex(archive));
        if (checkpoint.servingVersion != null) {
            JsonObject serving = new JsonObject();
            serving.addProperty("version", checkpoint.servingVersion);
            serving.addProperty("file", checkpoint.servingFile);
            serving.addProperty("file_sha256", checkpoint.servingSha256);
            serving.addProperty("state_offset", checkpoint.stateOffset);
            json.add("serving", serving);
        }
        AtomicFiles.write(dir.resolve(FILE), GSON.toJson(json).getBytes(StandardCharsets.UTF_8));
        for (String[] kind : new String[][] {{"checkpoint-v*.pt", checkpoint.file}, {"serving-v*.pt", checkpoint.servingFile}}) {
            try (DirectoryStream<Path> old = Files.newDirectoryStream(dir, kind[0])) {
                for (Path file : old) {
                    if (!file.getFileName().toString().equals(kind[1])) {
                        Files.deleteIfExists(file);
                    }
                }
            }
        }
    }

    /** @param leavesOut whether the module leaves its frozen tensors out */
    static String fileName(long version, boolean leavesOut) {
        return String.format(Locale.ROOT, "checkpoint-v%08d", version) + (leavesOut ? TRAINED_SUFFIX : ".pt");
    }

    /** @param leavesOut whether the module leaves its frozen tensors out */
    static String servingFileName(long version, boolean leavesOut) {
        return String.format(Locale.ROOT, "serving-v%08d", version) + (leavesOut ? TRAINED_SUFFIX : ".pt");
    }
}
