package dev.gradbridge.online;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/**
 * The digests of a version's parameters, as {@code dev.gradbridge.History#digest} computes them
 * (SHA-256 of the values' little-endian bytes in the parameter's dtype, lower-case hex), without
 * its per-call costs: one {@link MessageDigest} and one byte buffer reused across parameters and
 * versions, and hex from a table instead of {@code String.format} per byte (which was most of a
 * version's snapshot time). Not thread-safe: one instance per thread that snapshots.
 */
final class ParameterDigests {

    private static final char[] HEX = "0123456789abcdef".toCharArray();

    private final MessageDigest sha256;
    private ByteBuffer bytes = ByteBuffer.allocate(0).order(ByteOrder.LITTLE_ENDIAN);

    ParameterDigests() {
        try {
            sha256 = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is missing from this JVM", e);
        }
    }

    /**
     * @param values a parameter's values (exact: float32 values widened)
     * @param dtype {@code float32}, {@code float64} or {@code int64}
     * @return the same string as {@code History.digest(values, dtype)}
     */
    String digest(double[] values, String dtype) {
        int width;
        switch (dtype) {
            case "float32":
                width = 4;
                break;
            case "float64":
            case "int64":
                width = 8;
                break;
            default:
                throw new IllegalArgumentException("no digest for dtype " + dtype);
        }
        int size = values.length * width;
        if (bytes.capacity() < size) {
            bytes = ByteBuffer.allocate(size).order(ByteOrder.LITTLE_ENDIAN);
        }
        bytes.clear();
        if (width == 4) {
            for (double value : values) {
                bytes.putFloat((float) value);
            }
        } else if ("float64".equals(dtype)) {
            for (double value : values) {
                bytes.putDouble(value);
            }
        } else {
            for (double value : values) {
                bytes.putLong((long) value);
            }
        }
        sha256.reset();
        sha256.update(bytes.array(), 0, size);
        byte[] hash = sha256.digest();
        char[] hex = new char[hash.length * 2];
        for (int i = 0; i < hash.length; i++) {
            hex[2 * i] = HEX[(hash[i] >> 4) & 0xf];
            hex[2 * i + 1] = HEX[hash[i] & 0xf];
        }
        return new String(hex);
    }
}
