package dev.gradbridge.serve;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.GradbridgeException;
import java.io.BufferedReader;
import java.io.DataOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import org.apache.kafka.clients.consumer.CloseOptions;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

/**
 * The records of a Kafka topic in given offset ranges, for {@code gradbridge replay --from-kafka}:
 * read with the client, settings and properties file that gradbridge-serve uses, so a replay reads
 * the topic exactly as the service did.
 *
 * <p>Arguments: {@code BOOTSTRAP TOPIC [PROPERTIES_FILE]}; standard input: one line {@code
 * partition from to} per partition. Standard output, big-endian, per record in partition then
 * offset order: {@code i32 partition, i64 offset, i32 key length (-1: none), key, i32 value length
 * (-1: none), value}; then {@code i32 -1}. A failure is one line {@code error: ...} and exit 1.
 */
public final class TopicRecords {

    /**
     * The longest wait for a broker's answer, and for the next record of a range, unless the
     * properties file sets {@code default.api.timeout.ms}: a replay against a broker that is not
     * there fails in seconds, not after the client's own minute.
     */
    static final Duration DEFAULT_TIMEOUT = Duration.ofSeconds(5);

    private TopicRecords() {}

    /** @param args bootstrap, topic and optionally the client properties file */
    public static void main(String[] args) {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
                System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "error"));
        System.exit(run(args, System.out, System.err));
    }

    static int run(String[] args, OutputStream out, PrintStream err) {
        try {
            if (args.length < 2 || args.length > 3) {
                throw new GradbridgeException("usage: TopicRecords BOOTSTRAP TOPIC [PROPERTIES_FILE] < ranges");
            }
            Properties client = KafkaFeedback.properties(args.length == 3 ? Paths.get(args[2]) : null);
            Map<Integer, long[]> ranges = new TreeMap<>();
            BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
            for (String line; (line = in.readLine()) != null; ) {
                String[] f = line.trim().split(" ");
                ranges.put(Integer.parseInt(f[0]), new long[] {Long.parseLong(f[1]), Long.parseLong(f[2])});
            }
            DataOutputStream data = new DataOutputStream(out);
            read(args[0], args[1], client, ranges, data);
            data.writeInt(-1);
            data.flush();
            return 0;
        } catch (GradbridgeException e) {
            err.println(Messages.ERROR_PREFIX + e.getMessage());
            return 1;
        } catch (IOException | RuntimeException e) {
            err.println(Messages.ERROR_PREFIX + "cannot read Kafka topic records: " + ServeCommand.rootMessage(e));
            return 1;
        }
    }

    private static void read(String bootstrap, String topic, Properties client, Map<Integer, long[]> ranges,
            DataOutputStream out) throws IOException {
        KafkaConsumer<byte[], byte[]> consumer = KafkaConsumers.consumer(bootstrap, null, client);
        Duration timeout = KafkaConsumers.apiTimeout(client, DEFAULT_TIMEOUT);
        try {
            List<TopicPartition> partitions = KafkaConsumers.partitions(consumer, bootstrap, topic, timeout,
                    "the log was fed from a topic of that name");
            for (Map.Entry<Integer, long[]> range : ranges.entrySet()) {
                int p = range.getKey();
                long from = range.getValue()[0];
                long to = range.getValue()[1];
                if (p >= partitions.size()) {
                    throw new GradbridgeException("the log read partition " + p + " of Kafka topic '" + topic + "', which has "
                            + partitions.size() + " partitions at " + bootstrap);
                }
                TopicPartition tp = partitions.get(p);
                List<TopicPartition> one = Collections.singletonList(tp);
                long first = consumer.beginningOffsets(one, timeout).get(tp);
                long end = consumer.endOffsets(one, timeout).get(tp);
                if (first > from) {
                    throw new GradbridgeException("Kafka topic '" + topic + "' partition " + p + " starts at offset " + first
                            + " but the log read it from offset " + from + " (retention removed records the log learned from)");
                }
                if (end < to) {
                    throw new GradbridgeException("Kafka topic '" + topic + "' partition " + p + " ends at offset " + end
                            + " but the log read it up to offset " + to + " (not the topic the log was fed from)");
                }
                consumer.assign(one);
                consumer.seek(tp, from);
                long deadline = System.nanoTime() + timeout.toNanos(); // for the next record: a long range takes its time
                for (long position; (position = consumer.position(tp, timeout)) < to; ) {
                    if (System.nanoTime() > deadline) {
                        throw new GradbridgeException("Kafka topic '" + topic + "' partition " + p + ": no records after offset "
                                + position + " within " + timeout.toMillis() + " ms (the log read it up to " + to + ")");
                    }
                    List<ConsumerRecord<byte[], byte[]>> polled = consumer.poll(Duration.ofMillis(500)).records(tp);
                    if (!polled.isEmpty()) {
                        deadline = System.nanoTime() + timeout.toNanos();
                    }
                    for (ConsumerRecord<byte[], byte[]> record : polled) {
                        if (record.offset() < to) {
                            out.writeInt(p);
                            out.writeLong(record.offset());
                            bytes(out, record.key());
                            bytes(out, record.value());
                        }
                    }
                }
            }
        } finally {
            consumer.close(CloseOptions.timeout(Duration.ofSeconds(1)));
        }
    }

    private static void bytes(DataOutputStream out, byte[] bytes) throws IOException {
        if (bytes == null) {
            out.writeInt(-1);
        } else {
            out.writeInt(bytes.length);
            out.write(bytes);
        }
    }
}
