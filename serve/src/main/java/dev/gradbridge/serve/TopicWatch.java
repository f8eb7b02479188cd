package dev.gradbridge.serve;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TimeoutException;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka source's health, seen from its consumer thread every {@link #EVERY}: whether a broker
 * answers, whether the topic is there, and partitions added while serving. Kafka's client logs a
 * line per retry (thousands a second for a deleted topic), so its loggers are off in gradbridge-serve
 * and a condition here is one line when it starts and one when it ends, counted in {@code /metrics}.
 */
final class TopicWatch {

    private static final Logger logger = LoggerFactory.getLogger(TopicWatch.class);

    /** How often the topic's metadata is looked at. */
    static final Duration EVERY = Duration.ofSeconds(2);
    /**
     * The consumer's metadata refresh ({@code metadata.max.age.ms}) unless the properties file sets it:
     * partitions added while serving are read within this plus {@link #EVERY}.
     */
    static final String METADATA_MAX_AGE_MS = "10000";

    private final String bootstrap;
    private final String topic;
    private final AtomicLong outages = new AtomicLong();
    private volatile String waiting; // the condition in force, or null
    private long nextCheck = System.nanoTime() + EVERY.toNanos();

    TopicWatch(String bootstrap, String topic) {
        this.bootstrap = bootstrap;
        this.topic = topic;
    }

    /** @return conditions (no broker answering, the topic gone, its partitions unreadable) since the start */
    long outages() {
        return outages.get();
    }

    /** @return 1 while the source waits for a broker or for its topic, else 0 */
    int waiting() {
        return waiting == null ? 0 : 1;
    }

    /**
     * Looks at the topic when it is time: says when a condition starts or ends, and returns the topic's
     * partitions when there are more than {@code known} (else null).
     */
    List<TopicPartition> check(KafkaConsumer<?, ?> consumer, int known) {
        if (System.nanoTime() < nextCheck) {
            return null;
        }
        nextCheck = System.nanoTime() + EVERY.toNanos();
        List<PartitionInfo> infos;
        try {
            infos = consumer.partitionsFor(topic, Duration.ofSeconds(1));
        } catch (TimeoutException e) {
            condition("no broker answering", "no Kafka broker at " + bootstrap
                    + " answers: waiting for one; reading goes on where it stopped");
            return null;
        } catch (RuntimeException e) {
            condition("the topic unreadable", "cannot read Kafka topic '" + topic + "' at " + bootstrap + " ("
                    + ServeCommand.rootMessage(e) + "): waiting");
            return null;
        }
        if (infos == null || infos.isEmpty()) {
            condition("the topic gone", "Kafka topic '" + topic + "' is gone from " + bootstrap + " (deleted?): waiting for it");
            return null;
        }
        condition(null, null);
        if (infos.size() <= known) {
            return null;
        }
        List<TopicPartition> partitions = new ArrayList<>();
        for (PartitionInfo info : infos) {
            partitions.add(new TopicPartition(topic, info.partition()));
        }
        partitions.sort(Comparator.comparingInt(TopicPartition::partition));
        logger.warn("Kafka topic '{}' has {} partitions now (was {}): reading the new ones from their start", topic,
                partitions.size(), known);
        return partitions;
    }

    /** @param now a few words naming the condition in force (null: none), {@code line} saying it whole */
    private void condition(String now, String line) {
        String was = waiting;
        if (now == null ? was == null : now.equals(was)) {
            return;
        }
        if (was != null) {
            logger.warn("Kafka topic '{}' reads again ({}: over)", topic, was);
        }
        if (now != null) {
            outages.incrementAndGet();
            logger.warn(line);
        }
        waiting = now;
    }
}
