package dev.gradbridge;

import java.lang.ref.Cleaner;

/**
 * A native tensor's handle, freed exactly once: by {@link Tensor#close}, or by the cleaner when its
 * {@link Tensor} became unreachable unclosed (a safety net). Apart from {@link Tensor} so that the tensor's
 * class holds its API, not the ownership machinery.
 */
final class TensorHandle implements Runnable {

    private static final Cleaner CLEANER = Cleaner.create();

    volatile long value; // 0 once freed

    TensorHandle(long value) {
        this.value = value;
    }

    /** Frees this handle once {@code owner} is unreachable; the returned cleanable frees it now. */
    Cleaner.Cleanable register(Object owner) {
        return CLEANER.register(owner, this);
    }

    /** Frees the native tensor once, from close() or from the cleaner. */
    @Override
    public synchronized void run() {
        long handle = value;
        value = 0;
        if (handle != 0) {
            Native.tensorFree(handle);
        }
    }
}
