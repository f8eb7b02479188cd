package dev.gradbridge.serve;

import com.google.gson.GsonBuilder;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import dev.gradbridge.Metadata;
import dev.gradbridge.online.FsyncPolicy;
import dev.gradbridge.online.HostTensor;
import dev.gradbridge.online.OnlineLearner;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Kafka-fed variant of the online benchmark: learning throughput of a learner fed from a topic
 * ({@link KafkaFeedback}, exactly as gradbridge-serve runs it) against the same learner fed the same
 * JSON bodies by concurrent callers (the HTTP path without the socket: {@link JsonTensors} parse, then
 * {@code offer}), fsync never, in interleaved rounds; and the predict latency (p50/p99) from
 * {@code predictThreads} threads (each a call every 0.5 ms) while each learns.
 *
 * <p>Arguments: {@code MODEL WORK BOOTSTRAP TOPIC EVENTS ROWS FEEDERS ROUNDS PREDICT_THREADS}: EVENTS
 * events as records of ROWS events each (written once to TOPIC, created with 3 partitions), micro-batches
 * of ROWS. Prints one JSON object.
 */
public final class KafkaBenchmark {

    /** Between one thread's predictions: 2,000 calls/s per thread. */
    private static final long PREDICT_PAUSE_NANOS = 500_000;

    private KafkaBenchmark() {}

    /**
     * @param args see the class comment
     * @throws Exception when a run fails: the benchmark stops with it
     */
    public static void main(String[] args) throws Exception {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "error");
        Path model = Paths.get(args[0]);
        Path work = Paths.get(args[1]);
        String bootstrap = args[2];
        String topic = args[3];
        int events = Integer.parseInt(args[4]);
        int rows = Integer.parseInt(args[5]);
        int feeders = Integer.parseInt(args[6]);
        int rounds = Integer.parseInt(args[7]);
        int predictThreads = Integer.parseInt(args[8]);
        Metadata metadata = Metadata.read(model);
        int features = (int) metadata.getInput("x").getShape()[1];
        List<byte[]> bodies = records(events, rows, features);
        produce(bootstrap, topic, bodies);
        HostTensor one = HostTensor.ofFloats(new float[features], 1, features);
        Map<String, List<Double>> byRound = new LinkedHashMap<>();
        for (String key : new String[] {"http_json_events_per_s", "kafka_events_per_s", "kafka_steady_events_per_s", "http_json_p50_us",
            "http_json_p99_us", "kafka_p50_us", "kafka_p99_us"}) {
            byRound.put(key, new ArrayList<>());
        }
        for (int round = -1; round < rounds; round++) { // round -1: the JIT's, untimed
            for (String variant : round % 2 == 0 ? new String[] {"kafka", "http_json"} : new String[] {"http_json", "kafka"}) {
                Path log = work.resolve(variant + "-" + (round + 1));
                List<Long> latencies = Collections.synchronizedList(new ArrayList<>());
                double seconds;
                double steady = Double.NaN; // kafka: events/s after the first logged read (the consumer's start left out)
                try (OnlineLearner learner = OnlineLearner.builder().optMaxBatch(rows).optMaxWaitMillis(1).optPublishEvery(1)
                        .optCheckpointEvery(1_000_000).optQueueCapacity(rows * 8).optPredictors(predictThreads)
                        .optFsync(FsyncPolicy.NEVER).optValidateTargets(false).open(model, log)) {
                    AtomicBoolean stop = new AtomicBoolean();
                    List<Thread> predictors = predictors(learner, one, predictThreads, stop, latencies);
                    long started = System.nanoTime();
                    if (variant.equals("kafka")) {
                        steady = fromKafka(learner, bootstrap, topic, bodies.size(), rows);
                    } else {
                        feed(learner, metadata, bodies, feeders);
                    }
                    learner.awaitIdle(120, TimeUnit.SECONDS);
                    seconds = (System.nanoTime() - started) / 1e9;
                    stop.set(true);
                    for (Thread t : predictors) {
                        t.join();
                    }
                }
                if (round >= 0) {
                    record(byRound, variant, bodies.size() * rows / seconds, steady, latencies);
                }
            }
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("events", bodies.size() * rows);
        out.put("rows_per_record", rows);
        out.put("feeders", feeders);
        out.put("by_round", byRound);
        System.out.println(new GsonBuilder().create().toJson(out));
    }

    /** {@code events / rows} records of {@code rows} random events each, as JSON: {@code {"x": [[...], ...], "y": [...]}}. */
    private static List<byte[]> records(int events, int rows, int features) {
        Random random = new Random(0);
        List<byte[]> bodies = new ArrayList<>();
        for (int r = 0; r < events / rows; r++) {
            StringBuilder x = new StringBuilder("[");
            StringBuilder y = new StringBuilder("[");
            for (int i = 0; i < rows; i++) {
                x.append(i == 0 ? "[" : ",[");
                for (int f = 0; f < features; f++) {
                    x.append(f == 0 ? "" : ",").append((float) random.nextGaussian());
                }
                x.append(']');
                y.append(i == 0 ? "" : ",").append(random.nextInt(4));
            }
            bodies.add(("{\"x\": " + x + "], \"y\": " + y + "]}").getBytes(StandardCharsets.UTF_8));
        }
        return bodies;
    }

    /**
     * Feeds {@code learner} from the topic until it has read every record and learnt from them.
     *
     * @return events/s after the first logged read (the consumer's start left out)
     */
    private static double fromKafka(OnlineLearner learner, String bootstrap, String topic, int records, int rows)
            throws Exception {
        try (KafkaFeedback kafka = KafkaFeedback.start(learner, bootstrap, topic, null, new Properties(),
                Duration.ofSeconds(30))) {
            long firstSeen = 0;
            long firstRecords = 0;
            while (kafka.records() < records) {
                if (kafka.getFailure() != null) {
                    throw new IllegalStateException(kafka.getFailure());
                }
                if (firstSeen == 0 && kafka.records() > 0) {
                    firstSeen = System.nanoTime();
                    firstRecords = kafka.records();
                }
                Thread.sleep(1);
            }
            learner.awaitIdle(120, TimeUnit.SECONDS);
            return (records - firstRecords) * (double) rows / ((System.nanoTime() - firstSeen) / 1e9);
        }
    }

    /** A timed round's figures of one variant into {@code byRound}. */
    private static void record(Map<String, List<Double>> byRound, String variant, double eventsPerSecond, double steady,
            List<Long> latencies) {
        long[] sorted = latencies.stream().mapToLong(Long::longValue).sorted().toArray();
        byRound.get(variant + "_events_per_s").add(eventsPerSecond);
        if (variant.equals("kafka")) {
            byRound.get("kafka_steady_events_per_s").add(steady);
        }
        byRound.get(variant + "_p50_us").add(percentile(sorted, 0.50) / 1e3);
        byRound.get(variant + "_p99_us").add(percentile(sorted, 0.99) / 1e3);
    }

    private static void produce(String bootstrap, String topic, List<byte[]> bodies) throws Exception {
        Properties admin = new Properties();
        admin.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin client = Admin.create(admin)) {
            client.createTopics(Collections.singletonList(new NewTopic(topic, 3, (short) 1))).all().get();
        }
        Properties settings = new Properties();
        settings.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        settings.put(ProducerConfig.ACKS_CONFIG, "all");
        settings.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(settings, new ByteArraySerializer(),
                new ByteArraySerializer())) {
            for (int i = 0; i < bodies.size(); i++) {
                producer.send(new ProducerRecord<>(topic, i % 3, null, bodies.get(i)));
            }
            producer.flush();
        }
    }

    /** Concurrent callers, each parsing a body as /feedback does and waiting for its acknowledgement. */
    private static void feed(OnlineLearner learner, Metadata metadata, List<byte[]> bodies, int feeders) throws Exception {
        AtomicInteger next = new AtomicInteger();
        List<Thread> threads = new ArrayList<>();
        List<Throwable> failures = Collections.synchronizedList(new ArrayList<>());
        String yType = metadata.getInput("y").getDtype();
        for (int t = 0; t < feeders; t++) {
            Thread thread = new Thread(() -> {
                try {
                    for (int i; (i = next.getAndIncrement()) < bodies.size(); ) {
                        JsonObject json = JsonParser.parseString(new String(bodies.get(i), StandardCharsets.UTF_8))
                                .getAsJsonObject();
                        learner.offer(JsonTensors.parseInputs(json.get("x"), metadata), JsonTensors.parse("y", json.get("y"),
                                yType), null, 60, TimeUnit.SECONDS);
                    }
                } catch (RuntimeException e) {
                    failures.add(e);
                }
            });
            thread.start();
            threads.add(thread);
        }
        for (Thread thread : threads) {
            thread.join();
        }
        if (!failures.isEmpty()) {
            throw new IllegalStateException(failures.get(0));
        }
    }

    private static List<Thread> predictors(OnlineLearner learner, HostTensor x, int threads, AtomicBoolean stop,
            List<Long> latencies) {
        List<Thread> workers = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread worker = new Thread(() -> {
                List<Long> mine = new ArrayList<>();
                while (!stop.get()) {
                    long started = System.nanoTime();
                    learner.predict(x);
                    mine.add(System.nanoTime() - started);
                    LockSupport.parkNanos(PREDICT_PAUSE_NANOS); // a steady request rate, not a spin on shared cores
                }
                latencies.addAll(mine);
            });
            worker.start();
            workers.add(worker);
        }
        return workers;
    }

    private static double percentile(long[] sorted, double q) {
        return sorted.length == 0 ? Double.NaN : sorted[Math.min(sorted.length - 1, (int) Math.floor(q * (sorted.length - 1) + 0.5))];
    }
}
