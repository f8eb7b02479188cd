package dev.gradbridge.spark;

import java.nio.ByteBuffer;

/**
 * The JNI entry points of gradbridge-spark's own native library, {@code libgradbridge_gloo}
 * ({@code spark/src/main/native/gradbridge_gloo.cpp}): libtorch's c10d Gloo, which only
 * gradbridge-spark uses, so gradbridge's core library carries none of it. {@code javac -h} generates
 * the C++ signatures from this file alone ({@code python/gradbridge/_runtime/native.py}), so it uses only
 * {@code java.*} types. Callers load the library first ({@link GlooLibrary#load}); each error is a
 * one-line {@code dev.gradbridge.NativeException}.
 */
final class GlooNative {

    private GlooNative() {}

    /**
     * A c10d {@code TCPStore}: the server, listening on {@code host} only (port 0 picks a free one), or
     * a client of the server at host:port.
     */
    static native long glooStore(String host, int port, boolean server, int timeoutMillis);

    /**
     * A c10d store whose keys {@code keeper} (a {@code GlooGroup.Rendezvous}: an Object, as this
     * class compiles alone for {@code javac -h}) keeps; no socket: each operation calls it.
     */
    static native long glooStoreOver(Object keeper, int timeoutMillis);

    /** @return the store's port (the one the server picked) */
    static native int glooStorePort(long store);

    static native void glooStoreFree(long store);

    /**
     * A {@code ProcessGroupGloo} of {@code size} ranks met through the store under {@code prefix}, its
     * device on {@code host}; returns once every rank joined. The group keeps the store it needs.
     */
    static native long glooGroup(long store, String prefix, String host, int rank, int size, int timeoutMillis);

    /** Frees the group on a thread of its own (it waits for an operation in flight to end). */
    static native void glooGroupFree(long group);

    /**
     * Starts {@code alltoall_base} over bytes: {@code sendSplits[r]} bytes of {@code send} to rank r, in
     * rank order, and {@code receiveSplits[r]} bytes from rank r into {@code receive}; returns the
     * operation (direct buffers, kept alive by the operation).
     */
    static native long glooAlltoall(long group, ByteBuffer send, long[] sendSplits, ByteBuffer receive,
            long[] receiveSplits);

    /** Starts {@code allgather}: {@code each} bytes of {@code send} from every rank into {@code receive}, in rank order. */
    static native long glooAllgather(long group, ByteBuffer send, ByteBuffer receive, long each);

    /** @return whether the operation ended within {@code millis}; throws its error if it failed */
    static native boolean glooWait(long work, int millis);

    static native void glooWorkFree(long work);
}
