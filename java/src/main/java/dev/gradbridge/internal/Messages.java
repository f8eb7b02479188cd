package dev.gradbridge.internal;

import dev.gradbridge.DType;
import dev.gradbridge.Protocol;
import java.util.Arrays;

/**
 * The wording of gradbridge's error lines that both languages print: every program's, data files',
 * runs', resumes', tensors', files', histories' and metadata's. {@code python/gradbridge/messages/}
 * holds the same sentences; tests compare the two, so a user sees the same line whichever side
 * refused the input. Every line names the file, key, array or argument at fault and says what was
 * expected and what was found. The other surfaces have a class each beside it: {@link InputMessages},
 * {@link PlatformMessages}, {@link ShardedMessages}, {@link Protocol3Messages}.
 */
public final class Messages {

    private Messages() {}

    // ---- every program ----

    /** What a program's refusal line starts with (Python: {@code launcher.ERROR_PREFIX} reads it from output). */
    public static final String ERROR_PREFIX = "error: ";

    /**
     * @param n samples in the data
     * @param got the batch size asked for
     * @return the line for a batch size outside 1..n
     */
    public static String batchSize(long n, long got) {
        return "batch size must be in 1.." + n + ", got " + got;
    }

    // ---- data files (.npz / .npy) ----

    /**
     * @param source the data file
     * @param array the array's name
     * @param descr numpy's dtype descriptor, e.g. {@code >f4}
     * @return the line for a big-endian array (its bytes would be read swapped)
     */
    public static String bigEndian(String source, String array, String descr) {
        String little = "<" + descr.substring(1);
        return source + ": array " + array + " has dtype " + descr + " (big-endian); expected little-endian "
                + little + ": save it with " + array + ".astype('" + little + "')";
    }

    /**
     * @param source the data file
     * @param array the array's name
     * @return the line for an array stored in Fortran (column-major) order
     */
    public static String fortranOrder(String source, String array) {
        return source + ": array " + array + " is stored in Fortran order; expected C order: save"
                + " numpy.ascontiguousarray(" + array + ")";
    }

    /**
     * @param source the data file
     * @param array the array's name
     * @param shape the shape the header claims
     * @param descr numpy's dtype descriptor
     * @param claimed bytes the header implies, or -1 when that overflows 64 bits
     * @param available bytes of data the file actually holds
     * @return the line for a header that does not match the data that follows it
     */
    public static String npySize(String source, String array, long[] shape, String descr, long claimed, long available) {
        return source + ": array " + array + " header claims shape " + Arrays.toString(shape) + " of " + descr + " ("
                + (claimed < 0 ? "more than " + Long.MAX_VALUE : String.valueOf(claimed)) + " bytes) but the file holds "
                + available + " bytes";
    }

    /**
     * @param source the data file
     * @param array the array's name
     * @param reason what is wrong with the header
     * @return the line for an unreadable .npy header
     */
    public static String npyHeader(String source, String array, String reason) {
        return source + ": array " + array + " has no valid .npy header: " + reason;
    }

    // ---- resuming a run ----

    /**
     * @param checkpoint the checkpoint resumed from
     * @param what the setting
     * @param saved the checkpoint's value
     * @param given the caller's value
     * @return the line for a resume that would change the run
     */
    public static String resumeConflict(String checkpoint, String what, Object saved, Object given) {
        return checkpoint + " was trained with " + what + " " + saved + "; resume with the same " + what
                + " (or none) to continue the same run, not " + given;
    }

    /**
     * @param checkpoint the file given to resume
     * @return the line for a file without the {@code checkpoint} entry a run's checkpoint holds
     */
    public static String resumeWithoutCheckpoint(String checkpoint) {
        return checkpoint + ": not a checkpoint to resume: its " + Protocol.METADATA_FILE + " has no \"checkpoint\""
                + " entry (an exported module, or an edited checkpoint); resume from a file that --checkpoint wrote,"
                + " or start a new run with --model " + checkpoint;
    }

    /**
     * @param checkpoint the file given to resume
     * @param key the key its {@code checkpoint} entry lacks
     * @param data whether the key names the run's data (then {@code --allow-different-data} waives it)
     * @return the line for a checkpoint entry without a key a resume needs
     */
    public static String resumeKeyMissing(String checkpoint, String key, boolean data) {
        return checkpoint + ": its \"checkpoint\" entry has no \"" + key + "\" key, which a resume needs "
                + (data ? "to check that it continues on the data the run was trained on; resume from a file that"
                        + " --checkpoint wrote, or pass --allow-different-data to continue on any data"
                        : "to continue the run where it stopped; resume from a file that --checkpoint wrote, or start"
                        + " a new run with --model " + checkpoint);
    }

    /**
     * @param data the data given
     * @param checkpoint the checkpoint resumed from
     * @param expected the checkpoint's data (shapes, digest)
     * @param actual the given data (shapes, digest)
     * @return the line for resuming on other data
     */
    public static String differentData(String data, String checkpoint, String expected, String actual) {
        return data + ": not the data " + checkpoint + " was trained on: expected " + expected + ", got " + actual
                + "; pass --allow-different-data to continue on it anyway";
    }

    /**
     * @param checkpoint the checkpoint resumed from
     * @param completed the epochs it claims
     * @param epochs the epochs asked for
     * @param max the largest epoch count
     * @return the line for an epoch count that cannot be trained
     */
    public static String epochCount(String checkpoint, long completed, long epochs, long max) {
        return checkpoint + ": epochs_completed " + completed + " + epochs " + epochs + " must be in 0.." + max;
    }

    // ---- training runs ----

    /**
     * @param mode the mode asked for
     * @return the line for a mode that is not one of {@link dev.gradbridge.Trainer.Mode}
     */
    public static String unknownMode(String mode) {
        return "unknown mode '" + mode + "'; expected full, step or fused";
    }

    /**
     * @param loss the NaN or infinite loss
     * @param epoch the epoch it happened in
     * @param batch the batch's index in the epoch
     * @param first the batch's first sample, in the epoch's order
     * @param last its last sample
     * @return the line for a diverged run, before what was kept
     */
    public static String divergence(double loss, int epoch, int batch, long first, long last) {
        return "loss is " + loss + " at epoch " + epoch + ", batch " + batch + " (samples " + first + ".." + last
                + " of the epoch's order); training stopped";
    }

    // ---- tensors against the metadata ----

    /**
     * @param source the file or module the tensor came from, or empty
     * @param name the tensor, e.g. {@code x} or {@code input x}
     * @param dtype the dtype the metadata declares
     * @param shape the shape it declares (-1: any number of samples)
     * @param actualDtype the tensor's dtype
     * @param actualShape the tensor's shape
     * @return the line for a tensor that does not match its spec
     */
    public static String tensorSpec(
            String source, String name, String dtype, long[] shape, String actualDtype, long[] actualShape) {
        DType type = DType.of(dtype);
        String carried = type.carrier() != type ? " (as " + type.carrier().torchName() + ")" : "";
        return (source.isEmpty() ? "" : source + ": ") + name + " must be " + dtype + carried + " of shape "
                + Arrays.toString(shape) + " (-1: any number of samples), got " + actualDtype + " of shape "
                + Arrays.toString(actualShape);
    }

    /**
     * @param source the Parquet data
     * @param column the column of a 16-bit input
     * @param rows how many rows hold a value that {@code dtype} does not
     * @param dtype the input's 16-bit dtype
     * @return the line for a carrier column whose values the input's dtype does not hold ({@link DType#carrier})
     */
    public static String notExactRows(String source, String column, long rows, String dtype) {
        return source + ": column " + column + " holds values that are not " + dtype + " in " + rows
                + " rows; gradbridge casts float32 data to the model's " + dtype + " without rounding: round it first"
                + " (torch.from_numpy(a).to(torch." + dtype + ").float())";
    }

    /**
     * @param source the data (a file; empty for a request)
     * @param name the input
     * @param index the element's index
     * @param value its float32 value
     * @param dtype the input's 16-bit dtype
     * @return the line for a carried value that the input's dtype does not hold ({@link DType#carrier})
     */
    public static String notExact(String source, String name, long[] index, float value, String dtype) {
        return (source.isEmpty() ? "" : source + ": ") + name + Arrays.toString(index) + " = " + (double) value
                + " is not a " + dtype + " value; gradbridge casts float32 data to the model's " + dtype
                + " without rounding: round it first (torch.from_numpy(a).to(torch." + dtype + ").float())";
    }

    /**
     * @param source the data file
     * @param array the array's name in it
     * @param shape its shape
     * @param bytes its byte count (negative: past a long)
     * @param limit the most bytes one array may hold in Java
     * @return the line for an array too large for one Java buffer
     */
    public static String arrayTooLarge(String source, String array, long[] shape, long bytes, long limit) {
        return source + ": " + array + " of shape " + Arrays.toString(shape) + " holds "
                + (bytes < 0 ? "more than 2^63" : String.valueOf(bytes)) + " bytes, beyond the " + limit
                + " one array may have in Java; split the data into several files";
    }

    // ---- files gradbridge writes ----

    /**
     * @param path the file the user asked for (never a temp file)
     * @param reason the operating system's reason, e.g. {@code No space left on device}
     * @return the line for a file that cannot be written
     */
    public static String cannotWrite(String path, String reason) {
        return "cannot write " + path + ": " + reason;
    }

    /**
     * @param path a file gradbridge reads back (a history's side file)
     * @param reason the operating system's reason
     * @return the line for a file that cannot be read
     */
    public static String cannotRead(String path, String reason) {
        return "cannot read " + path + ": " + reason;
    }

    // ---- histories ----

    /**
     * Above this many parameter values in one epoch's record, a history file keeps them in its side
     * file ({@code <history>.values}, float64) instead of its line (Python: {@code history.INLINE_VALUES_LIMIT}).
     */
    public static final long HISTORY_INLINE_VALUES = 1_000_000L;

    /**
     * @param what Java's words for the memory that ran out ({@code Java heap space}, {@code Direct buffer memory})
     * @param program the program's name (its start script reads {@code JAVA_OPTS})
     * @return the one line a program prints when the JVM runs out of memory
     */
    public static String outOfMemory(String what, String program) {
        return program + " ran out of Java memory (" + what + "): give the JVM more, e.g. JAVA_OPTS=-Xmx16g "
                + "(-XX:MaxDirectMemorySize for direct buffers), or keep less: --digests-only records parameter "
                + "digests without their values";
    }

    // ---- metadata (gradbridge.json) ----

    /**
     * @param path the module
     * @param key the key, e.g. {@code parameters[0].shape}
     * @param expected what the key must hold
     * @param actual what it holds, as compact JSON ({@link #jsonText}), or a description
     * @return the line for a malformed metadata key
     */
    public static String metadataKey(String path, String key, String expected, String actual) {
        return path + ": " + Protocol.METADATA_FILE + " key '" + key + "' must be " + expected + ", got " + actual;
    }

    /**
     * @param path the module
     * @param actual the document, as compact JSON
     * @return the line for a metadata document that is not a JSON object
     */
    public static String metadataDocument(String path, String actual) {
        return path + ": " + Protocol.METADATA_FILE + " must be a JSON object, got " + actual;
    }

    /**
     * @param path the module
     * @param name the parameter
     * @param declared dtype and shape in gradbridge.json
     * @param actual dtype and shape in the module
     * @return the line for metadata that does not describe the module
     */
    public static String parameterMismatch(String path, String name, String declared, String actual) {
        return path + ": parameter " + name + " is " + actual + " in the module but " + Protocol.METADATA_FILE
                + " declares " + declared;
    }

    /**
     * @param json a JSON value's compact text
     * @return it, shortened to 60 characters as Python's {@code messages.json_text} does
     */
    public static String jsonText(String json) {
        return json.length() <= 60 ? json : json.substring(0, 57) + "...";
    }



    // ---- online learning ----

    /**
     * @param module the training module file
     * @param accumulate its gradient-accumulation factor
     * @return the line for a module exported with gradient accumulation, which online learning refuses
     */
    public static String onlineAccumulate(String module, long accumulate) {
        return module + " accumulates gradients over " + accumulate + " micro-batches; online learning applies one"
                + " step per micro-batch (export without accumulate)";
    }
}
