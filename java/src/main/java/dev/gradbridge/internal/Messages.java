package dev.gradbridge.internal;

import dev.gradbridge.DType;
import dev.gradbridge.Protocol;
import java.util.Arrays;

/**
 * The wording of gradbridge's error lines that both languages print, in one place. {@code
 * python/gradbridge/messages/} holds the same sentences; tests compare the two, so a user sees
 * the same line whichever side refused the input. Every line names the file, key, array or
 * argument at fault and says what was expected and what was found.
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

    // ---- custom operators ----

    /**
     * @param module the training module file
     * @param operator the custom operator ({@code NS::NAME}) that no loaded library provides
     * @return the line for a module whose operator library was not loaded
     */
    public static String missingCustomOp(String module, String operator) {
        return module + " uses the custom operator " + operator + ", which no loaded library provides: "
                + "load its library first with --op-library FILE";
    }

    /**
     * @param library the operator library as the user named it
     * @param reason why the dynamic linker refused it
     * @return the line for an operator library that cannot be loaded
     */
    public static String opLibraryUnloadable(String library, String reason) {
        return "--op-library " + library + ": cannot load it: " + reason;
    }

    // ---- a model's inputs (Inputs; Python: gradbridge.inputs) ----

    /** What the metadata's {@code inputs} must hold. */
    public static final String INPUT_SPECS =
            "the specs of the model's inputs (x, or several by name) then y, each name once";

    /**
     * @param source the data file
     * @param name the array it lacks
     * @param holds the arrays it holds
     * @param needs the arrays the module needs: its inputs, then y
     * @return the line for a data file without an array the module needs
     */
    public static String inputMissing(String source, String name, java.util.List<String> holds,
            java.util.List<String> needs) {
        StringBuilder save = new StringBuilder();
        for (String need : needs) {
            save.append(save.length() == 0 ? "" : ", ").append(need).append("=...");
        }
        return source + ": missing array '" + name + "'; the file holds [" + String.join(", ", holds)
                + "] (save with numpy.savez(path, " + save + "))";
    }

    /**
     * @param method the method called with one tensor
     * @param names the inputs the model takes
     * @return the line for a one-tensor call on a model of several inputs
     */
    public static String namedInputsNeeded(String method, java.util.List<String> names) {
        return method + ": the model takes the inputs " + names + ": pass them by name (a Map of name to Tensor)";
    }

    /**
     * @param method the method called
     * @param name the input it was given that the model does not take
     * @param names the inputs the model takes
     * @return the line for an unknown input name
     */
    public static String unknownInput(String method, String name, java.util.List<String> names) {
        return method + ": input " + name + ": the model takes no such input (it takes " + names + ")";
    }

    /**
     * @param method the method called
     * @param name the input it was not given
     * @param names the inputs the model takes
     * @return the line for a missing input
     */
    public static String missingInput(String method, String name, java.util.List<String> names) {
        return method + ": input " + name + " is missing (the model takes " + names + ")";
    }

    // why a file is not a shared library for this machine (checked before the dynamic linker maps
    // it: a truncated library kills the JVM with SIGBUS instead of failing)

    /** A file without the ELF magic. */
    public static final String NOT_ELF = "not an ELF shared library";

    /**
     * @param bits the file's ELF class (32 or 64)
     * @return the reason for an ELF file of another class or byte order
     */
    public static String elfClass(int bits) {
        return "a " + bits + "-bit ELF file; this machine loads 64-bit little-endian libraries";
    }

    /**
     * @param type the file's e_type
     * @return the reason for an ELF file that is not a shared object (ET_DYN)
     */
    public static String elfType(int type) {
        String what;
        switch (type) {
            case 0: what = "an ELF file of no type"; break;
            case 1: what = "a relocatable object (.o)"; break;
            case 2: what = "an executable"; break;
            case 4: what = "a core dump"; break;
            default: what = "an ELF file of type " + type;
        }
        return what + ", not a shared library";
    }

    /**
     * @param found the file's e_machine
     * @param machine this machine's architecture name
     * @param expected this machine's e_machine
     * @return the reason for a library built for another CPU
     */
    public static String elfMachine(int found, String machine, int expected) {
        return "built for ELF machine " + found + "; this machine is " + machine + " (ELF machine " + expected + ")";
    }

    /**
     * @param needed the bytes the file's headers and loadable segments need
     * @param size the file's size
     * @return the reason for a truncated library
     */
    public static String elfTruncated(long needed, long size) {
        return "truncated: its headers need " + needed + " bytes, the file has " + size;
    }

    // ---- the native layer: libtorch and gradbridge's native library (NativeLibrary) ----

    /** The environment variable that moves gradbridge's cache folder (python: native.CACHE_ENV). */
    public static final String CACHE_ENV = "GRADBRIDGE_CACHE_DIR";

    /**
     * @param property the system property, e.g. {@code gradbridge.numThreads}
     * @param value its value
     * @param max the most threads accepted
     * @return the line for a thread count that is not a whole number in 1..max
     */
    public static String threadCount(String property, String value, int max) {
        return "-D" + property + "=" + value + ": expected a whole number of threads in 1.." + max;
    }

    /**
     * @param property the system property
     * @param value its value
     * @param reason libtorch's refusal
     * @return the line for a thread count libtorch refused
     */
    public static String threadCountRefused(String property, String value, String reason) {
        return "-D" + property + "=" + value + ": libtorch refused it: " + reason;
    }

    /**
     * @param library the native library as named
     * @param source where it was named ({@code -Dgradbridge.native.library} or {@code GRADBRIDGE_NATIVE_LIBRARY})
     * @return the line for a native library whose name does not end in {@code .so}
     */
    public static String nativeLibraryName(String library, String source) {
        return "gradbridge's native library " + library + " (" + source + ") is not named *.so: name the .so file"
                + " that python -m gradbridge.native build --out DIR wrote (its .properties file lies beside it)";
    }

    /**
     * @param properties the properties file beside the native library
     * @param library the native library
     * @param key the key it lacks or holds badly
     * @param value what it holds ({@code null} when the key is missing)
     * @return the line for a properties file that does not say what the library was built for
     */
    public static String nativeProperties(String properties, String library, String key, String value) {
        return properties + " (what gradbridge's native library " + library + " was built for) "
                + (value == null ? "has no " + key : "holds " + key + "=" + value) + ": rebuild the library with"
                + " python -m gradbridge.native build --out DIR, which writes both files";
    }

    /**
     * @param library the native library
     * @param source where it was named, or "cached", "this jar's"
     * @param reason why it cannot be loaded (an ELF problem, a digest mismatch)
     * @return the line for a native library that must not reach the dynamic linker
     */
    public static String nativeLibraryUnloadable(String library, String source, String reason) {
        return "cannot load gradbridge's native library " + library + " (" + source + "): " + reason;
    }

    /**
     * @param file one of libtorch's libraries
     * @param source where its folder was named, or "extracted from the pytorch-native jar"
     * @param reason why it cannot be loaded
     * @return the line for a libtorch library that must not reach the dynamic linker
     */
    public static String libtorchUnloadable(String file, String source, String reason) {
        return "cannot load libtorch's " + file + " (" + source + "): " + reason;
    }

    /**
     * @param recorded the SHA-256 recorded when the file was made
     * @param actual the file's SHA-256 now
     * @return the reason for a file whose content changed since it was made
     */
    public static String digestMismatch(String recorded, String actual) {
        return "its SHA-256 is " + actual + ", not the " + recorded + " recorded when it was built (damaged or"
                + " replaced)";
    }

    /**
     * @param what the cached thing, e.g. "libtorch" or "gradbridge's native library"
     * @param folder its cache folder
     * @param reason what is wrong with it
     * @param action what happens now, e.g. "extracting it again"
     * @return the one line printed when a cached library is made again
     */
    public static String cacheDamaged(String what, String folder, String reason, String action) {
        return "gradbridge: the cached " + what + " in " + folder + " is damaged (" + reason + "): " + action;
    }

    /**
     * @param folder the folder that cannot be written
     * @param reason the system's reason
     * @return the line for a cache folder gradbridge cannot write
     */
    public static String cacheUnwritable(String folder, String reason) {
        return "cannot write gradbridge's cache folder " + folder + " (" + CACHE_ENV + ", by default"
                + " ~/.cache/gradbridge): " + reason + "; set " + CACHE_ENV + " to a writable folder";
    }

    /**
     * @param path a path on the way to the cache folder
     * @return the reason for a cache folder under a path that is a file ({@code GRADBRIDGE_CACHE_DIR} naming one)
     */
    public static String notAFolder(String path) {
        return path + " is a file, not a folder";
    }

    // ---- devices: where a module trains (Python: messages, the same sentences) ----

    /** The environment libtorch's cuBLAS reads for reproducible results, set before CUDA starts (with its value). */
    public static final String CUBLAS_WORKSPACE_CONFIG = "CUBLAS_WORKSPACE_CONFIG";

    /** {@link #CUBLAS_WORKSPACE_CONFIG}'s value on deterministic CUDA runs. */
    public static final String CUBLAS_WORKSPACE_VALUE = ":4096:8";

    /**
     * @param device the device string given
     * @return the line for a device string that names no device
     */
    public static String unknownDevice(String device) {
        return "unknown device '" + device + "'; expected cpu, cuda or cuda:N";
    }

    /**
     * @param device the device asked for, e.g. {@code cuda:0}
     * @param reason why it is not there ({@link #cudaDevicesSeen}, {@link #cudaCpuBuild}, ...)
     * @return the line for a device this process cannot train on
     */
    public static String deviceUnavailable(String device, String reason) {
        return device + " is not available: " + reason;
    }

    /**
     * @param libtorch the libtorch build, e.g. {@code 2.7.1+cu126}
     * @param count the CUDA devices it sees
     * @param driver whether the NVIDIA driver's library loads (said when no device is seen)
     * @return why a CUDA device index is out of reach
     */
    public static String cudaDevicesSeen(String libtorch, int count, boolean driver) {
        String seen = "this libtorch (" + libtorch + ") sees " + count + " CUDA device" + (count == 1 ? "" : "s");
        if (count > 0) {
            return seen + " (cuda:0" + (count > 1 ? " to cuda:" + (count - 1) : "") + ")";
        }
        return seen + (driver ? "" : " (no NVIDIA driver: libcuda.so.1 does not load)");
    }

    /**
     * @param libtorch the libtorch build and where it is
     * @return why a libtorch without CUDA libraries trains on no CUDA device
     */
    public static String cudaCpuBuild(String libtorch) {
        return "this libtorch (" + libtorch + ") is a CPU build (no libtorch_cuda.so): use a CUDA build (pip's torch"
                + " on Linux; for a JVM of its own, GRADBRIDGE_LIBTORCH=its torch/lib)";
    }

    /**
     * @param file libtorch's CUDA library
     * @param reason the dynamic linker's
     * @return why libtorch's CUDA library did not load
     */
    public static String cudaUnloadable(String file, String reason) {
        return "cannot load " + file + ": " + reason;
    }

    /** Why a JVM whose libtorch started without its CUDA libraries trains on no CUDA device (Java only). */
    public static final String CUDA_NOT_LOADED = "libtorch started in this JVM without its CUDA libraries, which"
            + " load with libtorch: name the CUDA device before other libtorch work, or start the JVM with"
            + " -Dgradbridge.cuda=true (or GRADBRIDGE_CUDA=1)";

    // ---- data-parallel training (gradbridge-spark, reference shards) ----

    /**
     * @param module the training module file
     * @param version its protocol version
     * @param missing the data-parallel methods it lacks
     * @return the line for a module that cannot train data-parallel
     */
    public static String dataParallelMethods(String module, int version, java.util.List<String> missing) {
        return module + ": protocol " + version + " module without " + String.join(", ", missing)
                + ", which data-parallel training needs (protocol 2); re-export it with this gradbridge version";
    }

    /**
     * @param module the training module file
     * @param buffers the buffers its training step writes
     * @return the line for a module whose training writes buffers, exported before {@code set_state}
     */
    public static String dataParallelBuffers(String module, java.util.List<String> buffers) {
        return module + ": training writes its buffers " + buffers + " (e.g. BatchNorm statistics), and it has no"
                + " method set_state, which data-parallel training needs to keep them equal across partitions;"
                + " re-export it with this gradbridge version";
    }

    /**
     * @param name the input field
     * @param index the element's index, e.g. {@code [2, 1]}
     * @param value its value
     * @param limit the magnitude limit
     * @return the line refusing an input value beyond the limit
     */
    public static String inputTooLarge(String name, String index, double value, double limit) {
        return "field '" + name + "' element " + index + " is " + value + ", beyond the input magnitude limit " + limit
                + " (--max-input-abs; 0 turns it off)";
    }

    /**
     * @param module the training module file
     * @param accumulate its gradient-accumulation factor
     * @return the line for a module exported with gradient accumulation
     */
    public static String dataParallelAccumulate(String module, long accumulate) {
        return module + ": exported with accumulate=" + accumulate + "; data-parallel training splits each"
                + " mini-batch over partitions instead: export it with accumulate=1";
    }

    /**
     * @param module the training module file
     * @param accumulate its gradient-accumulation factor
     * @return the line for a module exported with gradient accumulation, which online learning refuses
     */
    public static String onlineAccumulate(String module, long accumulate) {
        return module + " accumulates gradients over " + accumulate + " micro-batches; online learning applies one"
                + " step per micro-batch (export without accumulate)";
    }

    /**
     * @param scala the Scala version of the gradbridge-spark artifact that runs
     * @param built the Spark versions that artifact is built for
     * @param spark the Spark version that runs
     * @param sparkScala the Scala version that runs
     * @return the line for a gradbridge-spark artifact on a Spark of another line
     */
    public static String sparkLine(String scala, String built, String spark, String sparkScala) {
        return "gradbridge-spark_" + scala + " is built for Spark " + built + " (Scala " + scala + "), this is Spark "
                + spark + " on Scala " + sparkScala + "; use gradbridge-spark_2.12 (spark-submit:"
                + " gradbridge-spark-submit_2.12) for Spark 3.5.x on Scala 2.12, gradbridge-spark_2.13"
                + " (gradbridge-spark-submit_2.13) for Spark 4.0 to 4.3";
    }

    /**
     * @param source where the master came from ({@code --master} or {@code spark.master})
     * @param master the master URL
     * @return the line for a master URL Spark cannot run on
     */
    public static String sparkMaster(String source, String master) {
        return source + " " + master + ": not a Spark master URL; expected local, local[K], local[K,F] (K at"
                + " least 1 or *), local-cluster[N,C,M], spark://HOST:PORT, or one a cluster manager on the"
                + " classpath accepts (yarn, k8s://URL)";
    }

    /**
     * @param key the setting ({@code spark.driver.host} or {@code spark.driver.bindAddress})
     * @param host its value
     * @param reason why the driver cannot listen there
     * @return the line for a driver address that is not this machine's
     */
    public static String sparkDriverAddress(String key, String host, String reason) {
        return key + " " + host + ": the driver cannot listen there (" + reason + "); name an address of this"
                + " machine, or leave it unset";
    }

    /**
     * @param source the Parquet data
     * @param column a column of it that is neither an input of the model nor y
     * @param inputs the model's inputs
     * @return the line for a column that a module of several inputs does not take
     */
    public static String unknownColumn(String source, String column, java.util.List<String> inputs) {
        return notAnInput(source, "column", column, inputs,
                "a model of several inputs trains on exactly its inputs' columns and y: drop the others");
    }

    /**
     * @param source the .npz file
     * @param array an array of it that is neither an input of the model nor y
     * @param inputs the model's inputs
     * @return the line for an array the module does not take (any module: an .npz holds what was
     *     saved for training, a Parquet table of a one-input model may carry other columns)
     */
    public static String unknownArray(String source, String array, java.util.List<String> inputs) {
        return notAnInput(source, "array", array, inputs,
                "an .npz holds exactly the model's inputs and y: drop the others");
    }

    private static String notAnInput(String source, String kind, String name, java.util.List<String> inputs,
            String rule) {
        return source + ": " + kind + " " + name + " is not an input of the model (it takes " + inputs + " and y); "
                + rule;
    }

    /**
     * @param source the data (a file, or {@code training data} for arrays)
     * @param array the input (or y) that holds the value
     * @param element where in a row, for rows of more than one value; null otherwise
     * @param value the value the model does not take
     * @param low the smallest value the model takes there, searched from 0
     * @param high the largest
     * @return the line for an id or label the model cannot take (a class past its classes, an id
     *     past its embedding's rows): libtorch's error names neither the data nor the array
     */
    public static String valueOutOfRange(String source, String array, long[] element, long value, long low,
            long high) {
        String at = element == null ? "" : " at element " + Arrays.toString(element) + " of a row";
        String there = element == null ? "" : " there";
        return source + ": " + array + " holds " + value + at + ", outside the range the model takes" + there + " ("
                + low + ".." + high + ")";
    }

    /**
     * @param reason Spark's own message, first line
     * @return the line for a Spark context that failed to start
     */
    public static String sparkStart(String reason) {
        return "Spark could not start: " + reason;
    }

    /**
     * @param setting the exchange setting
     * @param allowed the values it takes
     * @param value the value given
     * @return the line for an exchange that does not exist
     */
    public static String sparkExchange(String setting, java.util.List<String> allowed, String value) {
        return setting + " must be " + String.join(" or ", allowed) + ", got " + value;
    }

    /**
     * @param setting the one-round bytes setting
     * @param most its largest value
     * @param value the value given
     * @return the line for a byte count out of range
     */
    public static String sparkOneRoundBytes(String setting, long most, String value) {
        return setting + " must be a whole number of bytes in 0.." + most + ", got " + value;
    }

    /**
     * @param setting the threads-per-task setting
     * @param most its largest value
     * @param value the value given
     * @return the line for a thread count out of range
     */
    public static String sparkThreads(String setting, int most, String value) {
        return setting + " must be a whole number of threads in 1.." + most + ", got " + value;
    }

    /** A protocol-3 file without one of its entries (python: messages.program_entry_missing). */
    public static String programEntryMissing(String path, String entry) {
        return path + ": the protocol-3 module lacks " + entry + " (a truncated or edited file); export it again";
    }

    /** A protocol-3 program of another op-list version (python: messages.program_version). */
    public static String programVersion(String path, String version, int supported) {
        return path + ": op-list version " + version + ", this gradbridge runs version " + supported
                + "; export the model again with this gradbridge";
    }

    /** A protocol-3 state entry of another dtype or shape than its tensor's (python: messages.program_state_mismatch). */
    public static String programStateMismatch(String path, String name, String expected, String actual) {
        return path + ": state tensor " + name + " is " + actual + ", expected " + expected + " (an edited file); export"
                + " it again";
    }

    /** A protocol-3 state file of another size than its entry needs (python: messages.program_state_bytes). */
    public static String programStateBytes(String path, String file, long size, String name, String spec, long needed) {
        return path + ": " + file + " holds " + size + " bytes, " + name + " (" + spec + ") needs " + needed
                + " (a truncated or edited file)";
    }

    /** A protocol-3 file that cannot be read (python: messages.program_unreadable). */
    public static String programUnreadable(String path, String reason) {
        return path + ": not a readable protocol-3 module: " + reason;
    }

    /** What protocol-3 modules do not support yet. */
    public static String protocol3Refuses(String path, String what) {
        return path + ": protocol-3 modules (format='export') do not support " + what + " yet; export with"
                + " format='torchscript' for them";
    }

    /** A protocol-3 module without graphs at one sample, where a batch of one must run (online micro-batches). */
    public static String protocol3NoBatchOfOne(String path, int minBatch, String what) {
        return path + ": this protocol-3 module runs batches of at least " + minBatch + " (its export could not"
                + " capture one sample), but " + what + " runs batches of one; export with format='torchscript' for it";
    }

    /** A protocol-3 module captured with another torch release than the libtorch this JVM runs. */
    public static String protocol3OtherTorch(String path, String captured, String engine) {
        return path + " was captured with torch " + captured + " but this JVM runs libtorch " + engine
                + ": a protocol-3 module (format='export') runs on the torch release it was captured with;"
                + " export it with that torch, or run Java on this torch's libtorch";
    }
}
