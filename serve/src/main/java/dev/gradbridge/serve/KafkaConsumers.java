package dev.gradbridge.serve;

import dev.gradbridge.GradbridgeException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Comparator;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * The Kafka consumer gradbridge-serve reads feedback with ({@link KafkaFeedback}) and replays a topic with
 * ({@link TopicRecords}): the settings exactly once depends on over the client's own properties file, how
 * long a first call waits, a topic's partitions. One place, so that both read a topic the same way.
 */
final class KafkaConsumers {

    /** Client properties gradbridge sets itself (the options name bootstrap and group). */
    static final List<String> RESERVED = Collections.unmodifiableList(Arrays.asList(
            ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, ConsumerConfig.GROUP_ID_CONFIG, ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG,
            ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, ConsumerConfig.ISOLATION_LEVEL_CONFIG,
            ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG,
            ConsumerConfig.GROUP_INSTANCE_ID_CONFIG));

    private KafkaConsumers() {}

    /** @see KafkaFeedback#properties */
    static Properties properties(Path file) {
        Properties properties = new Properties();
        if (file == null) {
            return properties;
        }
        if (!Files.isRegularFile(file)) {
            throw new GradbridgeException("--kafka-properties " + file.toAbsolutePath() + ": no such file");
        }
        try (InputStream in = Files.newInputStream(file)) {
            properties.load(in);
        } catch (IOException | IllegalArgumentException e) {
            throw new GradbridgeException("--kafka-properties " + file.toAbsolutePath() + ": cannot read it ("
                    + ServeCommand.ioLine(e instanceof IOException ? (IOException) e : new IOException(e.getMessage())) + ")");
        }
        for (String key : RESERVED) {
            if (properties.containsKey(key)) {
                throw new GradbridgeException("--kafka-properties " + file.toAbsolutePath() + ": " + key + " is set by"
                        + " gradbridge-serve (exactly once depends on it; use --kafka-bootstrap and --kafka-group for the"
                        + " address and group)");
            }
        }
        return properties;
    }

    /**
     * A consumer with the settings exactly once depends on (no auto-commit, {@code
     * auto.offset.reset=none}, {@code read_committed}, byte arrays) over {@code client}'s.
     *
     * @param bootstrap host:port[,host:port...]
     * @param group the group to commit offsets to, or null for none
     * @param client further client properties (security)
     * @return the consumer, not yet assigned
     * @throws GradbridgeException when the client refuses its settings
     */
    static KafkaConsumer<byte[], byte[]> consumer(String bootstrap, String group, Properties client) {
        Properties properties = new Properties();
        properties.putAll(client);
        properties.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        if (group != null) {
            properties.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        }
        properties.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        properties.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "none");
        properties.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        properties.putIfAbsent(ConsumerConfig.CLIENT_ID_CONFIG, "gradbridge-serve");
        properties.putIfAbsent(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "500");
        properties.putIfAbsent(ConsumerConfig.METADATA_MAX_AGE_CONFIG, TopicWatch.METADATA_MAX_AGE_MS);
        try {
            return new KafkaConsumer<>(properties, new ByteArrayDeserializer(), new ByteArrayDeserializer());
        } catch (RuntimeException e) {
            throw new GradbridgeException("cannot create the Kafka consumer for " + bootstrap + ": " + ServeCommand.rootMessage(e), e);
        }
    }

    /**
     * How long a first call waits for the brokers: the client's own {@code default.api.timeout.ms}
     * when the properties file sets it, else {@code fallback}.
     *
     * @param client the client properties
     * @param fallback the wait when they do not set it
     * @return the wait
     */
    static Duration apiTimeout(Properties client, Duration fallback) {
        String millis = client.getProperty(ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG);
        if (millis == null) {
            return fallback;
        }
        try {
            return Duration.ofMillis(Integer.parseInt(millis.trim()));
        } catch (NumberFormatException e) {
            throw new GradbridgeException("--kafka-properties: " + ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG
                    + " must be a whole number of milliseconds, got '" + millis + "'");
        }
    }

    /**
     * @param hint what to do when the topic does not exist
     * @return every partition of {@code topic}, ascending
     * @throws GradbridgeException when the topic does not exist, no broker answers within {@code
     *     timeout} or its partitions cannot be read
     */
    static List<TopicPartition> partitions(KafkaConsumer<?, ?> consumer, String bootstrap, String topic, Duration timeout,
            String hint) {
        List<PartitionInfo> infos;
        try {
            infos = consumer.partitionsFor(topic, timeout);
        } catch (TimeoutException e) {
            throw new GradbridgeException("no Kafka broker at " + bootstrap + " answered within " + timeout.toMillis()
                    + " ms (is it running and reachable from here? " + ConsumerConfig.DEFAULT_API_TIMEOUT_MS_CONFIG
                    + " in --kafka-properties sets the wait)", e);
        } catch (RuntimeException e) {
            throw new GradbridgeException("cannot read the partitions of Kafka topic '" + topic + "' at " + bootstrap + ": "
                    + ServeCommand.rootMessage(e), e);
        }
        if (infos == null || infos.isEmpty()) {
            throw new GradbridgeException("Kafka topic '" + topic + "' does not exist at " + bootstrap + " (" + hint + ")");
        }
        List<TopicPartition> partitions = new ArrayList<>();
        for (PartitionInfo info : infos) {
            partitions.add(new TopicPartition(topic, info.partition()));
        }
        partitions.sort(Comparator.comparingInt(TopicPartition::partition));
        return partitions;
    }
}
