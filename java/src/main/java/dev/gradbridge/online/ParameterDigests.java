package dev.gradbridge.online;

import dev.gradbridge.DType;
import dev.gradbridge.internal.Digests;
import java.nio.ByteBuffer;
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
    private ByteBuffer bytes = ByteBuffer.allocate(0).order(DType.FILE_ORDER);

    ParameterDigests() {
        sha256 = Digests.sha256();
    }

    /**
     * @param values a parameter's values (exact: float32 values widened)
     * @param dtype {@code float32}, {@code float64} or {@code int64}
     * @return the same string as {@code History.digest(values, dtype)}
     */
    String digest(double[] values, String dtype) {
        DType type = Digests.digestType(dtype);
        int size = values.length * type.size();
        if (bytes.capacity() < size) {
            bytes = ByteBuffer.allocate(size).order(DType.FILE_ORDER);
        }
        bytes.clear();
        for (double value : values) {
            type.put(bytes, value);
        }
        sha256.reset();
        sha256.update(bytes.array(), 0, size);
        return Digests.hex(sha256.digest());
    }
}
