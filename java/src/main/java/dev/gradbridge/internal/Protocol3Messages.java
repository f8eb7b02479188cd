package dev.gradbridge.internal;


/**
 * The wording of the lines about protocol-3 modules (format='export'): damaged program files and
 * what they do not support (python: {@code messages/protocol3.py}, the same sentences).
 */
public final class Protocol3Messages {

    private Protocol3Messages() {}

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
