package dev.gradbridge.serve;

import com.google.gson.JsonElement;
import com.google.gson.JsonParseException;
import com.google.gson.JsonParser;
import dev.gradbridge.GradbridgeException;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.online.HostTensor;
import dev.gradbridge.online.OnlineLearner;
import dev.gradbridge.online.QueueFullException;
import dev.gradbridge.online.SourceRecord;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Feedback from a Kafka topic into an {@link OnlineLearner}, exactly once: each record's value is
 * the JSON body of {@code POST /feedback} ({@code {"x": [[...]], "y": [...]}}) and its key the
 * idempotency key.
 *
 * <ul>
 *   <li>Every partition of the topic is assigned to this consumer (one model learns from the whole
 *       topic; no group rebalancing) and read from the position that the learner's log holds
 *       ({@link OnlineLearner#sourcePositions}), or from the beginning when it holds none. The
 *       group's committed offsets are never read: they are committed after each logged read, for
 *       monitoring (lag tools) only.
 *   <li>Each poll is learned in a defined order, partitions ascending and each in offset order,
 *       and logged in one write together with the offsets it consumed ({@link
 *       OnlineLearner#learnFromSource}), so a crash at any point either logged a read whole (a
 *       restart reads on after it) or not at all (a restart reads it again).
 *   <li>A record that is not feedback this module takes (not JSON, wrong shape, NaN, a key used
 *       with other feedback) is logged as refused and skipped; a full queue holds the consumer
 *       back (no record is dropped); a broker that is away is waited for.
 * </ul>
 *
 * <p>Settings that exactly once depends on are gradbridge's and cannot be overridden: no
 * auto-commit, {@code auto.offset.reset=none} (a logged position the topic no longer holds is an
 * error, not a silent skip), {@code isolation.level=read_committed}, byte-array deserializers.
 */
public final class KafkaFeedback implements AutoCloseable {

    private static final Logger logger = LoggerFactory.getLogger(KafkaFeedback.class);

    private final OnlineLearner learner;
    private final String topic;
    private final String group;
    private final KafkaConsumer<byte[], byte[]> consumer;
    private volatile List<TopicPartition> partitions; // grows when the topic does (TopicWatch)
    private final TopicWatch watch;
    private final Map<Integer, Long> next = new HashMap<>(); // consumer thread only
    private final Map<Integer, Long> lag = new ConcurrentHashMap<>();
    private final AtomicLong records = new AtomicLong();
    private final AtomicLong refused = new AtomicLong();
    private final int maxRows;
    private final Thread thread;
    private volatile boolean running = true;
    private volatile Throwable failure;

    /**
     * Reads the client properties file (security settings and other client options).
     *
     * @param file a Java properties file, or null
     * @return its properties (empty for null)
     * @throws GradbridgeException naming the file and key when it cannot be read or sets a key
     *     gradbridge controls
     */
    public static Properties properties(Path file) {
        return KafkaConsumers.properties(file);
    }

    /**
     * Connects, assigns every partition of {@code topic}, seeks to the log's positions and starts
     * the consumer thread.
     *
     * @param learner the learner to feed
     * @param bootstrap host:port[,host:port...]
     * @param topic the topic
     * @param group the group to commit offsets to for monitoring, or null for none
     * @param client further client properties (security)
     * @param startTimeout how long to wait for the topic's partitions
     * @return the running source
     * @throws GradbridgeException when the topic cannot be found or the client refuses its settings
     */
    public static KafkaFeedback start(OnlineLearner learner, String bootstrap, String topic, String group, Properties client,
            Duration startTimeout) {
        KafkaConsumer<byte[], byte[]> consumer = KafkaConsumers.consumer(bootstrap, group, client);
        try {
            return new KafkaFeedback(learner, bootstrap, topic, group, consumer, KafkaConsumers.partitions(consumer, bootstrap, topic, startTimeout,
                    "create it first: gradbridge-serve reads every partition of an existing topic"));
        } catch (RuntimeException e) {
            consumer.close(CloseOptions.timeout(Duration.ofSeconds(1)));
            throw e;
        }
    }

    private KafkaFeedback(OnlineLearner learner, String bootstrap, String topic, String group,
            KafkaConsumer<byte[], byte[]> consumer, List<TopicPartition> partitions) {
        this.learner = learner;
        this.topic = topic;
        this.group = group;
        this.consumer = consumer;
        this.partitions = Collections.unmodifiableList(partitions);
        this.watch = new TopicWatch(bootstrap, topic);
        this.maxRows = 256;
        Map<Integer, Long> logged = learner.sourcePositions(topic);
        for (Integer partition : logged.keySet()) {
            if (partition >= partitions.size()) {
                throw new GradbridgeException("the log of " + learner.getLogDir() + " read partition " + partition + " of Kafka topic '"
                        + topic + "', which has " + partitions.size() + " partitions now");
            }
        }
        consumer.assign(partitions);
        List<TopicPartition> fresh = new ArrayList<>();
        for (TopicPartition tp : partitions) {
            Long position = logged.get(tp.partition());
            if (position == null) {
                fresh.add(tp);
            } else {
                consumer.seek(tp, position);
                next.put(tp.partition(), position);
            }
        }
        if (!fresh.isEmpty()) {
            consumer.seekToBeginning(fresh);
            for (TopicPartition tp : fresh) {
                next.put(tp.partition(), consumer.position(tp, Duration.ofSeconds(30)));
            }
        }
        this.thread = new Thread(this::run, "gradbridge-kafka-" + topic);
        thread.setDaemon(true);
        thread.start();
    }

    /** Partitions added while serving: read from their start, after what this poll gave. */
    private void readAlso(List<TopicPartition> all) {
        List<TopicPartition> added = new ArrayList<>(all.subList(partitions.size(), all.size()));
        consumer.assign(all);
        consumer.seekToBeginning(added);
        for (TopicPartition tp : added) {
            next.put(tp.partition(), consumer.position(tp, Duration.ofSeconds(30)));
        }
        partitions = Collections.unmodifiableList(new ArrayList<>(all));
    }

    /** @return conditions the source waited out or waits in (no broker, the topic gone), one {@code /metrics} counter */
    public long outages() {
        return watch.outages();
    }

    /** @return 1 while the source waits for a broker or its topic, else 0 */
    public int waiting() {
        return watch.waiting();
    }

    /** @return the partitions read, ascending */
    public List<TopicPartition> partitions() {
        return partitions;
    }

    /**
     * @param partition a partition of the topic
     * @return records the consumer could see but has not read yet in it (after the last poll)
     */
    public long lag(int partition) {
        return lag.getOrDefault(partition, 0L);
    }

    /** @return records read and logged (learned, duplicates and refused) */
    public long records() {
        return records.get();
    }

    /** @return records refused (not feedback the module takes) */
    public long refused() {
        return refused.get();
    }

    /** @return why the consumer stopped, or null while it runs (or after a clean close) */
    public Throwable getFailure() {
        return failure;
    }

    private void run() {
        try {
            while (running) {
                ConsumerRecords<byte[], byte[]> polled;
                try {
                    polled = consumer.poll(Duration.ofMillis(200));
                } catch (WakeupException e) {
                    break;
                }
                for (TopicPartition tp : partitions) {
                    consumer.currentLag(tp).ifPresent(l -> lag.put(tp.partition(), l));
                }
                List<TopicPartition> grown = watch.check(consumer, partitions.size());
                if (grown != null) {
                    readAlso(grown);
                }
                if (polled.isEmpty()) {
                    continue;
                }
                learn(polled);
            }
        } catch (WakeupException e) {
            // closing
        } catch (RuntimeException e) {
            if (running && learner.getFailure() == null) {
                failure = e;
                logger.error("Kafka feedback from '{}' stopped: {}", topic, ServeCommand.rootMessage(e));
            }
        } finally {
            try {
                commit(true);
            } catch (RuntimeException ignored) {
                // monitoring only
            }
            consumer.close(CloseOptions.timeout(Duration.ofSeconds(5)));
        }
    }

    /** One poll in the defined order (partitions ascending, offsets ascending), logged in reads of at most maxRows events. */
    private void learn(ConsumerRecords<byte[], byte[]> polled) {
        List<SourceRecord> chunk = new ArrayList<>();
        Map<Integer, long[]> ranges = new TreeMap<>();
        int rows = 0;
        String yType = learner.getMetadata().getInput("y").getDtype();
        for (TopicPartition tp : partitions) {
            List<ConsumerRecord<byte[], byte[]>> list = polled.records(tp);
            if (list.isEmpty()) {
                continue;
            }
            int p = tp.partition();
            for (ConsumerRecord<byte[], byte[]> record : list) {
                SourceRecord decoded = decode(record, yType);
                int recordRows = lastRows;
                if (!chunk.isEmpty() && rows + recordRows > maxRows) {
                    flush(chunk, ranges);
                    chunk = new ArrayList<>();
                    ranges = new TreeMap<>();
                    rows = 0;
                }
                chunk.add(decoded);
                rows += recordRows;
                long from = ranges.containsKey(p) ? ranges.get(p)[0] : next.get(p);
                ranges.put(p, new long[] {from, record.offset() + 1});
            }
            long position = consumer.position(tp); // past control records that follow the last record
            long[] range = ranges.get(p);
            if (range != null && position > range[1]) {
                range[1] = position;
            }
        }
        if (!chunk.isEmpty()) {
            flush(chunk, ranges);
        }
    }

    private int lastRows; // rows of the record decode() last returned (consumer thread only)

    private SourceRecord decode(ConsumerRecord<byte[], byte[]> record, String yType) {
        int p = record.partition();
        long offset = record.offset();
        lastRows = 0;
        String key = null;
        if (record.key() != null) {
            try {
                key = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                        .decode(ByteBuffer.wrap(record.key())).toString();
            } catch (CharacterCodingException e) {
                return SourceRecord.refused(p, offset, "the record's key (its idempotency key) is not UTF-8 text");
            }
        }
        if (record.value() == null) {
            return SourceRecord.refused(p, offset, "the record has no value (expected the JSON of POST /feedback)");
        }
        try {
            JsonElement json = JsonParser.parseString(new String(record.value(), StandardCharsets.UTF_8));
            if (!json.isJsonObject()) {
                throw new InvalidInputException("the record's value must be a JSON object, got " + JsonTensors.abbreviate(json));
            }
            Map<String, HostTensor> x = JsonTensors.parseInputs(json.getAsJsonObject().get("x"), learner.getMetadata());
            HostTensor y = JsonTensors.parse("y", json.getAsJsonObject().get("y"), yType);
            lastRows = (int) Math.min(Integer.MAX_VALUE, JsonTensors.rows(x));
            return SourceRecord.feedback(p, offset, key, x, y);
        } catch (JsonParseException e) {
            return SourceRecord.refused(p, offset, "the record's value is not valid JSON: " + JsonTensors.abbreviate(HttpApi.gsonReason(e)));
        } catch (InvalidInputException e) {
            return SourceRecord.refused(p, offset, e.getMessage());
        }
    }

    /** Logs one read; waits while the queue is full; retries a write the disk refused. */
    private void flush(List<SourceRecord> chunk, Map<Integer, long[]> ranges) {
        while (running) {
            OnlineLearner.SourceResult result;
            try {
                result = learner.learnFromSource(topic, chunk, ranges, 1, TimeUnit.SECONDS);
            } catch (QueueFullException e) {
                continue; // back-pressure: the records wait in the topic
            } catch (UncheckedIOException e) {
                logger.warn("cannot log a read of Kafka topic '{}' ({}); retrying in 1 s", topic, e.getMessage());
                sleep(1000);
                continue;
            }
            ranges.forEach((p, r) -> next.put(p, r[1]));
            records.addAndGet(chunk.size());
            refused.addAndGet(result.getRefusals().size());
            for (String refusal : result.getRefusals()) {
                if (refused.get() <= 20 || refused.get() % 1000 == 0) {
                    logger.warn("Kafka topic '{}' partition/offset {} (logged as refused, not learned)", topic, refusal);
                }
            }
            commit(false);
            return;
        }
    }

    private void commit(boolean sync) {
        if (group == null) {
            return;
        }
        Map<TopicPartition, OffsetAndMetadata> offsets = new LinkedHashMap<>();
        for (TopicPartition tp : partitions) {
            Long position = next.get(tp.partition());
            if (position != null) {
                offsets.put(tp, new OffsetAndMetadata(position));
            }
        }
        if (sync) {
            consumer.commitSync(offsets, Duration.ofSeconds(5));
        } else {
            consumer.commitAsync(offsets, null);
        }
    }

    private static void sleep(long millis) {
        try {
            Thread.sleep(millis);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Stops reading (after the read in progress is logged), commits the group's offsets, closes the client. */
    @Override
    public void close() {
        running = false;
        consumer.wakeup();
        try {
            thread.join(TimeUnit.SECONDS.toMillis(30));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
