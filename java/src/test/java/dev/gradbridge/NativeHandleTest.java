package dev.gradbridge;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;

import org.junit.BeforeClass;
import org.junit.Test;

/**
 * The native layer's handles: a zero (closed) handle, or one of another kind, is refused by name with
 * one line in a {@link NativeException}, never a crash of the JVM.
 */
public class NativeHandleTest {

    @BeforeClass
    public static void load() {
        NativeLibrary.load();
    }

    private static String refused(org.junit.function.ThrowingRunnable call) {
        return assertThrows(NativeException.class, call).getMessage();
    }

    @Test
    public void aZeroHandleIsRefusedByItsKind() {
        assertEquals("the tensor is closed", refused(() -> Native.tensorShape(0)));
        assertEquals("the module is closed", refused(() -> Native.moduleMethods(0)));
        assertEquals("the method is closed", refused(() -> Native.methodAllFinite(0)));
        assertEquals("the plan is closed", refused(() -> Native.inferPlanRun(0, 0)));
        assertEquals("the exported module is closed", refused(() -> Native.exportedCounters(0)));
        // freeing a zero handle is nothing to do, as closing twice is
        Native.tensorFree(0);
        Native.moduleFree(0);
    }

    @Test
    public void aHandleOfAnotherKindIsRefusedByName() {
        long tensor = Native.tensorEmpty(DType.FLOAT32.code(), new long[] {2});
        try {
            assertEquals("a tensor handle where a module is expected", refused(() -> Native.moduleMethods(tensor)));
            assertEquals("a tensor handle where an exported module is expected",
                    refused(() -> Native.exportedCounters(tensor)));
            assertEquals("a tensor handle where a plan is expected", refused(() -> Native.planFree(tensor)));
            assertEquals("a tensor handle where a plan is expected", refused(() -> Native.plansStepWhileFinite(
                    new long[] {tensor, tensor, tensor, tensor}, new long[0], new long[0], new double[0], new int[1],
                    new String[1])));
            // the refused calls left it whole
            assertEquals(2, Native.tensorShape(tensor)[0]);
        } finally {
            Native.tensorFree(tensor);
        }
    }
}
