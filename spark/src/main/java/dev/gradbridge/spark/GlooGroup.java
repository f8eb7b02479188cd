package dev.gradbridge.spark;

import dev.gradbridge.NativeException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.concurrent.atomic.AtomicLong;

/**
 * A process group of libtorch's c10d Gloo (the one TorchDistributor's workers use) over bytes: the
 * collective gradbridge-spark's training tasks exchange gradients with. Ranks meet through a c10d
 * store, each group under a prefix of its own: either one whose keys a Java object keeps ({@link
 * Store#over}, a {@link Rendezvous}: gradbridge-spark's is on its driver, over Spark's RPC, and
 * answers only a task that presents the run's secret), which opens no socket, or a {@code TCPStore}
 * that one process serves on a host it names ({@link Store#serve}: never every interface) and the
 * ranks connect to ({@link Store#connect}). A group's own sockets listen on the host it joins with.
 *
 * <p>Each collective runs on Gloo's thread and blocks the caller until it ends, calling {@code
 * check} every {@link #CHECK_MILLIS} ms meanwhile, so that a caller that must stop (Spark killed the
 * task) can throw out of it. A peer that died or closed its group fails the collective on every
 * other rank with a {@link NativeException} (one line); so does Gloo's timeout. Buffers are direct
 * and the operation keeps them referenced, even past a caller that gave up on it.
 */
final class GlooGroup implements AutoCloseable {

    /** How often a caller waiting in a collective runs its check. */
    public static final int CHECK_MILLIS = 200;

    private final AtomicLong handle;
    private final int rank;
    private final int size;

    /**
     * The keys of a store kept in Java ({@link Store#over}). libtorch calls these on the joining
     * thread or one of its own; an exception thrown here fails the operation with its text.
     */
    public interface Rendezvous {
        /** Sets {@code key} to {@code value}. */
        void set(String key, byte[] value);

        /** @return the value of {@code key}, or null when it is absent */
        byte[] get(String key);

        /**
         * Sets {@code key} to {@code desired} when it holds {@code expected} (or is absent and {@code
         * expected} is empty).
         *
         * @return the value {@code key} holds afterwards
         */
        byte[] compareSet(String key, byte[] expected, byte[] desired);

        /** @return the counter {@code key} (0 when absent) plus {@code delta}, now stored */
        long add(String key, long delta);

        /** @return whether {@code key} was there to delete */
        boolean delete(String key);

        /** @return the number of keys */
        long count();

        /**
         * @param millis how long to wait (0: only look)
         * @return whether every key is present, waiting up to {@code millis} for them
         */
        boolean await(String[] keys, long millis);
    }

    /** The rendezvous: a store kept in Java, or a c10d {@code TCPStore}, served by one rank, connected to by the others. */
    public static final class Store implements AutoCloseable {
        private final AtomicLong handle;

        private Store(long handle) {
            this.handle = new AtomicLong(handle);
        }

        /**
         * @param keeper keeps the keys (every rank's store calls its own keeper; they must share the keys)
         * @param timeout how long a rank waits for a key
         * @return a store that opens no socket: each operation calls {@code keeper}
         */
        public static Store over(Rendezvous keeper, Duration timeout) {
            GlooLibrary.load();
            return new Store(GlooNative.glooStoreOver(keeper, millis(timeout)));
        }

        /**
         * @param host an address of this machine: the server listens there only (never on every interface)
         * @param timeout how long the store's operations wait
         * @return the server, on a free port ({@link #port()})
         */
        public static Store serve(String host, Duration timeout) {
            GlooLibrary.load();
            return new Store(GlooNative.glooStore(host, 0, true, millis(timeout)));
        }

        /**
         * @param timeout how long the store's operations wait
         * @return the server, listening on the loopback address only, on a free port ({@link #port()})
         */
        public static Store serve(Duration timeout) {
            return serve("127.0.0.1", timeout);
        }

        /** @return a client of the server at {@code host:port} */
        public static Store connect(String host, int port, Duration timeout) {
            GlooLibrary.load();
            return new Store(GlooNative.glooStore(host, port, false, millis(timeout)));
        }

        /** @return the port the server listens on (a {@code TCPStore} only) */
        public int port() {
            return GlooNative.glooStorePort(live());
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
                GlooNative.glooStoreFree(h);
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
        return new GlooGroup(GlooNative.glooGroup(store.live(), prefix, host, rank, size, millis(timeout)), rank, size);
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
        finish(startAlltoall(send, sendSplits, receive, receiveSplits), check);
    }

    /** All-gather: {@code each} bytes of {@code send} from every rank into {@code receive}, in rank order. */
    public void allgather(ByteBuffer send, ByteBuffer receive, long each, Runnable check) {
        finish(startAllgather(send, receive, each), check);
    }

    /**
     * Starts {@link #alltoall} and returns at once: Gloo's thread runs the group's collectives one at a
     * time in the order they were started (every rank must start the same ones in the same order).
     *
     * @return the operation under way, for {@link #finish} or {@link #drop}
     */
    long startAlltoall(ByteBuffer send, long[] sendSplits, ByteBuffer receive, long[] receiveSplits) {
        return GlooNative.glooAlltoall(live(), send, sendSplits, receive, receiveSplits);
    }

    /** Starts {@link #allgather}, as {@link #startAlltoall}. */
    long startAllgather(ByteBuffer send, ByteBuffer receive, long each) {
        return GlooNative.glooAllgather(live(), send, receive, each);
    }

    /** Lets go of an operation without waiting for it (it runs on, its buffers referenced until it ends). */
    static void drop(long work) {
        GlooNative.glooWorkFree(work);
    }

    /** Waits for a started operation, running {@code check} every {@link #CHECK_MILLIS} ms meanwhile, and lets go of it. */
    static void finish(long work, Runnable check) {
        try {
            while (!GlooNative.glooWait(work, CHECK_MILLIS)) {
                check.run();
            }
        } finally {
            GlooNative.glooWorkFree(work);
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
            GlooNative.glooGroupFree(h);
        }
    }

    private static int millis(Duration timeout) {
        return Math.toIntExact(Math.max(1, timeout.toMillis()));
    }
}
