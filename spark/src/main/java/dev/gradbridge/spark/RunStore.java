package dev.gradbridge.spark;

import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import org.apache.spark.TaskContext;

/**
 * The store the tasks of a Gloo run meet through ({@link GlooExchange}): c10d's key-value store,
 * kept in a map on the driver behind an endpoint of its RPC environment ({@link DriverEndpoint}), so
 * that it opens no socket of its own (c10d's {@code TCPStore} would listen on every interface, for
 * anyone) and answers only requests that carry the run's secret. The tasks reach it through {@link
 * Client}, a {@link GlooGroup.Rendezvous}: each rank's address under the stage attempt's keys, a few
 * keys per attempt.
 *
 * <p>Requests: {@code {"set", key, byte[]}} answers TRUE; {@code {"get", key}} answers {@code
 * Object[] {byte[] or null}}; {@code {"compareSet", key, byte[] expected, byte[] desired}} the value
 * after; {@code {"add", key, Long}} the new count (kept as its decimal digits, as c10d keeps counters);
 * {@code {"delete", key}} whether it was there; {@code {"count"}} the number of keys; {@code {"has",
 * String[] keys}} whether all are there.
 */
final class RunStore extends DriverEndpoint {

    static final String SET = "set";
    static final String GET = "get";
    static final String COMPARE_SET = "compareSet";
    static final String ADD = "add";
    static final String DELETE = "delete";
    static final String COUNT = "count";
    static final String HAS = "has";

    private final Map<String, byte[]> keys = new HashMap<>();

    private RunStore(byte[] secret) {
        super("gradbridge-store", secret);
    }

    /** Registers the run's store on the driver's RPC environment, answering requests that carry {@code secret}. */
    static RunStore start(byte[] secret) {
        RunStore store = new RunStore(secret);
        store.register();
        return store;
    }

    @Override
    synchronized void arrive(Object[] message, SparkInternals.Reply caller) {
        try {
            caller.reply(answer(message));
        } catch (RuntimeException e) {
            caller.sendFailure(new IllegalArgumentException("a malformed store request: " + e));
        }
    }

    private Object answer(Object[] message) {
        String op = (String) message[0];
        switch (op) {
            case SET:
                keys.put((String) message[1], ((byte[]) message[2]).clone());
                return Boolean.TRUE;
            case GET:
                return new Object[] {keys.get((String) message[1])};
            case COMPARE_SET: {
                String key = (String) message[1];
                byte[] expected = (byte[]) message[2];
                byte[] current = keys.get(key);
                if ((current == null && expected.length == 0) || (current != null && Arrays.equals(current, expected))) {
                    keys.put(key, ((byte[]) message[3]).clone());
                    return message[3];
                }
                return current == null ? expected : current;
            }
            case ADD: {
                String key = (String) message[1];
                byte[] current = keys.get(key);
                long value = (current == null ? 0 : Long.parseLong(new String(current, StandardCharsets.US_ASCII)))
                        + (Long) message[2];
                keys.put(key, Long.toString(value).getBytes(StandardCharsets.US_ASCII));
                return value;
            }
            case DELETE:
                return keys.remove((String) message[1]) != null;
            case COUNT:
                return (long) keys.size();
            case HAS:
                for (String key : (String[]) message[1]) {
                    if (!keys.containsKey(key)) {
                        return Boolean.FALSE;
                    }
                }
                return Boolean.TRUE;
            default:
                throw new IllegalArgumentException("no operation " + op);
        }
    }

    /** A task's side of the store: each operation a request to the driver (libtorch calls them). */
    static final class Client implements GlooGroup.Rendezvous {
        /** The longest pause between two looks while waiting for keys, ms. */
        private static final long MOST_PAUSE = 20;
        private final Caller driver;

        /**
         * @param name the store's endpoint
         * @param secret the secret the stage carried ({@link DriverEndpoint.Caller})
         */
        Client(String name, byte[] secret) {
            driver = new Caller(name, secret);
        }

        private <T> T ask(Class<T> type, Object... message) {
            return RelayExchange.await(driver.ask(message, type));
        }

        @Override
        public void set(String key, byte[] value) {
            ask(Boolean.class, SET, key, value);
        }

        @Override
        public byte[] get(String key) {
            return (byte[]) ask(Object[].class, GET, key)[0];
        }

        @Override
        public byte[] compareSet(String key, byte[] expected, byte[] desired) {
            return ask(byte[].class, COMPARE_SET, key, expected, desired);
        }

        @Override
        public long add(String key, long delta) {
            return ask(Long.class, ADD, key, delta);
        }

        @Override
        public boolean delete(String key) {
            return ask(Boolean.class, DELETE, key);
        }

        @Override
        public long count() {
            return ask(Long.class, COUNT);
        }

        @Override
        public boolean await(String[] names, long millis) {
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(millis);
            long pause = 1;
            while (!ask(Boolean.class, HAS, (Object) names)) {
                long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
                if (left <= 0) {
                    return false;
                }
                TaskContext task = TaskContext.get();
                if (task != null) {
                    task.killTaskIfInterrupted();
                }
                try {
                    Thread.sleep(Math.min(pause, left));
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException("interrupted while waiting for the other tasks");
                }
                pause = Math.min(2 * pause, MOST_PAUSE);
            }
            return true;
        }
    }
}
