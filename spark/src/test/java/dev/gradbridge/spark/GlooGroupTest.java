package dev.gradbridge.spark;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertSame;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import dev.gradbridge.NativeException;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.Callable;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.Test;

/** libtorch's c10d Gloo through the native layer: ranks on threads of this JVM, over 127.0.0.1. */
public class GlooGroupTest {

    private static final Duration TIMEOUT = Duration.ofSeconds(30);
    private static final Runnable NOTHING = () -> {};

    /** Ranks 0..size-1, each on a thread, joined through one store that rank 0 serves. */
    private static List<GlooGroup> join(int size, ExecutorService pool) throws Exception {
        String prefix = UUID.randomUUID().toString();
        GlooGroup.Store server = GlooGroup.Store.serve(TIMEOUT);
        int port = server.port();
        List<Future<GlooGroup>> joins = new ArrayList<>();
        for (int r = 0; r < size; r++) {
            int rank = r;
            joins.add(pool.submit(() -> {
                try (GlooGroup.Store store = rank == 0 ? null : GlooGroup.Store.connect("127.0.0.1", port, TIMEOUT)) {
                    return GlooGroup.join(rank == 0 ? server : store, prefix, "127.0.0.1", rank, size, TIMEOUT);
                }
            }));
        }
        List<GlooGroup> groups = new ArrayList<>();
        for (Future<GlooGroup> join : joins) {
            groups.add(join.get(60, TimeUnit.SECONDS));
        }
        server.close();
        return groups;
    }

    private static ByteBuffer bytes(int... values) {
        ByteBuffer b = ByteBuffer.allocateDirect(values.length);
        for (int v : values) {
            b.put((byte) v);
        }
        return b;
    }

    private static int[] read(ByteBuffer b) {
        int[] out = new int[b.capacity()];
        for (int i = 0; i < out.length; i++) {
            out[i] = b.get(i);
        }
        return out;
    }

    @Test
    public void alltoallWithUnequalSplitsThenAllgather() throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(3);
        try {
            List<GlooGroup> groups = join(3, pool);
            // rank r sends r+1 bytes of value 10*r + to, to each rank `to`
            List<Callable<int[][]>> work = new ArrayList<>();
            for (GlooGroup g : groups) {
                work.add(() -> {
                    int r = g.rank();
                    ByteBuffer send = ByteBuffer.allocateDirect(3 * (r + 1));
                    for (int to = 0; to < 3; to++) {
                        for (int i = 0; i <= r; i++) {
                            send.put((byte) (10 * r + to));
                        }
                    }
                    ByteBuffer receive = ByteBuffer.allocateDirect(1 + 2 + 3);
                    g.alltoall(send, new long[] {r + 1, r + 1, r + 1}, receive, new long[] {1, 2, 3}, NOTHING);
                    ByteBuffer gathered = ByteBuffer.allocateDirect(6);
                    g.allgather(bytes(r, -r), gathered, 2, NOTHING);
                    return new int[][] {read(receive), read(gathered)};
                });
            }
            List<Future<int[][]>> results = pool.invokeAll(work);
            for (int r = 0; r < 3; r++) {
                int[][] got = results.get(r).get();
                assertArrayEquals(new int[] {r, 10 + r, 10 + r, 20 + r, 20 + r, 20 + r}, got[0]);
                assertArrayEquals(new int[] {0, 0, 1, -1, 2, -2}, got[1]);
            }
            groups.forEach(GlooGroup::close);
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void aPeerThatLeavesFailsTheCollectiveWithOneLine() throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            List<GlooGroup> groups = join(2, pool);
            Future<NativeException> waiting = pool.submit(() -> assertThrows(NativeException.class,
                    () -> groups.get(0).allgather(bytes(1), ByteBuffer.allocateDirect(2), 1, NOTHING)));
            Thread.sleep(300);
            groups.get(1).close(); // as a failed task's group closes
            NativeException e = waiting.get(20, TimeUnit.SECONDS);
            assertFalse(e.getMessage(), e.getMessage().contains("\n"));
            groups.get(0).close();
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void aWaitingRankRunsItsCheckAndCanGiveUp() throws Exception {
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            List<GlooGroup> groups = join(2, pool);
            AtomicInteger checks = new AtomicInteger();
            IllegalStateException killed = new IllegalStateException("killed");
            IllegalStateException e = assertThrows(IllegalStateException.class,
                    () -> groups.get(0).allgather(bytes(1), ByteBuffer.allocateDirect(2), 1, () -> {
                        if (checks.incrementAndGet() == 3) {
                            throw killed;
                        }
                    }));
            assertSame(killed, e);
            assertTrue(checks.get() == 3);
            groups.forEach(GlooGroup::close); // the operation left behind ends when its peer leaves
            assertThrows(IllegalStateException.class, () -> groups.get(0).allgather(bytes(1), bytes(0, 0), 1, NOTHING));
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void aStoreNobodyServesIsOneLineAfterTheTimeout() throws Exception {
        int port;
        try (java.net.ServerSocket free = new java.net.ServerSocket(0)) {
            port = free.getLocalPort(); // closed again: nothing listens there
        }
        int closed = port;
        NativeException e = assertThrows(NativeException.class,
                () -> GlooGroup.Store.connect("127.0.0.1", closed, Duration.ofSeconds(2)));
        assertFalse(e.getMessage(), e.getMessage().contains("\n"));
        assertTrue(e.getMessage(), !e.getMessage().isEmpty());
    }

    @Test
    public void theServerListensOnItsHostOnlyNeverEveryInterface() throws Exception {
        try (GlooGroup.Store server = GlooGroup.Store.serve("127.0.0.1", TIMEOUT)) {
            String port = String.format(":%04X ", server.port());
            List<String> listening = new ArrayList<>();
            for (String table : new String[] {"/proc/net/tcp", "/proc/net/tcp6"}) {
                for (String row : java.nio.file.Files.readAllLines(java.nio.file.Paths.get(table))) {
                    String[] fields = row.trim().split("\\s+");
                    if (fields.length > 3 && "0A".equals(fields[3]) && (fields[1] + " ").endsWith(port)) {
                        listening.add(fields[1]); // LISTEN on the store's port
                    }
                }
            }
            assertEquals(listening.toString(), java.util.Collections.singletonList("0100007F" + port.trim()), listening);
        }
    }

    @Test
    public void ranksMeetThroughAStoreKeptInJavaWithoutASocket() throws Exception {
        java.util.Map<String, byte[]> keys = new java.util.concurrent.ConcurrentHashMap<>();
        GlooGroup.Rendezvous kept = new GlooGroup.Rendezvous() {
            @Override
            public void set(String key, byte[] value) {
                keys.put(key, value);
            }

            @Override
            public byte[] get(String key) {
                return keys.get(key);
            }

            @Override
            public synchronized byte[] compareSet(String key, byte[] expected, byte[] desired) {
                byte[] current = keys.get(key);
                if ((current == null && expected.length == 0) || java.util.Arrays.equals(current, expected)) {
                    keys.put(key, desired);
                    return desired;
                }
                return current == null ? expected : current;
            }

            @Override
            public synchronized long add(String key, long delta) {
                byte[] current = keys.get(key);
                long value = (current == null ? 0 : Long.parseLong(new String(current))) + delta;
                keys.put(key, Long.toString(value).getBytes());
                return value;
            }

            @Override
            public boolean delete(String key) {
                return keys.remove(key) != null;
            }

            @Override
            public long count() {
                return keys.size();
            }

            @Override
            public boolean await(String[] names, long millis) {
                long deadline = System.currentTimeMillis() + millis;
                while (!keys.keySet().containsAll(java.util.Arrays.asList(names))) {
                    if (System.currentTimeMillis() >= deadline) {
                        return false;
                    }
                    try {
                        Thread.sleep(2);
                    } catch (InterruptedException e) {
                        throw new IllegalStateException(e);
                    }
                }
                return true;
            }
        };
        ExecutorService pool = Executors.newFixedThreadPool(2);
        try {
            List<Future<GlooGroup>> joins = new ArrayList<>();
            for (int r = 0; r < 2; r++) {
                int rank = r;
                joins.add(pool.submit(() -> {
                    try (GlooGroup.Store store = GlooGroup.Store.over(kept, TIMEOUT)) {
                        return GlooGroup.join(store, "kept", "127.0.0.1", rank, 2, TIMEOUT);
                    }
                }));
            }
            List<GlooGroup> groups = new ArrayList<>();
            for (Future<GlooGroup> join : joins) {
                groups.add(join.get(60, TimeUnit.SECONDS));
            }
            List<Future<int[]>> gathered = new ArrayList<>();
            for (GlooGroup g : groups) {
                gathered.add(pool.submit(() -> {
                    ByteBuffer out = ByteBuffer.allocateDirect(2);
                    g.allgather(bytes(10 + g.rank()), out, 1, NOTHING);
                    return read(out);
                }));
            }
            for (Future<int[]> each : gathered) {
                assertArrayEquals(new int[] {10, 11}, each.get(60, TimeUnit.SECONDS));
            }
            assertTrue(keys.keySet().stream().allMatch(k -> k.startsWith("kept")));
            groups.forEach(GlooGroup::close);
        } finally {
            pool.shutdownNow();
        }
    }

    @Test
    public void aClosedOrForeignHandleIsRefusedInOneLine() {
        GlooLibrary.load();
        assertEquals("the Gloo operation is closed",
                assertThrows(NativeException.class, () -> GlooNative.glooWait(0, 1)).getMessage());
        assertEquals("the store is closed",
                assertThrows(NativeException.class, () -> GlooNative.glooStorePort(0)).getMessage());
        long store = GlooNative.glooStore("127.0.0.1", 0, true, 2000);
        try {
            assertEquals("a store handle where a Gloo operation is expected",
                    assertThrows(NativeException.class, () -> GlooNative.glooWait(store, 1)).getMessage());
            assertEquals("a store handle where a Gloo group is expected",
                    assertThrows(NativeException.class, () -> GlooNative.glooGroupFree(store)).getMessage());
            assertTrue(GlooNative.glooStorePort(store) > 0); // the refused calls left it whole
        } finally {
            GlooNative.glooStoreFree(store);
        }
    }
}
