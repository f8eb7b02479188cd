package dev.gradbridge.internal;

import dev.gradbridge.DType;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/** SHA-256 and lower-case hex: the one digest helper of gradbridge's Java side (data, parameters, modules). */
public final class Digests {

    private static final char[] HEX = "0123456789abcdef".toCharArray();
    private static final DType[] DIGEST_TYPES = {DType.FLOAT32, DType.FLOAT64, DType.INT64, DType.BFLOAT16, DType.FLOAT16};

    private Digests() {}

    /** @return a new SHA-256 digest (every JVM has one) */
    public static MessageDigest sha256() {
        try {
            return MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
    }

    /**
     * @param bytes the bytes
     * @return SHA-256 of the bytes as lower-case hex
     */
    public static String sha256Hex(byte[] bytes) {
        return hex(sha256().digest(bytes));
    }

    /**
     * @param file a file, read in chunks
     * @return SHA-256 of its bytes as lower-case hex
     * @throws IOException when it cannot be read
     */
    public static String sha256Hex(Path file) throws IOException {
        MessageDigest digest = sha256();
        try (InputStream in = Files.newInputStream(file)) {
            byte[] buffer = new byte[1 << 16];
            for (int n; (n = in.read(buffer)) > 0; ) {
                digest.update(buffer, 0, n);
            }
        }
        return hex(digest.digest());
    }

    /**
     * @param bytes e.g. a digest
     * @return lower-case hex, two characters per byte
     */
    public static String hex(byte[] bytes) {
        char[] out = new char[bytes.length * 2];
        for (int i = 0; i < bytes.length; i++) {
            out[2 * i] = HEX[(bytes[i] >> 4) & 0xf];
            out[2 * i + 1] = HEX[bytes[i] & 0xf];
        }
        return new String(out);
    }

    /**
     * The dtype whose bytes a parameter's digest hashes ({@code dev.gradbridge.History#digest}):
     * {@code float32}, {@code float64} or {@code int64} (what parameters, buffers and optimizer
     * state hold).
     *
     * @param dtype torch's name
     * @return its type
     * @throws IllegalArgumentException for any other
     */
    public static DType digestType(String dtype) {
        for (DType type : DIGEST_TYPES) {
            if (type.torchName().equals(dtype)) {
                return type;
            }
        }
        throw new IllegalArgumentException("no digest for dtype " + dtype);
    }
}
