package dev.gradbridge;

import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A process group of libtorch's c10d Gloo (the one TorchDistributor's workers use) over bytes: the
 * collective gradbridge-spark's training tasks exchange gradients with. Ranks meet through a c10d
 * {@code TCPStore} that one process serves ({@link Store#serve}: gradbridge-spark's driver) and the
 * ranks connect to ({@link Store#connect}), each group under a prefix of its own.
 *
 * <p>Each collective runs on Gloo's thread and blocks the caller until it ends, calling {@code
 * check} every {@link #CHECK_MILLIS} ms meanwhile, so that a caller that must stop (Spark killed the
 * task) can throw out of it. A peer that died or closed its group fails the collective on every
 * other rank with a {@link NativeException} (one line); so does Gloo's timeout. Buffers are direct
 * and the operation keeps them referenced, even past a caller that gave up on it.
 */
public final class GlooGroup implements AutoCloseable {

    /** How often a caller waiting in a collective runs its check. */
    public static final int CHECK_MILLIS = 200;

    private final AtomicLong handle;
    private final int rank;
    private final int size;

    /** The rendezvous: a c10d {@code TCPStore}, served by one rank, connected to by the others. */
    public static final class Store implements AutoCloseable {
        private final AtomicLong handle;

        private Store(long handle) {
            this.handle = new AtomicLong(handle);
        }

        /**
         * @param timeout how long the store's operations wait
         * @return the server, listening on every interface, on a free port ({@link #port()})
         */
        public static Store serve(Duration timeout) {
            NativeLibrary.load();
            return new Store(Native.glooStore("127.0.0.1", 0, true, millis(timeout)));
        }

        /** @return a client of the server at {@code host:port} */
        public static Store connect(String host, int port, Duration timeout) {
            NativeLibrary.load();
            return new Store(Native.glooStore(host, port, false, millis(timeout)));
        }

        /** @return the port the server listens on */
        public int port() {
            return Native.glooStorePort(live());
        }

        private long live() {
            long h = handle.get();
            if (h == 0) {
                throw new IllegalStateException("the store is closed");
            }
            return h;
        }

        /** Drops this reference; a group made from the store keeps its own. */
        @Override
        public void close() {
            long h = handle.getAndSet(0);
            if (h != 0) {
                Native.glooStoreFree(h);
            }
        }
    }

    private GlooGroup(long handle, int rank, int size) {
        this.handle = new AtomicLong(handle);
        this.rank = rank;
        this.size = size;
    }

    /**
     * Joins a group; returns once all {@code size} ranks joined (or fails after {@code timeout}).
     *
     * @param store the rendezvous
     * @param prefix names this group in the store (a new one per group met through one store)
     * @param host this rank's address, which the others connect to
     * @param timeout how long a collective (and the rendezvous) waits for the peers
     */
    public static GlooGroup join(Store store, String prefix, String host, int rank, int size, Duration timeout) {
        return new GlooGroup(Native.glooGroup(store.live(), prefix, host, rank, size, millis(timeout)), rank, size);
    }

    /** @return this rank */
    public int rank() {
        return rank;
    }

    /** @return the number of ranks */
    public int size() {
        return size;
    }

    /**
     * All-to-all: {@code sendSplits[r]} bytes of {@code send}, in rank order, to rank r, and
     * {@code receiveSplits[r]} bytes from rank r into {@code receive}, in rank order.
     */
    public void alltoall(ByteBuffer send, long[] sendSplits, ByteBuffer receive, long[] receiveSplits, Runnable check) {
        await(Native.glooAlltoall(live(), send, sendSplits, receive, receiveSplits), check);
    }

    /** All-gather: {@code each} bytes of {@code send} from every rank into {@code receive}, in rank order. */
    public void allgather(ByteBuffer send, ByteBuffer receive, long each, Runnable check) {
        await(Native.glooAllgather(live(), send, receive, each), check);
    }

    private static void await(long work, Runnable check) {
        try {
            while (!Native.glooWait(work, CHECK_MILLIS)) {
                check.run();
            }
        } finally {
            Native.glooWorkFree(work);
        }
    }

    private long live() {
        long h = handle.get();
        if (h == 0) {
            throw new IllegalStateException("the Gloo group is closed");
        }
        return h;
    }

    /** Leaves the group: its connections close (peers in a collective with it fail), in the background. */
    @Override
    public void close() {
        long h = handle.getAndSet(0);
        if (h != 0) {
            Native.glooGroupFree(h);
        }
    }

    private static int millis(Duration timeout) {
        return Math.toIntExact(Math.max(1, timeout.toMillis()));
    }
}
