package dev.gradbridge.spark;

import dev.gradbridge.internal.Messages;
import dev.gradbridge.DType;
import dev.gradbridge.Tensor;
import dev.gradbridge.data.Dataset;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

/**
 * Writes .npz files (arrays x and y, or one per input of a model of several inputs and y) as
 * Parquet in the layout {@link ShardedData} reads: one column per array, named as it (the inputs in
 * the file's order, then y), one row per sample in the file's order (one Parquet file), a sample
 * flattened into an array column, or a plain column when the array is one-dimensional. No checks
 * against any model: the examples and tests use it to make good and bad Parquet data.
 *
 * <p>Usage: {@code NpzToParquet IN.npz OUT.parquet [IN2.npz OUT2.parquet ...]} (one Spark start).
 */
public final class NpzToParquet {

    private NpzToParquet() {}

    /**
     * @param args pairs of input .npz and output Parquet folder (must not exist)
     */
    public static void main(String[] args) {
        if (args.length == 0 || args.length % 2 != 0) {
            System.err.println(Messages.ERROR_PREFIX + "usage: NpzToParquet IN.npz OUT.parquet [IN2.npz OUT2.parquet ...]");
            System.exit(1);
        }
        for (int i = 1; i < args.length; i += 2) {
            if (Files.exists(Paths.get(args[i]))) {
                System.err.println(Messages.ERROR_PREFIX + args[i] + " exists; give a new folder");
                System.exit(1);
            }
        }
        SparkSession spark = SparkSession.builder().master("local[1]").appName("npz-to-parquet")
                .config("spark.ui.enabled", "false").getOrCreate();
        try {
            for (int i = 0; i < args.length; i += 2) {
                Path in = Paths.get(args[i]);
                try (Dataset data = Dataset.loadNpz(in)) {
                    int n = data.size();
                    Map<String, Tensor> arrays = new LinkedHashMap<>(data.getInputs());
                    arrays.put("y", data.getY());
                    List<Column> columns = new ArrayList<>();
                    StructType schema = new StructType();
                    for (Map.Entry<String, Tensor> array : arrays.entrySet()) {
                        Column column = new Column(array.getValue(), n);
                        columns.add(column);
                        schema = schema.add(array.getKey(), column.type, false);
                    }
                    List<Row> rows = new ArrayList<>(n);
                    for (int r = 0; r < n; r++) {
                        Object[] values = new Object[columns.size()];
                        for (int c = 0; c < values.length; c++) {
                            values[c] = columns.get(c).value(r);
                        }
                        rows.add(RowFactory.create(values));
                    }
                    spark.createDataFrame(rows, schema).coalesce(1).write().parquet(args[i + 1]);
                    System.out.println("wrote " + args[i + 1] + " (" + n + " rows)");
                }
            }
        } finally {
            spark.stop();
        }
    }

    private static final class Column {
        final DataType type;
        final DType dtype;
        final boolean array;
        final int perRow;
        final ByteBuffer bytes;

        Column(Tensor values, int n) {
            dtype = values.dtype();
            DataType element = ShardedData.sparkType(dtype);
            array = values.dim() > 1;
            type = array ? DataTypes.createArrayType(element, false) : element;
            perRow = n == 0 ? 0 : (int) (values.numel() / n);
            bytes = ByteBuffer.wrap(values.toBytes()).order(ByteOrder.nativeOrder());
        }

        Object value(int row) {
            if (!array) {
                return element(row);
            }
            Object[] items = new Object[perRow];
            for (int j = 0; j < perRow; j++) {
                items[j] = element(row * perRow + j);
            }
            return items;
        }

        private Object element(int index) {
            switch (dtype) {
                case FLOAT32:
                    return bytes.getFloat(index * dtype.size());
                case FLOAT64:
                    return bytes.getDouble(index * dtype.size());
                default:
                    return bytes.getLong(index * dtype.size());
            }
        }
    }
}
