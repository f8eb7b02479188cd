package dev.gradbridge;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import org.junit.Test;

/** gradbridge's tensor type over the native layer: ownership, buffers, shapes, libtorch's errors. */
public class TensorTest {

    @Test
    public void valuesShapeAndTypeRoundTrip() {
        try (Tensor t = Tensor.of(new float[] {1.5f, -2f, 3f, 4f, 5f, 6f}, 2, 3)) {
            assertEquals(DType.FLOAT32, t.dtype());
            assertArrayEquals(new long[] {2, 3}, t.shape());
            assertEquals(6, t.numel());
            assertArrayEquals(new float[] {1.5f, -2f, 3f, 4f, 5f, 6f}, t.toFloatArray(), 0f);
            assertArrayEquals(new double[] {1.5, -2, 3, 4, 5, 6}, t.toExactDoubles(), 0.0);
        }
        try (Tensor b = Tensor.of(new boolean[] {true, false}, 2)) {
            assertArrayEquals(new boolean[] {true, false}, b.toBooleanArray());
        }
    }

    @Test
    public void emptyAndScalarShapes() {
        try (Tensor none = Tensor.of(new float[0], 0, 4);
                Tensor scalar = Tensor.of(new double[] {7})) {
            assertArrayEquals(new long[] {0, 4}, none.shape());
            assertEquals(0, none.toFloatArray().length);
            assertEquals(0, scalar.dim());
            assertEquals(7.0, scalar.toDoubleArray()[0], 0.0);
        }
    }

    @Test
    public void fromBufferUsesTheBuffersMemoryFromItsPosition() {
        ByteBuffer bytes = ByteBuffer.allocateDirect(8 + 3 * 8).order(ByteOrder.nativeOrder());
        bytes.putLong(99).putLong(1).putLong(2).putLong(3);
        bytes.position(8);
        try (Tensor t = Tensor.fromBuffer(bytes, DType.INT64, 3)) {
            assertArrayEquals(new long[] {1, 2, 3}, t.toLongArray());
            bytes.putLong(8, 10); // no copy: the tensor sees the change
            assertArrayEquals(new long[] {10, 2, 3}, t.toLongArray());
        }
    }

    @Test
    public void badBuffersAreRefusedInJava() {
        assertThrows(InvalidInputException.class, () -> Tensor.fromBuffer(ByteBuffer.allocate(16), DType.FLOAT32, 4));
        InvalidInputException small = assertThrows(InvalidInputException.class,
                () -> Tensor.fromBuffer(ByteBuffer.allocateDirect(8), DType.FLOAT32, 4));
        assertTrue(small.getMessage(), small.getMessage().contains("needs 16 bytes, the buffer has 8"));
        assertThrows(InvalidInputException.class, () -> Tensor.of(new float[3], 2, 2));
    }

    @Test
    public void rowsIndexCopyAndConversion() {
        try (Tensor t = Tensor.of(new float[] {0, 1, 2, 3, 4, 5}, 3, 2);
                Tensor middle = t.rows(1, 2);
                Tensor order = Tensor.of(new long[] {2, 0}, 2);
                Tensor picked = t.index(order);
                Tensor wide = t.to(DType.FLOAT64);
                Tensor copy = t.copy()) {
            assertArrayEquals(new float[] {2, 3}, middle.toFloatArray(), 0f);
            assertArrayEquals(new float[] {4, 5, 0, 1}, picked.toFloatArray(), 0f);
            assertArrayEquals(new double[] {0, 1, 2, 3, 4, 5}, wide.toDoubleArray(), 0.0);
            t.buffer().putFloat(0, 42f).putFloat(8, 7f);
            assertEquals(7f, middle.toFloatArray()[0], 0f); // rows() is a view of t's memory
            assertEquals(0f, copy.toFloatArray()[0], 0f); // a copy has memory of its own
        }
    }

    @Test
    public void libtorchErrorsArriveAsOneMessageWithoutTheCppBacktrace() {
        try (Tensor t = Tensor.of(new float[] {0, 1}, 2, 1);
                Tensor outside = Tensor.of(new long[] {5}, 1)) {
            NativeException e = assertThrows(NativeException.class, () -> t.index(outside));
            assertTrue(e.getMessage(), e.getMessage().contains("out of range"));
            assertFalse(e.getMessage(), e.getMessage().contains("Exception raised from"));
        }
    }

    @Test
    public void closingTwiceIsHarmlessAndUseAfterCloseIsRefused() {
        Tensor t = Tensor.of(new float[] {1}, 1);
        t.close();
        t.close();
        assertTrue(t.isClosed());
        assertThrows(IllegalStateException.class, t::toFloatArray);
    }

    @Test
    public void oneDtypeDefinition() {
        assertEquals(DType.FLOAT32, DType.of("float32"));
        assertEquals(DType.INT64, DType.ofNumpy("<i8"));
        assertEquals(DType.BOOL, DType.ofNumpy("|b1"));
        assertEquals(null, DType.ofNumpy(">f4"));
        assertEquals(8, DType.FLOAT64.size());
        assertThrows(InvalidInputException.class, () -> DType.of("complex64"));
    }
}
