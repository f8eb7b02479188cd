package dev.gradbridge.spark;

import dev.gradbridge.DType;
import dev.gradbridge.InvalidInputException;
import dev.gradbridge.Metadata;
import dev.gradbridge.internal.Messages;
import static dev.gradbridge.spark.ShardedData.perRow;
import static dev.gradbridge.spark.ShardedData.sparkType;
import static dev.gradbridge.spark.ShardedData.supported;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;

/**
 * One column (an input or y) as the metadata wants it. A 16-bit input is a {@code float} column
 * ({@link DType#carrier}: Parquet has no bfloat16) of values that are exactly its dtype's, checked by
 * a SQL function of its own ({@link #register}) and held in the shards as its 2-byte words.
 */
final class ShardColumn implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final String source;
    final String name;
    final String dtype;
    final DType type;
    final long[] shape;
    final long values;
    final boolean array;

    private ShardColumn(String source, String name, String dtype, long[] shape, boolean array) {
        this.source = source;
        this.name = name;
        this.dtype = dtype;
        this.type = supported(dtype);
        this.shape = shape;
        this.values = perRow(shape);
        this.array = array;
    }

    static ShardColumn of(String source, org.apache.spark.sql.Dataset<Row> frame, Metadata.TensorSpec spec) {
        String name = spec.getName();
        DataType expected = sparkType(supported(spec.getDtype()).carrier());
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
        return new ShardColumn(source, name, spec.getDtype(), spec.getShape(), isArray);
    }

    private boolean floating() {
        return type.isFloating();
    }

    /** SQL aggregates: nulls, then (arrays) min and max size and null elements, then non-finite rows. */
    List<String> checks() {
        // quoted: an input may be named as a SQL function without arguments (user, current_date)
        String column = "`" + name + "`";
        List<String> out = new ArrayList<>();
        out.add("sum(if(" + column + " is null, 1, 0))");
        String bad = nonFinite("v");
        if (array) {
            out.add("min(size(" + column + "))");
            out.add("max(size(" + column + "))");
            out.add("sum(if(exists(" + column + ", v -> v is null), 1, 0))");
            if (floating()) {
                out.add("sum(if(exists(" + column + ", v -> " + bad + "), 1, 0))");
            }
        } else if (floating()) {
            out.add("sum(if(" + nonFinite(column) + ", 1, 0))");
        }
        if (type.carrier() != type) { // rows holding a value the 16-bit dtype does not
            String inexact = NOT_EXACT + type.torchName();
            out.add(array ? "sum(if(exists(" + column + ", v -> " + inexact + "(v)), 1, 0))"
                    : "sum(if(" + inexact + "(" + column + "), 1, 0))");
        }
        return out;
    }

    /** The SQL functions {@code NOT_EXACT + dtype}: whether a float is not exactly a value of that 16-bit dtype. */
    static final String NOT_EXACT = "gradbridge_not_exact_";

    /** Registers the {@link #NOT_EXACT} functions with {@code spark} (the checks of 16-bit columns call them). */
    static void register(org.apache.spark.sql.SparkSession spark) {
        for (DType type : new DType[] {DType.BFLOAT16, DType.FLOAT16}) {
            spark.udf().register(NOT_EXACT + type.torchName(),
                    (org.apache.spark.sql.api.java.UDF1<Float, Boolean>) v -> v != null && !type.holds(v),
                    org.apache.spark.sql.types.DataTypes.BooleanType);
        }
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
        if (type.carrier() != type && stats.getLong(next + 1) > 0) {
            throw new InvalidInputException(Messages.notExactRows(source, name, stats.getLong(next + 1), dtype));
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
                case BFLOAT16:
                case FLOAT16:
                    type.put(out, row.getFloat(index)); // a value of the dtype (checked): its word
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
                case BFLOAT16:
                case FLOAT16:
                    type.put(out, (Float) item);
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
