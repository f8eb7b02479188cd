package dev.gradbridge.spark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertThrows;

import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import org.junit.Test;

/** A partition's step result through its wire form and back, byte for byte. */
public class ShardResultTest {

    private static ByteBuffer floats(float... values) {
        ByteBuffer buffer = ByteBuffer.allocate(4 * values.length).order(ByteOrder.LITTLE_ENDIAN);
        for (float v : values) {
            buffer.putFloat(v);
        }
        buffer.flip();
        return buffer;
    }

    private static byte[] bytes(ByteBuffer buffer) {
        byte[] out = new byte[buffer.remaining()];
        buffer.duplicate().get(out);
        return out;
    }

    @Test
    public void aResultWithGradientsDecodesToTheSameValues() {
        // a gradient that is a slice of a larger buffer (a chunk of a parameter) is sent from its position on
        ByteBuffer whole = floats(9f, 1.5f, -2f, Float.MIN_VALUE);
        whole.position(4);
        ShardResult sent = new ShardResult(3, 17, 0.6931471805599453,
                new ByteBuffer[] {floats(0.25f, -0f), whole.slice().order(ByteOrder.LITTLE_ENDIAN)},
                new boolean[] {true, false, true});
        byte[] wire = sent.encode();
        assertEquals(16 + 4 + 3 + 4 + 2 * 4 + 8 + 12, wire.length); // exactly as large as it needs
        ShardResult got = ShardResult.decode(wire);
        assertEquals(3, got.partition);
        assertEquals(17, got.rows);
        assertEquals(Double.doubleToLongBits(0.6931471805599453), Double.doubleToLongBits(got.loss));
        assertArrayEquals(new boolean[] {true, false, true}, got.flags);
        assertEquals(2, got.gradients.length);
        assertArrayEquals(bytes(floats(0.25f, -0f)), bytes(got.gradients[0]));
        assertArrayEquals(bytes(floats(1.5f, -2f, Float.MIN_VALUE)), bytes(got.gradients[1]));
        assertEquals(ByteOrder.LITTLE_ENDIAN, got.gradients[1].order());
        assertEquals(sent.gradientBytes(), got.gradientBytes());
    }

    @Test
    public void anEmptyPartitionSendsItsHeaderOnly() {
        byte[] wire = ShardResult.empty(5).encode();
        assertEquals(16, wire.length);
        ShardResult got = ShardResult.decode(wire);
        assertEquals(5, got.partition);
        assertEquals(0, got.rows);
        assertNull(got.gradients);
        assertEquals(0, got.gradientBytes());
    }

    @Test
    public void aTruncatedResultIsRefused() {
        byte[] wire = new ShardResult(0, 2, 1.0, new ByteBuffer[] {floats(1f, 2f)}, new boolean[] {true}).encode();
        byte[] truncated = Arrays.copyOf(wire, wire.length - 3);
        assertEquals("a malformed shard result",
                assertThrows(UncheckedIOException.class, () -> ShardResult.decode(truncated)).getMessage());
    }
}
