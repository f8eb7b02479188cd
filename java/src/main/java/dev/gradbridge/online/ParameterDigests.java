package dev.gradbridge.online;

import dev.gradbridge.Digests;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.security.MessageDigest;

/**
 * The digests of a version's parameters, as {@code dev.gradbridge.History#digest} computes them
 * (SHA-256 of the values' little-endian bytes in the parameter's dtype, lower-case hex), without
 * its per-call costs: one {@link MessageDigest} and one byte buffer reused across parameters and
 * versions, and hex from a table instead of {@code String.format} per byte (which was most of a
 * version's snapshot time). Not thread-safe: one instance per thread that snapshots.
 */
final class ParameterDigests {

    private final MessageDigest sha256;
    private ByteBuffer bytes = ByteBuffer.allocate(0).order(ByteOrder.LITTLE_ENDIAN);

    ParameterDigests() {
        sha256 = Digests.sha256();
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
        return Digests.hex(sha256.digest());
    }
}
