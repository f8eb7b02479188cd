package dev.gradbridge.spark;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/** The exchanges' direct buffers: allocated once per run, read and written through views made once. */
final class Buffers {

    private Buffers() {}

    /** @return a zeroed little-endian direct buffer, its limit {@code bytes} (its capacity at least one: a native address) */
    static ByteBuffer direct(long bytes) {
        ByteBuffer out = ByteBuffer.allocateDirect(Math.toIntExact(Math.max(1, bytes))).order(ByteOrder.LITTLE_ENDIAN);
        out.limit(Math.toIntExact(bytes));
        return out;
    }

    /** @return a little-endian view of {@code length} bytes of {@code buffer} from index {@code offset} */
    static ByteBuffer view(ByteBuffer buffer, long offset, long length) {
        return buffer.slice(Math.toIntExact(offset), Math.toIntExact(length)).order(ByteOrder.LITTLE_ENDIAN);
    }
}
