package dev.gradbridge.spark;

import dev.gradbridge.InvalidInputException;
import dev.gradbridge.DType;
import dev.gradbridge.Digests;
import dev.gradbridge.Metadata;
import dev.gradbridge.data.Dataset;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Path;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.Function2;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

/**
 * Training data spread over K Spark partitions, one {@link Shard} each (rows dealt round-robin by
 * global index), cached, and checked against the module's metadata before any step.
 *
 * <p>Sources: a Parquet file or folder (or any {@code Dataset<Row>}) with columns {@code x} and
 * {@code y}, each an array column holding one sample flattened in C order (a plain numeric column
 * when a sample is one value); Spark types {@code float} for float32, {@code double} for float64,
 * {@code bigint} for int64. Or an {@code .npz} with arrays x and y (the examples' format), read
 * on the driver.
 */
public final class ShardedData {

    private final String source;
    private final JavaRDD<Shard> shards;
    private final long rows;
    private final int partitions;
    private final long[] xShape;
    private final long[] yShape;
    private final String fingerprint;

    private ShardedData(String source, JavaRDD<Shard> shards, long rows, int partitions, Metadata metadata) {
        this.source = source;
        this.shards = shards;
        this.rows = rows;
        this.partitions = partitions;
        this.xShape = withRows(metadata.getInput("x").getShape(), rows);
        this.yShape = withRows(metadata.getInput("y").getShape(), rows);
        this.fingerprint = digest(shards);
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
     * @return SHA-256 over the partitions' digests (each: SHA-256 of its x bytes, then its y bytes)
     *     in partition order; the same data in the same number of partitions gives the same value
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

    private static String digest(JavaRDD<Shard> shards) {
        // One job that also materializes the cache: every partition is built (and checked) here.
        List<Tuple2<Integer, byte[]>> digests =
                shards.map(s -> new Tuple2<>(s.partition, s.digest())).collect();
        List<Tuple2<Integer, byte[]>> ordered = new ArrayList<>(digests);
        ordered.sort((a, b) -> Integer.compare(a._1, b._1));
        MessageDigest sha = Digests.sha256();
        for (Tuple2<Integer, byte[]> d : ordered) {
            sha.update(d._2);
        }
        return Digests.hex(sha.digest());
    }

    /** The dtypes a shard column holds (what parameters and metadata's x and y hold). */
    private static final java.util.Set<DType> SUPPORTED =
            java.util.EnumSet.of(DType.FLOAT32, DType.FLOAT64, DType.INT64);

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
     */
    public static ShardedData fromNpz(JavaSparkContext jsc, Path npz, int partitions, Metadata metadata) {
        try (Dataset data = Dataset.loadNpz(npz)) {
            data.check(metadata);
            long n = data.size();
            checkPartitions(npz.toString(), n, partitions);
            byte[] x = data.getX().toBytes();
            byte[] y = data.getY().toBytes();
            int xRow = (int) (x.length / n);
            int yRow = (int) (y.length / n);
            List<Tuple2<Integer, Shard>> shards = new ArrayList<>();
            for (int p = 0; p < partitions; p++) {
                int count = Shard.rowsOf(n, p, partitions);
                byte[] xs = new byte[count * xRow];
                byte[] ys = new byte[count * yRow];
                for (int j = 0; j < count; j++) {
                    long row = p + (long) j * partitions;
                    System.arraycopy(x, (int) (row * xRow), xs, j * xRow, xRow);
                    System.arraycopy(y, (int) (row * yRow), ys, j * yRow, yRow);
                }
                shards.add(new Tuple2<>(p, new Shard(p, partitions, n, count, xRow, yRow, xs, ys)));
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
     */
    public static ShardedData fromParquet(SparkSession spark, String parquet, int partitions, Metadata metadata) {
        org.apache.spark.sql.Dataset<Row> frame;
        try {
            frame = spark.read().parquet(parquet);
        } catch (RuntimeException e) {
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
     * Checks a {@code Dataset<Row>} with columns x and y against the metadata (schema, values per
     * row, nulls, NaN and infinities: one Spark SQL aggregation) and deals it into cached shards;
     * global row order is the frame's order ({@code zipWithIndex}).
     */
    public static ShardedData fromRows(String source, org.apache.spark.sql.Dataset<Row> frame, int partitions,
            Metadata metadata) {
        Column x = Column.of(source, frame, metadata.getInput("x"));
        Column y = Column.of(source, frame, metadata.getInput("y"));
        org.apache.spark.sql.Dataset<Row> selected = frame.select("x", "y");
        List<String> exprs = new ArrayList<>();
        exprs.add("count(*)");
        exprs.addAll(x.checks());
        exprs.addAll(y.checks());
        Row stats = selected.selectExpr(exprs.toArray(new String[0])).first();
        long n = stats.getLong(0);
        checkPartitions(source, n, partitions);
        x.verify(stats, 1);
        y.verify(stats, 1 + x.checks().size());
        JavaPairRDD<Long, Row> indexed =
                selected.javaRDD().zipWithIndex().mapToPair(t -> new Tuple2<>(t._2(), t._1()));
        JavaRDD<Shard> rdd =
                indexed.partitionBy(new ModuloPartitioner(partitions))
                        .mapPartitionsWithIndex(new BuildShard(partitions, n, x, y), true)
                        .persist(StorageLevel.MEMORY_ONLY());
        return new ShardedData(source, rdd, n, partitions, metadata);
    }

    /** One column (x or y) as the metadata wants it. */
    static final class Column implements java.io.Serializable {
        private static final long serialVersionUID = 1L;
        final String source;
        final String name;
        final String dtype;
        final DType type;
        final long[] shape;
        final long values;
        final boolean array;

        private Column(String source, String name, String dtype, long[] shape, boolean array) {
            this.source = source;
            this.name = name;
            this.dtype = dtype;
            this.type = supported(dtype);
            this.shape = shape;
            this.values = perRow(shape);
            this.array = array;
        }

        static Column of(String source, org.apache.spark.sql.Dataset<Row> frame, Metadata.TensorSpec spec) {
            String name = spec.getName();
            DataType expected = sparkType(supported(spec.getDtype()));
            StructField field = null;
            for (StructField f : frame.schema().fields()) {
                if (f.name().equals(name)) {
                    field = f;
                }
            }
            String type = expected.simpleString();
            String wanted = perRow(spec.getShape()) == 1 ? type + " or array<" + type + ">" : "array<" + type + ">";
            if (field == null) {
                throw new InvalidInputException(
                        source + ": no column " + name + "; expected a column " + name + " of " + wanted + " ("
                                + spec.getDtype() + " of shape " + Arrays.toString(spec.getShape())
                                + " in the model's metadata), found columns "
                                + Arrays.toString(frame.schema().fieldNames()));
            }
            DataType actual = field.dataType();
            boolean isArray = actual instanceof ArrayType;
            DataType element = isArray ? ((ArrayType) actual).elementType() : actual;
            if (!element.equals(expected) || (!isArray && perRow(spec.getShape()) != 1)) {
                throw new InvalidInputException(
                        source + ": column " + name + " must be " + wanted + " (" + spec.getDtype() + " of shape "
                                + Arrays.toString(spec.getShape()) + " in the model's metadata), got "
                                + actual.simpleString());
            }
            return new Column(source, name, spec.getDtype(), spec.getShape(), isArray);
        }

        private boolean floating() {
            return type.isFloating();
        }

        /** SQL aggregates: nulls, then (arrays) min and max size and null elements, then non-finite rows. */
        List<String> checks() {
            List<String> out = new ArrayList<>();
            out.add("sum(if(" + name + " is null, 1, 0))");
            String bad = nonFinite("v");
            if (array) {
                out.add("min(size(" + name + "))");
                out.add("max(size(" + name + "))");
                out.add("sum(if(exists(" + name + ", v -> v is null), 1, 0))");
                if (floating()) {
                    out.add("sum(if(exists(" + name + ", v -> " + bad + "), 1, 0))");
                }
            } else if (floating()) {
                out.add("sum(if(" + nonFinite(name) + ", 1, 0))");
            }
            return out;
        }

        private static String nonFinite(String value) {
            return "isnan(" + value + ") or " + value + " = double('Infinity') or " + value + " = double('-Infinity')";
        }

        void verify(Row stats, int offset) {
            String spec = dtype + " of shape " + Arrays.toString(shape);
            long nulls = stats.isNullAt(offset) ? 0 : stats.getLong(offset);
            if (nulls > 0) {
                throw new InvalidInputException(
                        source + ": column " + name + " has " + nulls + " null rows; every row must hold " + spec);
            }
            int next = offset + 1;
            if (array) {
                int min = stats.getInt(next);
                int max = stats.getInt(next + 1);
                if (min != values || max != values) {
                    throw new InvalidInputException(
                            source + ": column " + name + " rows must hold " + values + " values (" + spec
                                    + " in the model's metadata), found rows of " + (min == max ? min + "" : min + " to " + max)
                                    + " values");
                }
                long nullElements = stats.getLong(next + 2);
                if (nullElements > 0) {
                    throw new InvalidInputException(
                            source + ": column " + name + " has " + nullElements + " rows with null elements");
                }
                next += 3;
            }
            if (floating() && stats.getLong(next) > 0) {
                throw new InvalidInputException(
                        source + ": column " + name + " holds NaN or infinite values in " + stats.getLong(next)
                                + " rows; clean the data first");
            }
        }

        int rowBytes() {
            return (int) (values * type.size());
        }

        void write(Row row, int index, ByteBuffer out) {
            if (!array) {
                switch (type) {
                    case FLOAT32:
                        out.putFloat(row.getFloat(index));
                        return;
                    case FLOAT64:
                        out.putDouble(row.getDouble(index));
                        return;
                    default:
                        out.putLong(row.getLong(index));
                        return;
                }
            }
            List<Object> items = row.getList(index);
            for (Object item : items) {
                switch (type) {
                    case FLOAT32:
                        out.putFloat((Float) item);
                        break;
                    case FLOAT64:
                        out.putDouble((Double) item);
                        break;
                    default:
                        out.putLong((Long) item);
                        break;
                }
            }
        }

        @Override
        public String toString() {
            return String.format(Locale.ROOT, "%s %s %s", name, dtype, Arrays.toString(shape));
        }
    }

    /** Builds partition p's shard from its (global index, row) pairs, placing row i at i / K. */
    private static final class BuildShard
            implements Function2<Integer, Iterator<Tuple2<Long, Row>>, Iterator<Shard>> {
        private static final long serialVersionUID = 1L;
        private final int partitions;
        private final long total;
        private final Column x;
        private final Column y;

        BuildShard(int partitions, long total, Column x, Column y) {
            this.partitions = partitions;
            this.total = total;
            this.x = x;
            this.y = y;
        }

        @Override
        public Iterator<Shard> call(Integer p, Iterator<Tuple2<Long, Row>> rows) {
            int count = Shard.rowsOf(total, p, partitions);
            int xRow = x.rowBytes();
            int yRow = y.rowBytes();
            ByteBuffer xs = ByteBuffer.allocate(count * xRow).order(ByteOrder.LITTLE_ENDIAN);
            ByteBuffer ys = ByteBuffer.allocate(count * yRow).order(ByteOrder.LITTLE_ENDIAN);
            while (rows.hasNext()) {
                Tuple2<Long, Row> item = rows.next();
                int j = (int) (item._1() / partitions);
                xs.position(j * xRow);
                x.write(item._2(), 0, xs);
                ys.position(j * yRow);
                y.write(item._2(), 1, ys);
            }
            return java.util.Collections.singletonList(
                    new Shard(p, partitions, total, count, xRow, yRow, xs.array(), ys.array())).iterator();
        }
    }
}
