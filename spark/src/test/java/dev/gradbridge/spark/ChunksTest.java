package dev.gradbridge.spark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;
import org.junit.Test;

/** The gradient's cut into K chunks: every element once, in order; the chunks but the last of equal length. */
public class ChunksTest {

    /** Every element of every parameter in exactly one piece, chunk after chunk in protocol order. */
    private static void assertCovers(Chunks chunks, long[] sizes, int k) {
        long total = Arrays.stream(sizes).sum();
        long each = (total + k - 1) / k;
        int parameter = 0;
        long next = 0;
        for (int c = 0; c < k; c++) {
            long elements = 0;
            for (Chunks.Piece piece : chunks.pieces(c)) {
                while (next == sizes[parameter]) {
                    parameter++;
                    next = 0;
                }
                assertEquals(parameter, piece.parameter);
                assertEquals(next, piece.start);
                assertTrue(piece.length > 0);
                next += piece.length;
                elements += piece.length;
            }
            assertEquals("chunk " + c, Math.max(0, Math.min(each, total - each * c)), elements);
        }
        assertEquals(sizes.length - 1, parameter);
        assertEquals(sizes[sizes.length - 1], next);
    }

    @Test
    public void chunksCoverEveryElementInOrder() {
        long[][] cases = {{5, 3, 7}, {1}, {4, 4}, {1_000_003, 17}, {2, 1}};
        for (long[] sizes : cases) {
            List<String> dtypes = Collections.nCopies(sizes.length, "float32");
            for (int k = 1; k <= 5; k++) {
                assertCovers(new Chunks(dtypes, sizes, k), sizes, k);
            }
        }
    }

    @Test
    public void oneDtypeChunksButTheLastHaveTheSameBytes() {
        long[] sizes = {524288, 1024, 524288, 512, 5120, 11};
        Chunks chunks = new Chunks(Collections.nCopies(sizes.length, "float32"), sizes, 3);
        assertEquals(chunks.bytes(0), chunks.bytes(1));
        assertTrue(chunks.bytes(2) <= chunks.bytes(0));
        assertEquals(4 * Arrays.stream(sizes).sum(), chunks.bytes(0) + chunks.bytes(1) + chunks.bytes(2));
    }

    @Test
    public void byteOffsetsFollowEachParametersDtype() {
        List<String> dtypes = Arrays.asList("float32", "float64");
        Chunks chunks = new Chunks(dtypes, new long[] {3, 3}, 2); // 6 elements: [0..3) of p0, [0..3) of p1
        assertEquals(1, chunks.pieces(1).size());
        Chunks.Piece piece = chunks.pieces(1).get(0);
        assertEquals(1, piece.parameter);
        assertEquals(0, chunks.offset(piece));
        assertEquals(24, chunks.bytes(piece));
        assertEquals(12, chunks.bytes(0));
        assertEquals(Arrays.asList("float64"), chunks.dtypes(1, dtypes));
        assertArrayEquals(new int[] {1}, chunks.parameters(1));
    }

    @Test
    public void cutThenPasteGivesTheGradientBack() {
        long[] sizes = {5, 3, 7};
        List<String> dtypes = Arrays.asList("float32", "float64", "float32");
        ByteBuffer[] gradients = new ByteBuffer[sizes.length];
        ByteBuffer[] pasted = new ByteBuffer[sizes.length];
        int value = 1;
        for (int i = 0; i < sizes.length; i++) {
            gradients[i] = Buffers.direct(sizes[i] * ShardedData.bytesOf(dtypes.get(i)));
            pasted[i] = Buffers.direct(gradients[i].limit());
            for (int b = 0; b < gradients[i].limit(); b++) {
                gradients[i].put(b, (byte) value++);
            }
        }
        for (int k = 1; k <= 4; k++) {
            Chunks chunks = new Chunks(dtypes, sizes, k);
            for (int c = 0; c < k; c++) {
                chunks.paste(c, chunks.cut(c, gradients), pasted);
            }
            for (int i = 0; i < sizes.length; i++) {
                assertEquals("k=" + k + ", parameter " + i, gradients[i], pasted[i]);
                for (int b = 0; b < pasted[i].limit(); b++) {
                    pasted[i].put(b, (byte) 0);
                }
            }
        }
    }
}
