package dev.gradbridge.spark;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.data.Dataset;
import dev.gradbridge.internal.Digests;
import dev.gradbridge.internal.InputMessages;
import dev.gradbridge.internal.ValueRanges;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

/**
 * Training data spread over K Spark partitions, one shard each (rows dealt round-robin by
 * global index), cached, and checked against the module's metadata before any step.
 *
 * <p>Sources: a Parquet file or folder (or any {@code Dataset<Row>}) with one column per input of
 * the model, named as its metadata names them ({@code x}, or several: {@code input_ids},
 * {@code attention_mask}), and {@code y}, each an array column holding one sample flattened in C
 * order (a plain numeric column when a sample is one value); Spark types {@code float} for
 * float32, {@code double} for float64, {@code bigint} for int64. A model of one input ignores other
 * columns; one of several takes exactly its inputs and y (a column it does not take is refused, so
 * that a feature the user meant it to use is never dropped without a word). Or an {@code .npz}
 * with one array per input and y (the examples' format), read on the driver.
 */
public final class ShardedData {

    private final String source;
    private final JavaRDD<Shard> shards;
    private final long rows;
    private final int partitions;
    private final long[] xShape;
    private final long[] yShape;
    private final String fingerprint;
    /** The columns (inputs, then y) summarised over every row: ids' and labels' extremes ({@link ValueRanges}). */
    private final List<ValueRanges.Column> ranges;

    private ShardedData(String source, JavaRDD<Shard> shards, long rows, int partitions, Metadata metadata) {
        this.source = source;
        this.shards = shards;
        this.rows = rows;
        this.partitions = partitions;
        // a checkpoint's x_shape is the first input's, as the single-process Trainer writes it
        this.xShape = withRows(metadata.getInput(metadata.getInputNames().get(0)).getShape(), rows);
        this.yShape = withRows(metadata.getInput("y").getShape(), rows);
        List<String> names = new ArrayList<>(metadata.getInputNames());
        names.add("y");
        ArrayList<DType> dtypes = new ArrayList<>();
        ArrayList<long[]> rowShapes = new ArrayList<>();
        for (String name : names) {
            Metadata.TensorSpec spec = metadata.getInput(name);
            dtypes.add(supported(spec.getDtype()));
            rowShapes.add(Arrays.copyOfRange(spec.getShape(), 1, spec.getShape().length));
        }
        // One job that also materializes the cache: every partition is built (and checked) here.
        List<Tuple2<Integer, Tuple2<byte[], ArrayList<ValueRanges.Column>>>> summaries = shards.map(
                s -> new Tuple2<>(s.partition, new Tuple2<>(s.digest(), summary(s, new ArrayList<>(names), dtypes,
                        rowShapes)))).collect();
        List<Tuple2<Integer, Tuple2<byte[], ArrayList<ValueRanges.Column>>>> ordered = new ArrayList<>(summaries);
        ordered.sort((a, b) -> Integer.compare(a._1, b._1));
        MessageDigest sha = Digests.sha256();
        List<ValueRanges.Column> merged = null;
        for (Tuple2<Integer, Tuple2<byte[], ArrayList<ValueRanges.Column>>> partition : ordered) {
            sha.update(partition._2._1);
            List<ValueRanges.Column> columns = partition._2._2;
            if (merged == null) {
                merged = new ArrayList<>(columns);
            } else {
                for (int c = 0; c < merged.size(); c++) {
                    merged.set(c, merged.get(c).merge(columns.get(c)));
                }
            }
        }
        this.fingerprint = Digests.hex(sha.digest());
        this.ranges = merged;
    }

    /** A shard's columns summarised (ids' and labels' extremes: {@link ValueRanges.Column}). */
    private static ArrayList<ValueRanges.Column> summary(Shard shard, List<String> names, List<DType> dtypes,
            List<long[]> rowShapes) {
        ArrayList<ValueRanges.Column> columns = new ArrayList<>();
        for (int c = 0; c < names.size(); c++) {
            columns.add(ValueRanges.Column.of(names.get(c), dtypes.get(c), rowShapes.get(c), shard.columns[c],
                    shard.rows));
        }
        return columns;
    }

    /** @return where the data came from */
    public String getSource() {
        return source;
    }

    JavaRDD<Shard> shards() {
        return shards;
    }

    /** @return number of rows (samples) */
    public long getRows() {
        return rows;
    }

    /** @return number of partitions (shards) */
    public int getPartitions() {
        return partitions;
    }

    long[] xShape() {
        return xShape.clone();
    }

    long[] yShape() {
        return yShape.clone();
    }

    /**
     * @return SHA-256 over the partitions' digests (each: SHA-256 of its x bytes, or each input's in
     *     the metadata's order, then its y bytes) in partition order; the same data in the same number
     *     of partitions gives the same value
     */
    public String fingerprint() {
        return fingerprint;
    }

    /**
     * Frees the cached partitions, waiting for the executors to answer: a removal still in flight
     * when the application stops makes Spark log an ERROR.
     */
    public void unpersist() {
        shards.unpersist(true);
    }

    private static long[] withRows(long[] shape, long rows) {
        long[] out = shape.clone();
        out[0] = rows;
        return out;
    }

    /**
     * @return each column (the module's inputs, then y) summarised over every row, for {@link
     *     ValueRanges#check} before the first step
     */
    List<ValueRanges.Column> ranges() {
        return ranges;
    }

    /** The dtypes a shard column holds (what parameters and metadata's x and y hold). */
    private static final java.util.Set<DType> SUPPORTED =
            java.util.EnumSet.of(DType.FLOAT32, DType.FLOAT64, DType.INT64, DType.BFLOAT16, DType.FLOAT16);

    static DType supported(String dtype) {
        for (DType type : SUPPORTED) {
            if (type.torchName().equals(dtype)) {
                return type;
            }
        }
        throw new IllegalArgumentException("unsupported dtype " + dtype);
    }

    static int bytesOf(String dtype) {
        return supported(dtype).size();
    }

    /** The Spark column type of a tensor's elements. */
    static DataType sparkType(DType type) {
        switch (type) {
            case FLOAT32:
                return DataTypes.FloatType;
            case FLOAT64:
                return DataTypes.DoubleType;
            case INT64:
                return DataTypes.LongType;
            default:
                throw new IllegalArgumentException("unsupported dtype " + type);
        }
    }

    static long perRow(long[] shape) {
        long values = 1;
        for (int i = 1; i < shape.length; i++) {
            values *= shape[i];
        }
        return values;
    }

    private static void checkPartitions(String source, long rows, int partitions) {
        if (partitions < 1) {
            throw new InvalidInputException("--partitions must be at least 1, got " + partitions);
        }
        if (rows == 0) {
            throw new InvalidInputException(source + ": the dataset is empty (0 samples)");
        }
        if (rows < partitions) {
            throw new InvalidInputException(
                    source + ": " + rows + " rows cannot fill " + partitions + " partitions (partition " + rows
                            + " would be empty); use at most " + rows + " partitions");
        }
    }

    /**
     * Reads an .npz on the driver, checks it like the single-process Trainer does, and deals it
     * into {@code partitions} cached shards.
     *
     * @param jsc the application's Spark context
     * @param npz one array per input of the model and {@code y}
     * @param partitions K, the shards (at most the rows)
     * @param metadata the module's metadata, which the arrays must fit
     * @return the cached shards
     * @throws InvalidInputException (one line, naming the file) when the data does not fit
     */
    public static ShardedData fromNpz(JavaSparkContext jsc, Path npz, int partitions, Metadata metadata) {
        try (Dataset data = Dataset.loadNpz(npz)) {
            data.check(metadata); // the module's inputs, in its order
            long n = data.size();
            checkPartitions(npz.toString(), n, partitions);
            List<byte[]> all = new ArrayList<>();
            for (dev.gradbridge.Tensor input : data.getInputs().values()) {
                all.add(input.toBytes());
            }
            all.add(data.getY().toBytes());
            int[] rowBytes = new int[all.size()];
            for (int c = 0; c < rowBytes.length; c++) {
                rowBytes[c] = (int) (all.get(c).length / n);
            }
            List<Tuple2<Integer, Shard>> shards = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                int count = Shard.rowsOf(n, p, partitions);
                byte[][] columns = new byte[rowBytes.length][];
                for (int c = 0; c < columns.length; c++) {
                    int row = rowBytes[c];
                    columns[c] = new byte[count * row];
                    for (int j = 0; j < count; j++) {
                        long global = p + (long) j * partitions;
                        System.arraycopy(all.get(c), (int) (global * row), columns[c], j * row, row);
                    }
                }
                shards.add(new Tuple2<>(p, new Shard(p, partitions, n, count, rowBytes, columns)));
            }
            // partitionBy: the cached partitions are a shuffle's output, so a task carries no data
            // (a parallelized collection's partitions would travel with every task of every step).
            JavaRDD<Shard> rdd =
                    jsc.parallelizePairs(shards, partitions)
                            .partitionBy(new ModuloPartitioner(partitions))
                            .values()
                            .persist(StorageLevel.MEMORY_ONLY());
            return new ShardedData(npz.toString(), rdd, n, partitions, metadata);
        }
    }

    /**
     * Reads Parquet (a file, a folder of them, or any path Spark reads, e.g. {@code hdfs://...}),
     * checks it, and deals it into cached shards.
     *
     * @param spark the application's Spark session
     * @param parquet where the Parquet data is
     * @param partitions K, the shards (at most the rows)
     * @param metadata the module's metadata, which the columns must fit
     * @return the cached shards
     * @throws InvalidInputException (one line, naming the path) when it is not Parquet or does not fit
     */
    public static ShardedData fromParquet(SparkSession spark, String parquet, int partitions, Metadata metadata) {
        org.apache.spark.sql.Dataset<Row> frame;
        try {
            frame = spark.read().parquet(parquet);
        } catch (Exception e) { // Spark's AnalysisException (an empty folder: no schema) is checked, not a RuntimeException
            throw new InvalidInputException(parquet + ": not a Parquet dataset: " + firstLine(e.getMessage()));
        }
        return fromRows(parquet, frame, partitions, metadata);
    }

    private static String firstLine(String message) {
        String text = String.valueOf(message).trim();
        int end = text.indexOf('\n');
        return end < 0 ? text : text.substring(0, end);
    }

    /**
     * Checks a {@code Dataset<Row>} with a column per input of the model and y against the metadata
     * (schema, values per row, nulls, NaN and infinities: one Spark SQL aggregation) and deals it into
     * cached shards; global row order is the frame's order ({@code zipWithIndex}).
     *
     * @param source what the rows are, for messages (a path, a table's name)
     * @param frame the rows
     * @param partitions K, the shards (at most the rows)
     * @param metadata the module's metadata, which the columns must fit
     * @return the cached shards
     * @throws InvalidInputException (one line, naming the source and column) when the rows do not fit
     */
    public static ShardedData fromRows(String source, org.apache.spark.sql.Dataset<Row> frame, int partitions,
            Metadata metadata) {
        List<String> names = new ArrayList<>(metadata.getInputNames());
        names.add("y");
        ShardColumn.register(frame.sparkSession());
        ShardColumn[] columns = new ShardColumn[names.size()];
        for (int c = 0; c < columns.length; c++) {
            columns[c] = ShardColumn.of(source, frame, metadata.getInput(names.get(c)));
        }
        if (metadata.hasNamedInputs()) {
            for (String column : frame.schema().fieldNames()) {
                if (!names.contains(column)) {
                    throw new InvalidInputException(
                            InputMessages.unknownColumn(source, column, metadata.getInputNames()));
                }
            }
        }
        org.apache.spark.sql.Dataset<Row> selected =
                frame.select(names.get(0), names.subList(1, names.size()).toArray(new String[0]));
        List<String> exprs = new ArrayList<>();
        exprs.add("count(*)");
        for (ShardColumn column : columns) {
            exprs.addAll(column.checks());
        }
        Row stats = selected.selectExpr(exprs.toArray(new String[0])).first();
        long n = stats.getLong(0);
        checkPartitions(source, n, partitions);
        int offset = 1;
        for (ShardColumn column : columns) {
            column.verify(stats, offset);
            offset += column.checks().size();
        }
        JavaPairRDD<Long, Row> indexed =
                selected.javaRDD().zipWithIndex().mapToPair(t -> new Tuple2<>(t._2(), t._1()));
        JavaRDD<Shard> rdd =
                indexed.partitionBy(new ModuloPartitioner(partitions))
                        .mapPartitionsWithIndex(new BuildShard(partitions, n, columns), true)
                        .persist(StorageLevel.MEMORY_ONLY());
        return new ShardedData(source, rdd, n, partitions, metadata);
    }

    /** Builds partition p's shard from its (global index, row) pairs, placing row i at i / K. */
    private static final class BuildShard
            implements Function2<Integer, Iterator<Tuple2<Long, Row>>, Iterator<Shard>> {
        private static final long serialVersionUID = 2L;
        private final int partitions;
        private final long total;
        /** The inputs then y, in the rows' order. */
        private final ShardColumn[] columns;

        BuildShard(int partitions, long total, ShardColumn[] columns) {
            this.partitions = partitions;
            this.total = total;
            this.columns = columns;
        }

        @Override
        public Iterator<Shard> call(Integer p, Iterator<Tuple2<Long, Row>> rows) {
            int count = Shard.rowsOf(total, p, partitions);
            int[] rowBytes = new int[columns.length];
            ByteBuffer[] out = new ByteBuffer[columns.length];
            for (int c = 0; c < columns.length; c++) {
                rowBytes[c] = columns[c].rowBytes();
                out[c] = ByteBuffer.allocate(count * rowBytes[c]).order(ByteOrder.LITTLE_ENDIAN);
            }
            while (rows.hasNext()) {
                Tuple2<Long, Row> item = rows.next();
                int j = (int) (item._1() / partitions);
                for (int c = 0; c < columns.length; c++) {
                    out[c].position(j * rowBytes[c]);
                    columns[c].write(item._2(), c, out[c]);
                }
            }
            byte[][] bytes = new byte[columns.length][];
            for (int c = 0; c < columns.length; c++) {
                bytes[c] = out[c].array();
            }
            return java.util.Collections.singletonList(new Shard(p, partitions, total, count, rowBytes, bytes))
                    .iterator();
        }
    }
}
